"""Waiting for people inside a workflow: ``engine.approve(...)`` and ``engine.wait_for_input(...)``.

A workflow body may stop and wait for a person: an approval (``gangflow approve RUN [--reject]``) or a
typed value (``gangflow input RUN threshold 0.93``). On Temporal the wait is a workflow condition with an
optional durable timer, so it costs nothing while it waits and survives worker restarts; the answer
arrives as a Workflow Update whose validator refuses a wrong type or an unknown name at the sender, so the
run keeps waiting (workflows/waits.py).

Semantics (chosen to match Flyte's gate nodes):

- ``approve`` returns an :class:`Approval` when approved; a rejection raises :class:`Rejected`, which fails
  the run with the question, who rejected it and their comment, like Flyte's approve gate. A workflow
  that wants to branch on "no" catches ``Rejected`` (its ``approval`` holds the answer).
- ``wait_for_input(name, type)`` returns the value validated against ``type`` with the same type
  machinery as task inputs. A name takes one value per run: waiting for it again returns the same value.
- A timeout (seconds or a ``timedelta``; ``None`` waits forever) raises :class:`WaitTimedOut` naming the
  question or input.
- Plain Python and ``engine.run_local`` have no one to ask: both raise :class:`NoOneToAsk` (a
  GangflowError) saying so, rather than blocking on a terminal prompt a test or a notebook never answers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar

from engine.core.dispatch import current_dispatcher
from engine.core.interface import parse_text
from engine.errors import GangflowError, InputError
from engine.types.codec import ValueCodec

__all__ = [
    "Approval",
    "NoOneToAsk",
    "Rejected",
    "WaitKind",
    "WaitRequest",
    "WaitTimedOut",
    "approve",
    "check_input_name",
    "duration_text",
    "no_one_to_ask",
    "parse_text",
    "wait_for_input",
]

T = TypeVar("T")
WaitKind = Literal["input", "approval"]

#: an input's name travels on a command line and in the UI: keep it a plain word
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True)
class Approval:
    """The answer to ``engine.approve(question)``; ``by`` names who answered (the sender's user name)."""

    approved: bool
    comment: str | None = None
    by: str | None = None


class Rejected(GangflowError):
    """``engine.approve(question)`` was answered with a rejection; fails the run unless the workflow catches it."""

    kind = "Rejected"

    def __init__(self, question: str, approval: Approval) -> None:
        who = f" by {approval.by}" if approval.by else ""
        why = f": {approval.comment}" if approval.comment else ""
        super().__init__(f"rejected{who}: {question!r}{why}")
        self.question, self.approval = question, approval


class WaitTimedOut(GangflowError):
    """No answer came within the wait's timeout."""

    kind = "WaitTimedOut"


class NoOneToAsk(GangflowError):
    """A wait outside a run on Temporal (plain Python, ``run_local``): nobody can answer it."""

    kind = "NoOneToAsk"


@dataclass(frozen=True)
class WaitRequest:
    """One wait of a workflow body: what the dispatcher's ``wait_for`` is asked to wait for.

    ``name`` is the input's name, or the question for an approval (the key an answer is matched by).
    """

    kind: WaitKind
    name: str
    codec: ValueCodec | None = field(default=None, compare=False)  # inputs only
    timeout: timedelta | None = None
    prompt: str | None = None  # what to tell the person (an approval's is its question)

    @property
    def type_name(self) -> str:
        return self.codec.name if self.codec is not None else "approval"

    def describe(self) -> str:
        """``input 'threshold' (float)`` / ``approval 'promote the model?'``: for messages."""
        if self.kind == "approval":
            return f"approval {self.name!r}"
        return f"input {self.name!r} ({self.type_name})"

    def timed_out(self) -> WaitTimedOut:
        after = f" within {duration_text(self.timeout)}" if self.timeout is not None else ""
        return WaitTimedOut(f"no answer to {self.describe()}{after}")


def duration_text(duration: timedelta) -> str:
    """``1 day``, ``2 h 30 min``, ``1.5 s``: a timeout as a person reads it."""
    seconds = duration.total_seconds()
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, rest = divmod(rest, 60)
    parts = [f"{days:g} day" + ("s" if days > 1 else "")] if days else []
    parts += [f"{hours:g} h"] if hours else []
    parts += [f"{minutes:g} min"] if minutes else []
    parts += [f"{round(rest, 3):g} s"] if rest or not parts else []
    return " ".join(parts)


def check_input_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(
            f"an input's name is a word of letters, digits, '_', '.' or '-' (at most 100), starting with a letter "
            f"or '_'; got {name!r}"
        )
    return name


def _timeout(timeout: object, what: str) -> timedelta | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise InputError(f"{what}: timeout is seconds (a number), a timedelta or None; got {timeout!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(f"{what}: timeout must be > 0 (None waits forever); got {timeout!r}")
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)


def no_one_to_ask(request: WaitRequest) -> NoOneToAsk:
    """The error of a wait where nobody can answer (the local dispatchers raise it)."""
    return NoOneToAsk(
        f"the workflow waits for {request.describe()}, which only a run on Temporal can receive "
        "(gangflow run / Client.start, answered with gangflow approve / gangflow input); plain Python and "
        "run_local have no one to ask"
    )


async def _wait(request: WaitRequest) -> Any:
    dispatcher = current_dispatcher()
    if dispatcher is None:
        raise no_one_to_ask(request)
    return await dispatcher.wait_for(request)


async def approve(question: str, *, timeout: float | timedelta | None = None) -> Approval:
    """Wait until someone approves ``question`` (``gangflow approve RUN``) and return the :class:`Approval`;
    a rejection (``gangflow approve RUN --reject``) raises :class:`Rejected`, a timeout :class:`WaitTimedOut`."""
    if not isinstance(question, str) or not question.strip() or len(question) > 500:
        raise InputError(f"engine.approve() needs a question (text, at most 500 characters); got {question!r}")
    request = WaitRequest("approval", question, None, _timeout(timeout, f"engine.approve({question!r})"), question)
    answer = await _wait(request)
    if not isinstance(answer, Approval):  # pragma: no cover - the dispatchers answer an approval with one
        raise GangflowError(f"approval {question!r}: unexpected answer {answer!r}")
    if not answer.approved:
        raise Rejected(question, answer)
    return answer


async def wait_for_input(
    name: str, type_: type[T] | Any, *, timeout: float | timedelta | None = None, prompt: str | None = None
) -> T:
    """Wait for a value of type ``type_`` sent with ``gangflow input RUN NAME VALUE`` (or
    ``engine.client.send_input``) and return it; a timeout raises :class:`WaitTimedOut`. ``prompt`` is shown
    with the wait (``gangflow status``)."""
    check_input_name(name)
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > 500):
        raise InputError(f"engine.wait_for_input({name!r}): prompt is text of at most 500 characters")
    try:
        codec = ValueCodec(type_)
    except TypeError as exc:
        raise InputError(f"engine.wait_for_input({name!r}): {exc}") from None
    request = WaitRequest("input", name, codec, _timeout(timeout, f"engine.wait_for_input({name!r})"), prompt)
    return await _wait(request)  # type: ignore[no-any-return]
