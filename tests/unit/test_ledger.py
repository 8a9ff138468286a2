"""The goodput ledger (engine.runtime.ledger): an attempt's allocated GPU-seconds split by cause, from its
record and what its ranks reported, the parts always adding up to the whole."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.core.protocol import BADPUT
from engine.runtime.ledger import add_ledgers, attempt_ledger, goodput_line


def attempt(kind: str, placed: float, ended: float | None, reason: str = "") -> dict[str, Any]:
    return {"attempt": 0, "kind": kind, "reason": reason, "started_at": placed, "ended_at": ended}


def node(gpus: int, started: float, **report: Any) -> dict[str, Any]:
    return {"node": "n", "gpus": gpus, "started": started, "progress": {"0": report} if report else {}}


def parts(ledger: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in ledger["badput"].items() if v}


def test_a_completed_attempt_launch_checkpoints_steps_and_the_tail() -> None:
    # placed at 100, ranks up at 102, first step at 105, 2 s of saves, last step at 150, released at 152; 2 x 2 GPUs
    nodes = [node(2, 102, since=105, time=150, first_step=1, ckpt_time=140, ckpt_s=2.0)] * 2
    ledger = attempt_ledger(attempt("completed", 100, 152), nodes)
    assert ledger is not None
    assert ledger["gpus"] == 4 and ledger["allocated_gpu_s"] == 52 * 4
    assert parts(ledger) == {"launch": 20.0, "checkpoint": 8.0, "idle": 8.0}
    assert ledger["productive_gpu_s"] == (52 - 5 - 2 - 2) * 4 and ledger["goodput"] == pytest.approx(43 / 52, abs=1e-4)


def test_pauses_between_reports_are_idle_and_those_after_the_last_checkpoint_are_lost_work() -> None:
    # ranks stepping from 105 to 150 that paused 10 s and 6 s between reports (the means: 8 s), and 3 s before
    # the checkpoint at 140: a completed attempt counts all 8 s idle, a preempted one the 3 s before its checkpoint
    reports = [dict(since=105, time=150, first_step=1, idle_s=idle, ckpt_time=140, ckpt_s=2.0) for idle in (10, 6)]
    reports[0]["ckpt_idle_s"] = 3.0  # rank 0 saves: only its report names the checkpoint's pauses
    nodes = [{"node": "n", "gpus": 1, "started": 102, "progress": {str(i): r for i, r in enumerate(reports)}}]
    done = attempt_ledger(attempt("completed", 100, 152), nodes)
    assert done is not None and parts(done) == {"launch": 5.0, "checkpoint": 2.0, "idle": 8.0 + 2.0}
    assert done["productive_gpu_s"] == 52 - 5 - 2 - 10
    preempted = attempt_ledger(attempt("preempted", 100, 152, "preempted by x of t (reclaim)"), nodes)
    assert preempted is not None
    assert parts(preempted) == {"launch": 5.0, "checkpoint": 2.0, "idle": 3.0, "lost_preemption": 12.0}
    no_checkpoint = [{**n, "progress": {"0": {"since": 105, "time": 150, "first_step": 1, "idle_s": 9}}} for n in nodes]
    failed = attempt_ledger(attempt("system", 100, 152, "node n lost"), no_checkpoint)
    assert failed is not None and parts(failed) == {"launch": 5.0, "lost_failure": 47.0}  # every pause lost too


def test_a_preempted_attempt_resumed_from_a_checkpoint_loses_the_work_since_its_last_one() -> None:
    nodes = [node(1, 102, since=110, time=149, first_step=41, ckpt_time=140, ckpt_s=1.0)]
    ledger = attempt_ledger(attempt("preempted", 100, 150, "preempted by b.train-1 of team-b (reclaim)"), nodes)
    assert ledger is not None
    assert parts(ledger) == {"launch": 2.0, "restore": 8.0, "checkpoint": 1.0, "lost_preemption": 10.0}


def test_a_drain_and_a_failure_are_their_own_causes() -> None:
    nodes = [node(1, 100, since=101, time=120, first_step=1)]  # no checkpoint: every step is lost
    drained = attempt_ledger(attempt("preempted", 100, 121, "node n1 is draining"), nodes)
    failed = attempt_ledger(attempt("system", 100, 121, "node n1 lost (heartbeat timeout)"), nodes)
    assert drained is not None and failed is not None
    assert parts(drained) == {"launch": 1.0, "lost_drain": 20.0}
    assert parts(failed) == {"launch": 1.0, "lost_failure": 20.0}
    assert drained["productive_gpu_s"] == failed["productive_gpu_s"] == 0


def test_a_hung_rank_is_hang_until_detected_and_lost_since_the_checkpoint_before() -> None:
    nodes = [node(1, 100, since=101, time=130, first_step=1, ckpt_time=120, ckpt_s=0.5)]
    ledger = attempt_ledger(attempt("system", 100, 160, "rank 0 (node n1) (hung): no report for 30 s"), nodes)
    assert ledger is not None
    assert parts(ledger) == {"launch": 1.0, "checkpoint": 0.5, "hang": 30.0, "lost_failure": 10.0}


def test_an_attempt_with_no_step_and_a_running_one() -> None:
    never = attempt_ledger(attempt("system", 100, 130, "node n1 lost"), [node(2, 101)])
    assert never is not None and parts(never) == {"lost_failure": 60.0} and never["goodput"] == 0
    silent = attempt_ledger(attempt("completed", 100, 130), [node(2, 101)])  # ranks that never call report
    assert silent is not None and parts(silent) == {"idle": 60.0} and silent["reported"] is False
    assert goodput_line(silent).startswith("goodput unknown: the ranks reported no step")
    assert attempt_ledger(attempt("running", 100, None), [node(2, 101, since=102, time=110)]) is None
    assert attempt_ledger({"kind": "completed"}, []) is None  # times unknown (an agent from before them)


def test_the_parts_always_add_up_to_the_allocated_gpu_seconds() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        placed = rng.uniform(0, 100)
        end = placed + rng.uniform(0, 500)
        times = sorted(rng.uniform(placed - 10, end + 10) for _ in range(4))
        report = {"since": times[1], "time": times[3], "first_step": rng.choice([0, 1, 50])}
        if rng.random() < 0.7:  # pauses between reports: any size, even more than the attempt lasted
            report["idle_s"] = rng.uniform(0, 600)
        if rng.random() < 0.7:
            report.update(ckpt_time=times[2], ckpt_s=rng.uniform(0, 50))
            if "idle_s" in report:
                report["ckpt_idle_s"] = rng.uniform(0, report["idle_s"])
        kind = rng.choice(["completed", "cancelled", "preempted", "user", "system"])
        reason = rng.choice(["", "node n1 is draining", "rank 0 (node n1) (hung): no report", "preempted by x"])
        ledger = attempt_ledger(attempt(kind, placed, end, reason), [node(rng.randint(0, 8), times[0], **report)])
        assert ledger is not None
        whole = ledger["allocated_gpu_s"]
        assert all(v >= 0 for v in ledger["badput"].values()) and ledger["productive_gpu_s"] >= 0
        assert ledger["productive_gpu_s"] + sum(ledger["badput"].values()) == pytest.approx(whole, abs=0.01)


def test_attempts_add_up_and_the_line_names_the_biggest_causes_first() -> None:
    first = attempt_ledger(
        attempt("system", 0, 10, "node n1 lost"), [node(1, 0, since=1, time=10, first_step=1, ckpt_time=8)]
    )
    second = attempt_ledger(attempt("completed", 10, 100), [node(1, 10, since=13, time=99, first_step=8)])
    total = add_ledgers([first, None, second])
    assert total is not None and total["allocated_gpu_s"] == 100
    assert total["badput"]["lost_failure"] == 2 and total["badput"]["launch"] == 1
    assert sum(total["badput"].values()) + total["productive_gpu_s"] == pytest.approx(100)
    assert goodput_line(total) == "goodput 93 %: 3 % restore, 2 % lost to failures, 1 % launch, 1 % idle"
    assert add_ledgers([None]) is None
    assert set(BADPUT) == set(total["badput"])


def test_usage_rows_by_tenant_run_priority_class_and_cause() -> None:
    from engine.cli.usage import usage_rows

    def ledger(alloc: float, productive: float, **badput: float) -> dict[str, Any]:
        full = dict.fromkeys(BADPUT, 0.0) | badput
        return {
            "gpus": 1,
            "allocated_s": alloc,
            "allocated_gpu_s": alloc,
            "productive_gpu_s": productive,
            "badput": full,
            "goodput": productive / alloc,
        }

    entries = [
        {"tenant": "a", "run": "r1", "priority": "high", "ledger": ledger(100, 90, launch=10), "wait_s": 5},
        {"tenant": "a", "run": "r2", "priority": "low", "ledger": ledger(50, 25, lost_preemption=25), "wait_s": 1},
        {"tenant": "b", "run": "r3", "priority": "high", "ledger": None, "wait_s": 2},  # a gang that never started
    ]
    by_tenant = usage_rows(entries, "tenant")
    assert [(r["tenant"], r["allocated_gpu_s"], r["wait_s"]) for r in by_tenant] == [("a", 150, 6), ("b", 0, 2)]
    assert by_tenant[0]["badput"]["lost_preemption"] == 25
    assert by_tenant[0]["goodput"] == pytest.approx(115 / 150, abs=1e-4)
    assert [r["run"] for r in usage_rows(entries, "run")] == ["r1", "r2", "r3"]
    causes = {r["cause"]: r["gpu_s"] for r in usage_rows(entries, "cause")}
    assert causes["productive"] == 115 and causes["launch"] == 10 and sum(causes.values()) == 150
    by_class = usage_rows(entries, "priority")
    assert [(r["priority"], r["tenants"], r["allocated_gpu_s"], r["wait_s"]) for r in by_class] == [
        ("high", ["a", "b"], 100, 7),
        ("low", ["a"], 50, 0 + 1),
    ]
    assert by_class[1]["badput"]["lost_preemption"] == 25 and by_class[0]["goodput"] == pytest.approx(0.9)


def test_usage_rows_by_flavor_count_each_attempt_under_the_flavor_it_was_admitted_on() -> None:
    """A call requeued after a preemption may run its next attempt on another flavor of its list: each attempt
    counts under its own; an attempt without a flavor (a queue file naming none) under ``None``."""
    from engine.cli.usage import usage_rows

    def ledger(alloc: float, flavor: str | None = None, **badput: float) -> dict[str, Any]:
        full = dict.fromkeys(BADPUT, 0.0) | badput
        productive = alloc - sum(full.values())
        row = {"gpus": 2, "allocated_s": alloc / 2, "allocated_gpu_s": alloc, "productive_gpu_s": productive}
        return row | {"badput": full, "goodput": productive / alloc} | ({"flavor": flavor} if flavor else {})

    entries = [
        {"tenant": "a", "attempts": [ledger(40, "h100", lost_preemption=10), ledger(60, "a100", restore=6)]},
        {"tenant": "b", "attempts": [ledger(30, "h100", launch=3)]},
        {"tenant": "c", "attempts": [ledger(5)]},
    ]
    rows = usage_rows(entries, "flavor")
    assert [(r["flavor"], r["tenants"], r["allocated_gpu_s"]) for r in rows] == [
        ("h100", ["a", "b"], 70),
        ("a100", ["a"], 60),
        (None, ["c"], 5),
    ]
    assert rows[0]["badput"]["lost_preemption"] == 10 and rows[0]["goodput"] == pytest.approx(57 / 70, abs=1e-4)
    assert rows[1]["badput"]["restore"] == 6 and "wait_s" not in rows[0]


@pytest.mark.parametrize("text, seconds", [("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("1.5h", 5400)])
def test_since_reads_durations(text: str, seconds: float) -> None:
    from engine.cli.usage import parse_since

    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "0d", "-1h", "1y", "abc"])
def test_a_bad_since_is_refused_naming_it(text: str) -> None:
    from engine.cli.usage import parse_since

    with pytest.raises(ValueError, match="--since must be a positive duration such as 7d, 12h or 30m, got"):
        parse_since(text)


def test_gangflow_usage_refuses_a_bad_since_with_exit_2() -> None:
    from conftest import gangflow_cli

    done = gangflow_cli("usage", "--since", "soon", "--address", "127.0.0.1:1")
    assert done.returncode == 2 and "--since must be a positive duration" in done.stderr, done.stderr


def _plot_entries() -> list[dict[str, Any]]:
    """Two tenants' task calls: team-a held 2 GPUs for an hour (a preemption threw 10 GPU-minutes away) and
    then 4 for half an hour; team-b 1 GPU for two hours, 5 % of it launching."""
    t0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC

    def ledger(alloc: float, gpus: int, **badput: float) -> dict[str, Any]:
        full = dict.fromkeys(BADPUT, 0.0) | badput
        productive = alloc - sum(full.values())
        return {
            "gpus": gpus,
            "allocated_s": alloc / gpus,
            "allocated_gpu_s": alloc,
            "productive_gpu_s": productive,
            "badput": full,
            "goodput": productive / alloc,
        }

    return [
        {
            "tenant": "team-a",
            "run": "r1",
            "ledger": add_ledgers([ledger(7200, 2, lost_preemption=1200), ledger(7200, 4, launch=60)]),
            "wait_s": 30,
            "spans": [(t0, t0 + 3600, 2), (t0 + 3700, t0 + 5500, 4)],
        },
        {
            "tenant": "team-b",
            "run": "r2",
            "ledger": ledger(7200, 1, launch=360),
            "wait_s": 0,
            "spans": [(t0 + 600, t0 + 7800, 1)],
        },
    ]


def test_gpu_use_by_tenant_over_time_is_a_step_function_of_the_attempts() -> None:
    from engine.cli.usage_plot import gpu_steps

    times, held = gpu_steps(_plot_entries())
    t0 = times[0]
    assert [t - t0 for t in times] == [0, 600, 3600, 3700, 5500, 7800]
    assert held == {"team-a": [2, 2, 0, 4, 0, 0], "team-b": [0, 1, 1, 1, 1, 0]}
    assert gpu_steps([]) == ([], {})


def test_usage_plot_draws_gpu_use_and_badput_from_the_ledger_into_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plots extra is not installed (pip install 'gangflow[plots]')")
    from engine.cli.usage_plot import plot_usage

    out = plot_usage(_plot_entries(), tmp_path / "usage.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # two drawn panels, not an empty canvas
    empty = plot_usage([], tmp_path / "empty.png")  # nothing finished yet: still a picture that says so
    assert empty.read_bytes()[:4] == b"\x89PNG"


def test_usage_plot_without_matplotlib_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import asyncio
    import sys

    from engine.cli.common import EXIT_BAD_INPUT, CliError
    from engine.cli.usage import cmd_usage

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    args = argparse.Namespace(since="7d", limit=10, plot="usage.png", tenant=None, by="tenant", json=False, csv=False)
    with pytest.raises(CliError) as refused:
        asyncio.run(cmd_usage(args))  # refused before it connects anywhere
    assert "pip install 'gangflow[plots]'" in str(refused.value) and refused.value.code == EXIT_BAD_INPUT


def test_usage_by_node_splits_each_attempt_over_its_nodes_by_their_gpus() -> None:
    from engine.cli.usage import usage_rows

    # team-a's attempt: 3 GPUs on n1 and 1 on n2, 100 s, 10 s of launch; team-b's: 2 GPUs on n2 alone, 50 s
    a = attempt_ledger(
        attempt("completed", 0, 100),
        [
            {"node": "n1", "gpus": 3, "started": 5, "progress": {"0": {"since": 10, "time": 100, "first_step": 1}}},
            {"node": "n2", "gpus": 1, "started": 5, "progress": {"0": {"since": 10, "time": 100, "first_step": 1}}},
        ],
    )
    b = attempt_ledger(
        attempt("completed", 0, 50),
        [{"node": "n2", "gpus": 2, "started": 0, "progress": {"0": {"since": 0, "time": 50, "first_step": 1}}}],
    )
    assert a is not None and b is not None and a["nodes"] == {"n1": 3, "n2": 1}
    entries = [
        {"tenant": "team-a", "run": "r1", "ledger": a, "attempts": [a], "wait_s": 3},
        {"tenant": "team-b", "run": "r2", "ledger": b, "attempts": [b], "wait_s": 0},
        {"tenant": "team-b", "run": "r3", "ledger": None, "attempts": [], "wait_s": 9},  # never placed
    ]
    rows = {r["node"]: r for r in usage_rows(entries, "node")}
    assert rows["n1"]["allocated_gpu_s"] == 300 and rows["n1"]["badput"]["launch"] == 30
    assert rows["n1"]["tenants"] == ["team-a"] and rows["n2"]["tenants"] == ["team-a", "team-b"]
    assert rows["n2"]["allocated_gpu_s"] == 100 + 100 and rows["n2"]["badput"]["launch"] == 10
    whole = sum(r["allocated_gpu_s"] for r in rows.values())
    assert whole == a["allocated_gpu_s"] + b["allocated_gpu_s"]  # the nodes' shares add up to the attempts
    assert [r["node"] for r in usage_rows(entries, "node")] == ["n1", "n2"]  # ties: by name
