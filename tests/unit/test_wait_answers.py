"""engine.approve / engine.wait_for_input without Temporal: argument checks, reading typed text, what the
run's update validators accept or refuse (workflows/waits.py), the status lines, and the clear error of a
wait where nobody can answer (plain Python, run_local)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

import engine
from engine import task, workflow
from engine.cli.app import build_parser
from engine.cli.render import run_json, waiting_lines
from engine.client import RunInfo
from engine.core.waits import Approval, NoOneToAsk, Rejected, WaitRequest, duration_text, parse_text
from engine.errors import InputError
from engine.types.codec import ValueCodec
from workflows.waits import Waits, _Pending


class Limits(BaseModel):
    low: float
    high: float


def _waits(*requests: WaitRequest) -> Waits:
    waits = Waits(lambda: None)
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    waits.pending.extend(_Pending(r, since) for r in requests)
    return waits


def _input(name: str, annotation: Any, timeout: timedelta | None = None) -> WaitRequest:
    return WaitRequest("input", name, ValueCodec(annotation), timeout, None)


def _refusal(waits: Waits, message: Any, approval: bool = False) -> str:
    with pytest.raises(ApplicationError) as caught:
        (waits.check_approval if approval else waits.check_input)(message)
    assert caught.value.type == "InputRefused"
    return caught.value.message


# -- reading a value typed on a command line ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("annotation", "text", "value"),
    [
        (float, "0.93", 0.93),
        (int, "3", 3),
        (str, "0.93", "0.93"),  # a str stays as typed
        (bool, "yes", True),
        (bool, "off", False),
        (list[int], "[1, 2]", [1, 2]),
        (dict[str, float], '{"lr": 0.1}', {"lr": 0.1}),
        (float, "abc", "abc"),  # not JSON: the text itself, for the type's validator to refuse
    ],
)
def test_parse_text_reads_like_gangflow_run(annotation: Any, text: str, value: Any) -> None:
    assert parse_text(annotation, text) == value


# -- the validator: what the run takes while it waits ------------------------------------------------------
def test_a_value_of_the_right_type_is_taken_once() -> None:
    waits = _waits(_input("threshold", float))
    waits.check_input({"name": "threshold", "text": "0.93"})
    assert waits.receive_input({"name": "threshold", "text": "0.93"}) == {
        "accepted": True,
        "name": "threshold",
        "kept": False,
    }
    assert waits.inputs == {"threshold": 0.93}
    again = _refusal(waits, {"name": "threshold", "text": "0.5"})
    assert "input 'threshold' was already given (0.93)" in again
    # the handler never raises, and a refused value changes nothing
    assert waits.receive_input({"name": "threshold", "text": "0.5"})["accepted"] is False
    assert waits.inputs == {"threshold": 0.93}


def test_a_wrong_type_is_refused_with_the_expected_type_and_nothing_changes() -> None:
    waits = _waits(_input("threshold", float))
    reason = _refusal(waits, {"name": "threshold", "text": "abc"})
    assert "input 'threshold': expected float, got 'abc'" in reason
    assert waits.receive_input({"name": "threshold", "text": "abc"})["accepted"] is False
    assert waits.inputs == {} and len(waits.pending) == 1


def test_structured_values_are_validated_by_the_type_machinery() -> None:
    waits = _waits(_input("limits", Limits))
    assert "expected Limits" in _refusal(waits, {"name": "limits", "text": '{"low": 1}'})
    waits.check_input({"name": "limits", "value": {"low": 0.1, "high": 0.9}})
    waits.receive_input({"name": "limits", "text": '{"low": 0.1, "high": 0.9}'})
    assert waits.inputs["limits"] == Limits(low=0.1, high=0.9)


def test_a_name_the_run_does_not_wait_for_is_refused_naming_what_it_waits_for() -> None:
    waits = _waits(_input("threshold", float))
    reason = _refusal(waits, {"name": "treshold", "text": "0.9"})
    assert "does not wait for input 'treshold'" in reason
    assert "it waits for input 'threshold' (float)" in reason
    assert "nothing now" in _refusal(_waits(), {"name": "x", "text": "1"})


def test_an_early_value_is_kept_untyped_until_the_run_waits_for_it() -> None:
    waits = _waits()
    message = {"name": "threshold", "text": "0.9", "early": True}
    waits.check_input(message)
    assert waits.receive_input(message) == {"accepted": True, "name": "threshold", "kept": True}
    assert "already given" in _refusal(waits, {"name": "threshold", "text": "0.8", "early": True})


@pytest.mark.parametrize(
    "message",
    [None, [], "threshold", {"text": "1"}, {"name": 3, "text": "1"}, {"name": "x", "text": 3}, {"name": "a b"}],
)
def test_malformed_messages_are_refused_and_the_handler_never_raises(message: Any) -> None:
    waits = _waits(_input("x", int))
    _refusal(waits, message)
    assert waits.receive_input(message)["accepted"] is False
    assert waits.receive_approval(message)["accepted"] is False


def test_approvals_answer_the_oldest_open_question_or_the_one_named() -> None:
    first = WaitRequest("approval", "promote?", prompt="promote?")
    second = WaitRequest("approval", "deploy?", prompt="deploy?")
    waits = _waits(first, second)
    assert "does not wait for approval 'delete?'" in _refusal(
        waits, {"approved": True, "question": "delete?"}, approval=True
    )
    assert _refusal(waits, {"approved": "yes"}, approval=True).startswith("an approval message")
    answer = waits.receive_approval({"approved": False, "comment": "not yet", "by": "ana"})
    assert answer == {"accepted": True, "question": "promote?", "approved": False}
    assert waits.approvals["promote?"] == Approval(False, "not yet", "ana")
    waits.receive_approval({"approved": True, "question": "deploy?"})
    assert waits.approvals["deploy?"].approved is True
    assert "does not wait for an approval" in _refusal(_waits(), {"approved": True}, approval=True)


# -- what a waiting run shows ------------------------------------------------------------------------------
def test_details_and_status_lines_say_what_the_run_waits_for() -> None:
    waits = _waits(_input("threshold", float, timedelta(hours=1)), WaitRequest("approval", "promote?"))
    assert waits.details() == "waiting for input: threshold (float) · waiting for approval: promote?"
    described = waits.describe()
    assert described[0] | {"since": None} == {
        "kind": "input",
        "name": "threshold",
        "type": "float",
        "prompt": None,
        "since": None,
        "timeout_s": 3600.0,
        "note": None,
    }
    lines = waiting_lines({"waiting": described}, "run-1")
    assert lines[0].startswith("waiting for input 'threshold' (float) since 2026-01-02 03:04:05 UTC")
    assert "times out after 1 h" in lines[0]
    assert "gangflow input run-1 threshold VALUE" in lines[0]
    assert lines[1].startswith("waiting for approval: promote? (since 2026-01-02 03:04:05 UTC")
    assert waiting_lines({}) == [] and _waits().details() == ""
    info = RunInfo("run-1", "pipeline", "RUNNING", None, None, progress={"running": [], "waiting": described})
    assert run_json(info)["waiting"] == described  # gangflow status --json
    assert run_json(RunInfo("run-2", "pipeline", "COMPLETED", None, None))["waiting"] == []


# -- the public functions ----------------------------------------------------------------------------------
def test_bad_arguments_fail_before_waiting() -> None:
    with pytest.raises(InputError, match="needs a question"):
        asyncio.run(engine.approve(""))
    with pytest.raises(InputError, match="timeout must be > 0"):
        asyncio.run(engine.approve("ok?", timeout=0))
    with pytest.raises(InputError, match="timeout is seconds"):
        asyncio.run(engine.wait_for_input("x", int, timeout="1h"))
    with pytest.raises(InputError, match="an input's name"):
        asyncio.run(engine.wait_for_input("two words", int))
    with pytest.raises(InputError, match="unsupported type"):
        asyncio.run(engine.wait_for_input("x", object()))


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (timedelta(days=1), "1 day"),
        (timedelta(days=2, hours=1), "2 days 1 h"),
        (timedelta(hours=2, minutes=30), "2 h 30 min"),
        (timedelta(seconds=1.5), "1.5 s"),
        (timedelta(0), "0 s"),
    ],
)
def test_timeouts_read_as_people_say_them(duration: timedelta, text: str) -> None:
    assert duration_text(duration) == text
    assert (
        str(WaitRequest("approval", "ok?", timeout=duration).timed_out())
        == f"no answer to approval 'ok?' within {text}"
    )


def test_rejected_names_the_question_who_and_why() -> None:
    err = Rejected("promote?", Approval(False, "accuracy too low", "ana"))
    assert str(err) == "rejected by ana: 'promote?': accuracy too low"
    assert err.kind == "Rejected" and err.approval.approved is False


@task
def double(x: int) -> int:
    return 2 * x


@workflow
async def asks(x: int = 1) -> float:
    y = await double(x=x)
    return y * await engine.wait_for_input("threshold", float)


@workflow
async def gated(x: int = 1) -> int:
    await engine.approve("go?")
    return x


def test_plain_python_and_run_local_have_no_one_to_ask() -> None:
    with pytest.raises(NoOneToAsk, match=r"waits for input 'threshold' \(float\), which only a run on Temporal"):
        asyncio.run(asks(x=2))
    with pytest.raises(NoOneToAsk, match=r"approval 'go\?'"):
        engine.run_local(gated)
    with pytest.raises(NoOneToAsk, match="run_local have no one to ask"):
        engine.run_local(asks, x=2)


def test_the_cli_commands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["approve", "run-1", "--reject", "--comment", "no"])
    assert (args.command, args.run_id, args.reject, args.comment) == ("approve", "run-1", True, "no")
    args = parser.parse_args(["input", "run-1", "threshold", "0.93", "--early"])
    assert (args.command, args.name, args.value, args.early) == ("input", "threshold", "0.93", True)


def test_an_input_with_an_unknown_field_is_refused_and_the_run_keeps_waiting():
    """`gangflow input RUN limits '{"hihg": 2}'`: a typo would otherwise set `high` to nothing at all."""
    waits = _waits(_input("limits", Limits))
    message = _refusal(waits, {"name": "limits", "text": '{"low": 0.1, "hihg": 2}'})
    assert "unknown field 'hihg' (did you mean 'high'?)" in message
    assert [p.request.name for p in waits.pending] == ["limits"]
