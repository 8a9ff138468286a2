"""The determinism guard and the replay-safe helpers in plain Python (no server): what is refused, what is
allowed, naming, re-arming, and the prefetch codec's envelope detection."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import random
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.converter import DataConverter

import engine
from engine.core.guard import NonDeterministicCall, forbidden_calls, guarding, hooked, rearm, unguarded
from engine.core.wire import CodeRef, Envelope, RunContext
from engine.runtime.prefetch import PrefetchCodec, _code_of


def guarded(fn: Callable[[], Any], workflow: str = "pipeline") -> str | None:
    """Run ``fn`` as a workflow body would run; the guard's message, or None if it was allowed."""

    async def body() -> str | None:
        with guarding(workflow, __name__):
            try:
                fn()
            except NonDeterministicCall as exc:
                return str(exc)
        return None

    with hooked():
        return asyncio.run(body())


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (time.time, "time.time() inside workflow 'pipeline' is not replayable; use engine.now()"),
        (dt.datetime.now, "datetime.datetime.now() inside workflow 'pipeline' is not replayable; use engine.now()"),
        (
            lambda: random.uniform(0, 1),
            "random.uniform() inside workflow 'pipeline' is not replayable; use engine.random()",
        ),
        (lambda: random.sample(range(9), 2), "random.sample()"),
        (lambda: random.SystemRandom().random(), "random.SystemRandom.random()"),
        (uuid.uuid4, "uuid.uuid4() inside workflow 'pipeline' is not replayable; use engine.uuid4()"),
        (lambda: open(__file__).close(), "open() inside workflow 'pipeline' is not replayable; read and write files"),
        (lambda: time.sleep(0), "time.sleep() inside workflow 'pipeline' is not replayable; use await engine.sleep()"),
    ],
)
def test_forbidden_calls_are_refused_with_their_name_and_replacement(fn: Callable[[], Any], message: str) -> None:
    assert message in (guarded(fn) or "allowed")


def test_network_libraries_are_refused_by_the_call_the_user_made() -> None:
    requests = pytest.importorskip("requests")
    error = guarded(lambda: requests.get("http://127.0.0.1:9/", timeout=1))
    assert error == "requests.api.get() inside workflow 'pipeline' is not replayable; do network I/O in a @task"


@pytest.mark.parametrize(
    "fn",
    [
        lambda: random.Random(42).random(),  # seeded: deterministic
        lambda: uuid.uuid5(uuid.NAMESPACE_DNS, "gangflow"),  # a hash, not randomness
        lambda: dt.datetime(2026, 1, 1).isoformat(),
        lambda: logging.getLogger("guard-test").warning("logging stamps records with time.time()"),
        lambda: "".join(traceback.format_stack(limit=3)),  # reads source lines with open()
        lambda: json.dumps({"a": 1}),
    ],
)
def test_deterministic_code_and_library_internals_are_allowed(fn: Callable[[], Any]) -> None:
    assert guarded(fn) is None


def test_engine_helpers_are_allowed_in_a_body_and_behave_like_the_stdlib_outside() -> None:
    assert guarded(lambda: (engine.now(), engine.uuid4())) is None
    now = engine.now()
    assert now.tzinfo is dt.UTC and abs((dt.datetime.now(dt.UTC) - now).total_seconds()) < 5
    assert engine.uuid4().version == 4
    random.seed(3)
    first = engine.random().random()
    random.seed(3)
    assert random.random() == first  # the random module's own generator, seeded by random.seed()


def test_nothing_is_refused_outside_a_workflow_body_or_inside_unguarded() -> None:
    with hooked():
        time.time()
        with guarding("pipeline"), unguarded():
            time.time()


def test_the_first_violation_is_kept_and_the_hook_rearms() -> None:
    with hooked(), guarding("pipeline") as scope:
        with pytest.raises(NonDeterministicCall):
            time.time()
        assert sys.getprofile() is None  # Python drops a profile function that raised
        rearm()
        with pytest.raises(NonDeterministicCall, match="uuid"):
            uuid.uuid4()
        rearm()
        assert scope.violation is not None and "time.time()" in str(scope.violation)
        with pytest.raises(NonDeterministicCall, match=r"time\.time\(\)"):
            scope.check()


def test_hooked_restores_a_profiler_that_was_there() -> None:
    def other(frame: Any, event: str, arg: Any) -> None:
        return None

    sys.setprofile(other)
    try:
        with hooked():
            assert sys.getprofile() is not other
        assert sys.getprofile() is other
    finally:
        sys.setprofile(None)


def test_forbidden_calls_lists_each_call_with_its_advice() -> None:
    calls = dict(forbidden_calls())
    assert calls["time.time()"] == "use engine.now()"
    assert calls["socket.socket()"] == "do network I/O in a @task"


@pytest.mark.parametrize("bad", ["1", -1, float("nan"), float("inf"), True, dt.timedelta(seconds=-1)])
def test_sleep_refuses_bad_durations(bad: Any) -> None:
    with pytest.raises(engine.InputError, match=r"engine\.sleep\(\)"):
        asyncio.run(engine.sleep(bad))


def test_sleep_outside_a_workflow_waits() -> None:
    start = time.monotonic()
    asyncio.run(engine.sleep(dt.timedelta(milliseconds=50)))
    asyncio.run(engine.sleep(0))
    assert time.monotonic() - start >= 0.04


def test_prefetch_recognizes_envelopes_only() -> None:
    ref = CodeRef("flows", "pipeline", "file:///b.zip", "ab" * 32)
    envelope = Envelope(ref, {"n": 1}, RunContext("r", "pipeline", "default", "/tmp/a"))
    convert = DataConverter.default.payload_converter
    assert _code_of(convert.to_payloads([envelope.encode("test")])[0]) == ref
    for other in (b"\x83\xa4code but not msgpack", b"plain bytes", "a string", {"code": 1}):
        assert _code_of(convert.to_payloads([other])[0]) is None


def test_prefetch_codec_passes_payloads_through_and_survives_unloadable_code() -> None:
    ref = CodeRef("no_such_module_anywhere", "wf")
    blob = Envelope(ref, {}, RunContext("r", "wf", "default", "/tmp/a")).encode("test")
    payloads = DataConverter.default.payload_converter.to_payloads([blob, 3])
    codec = PrefetchCodec()
    decoded = asyncio.run(codec.decode(payloads))
    assert decoded == list(payloads)  # unchanged; the shell reports the missing code itself
    assert asyncio.run(codec.encode(payloads)) == list(payloads)
