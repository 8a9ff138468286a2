"""The workflow side of ``engine.approve`` / ``engine.wait_for_input``: what a run waits for, and the answers.

A wait is a ``workflow.wait_condition`` (plus a durable timer when it has a timeout), so it survives worker
restarts: on replay the same updates arrive in the same order and the same wait ends the same way.

Answers arrive as Workflow Updates (``gangflow_input``, ``gangflow_approve``; the shell's handlers delegate
here). The *validator* judges a message against what the run waits for now, so a value of the wrong type or
for a name the run does not wait for is refused at the sender (``gangflow input`` exits 2) and never enters
history: the run keeps waiting. The *handler* never raises (a bad message is answered, not thrown), and
applies only what the validator would accept, so a replay (which skips validators) ends where the first
run did.

A value sent before its wait (``early``) is kept untyped; the wait that asks for it reads and checks it then,
and drops it, noting why, if it does not fit the type (the run then keeps waiting for a proper one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from engine.core.waits import Approval, WaitRequest, check_input_name, parse_text
from engine.errors import GangflowError, InputError

__all__ = ["Waits"]

_MAX_COMMENT = 2000


@dataclass
class _Pending:
    request: WaitRequest
    since: datetime
    note: str | None = None  # why an early value was dropped


class _Refused(Exception):
    """A message the run cannot take; the validator turns it into a rejected update."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Waits:
    """The waits of one run and the answers it has received. ``changed`` refreshes the UI's details."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self.pending: list[_Pending] = []
        self.inputs: dict[str, Any] = {}  # name -> its value (typed by the wait that took it)
        self.early: dict[str, dict[str, Any]] = {}  # name -> a message that came before its wait
        self.approvals: dict[str, Approval] = {}  # question -> answer
        self.changed = changed

    # -- the workflow body's side ------------------------------------------------------------------------
    async def wait_for(self, request: WaitRequest) -> Any:
        if request.kind == "approval":
            if request.name not in self.approvals:
                await self._wait(request, lambda: request.name in self.approvals)
            return self.approvals[request.name]
        codec = request.codec
        if codec is None:  # pragma: no cover - engine.wait_for_input always sets it
            raise InputError(f"{request.describe()}: no type")
        note = None
        if request.name not in self.inputs and request.name in self.early:
            message = self.early.pop(request.name)
            try:
                self.inputs[request.name] = self._typed(request, message)
            except _Refused as refused:
                note = f"a value sent before the run waited was dropped: {refused}"
        if request.name not in self.inputs:
            await self._wait(request, lambda: request.name in self.inputs, note)
        # waiting again for a name returns its one value (checked against this wait's type)
        return codec.validate(self.inputs[request.name], f"input {request.name!r}")

    async def _wait(self, request: WaitRequest, answered: Callable[[], bool], note: str | None = None) -> None:
        entry = _Pending(request, workflow.now(), note)
        self.pending.append(entry)
        self.changed()
        try:
            if request.timeout is None:
                await workflow.wait_condition(answered)
            else:
                await workflow.wait_condition(
                    answered, timeout=request.timeout, timeout_summary=f"waiting for {request.describe()}"
                )
        except TimeoutError:  # asyncio.TimeoutError is TimeoutError on 3.11
            raise request.timed_out() from None
        finally:
            self.pending.remove(entry)
            self.changed()

    # -- what the run waits for: the progress query and the UI's details -------------------------------
    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "kind": p.request.kind,
                "name": p.request.name,
                "type": p.request.type_name,
                "prompt": p.request.prompt,
                "since": p.since.isoformat(),
                "timeout_s": p.request.timeout.total_seconds() if p.request.timeout is not None else None,
                "note": p.note,
            }
            for p in self.pending
        ]

    def details(self) -> str:
        """``waiting for input: threshold (float)`` / ``waiting for approval: promote?``; "" when none."""
        parts = [
            f"waiting for approval: {p.request.name}"
            if p.request.kind == "approval"
            else f"waiting for input: {p.request.name} ({p.request.type_name})"
            for p in self.pending
        ]
        return " · ".join(parts)

    def _waiting_for(self) -> str:
        names = [p.request.describe() for p in self.pending]
        return "it waits for " + ", ".join(names) if names else "it waits for nothing now"

    # -- inputs -----------------------------------------------------------------------------------------
    def _input_wait(self, name: str) -> _Pending | None:
        return next((p for p in self.pending if p.request.kind == "input" and p.request.name == name), None)

    def _typed(self, request: WaitRequest, message: dict[str, Any]) -> Any:
        codec = request.codec
        if codec is None:  # pragma: no cover
            raise _Refused(f"{request.describe()}: no type")
        value = parse_text(codec.annotation, message["text"]) if "text" in message else message.get("value")
        try:  # what a person sent: a key no field takes is a typo, refused (the run keeps waiting)
            return codec.validate(value, f"input {request.name!r}", strict_fields=True)
        except GangflowError as exc:
            raise _Refused(str(exc)) from None

    def _judge_input(self, message: Any) -> tuple[str, Any, bool]:
        """(name, typed value or the raw message, whether the run waits for it now); raises _Refused."""
        if not isinstance(message, dict) or not isinstance(message.get("name"), str):
            raise _Refused("an input message is {'name': NAME, 'value': VALUE} or {'name': NAME, 'text': TEXT}")
        if "text" in message and not isinstance(message["text"], str):
            raise _Refused("an input's 'text' is a string (the value as typed on a command line)")
        name = message["name"]
        try:
            check_input_name(name)
        except InputError as exc:
            raise _Refused(str(exc)) from None
        if name in self.inputs or name in self.early:
            early = self.early.get(name, {})
            given = self.inputs[name] if name in self.inputs else early.get("text", early.get("value"))
            raise _Refused(f"input {name!r} was already given ({_shown(given)}); a name takes one value per run")
        pending = self._input_wait(name)
        if pending is not None:
            return name, self._typed(pending.request, message), True
        if message.get("early") is True:
            return name, dict(message), False
        raise _Refused(
            f"the run does not wait for input {name!r}; {self._waiting_for()} (send it with early=True / "
            "gangflow input --early to keep it until the run waits for it)"
        )

    def check_input(self, message: Any) -> None:
        """The update's validator: refuse what the run cannot take, so the sender gets the reason."""
        try:
            self._judge_input(message)
        except _Refused as refused:
            raise ApplicationError(str(refused), type="InputRefused", non_retryable=True) from None

    def receive_input(self, message: Any) -> dict[str, Any]:
        """The update's handler: apply an accepted message; never raises."""
        try:
            name, value, now = self._judge_input(message)
        except _Refused as refused:
            return {"accepted": False, "error": str(refused)}
        if now:
            self.inputs[name] = value
            return {"accepted": True, "name": name, "kept": False}
        self.early[name] = value
        return {"accepted": True, "name": name, "kept": True}

    # -- approvals --------------------------------------------------------------------------------------
    def _judge_approval(self, message: Any) -> tuple[str, Approval]:
        if not isinstance(message, dict) or not isinstance(message.get("approved"), bool):
            raise _Refused("an approval message is {'approved': true|false, 'comment': TEXT, 'by': NAME}")
        comment, by, question = message.get("comment"), message.get("by"), message.get("question")
        for key, text in (("comment", comment), ("by", by), ("question", question)):
            if text is not None and (not isinstance(text, str) or len(text) > _MAX_COMMENT):
                raise _Refused(f"an approval's {key!r} is text of at most {_MAX_COMMENT} characters")
        waiting = [
            p.request.name
            for p in self.pending
            if p.request.kind == "approval" and p.request.name not in self.approvals
        ]
        if question is not None:
            if question not in waiting:
                raise _Refused(f"the run does not wait for approval {question!r}; {self._waiting_for()}")
        elif waiting:
            question = waiting[0]  # the oldest open question
        else:
            raise _Refused(f"the run does not wait for an approval; {self._waiting_for()}")
        return question, Approval(message["approved"], comment, by)

    def check_approval(self, message: Any) -> None:
        try:
            self._judge_approval(message)
        except _Refused as refused:
            raise ApplicationError(str(refused), type="InputRefused", non_retryable=True) from None

    def receive_approval(self, message: Any) -> dict[str, Any]:
        try:
            question, answer = self._judge_approval(message)
        except _Refused as refused:
            return {"accepted": False, "error": str(refused)}
        self.approvals[question] = answer
        return {"accepted": True, "question": question, "approved": answer.approved}
