"""Answering a waiting run from the client side: ``approve(client, run)`` and ``send_input(client, run, name, v)``.

The answer goes to the run as a Workflow Update; the run's validator judges it against what the run waits for
now, so a refusal (a wrong type, a name it does not wait for, a second value) raises :class:`InputRefused`
here with the run's reason, and the run keeps waiting. ``waiting(client, run)`` says what a run waits for.

    from engine.client import Client, approve, send_input

    client = await Client.connect()
    await send_input(client, run_id, "threshold", 0.93)
    await approve(client, run_id, comment="metrics look fine")
"""

from __future__ import annotations

import getpass
from typing import Any

from pydantic_core import to_jsonable_python
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from engine.client._client import Client
from engine.core.protocol import APPROVE_UPDATE, INPUT_UPDATE
from engine.errors import GangflowError, InputError

__all__ = ["InputRefused", "RunNotWaiting", "approve", "send_input", "waiting"]

_MISSING: Any = object()


class InputRefused(GangflowError):
    """The run refused the answer (wrong type, a name it does not wait for, already answered); it keeps waiting."""

    kind = "InputRefused"


class RunNotWaiting(GangflowError):
    """The run is not running (finished, failed, cancelled) or does not exist: nobody waits for an answer."""

    kind = "RunNotWaiting"


def _sender() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without passwd entry)
        return None


async def _send(client: Client, run_id: str, update: str, message: dict[str, Any]) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = await client.handle(run_id).execute_update(update, message, result_type=dict)
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        raise InputRefused(cause.message if isinstance(cause, ApplicationError) else str(cause or exc)) from None
    except RPCError as exc:
        try:
            desc = await client.handle(run_id).describe()
        except RPCError:
            raise RunNotWaiting(f"run {run_id!r}: {exc.message}") from None
        status = desc.status.name if desc.status else "UNKNOWN"
        if status != "RUNNING":
            raise RunNotWaiting(f"run {run_id!r} is {status}: it waits for nothing") from None
        raise
    if not answer.get("accepted"):  # the handler's own refusal (a race with another sender)
        raise InputRefused(str(answer.get("error") or "refused"))
    return answer


async def send_input(
    client: Client,
    run_id: str,
    name: str,
    value: Any = _MISSING,
    *,
    text: str | None = None,
    early: bool = False,
    by: str | None = None,
) -> dict[str, Any]:
    """Send the value of input ``name`` (``engine.wait_for_input(name, type)``): a JSON-able ``value``, or
    ``text`` read against the input's type the way ``gangflow run`` reads a parameter. ``early``: the run
    does not wait for it yet; keep it for when it does (its type is checked then)."""
    if (value is _MISSING) == (text is None):
        raise InputError("send_input takes either a value or text, not both and not neither")
    message: dict[str, Any] = {"name": name, "early": early, "by": by or _sender()}
    if text is not None:
        message["text"] = text
    else:
        try:
            message["value"] = to_jsonable_python(value)
        except Exception as exc:
            raise InputError(f"input {name!r}: cannot send {value!r}: {exc}") from None
    return await _send(client, run_id, INPUT_UPDATE, message)


async def approve(
    client: Client,
    run_id: str,
    *,
    reject: bool = False,
    comment: str | None = None,
    by: str | None = None,
    question: str | None = None,
) -> dict[str, Any]:
    """Answer the run's open ``engine.approve(question)`` (the oldest, when it waits for several and
    ``question`` is not given): approve it, or reject it (the run fails with the comment)."""
    message = {"approved": not reject, "comment": comment, "by": by or _sender(), "question": question}
    return await _send(client, run_id, APPROVE_UPDATE, message)


async def waiting(client: Client, run_id: str) -> list[dict[str, Any]]:
    """What the run waits for now: ``[{kind, name, type, prompt, since, timeout_s, note}]`` (empty when
    nothing, or when the run is not running)."""
    progress = await client.progress(run_id)
    return list((progress or {}).get("waiting") or [])
