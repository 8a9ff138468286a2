"""The Scheduler workflow load test's harness: its checks catch what they claim to, its output and bad input.

The checks are fed made-up load runs (a GPU held twice, a gang placed twice, a broken continue-as-new chain,
...), so that a real run that passes them means something. One small run end to end, as a user runs the
benchmark, is marked slow; ``tests/test_scheduler_load.py`` is the real load test of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import bench_scheduler_workflow as sw
import pytest

HERE = Path(__file__).resolve().parent


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python tests/perf/bench_scheduler_workflow.py ...`` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, str(HERE / "bench_scheduler_workflow.py"), *args],
        cwd=HERE.parents[1],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- made-up load runs ---------------------------------------------------------------------------------------
def gang(gang_id: str, *holds: tuple[str, list[int], float, float], **extra: Any) -> dict[str, Any]:
    return {
        "gang_id": gang_id,
        "submits": len(holds),
        "holds": [{"nodes": [[node, gpus]], "from": t0, "to": t1, "preempted": False} for node, gpus, t0, t1 in holds],
        "pending": 1,
        "rejected": None,
        "late": 0,
        "stale_preempts": 0,
        **extra,
    }


def scheduler_run(run_id: str, status: str, placements: dict[str, int], events: int = 100) -> sw.RunStats:
    stats = sw.RunStats(run_id=run_id, events=events, status=status)
    stats.placements = Counter(placements)
    stats.received = Counter({"submit": sum(placements.values()), "release": sum(placements.values())})
    stats.sent = Counter({"placement": sum(placements.values()), "pending": 2})
    stats.pendings = Counter({g: 1 for g in placements})
    stats.first_submit, stats.last_release = 100.0, 110.0
    stats.signal_times = [100.0, 105.0, 110.0]
    return stats


def load_run(gangs: dict[str, dict[str, Any]], runs: list[sw.RunStats], describe: Any = None) -> sw.LoadRun:
    empty = {"totals": {"running": 0, "pending": 0}, "running": [], "pending": []}
    return sw.LoadRun(gangs, runs, empty if describe is None else describe, 12.0, 2, 8, {"server": 5.0})


def good() -> tuple[dict[str, dict[str, Any]], list[sw.RunStats]]:
    gangs = {
        "a": gang("a", ("n0", [0, 1], 100.0, 101.0)),
        "b": gang("b", ("n0", [1, 2], 101.0, 102.0)),  # GPU 1 again, after a released it: fine
        "c": gang("c", ("n1", [0], 100.5, 103.0)),
    }
    runs = [
        scheduler_run("r0", sw.CONTINUED, {"a": 1, "b": 1}),
        scheduler_run("r1", "WORKFLOW_TASK_COMPLETED", {"c": 1}),
    ]
    runs[0].next_run_id = "r1"
    return gangs, runs


def test_a_clean_run_passes_every_check() -> None:
    checked = sw.checks(load_run(*good()))
    assert checked["violations"] == []
    assert all(checked[k] for k in checked if k != "violations")


def test_a_gpu_held_by_two_gangs_at_once_is_caught() -> None:
    gangs, runs = good()
    gangs["b"] = gang("b", ("n0", [1, 2], 100.5, 102.0))  # starts before a let GPU 1 go
    checked = sw.checks(load_run(gangs, runs))
    assert not checked["no_double_allocation"]
    assert checked["violations"] == ["GPUs held by two gangs at once: 1 (n0/gpu1: a and b)"]


def test_a_gang_placed_twice_for_one_submission_is_caught() -> None:
    gangs, runs = good()
    runs[1].placements["a"] += 1  # the Scheduler sent a second placement the gang never asked for
    checked = sw.checks(load_run(gangs, runs))
    assert not checked["admitted_once"]
    assert checked["violations"] == ["gangs not admitted exactly once per submission: 1 (a)"]


def test_a_placement_that_came_while_holding_one_is_caught() -> None:
    gangs, runs = good()
    gangs["c"]["late"] = 1
    assert sw.checks(load_run(gangs, runs))["violations"] == ["gangs not admitted exactly once per submission: 1 (c)"]


def test_a_placement_for_a_gang_nobody_submitted_is_caught() -> None:
    gangs, runs = good()
    runs[0].placements["ghost"] = 1
    assert sw.checks(load_run(gangs, runs))["violations"] == ["placements for unknown gangs: 1 (ghost)"]


def test_failed_and_rejected_gangs_are_named() -> None:
    gangs, runs = good()
    gangs["a"] = {"gang_id": "a", "error": "WorkflowFailureError: boom"}
    gangs["c"] = gang("c", rejected="rejected: unknown tenant 'x'")
    runs[1].placements = Counter()
    checked = sw.checks(load_run(gangs, runs))
    assert not checked["all_finished"]
    assert checked["violations"][:3] == [
        "gangs that failed or were rejected: 2 (a, c)",
        "  a: WorkflowFailureError: boom",
        "  c: rejected: unknown tenant 'x'",
    ]


def test_a_scheduler_that_still_holds_gangs_at_the_end_is_caught() -> None:
    described = {"totals": {"running": 1, "pending": 0}, "running": [{"gang_id": "c"}], "pending": []}
    checked = sw.checks(load_run(*good(), describe=described))
    assert not checked["scheduler_empty"]
    assert checked["violations"] == ["gangs the Scheduler still holds at the end: 1 (c)"]


def test_a_run_over_temporals_history_warning_is_caught() -> None:
    gangs, runs = good()
    runs[0].events = sw.HISTORY_WARN_EVENTS + 1
    checked = sw.checks(load_run(gangs, runs))
    assert not checked["history_bounded"]
    assert checked["violations"] == [
        f"Scheduler runs over 10,240 history events: 1 (run 0 ({sw.HISTORY_WARN_EVENTS + 1} events))"
    ]


@pytest.mark.parametrize(
    ("first", "last", "why"),
    [
        ("WORKFLOW_EXECUTION_FAILED", "WORKFLOW_TASK_COMPLETED", "run 0 ended WORKFLOW_EXECUTION_FAILED"),
        (sw.CONTINUED, "WORKFLOW_EXECUTION_TERMINATED", "the last run ended WORKFLOW_EXECUTION_TERMINATED"),
    ],
)
def test_a_broken_continue_as_new_chain_is_caught(first: str, last: str, why: str) -> None:
    gangs, runs = good()
    runs[0].status, runs[1].status = first, last
    checked = sw.checks(load_run(gangs, runs))
    assert not checked["chain_complete"]
    assert checked["violations"] == [f"Scheduler runs that did not continue as new: 1 ({why})"]


def test_figures_count_signals_and_admissions_in_the_window() -> None:
    figures = sw.summarize(load_run(*good()))
    assert figures["wall_s"] == 10.0  # first submit 100.0 to last release 110.0
    assert figures["admissions"] == 3 and figures["admissions_per_s"] == 0.3
    assert figures["signals"] == 6 and figures["signals_per_s"] == 0.6  # 3 per run, both runs in the window
    assert figures["runs"] == 2 and figures["max_history_events"] == 100
    assert figures["pending_per_gang"] == {"mean": 1.0, "max": 1, "received_mean": 1.0}
    # GPU-seconds held: a 2 x 1 s, b 2 x 1 s, c 1 x 2.5 s over 10 s on 2 nodes x 8 GPUs
    assert figures["gpu_utilization"] == round(6.5 / (10 * 16), 3)


@pytest.mark.parametrize(
    ("duration", "hold"), [(0.0, 0.0), (600.0, 0.0), (6000.0, 2 / 3), (60_000.0, 4 / 3), (600_000.0, 2.0), (1e9, 2.0)]
)
def test_trace_durations_become_holds_of_up_to_max_hold_s(duration: float, hold: float) -> None:
    assert sw.hold_for(duration, 2.0) == round(hold, 3)


# -- output ----------------------------------------------------------------------------------------------------
def result_line(floor: bool = True) -> dict[str, Any]:
    run = load_run(*good())
    figures = sw.summarize(run)
    return {
        "benchmark": "scheduler_workflow",
        "figures": figures,
        "checks": sw.checks(run),
        "floor": {**figures, "checks": sw.checks(run)} if floor else None,
        "config": {
            "nodes": 2,
            "gpus_per_node": 8,
            "gangs": 3,
            "tenants": 10,
            "seed": 0,
            "max_hold_s": 2.0,
            "min_runtime_s": 1.0,
            "max_events": 150,
            "floor": floor,
        },
        "environment": {"date": "2026-11-30 12:00 UTC", "cores": 2, "cpu": "AMD EPYC", "python": "3.11.7"},
        "load": {"start": 1.0, "min": 1.0, "max": 2.0, "end": 2.0},
    }


def test_render_prints_the_readme_rows_of_a_saved_line(tmp_path: Path) -> None:
    saved = tmp_path / "scheduler_workflow.json"
    saved.write_text("a table on stderr, then\n" + json.dumps(result_line(floor=False)) + "\n")
    done = bench("--render", str(saved), timeout=60)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0] == "|  | Scheduler workflow | floor: echo scheduler | goal |"
    assert "| submit of the first gang to release of the last | 10.0 s | – | ≤ 60 s |" in rows
    assert "| pending signals per gang, mean / max | 1.00 / 1 | – |  |" in rows
    assert "Checks passed: all_finished, admitted_once" in done.stdout
    caption = rows[-1]
    assert "--nodes 2 --gpus-per-node 8 --gangs 3 --seed 0 --max-events 150 --no-floor`" in caption
    assert "1-minute load average 1.0–2.0" in caption


def test_the_floor_column_leaves_out_what_an_echo_scheduler_has_not() -> None:
    rows = sw.markdown(result_line(floor=True))
    assert "| longest history of one run | 100 events | – |  |" in rows
    assert "| admissions per second | 0.3 | 0.3 |  |" in rows


def test_render_of_another_benchmarks_result_names_it(tmp_path: Path) -> None:
    saved = tmp_path / "x.json"
    saved.write_text(json.dumps({"benchmark": "scheduler"}) + "\n")
    done = bench("--render", str(saved), timeout=60)
    assert done.returncode == 1
    assert "not a result of bench_scheduler_workflow.py" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gangs", "0"), "--gangs must be at least 1, got 0"),
        (("--nodes", "-1"), "--nodes must be at least 1, got -1"),
        (("--max-events", "0"), "--max-events must be at least 1, got 0"),
        (("--max-hold-s", "nan"), "--max-hold-s must be a finite number >= 0, got nan"),
        (("--min-runtime-s", "-1"), "--min-runtime-s must be a finite number >= 0, got -1.0"),
        (("--json", "--markdown"), "not allowed with argument"),
        (("--gang", "5"), "unrecognized arguments: --gang"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(args: tuple[str, ...], message: str) -> None:
    done = bench(*args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


# -- end to end ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_small_run_prints_one_json_line_with_both_columns() -> None:
    done = bench("--nodes", "3", "--gangs", "30", "--tenants", "2", "--seed", "3", "--max-hold-s", "0.5", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout[-2000:]
    result = json.loads(lines[0])
    assert result["checks"]["violations"] == [], result["checks"]
    assert result["floor"]["checks"]["all_finished"] and result["floor"]["checks"]["admitted_once"]
    figures = result["figures"]
    assert figures["gangs"] == 30 and figures["admissions"] >= 30
    assert figures["signals_received"]["submit"] == figures["signals_received"]["release"] >= 30
    assert figures["runs"] == 1 and figures["wall_s"] > 0 and figures["signals_per_s"] > 0
    assert {"server", "scheduler_worker", "gangs_and_client"} <= figures["cpu_s"].keys()
    assert result["floor"]["signals_sent"] == {"placement": 30}
    assert {"date", "cores", "cpu", "python"} <= result["environment"].keys()
