"""The preemption benchmark's harness: what it computes from what it saw, its output and its bad input.

``analyse`` is fed made-up observations (a cooperative preemption that saved at the notice, a kill between
two periodic checkpoints, a poll that missed a first report, runs that went wrong), so that a real run's
figures mean what the README says. One small run end to end, as a user runs the benchmark, is marked slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import bench_preemption as bp
import pytest

HERE = Path(__file__).resolve().parent
PERIOD = 0.1


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python tests/perf/bench_preemption.py ...`` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, str(HERE / "bench_preemption.py"), *args],
        cwd=HERE.parents[1],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def observed(mode: str, *, last_report: int, resumed_from: int, saved: int | None) -> bp.Observed:
    """A victim that reported every step at 100 + step x 0.1 s up to ``last_report`` (both ranks), was
    preempted at 103.05 (notice delivered at 103.15), saved ``saved`` at 103.25 or nothing, released the GPUs
    at 103.65, and resumed from ``resumed_from`` at 111.0 after the preemptor ran from 106.0 to 108.0."""
    obs = bp.Observed(mode=mode, trigger_step=23, victim_run="v", preemptor_run="p", steps=100)
    for rank in (0, 1):
        for step in range(1, last_report + 1):
            obs.add_report("victim", 0, rank, step, 100 + step * PERIOD)
        obs.add_report("victim", 1, rank, resumed_from + 1, 111.0 + rank * 0.01)
        obs.add_report("preemptor", 0, rank, 1, 106.0)
        obs.proc_start[("preemptor", 0, rank)] = 90.0  # a standby, started long before its launch
        obs.proc_start[("victim", 1, rank)] = 108.2  # a fresh process, after its launch
    obs.checkpoints = {20: 102.0, 30: 103.0}
    if saved is not None:
        obs.checkpoints[saved] = 103.25
    obs.notice_t = 103.15
    obs.first_step, obs.attempt, obs.preemptions = resumed_from, 1, 1
    obs.victim_events = [
        (99.0, "WORKFLOW_EXECUTION_SIGNALED", "placement"),
        (103.05, "WORKFLOW_EXECUTION_SIGNALED", "preempt"),
        (103.07, "ACTIVITY_TASK_SCHEDULED", bp.NOTICE),
        (103.6, "ACTIVITY_TASK_FAILED", bp.RUN_RANKS),
        (103.65, "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED", "release"),
        (103.66, "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED", "submit"),
        (108.05, "WORKFLOW_EXECUTION_SIGNALED", "placement"),
        (108.1, "ACTIVITY_TASK_STARTED", bp.RUN_RANKS),
    ]
    obs.preemptor_events = [
        (103.7, "WORKFLOW_EXECUTION_SIGNALED", "placement"),
        (103.75, "ACTIVITY_TASK_STARTED", bp.RUN_RANKS),
        (108.0, "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED", "release"),
    ]
    return obs


def cooperative() -> bp.Observed:
    return observed("cooperative", last_report=31, resumed_from=31, saved=31)


def kill() -> bp.Observed:
    # the last report (throttled) at step 28, 0.35 s before the notice: 3 more steps were done, 31 in all
    return observed("kill", last_report=28, resumed_from=30, saved=None)


def test_a_cooperative_preemption_is_timed_from_the_notice() -> None:
    sample = bp.analyse(cooperative())
    assert sample["notice_delivered_s"] == 0.1
    assert sample["save_s"] == 0.1  # notice delivered → the checkpoint written at the notice
    assert sample["gpus_free_s"] == 0.6
    assert sample["preemptor_placed_s"] == 0.65
    assert sample["preemptor_first_step_s"] == 2.95
    assert sample["capacity_back_s"] == 4.95
    assert sample["resume_after_capacity_s"] == 3.0
    assert sample["notice_to_resume_s"] == 7.95
    assert (sample["saved_step"], sample["reached_step"], sample["steps_lost"]) == (31, 31, 0)
    assert sample["reached_from"] == "checkpoint at the notice"
    assert sample["step_period_s"] == PERIOD
    assert sample["breakdown_s"]["ranks_gone_to_release"] == 0.05
    assert sample["breakdown_s"]["capacity_back_to_victim_placed"] == 0.05
    # the preemptor's ranks were standby processes created 13.75 s before their launch; the resumed ones fresh
    assert (sample["preemptor_standby_age_s"], sample["resumed_standby_age_s"]) == (13.75, -0.1)


def test_a_kill_loses_the_steps_since_the_last_periodic_checkpoint() -> None:
    sample = bp.analyse(kill())
    assert sample["save_s"] is None and sample["saved_step"] is None  # checkpoint 30 predates the notice
    assert sample["last_step_reported_before_notice"] == 28
    assert sample["reached_step"] == 31  # 28 + the 3 whole steps of the 0.35 s since that report
    assert sample["reached_from"] == "last report before the notice, extrapolated"
    assert sample["steps_lost"] == 1


def test_a_first_report_missed_by_the_poll_is_taken_back_to_the_first_step() -> None:
    obs = cooperative()
    for rank in (0, 1):  # only step 34 (0.2 s after the first resumed step, 32) was seen
        obs.reports[("victim", 1, rank)] = {34: 111.2}
    sample = bp.analyse(obs)
    assert sample["notice_to_resume_s"] == 7.95
    assert sample["first_reports_extrapolated"] == {"preemptor": False, "victim": True}


def test_a_victim_that_was_never_preempted_is_named() -> None:
    obs = cooperative()
    obs.attempt, obs.preemptions = 0, 0
    obs.victim_events = [e for e in obs.victim_events if e[2] != "preempt"]
    with pytest.raises(bp.AnalysisError, match=r"the victim v was not preempted .*raise --steps"):
        bp.analyse(obs)


def test_a_victim_that_had_finished_its_steps_is_named() -> None:
    obs = observed("kill", last_report=28, resumed_from=100, saved=None)
    with pytest.raises(bp.AnalysisError, match="had done all its 100 steps when the notice came"):
        bp.analyse(obs)


def test_missing_milestones_are_named() -> None:
    obs = kill()
    obs.notice_t = None
    obs.preemptor_events = []
    with pytest.raises(
        bp.AnalysisError, match="not seen: the preemptor's placement, the preemptor's release, the notice"
    ):
        bp.analyse(obs)


def test_trigger_steps_spread_over_one_checkpoint_interval() -> None:
    assert bp.trigger_steps(3, 20, 80) == [83, 90, 97]
    assert bp.trigger_steps(1, 20, 80) == [90]
    assert bp.trigger_steps(2, 1, 5) == [6, 6]


# -- output ----------------------------------------------------------------------------------------------------
def result_line() -> dict[str, Any]:
    samples = {"cooperative": [bp.analyse(cooperative())], "kill": [bp.analyse(kill())]}
    settings = {"reps": 1, **bp.DEFAULTS, "warmup": True}
    result = bp.summarise(samples, settings)
    result["environment"] = {"date": "2026-11-30 12:00 UTC", "cores": 2, "cpu": "AMD EPYC", "python": "3.11.7"}
    result["load"] = {"start": 1.0, "min": 1.0, "max": 2.0, "end": 2.0}
    return result


def test_goals_are_judged_on_the_cooperative_runs() -> None:
    goals = result_line()["goals"]
    assert goals["gpus_free_le_save_plus_5s"] == {"value": 0.6, "limit": 5.1, "ok": True, "ok_every_rep": True}
    assert goals["preemptor_first_step_le_save_plus_15s"]["limit"] == 15.1
    assert goals["steps_lost_le_1"] == {"value": 0, "limit": 1, "ok": True, "ok_every_rep": True}


def test_render_prints_the_readme_rows_of_a_saved_line(tmp_path: Path) -> None:
    saved = tmp_path / "preemption.json"
    saved.write_text("a table on stderr, then\n" + json.dumps(result_line()) + "\n")
    done = bench("--render", str(saved))
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0] == "| median of 1 | cooperative (checkpoint at the notice) | SIGTERM and kill (baseline) | goal |"
    assert "| notice → GPUs free (released to the Scheduler) | 0.60 s | 0.60 s | ≤ save + 5 s (5.10 s) |" in rows
    assert "| delivered → checkpoint saved: the save | 0.10 s | – (no save) |  |" in rows
    assert "| steps lost per preemption (checkpoint every 20 steps) | 0 | 1 | ≤ 1 |" in rows
    assert "The ranks of 1 and 1 of 1 preemptors and of 0 and 0 of 1 resumed victims" in done.stdout
    assert "Goals met in every rep: gpus_free_le_save_plus_5s, preemptor_first_step_le_save_plus_15s" in done.stdout
    assert "`python tests/perf/bench_preemption.py --reps 1`" in rows[-1]
    assert "1-minute load average 1.0–2.0" in rows[-1]


def test_the_note_says_so_when_every_new_gang_had_standby_ranks() -> None:
    result = result_line()
    for mode in bp.MODES:
        result[mode]["from_standby"] = {"preemptor": 1, "resumed": 1, "of": 1}
    note = bp.markdown(result)[-3]
    assert "The ranks of every preemptor and every resumed victim were the node agent's standby processes" in note
    assert "kill 1 (mean 1; half a checkpoint interval is 10)" in note


def test_render_of_another_benchmarks_result_names_it(tmp_path: Path) -> None:
    saved = tmp_path / "x.json"
    saved.write_text(json.dumps({"benchmark": "launch"}) + "\n")
    done = bench("--render", str(saved))
    assert done.returncode == 1
    assert "not a result of bench_preemption.py" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--reps", "0"), "--reps must be at least 1, got 0"),
        (("--checkpoint-every", "0"), "--checkpoint-every must be at least 1, got 0"),
        (("--preemptor-steps", "-1"), "--preemptor-steps must be at least 1, got -1"),
        (("--step-seconds", "nan"), "--step-seconds must be a finite number >= 0, got nan"),
        (("--grace", "0.5"), "--grace must be at least 1 s"),
        (("--steps", "50"), "--steps must be at least --preempt-from + --checkpoint-every + 20 (120)"),
        (("--preempt-from", "0"), "--preempt-from must be at least 1, got 0"),
        (("--step", "5"), "unrecognized arguments: --step"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(args: tuple[str, ...], message: str) -> None:
    done = bench(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


# -- end to end ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_small_run_prints_one_json_line_with_both_modes() -> None:
    small = ["--reps", "1", "--checkpoint-every", "5", "--preempt-from", "5", "--steps", "30", "--no-warmup"]
    done = bench(*small, "--preemptor-steps", "1", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout[-2000:]
    result = json.loads(lines[0])
    assert result["benchmark"] == "preemption" and result["settings"]["reps"] == 1
    for mode in bp.MODES:
        (sample,) = result["samples"][mode]
        assert sample["preemptions"] == 1 and sample["restarts"] == 0, sample
        assert sample["optimizer_steps"] == sample["steps"] == 30, sample  # no step applied twice
        assert 0 < sample["notice_delivered_s"] <= sample["gpus_free_s"] < sample["preemptor_first_step_s"]
        assert sample["capacity_back_s"] < sample["notice_to_resume_s"]
        (attempt,) = sample["failed_attempts"]
        assert attempt["kind"] == "preempted", attempt
    assert result["samples"]["cooperative"][0]["saved_step"] == result["samples"]["cooperative"][0]["reached_step"]
    assert result["samples"]["kill"][0]["saved_step"] is None
    assert {"date", "cores", "cpu", "python"} <= result["environment"].keys()
