"""A rank's pauses between reports (engine.rank.pace): the part of the goodput ledger's ``idle`` it counts as
it reports, and what its report carries (engine.rank.progress)."""

from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rank import progress
from engine.rank.pace import IDLE_FACTOR, IDLE_MIN_S, Pace


def steps(pace: Pace, start: float, count: int, every: float, first: int = 1) -> float:
    """``count`` reports every ``every`` seconds from ``start``; the time of the last one."""
    now = start
    for i in range(count):
        now = start + i * every
        pace.step(first + i, now)
    return now


def test_steady_steps_are_never_idle_and_a_long_pause_is_its_excess() -> None:
    pace = Pace()
    now = steps(pace, 0.0, 100, 0.1)
    assert pace.idle_s == 0 and pace.usual_s == pytest.approx(0.1)
    pace.step(101, now + 30.0)  # an evaluation that reported nothing for 30 s
    assert pace.idle_s == pytest.approx(30.0 - 0.1)
    assert pace.usual_s == pytest.approx(0.1)  # a pause does not move the usual interval


def test_a_checkpoint_save_jitter_and_short_gaps_are_not_pauses() -> None:
    pace = Pace()
    now = steps(pace, 0.0, 50, 0.5)
    pace.saved(20.0)  # a 20 s save: the ledger's checkpoint, not idle
    pace.step(50, now + 20.5)
    assert pace.idle_s == 0
    now = steps(pace, now + 20.5, 20, 0.01, first=51)  # 10 ms steps now: the usual interval follows quickly
    pace.step(71, now + 1.5)  # 150 usual intervals, but only 1.5 s: under IDLE_MIN_S
    assert pace.idle_s == 0 and IDLE_MIN_S > 1.5
    pace.step(72, now + 1.5 + 0.01 * IDLE_FACTOR * 0.9)  # below the factor
    assert pace.idle_s == 0


def test_the_same_step_is_no_progress_and_a_lower_step_starts_over() -> None:
    pace = Pace()
    now = steps(pace, 0.0, 10, 1.0)
    for extra in range(1, 30):  # metrics reported again at the same step: the gap runs on
        pace.step(10, now + extra)
    pace.step(11, now + 31.0)
    assert pace.idle_s == pytest.approx(30.0)
    pace.step(0, now + 100.0)  # a new loop: starts over, nothing counted
    pace.step(1, now + 101.0)
    assert pace.idle_s == pytest.approx(30.0)


def test_a_pause_spanning_several_steps_keeps_their_usual_time() -> None:
    pace = Pace()
    now = steps(pace, 0.0, 20, 1.0)
    pace.step(25, now + 60.0)  # 5 steps in 60 s: 5 s of it were steps
    assert pace.idle_s == pytest.approx(55.0)


@settings(max_examples=200, deadline=None)
@given(
    every=st.floats(0.01, 2.0),
    jitter=st.floats(0.0, 0.3),
    pauses=st.lists(st.floats(0.0, 120.0), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_inserted_pauses_are_found_and_nothing_more(
    every: float, jitter: float, pauses: list[float], seed: int
) -> None:
    """Steps of a usual interval with up to 30 % jitter, and pauses inserted between some of them: each pause
    well over the threshold is found within the jitter of one step; one under it adds nothing."""
    rng = random.Random(seed)
    pace, now, step = Pace(), 0.0, 0
    threshold = max(IDLE_FACTOR * every * (1 + jitter), every * (1 + jitter) + IDLE_MIN_S)
    expected, slack = 0.0, 0.0
    for pause in pauses:
        for _ in range(30):
            step += 1
            now += every * (1 + rng.uniform(-jitter, jitter))
            pace.step(step, now)
        step += 1
        now += pause + every
        pace.step(step, now)
        if pause + every > 2 * threshold:  # surely a pause: its excess over the usual interval
            expected += pause
            slack += 2 * every * jitter + 0.01
        elif pause + every < IDLE_MIN_S or pause + every < IDLE_FACTOR * every * (1 - jitter) * 0.5:
            slack += 0.0  # surely not a pause
        else:
            slack += pause + every  # near the threshold: either way
    assert pace.idle_s == pytest.approx(expected, abs=slack + 1e-6)


def test_the_report_carries_its_idle_seconds_and_the_checkpoint_those_before_it(tmp_path, monkeypatch) -> None:
    class Clock:  # progress's view of the time module: a monotonic clock the test moves
        now = 0.0

        @staticmethod
        def monotonic() -> float:
            return Clock.now

        time = staticmethod(time.time)

    target = tmp_path / "rank0.json"
    monkeypatch.setenv("GANGFLOW_PROGRESS_FILE", str(target))
    monkeypatch.setattr(progress, "time", Clock)
    for state in ("_first", "_since", "_paces", "_checkpoints"):  # this test's own: others in this process share them
        monkeypatch.setattr(progress, state, {})
    monkeypatch.setattr(progress, "_last", None)
    try:
        for step, at in ((1, 0.0), (2, 1.0), (3, 2.0), (4, 40.0)):  # a 37 s pause after 1 s steps
            Clock.now = at
            progress.report(step, force=True)
        progress.checkpointed(4, 0.0)
        Clock.now = 41.0
        progress.report(5, force=True)
        Clock.now = 60.0  # a pause after the checkpoint: in idle_s, not in ckpt_idle_s
        progress.report(6, force=True)
        written = json.loads(target.read_text())
        assert written["ckpt_idle_s"] == pytest.approx(37.0) and written["idle_s"] == pytest.approx(37.0 + 18.0)
    finally:
        progress.flush()
