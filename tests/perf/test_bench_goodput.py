"""The goodput benchmark's harness, fast: what it reads from rank 0's logs and the saved rank reports, how it
judges the two claims, and its bad input. The run itself (a minute and more) is not part of the suite:
``python tests/perf/bench_goodput.py`` makes the README's figure (results/goodput.json)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import bench_goodput as bg
import pytest

HERE = Path(__file__).resolve().parent


def ledger(allocated: float, productive: float, **badput: float) -> dict[str, Any]:
    causes = dict.fromkeys(("launch", "checkpoint", "restore", "lost_failure", "lost_preemption", "idle"), 0.0)
    return {"allocated_gpu_s": allocated, "productive_gpu_s": productive, "badput": causes | badput}


def test_rank_0s_logs_give_each_attempts_start_and_last_step() -> None:
    logs = [
        ("train-1.rank0.attempt0.log", "attempt 0 starts at step 0\nstep 1\nstep 2\nstep 3\nsome warning\n"),
        ("train-1.rank0.attempt1.log", "attempt 1 starts at step 2\nstep 3\n"),
        ("train-1.rank0.attempt2.log", "attempt 2 starts at step 3\n"),  # stopped before its first step
        ("prep.activity.attempt1.log", "not a rank's log\n"),
    ]
    assert bg.logged_steps(logs) == {
        0: {"start": 0, "last": 3},
        1: {"start": 2, "last": 3},
        2: {"start": 3, "last": 3},
    }


def test_lost_steps_are_the_ledgers_and_the_logs_side_by_side() -> None:
    attempts = [
        {"attempt": 0, "last_step": 110, "ledger": ledger(60, 20, launch=30, lost_failure=10)},
        {"attempt": 1, "last_step": 212, "ledger": ledger(40, 30, lost_preemption=10)},
        {"attempt": 2, "last_step": 300, "ledger": ledger(50, 50)},  # completed: nothing lost
    ]
    report = {"step": 0, "ckpt_step": 100, "ckpt_time": 5.0}
    saved = {
        0: [{"progress": {"0": report | {"step": 110}}}, {"progress": {}}],
        1: [{"progress": {"0": report | {"step": 212, "ckpt_step": 200, "ckpt_time": 9.0}}}],
    }
    logs = {0: {"start": 0, "last": 110}, 1: {"start": 100, "last": 212}, 2: {"start": 200, "last": 300}}
    lost = bg.lost_steps(attempts, saved, logs)
    assert [(x["attempt"], x["cause"], x["ledger_lost_steps"], x["logs_repeated_steps"]) for x in lost] == [
        (0, "lost_failure", 10, 10),
        (1, "lost_preemption", 12, 12),
    ]
    row = ledger(150, 100, launch=30, lost_failure=10, lost_preemption=10)
    assert bg.claims(attempts, row, lost) == {"sum_within_1pct": True, "max_sum_error": 0.0, "lost_steps_match": True}
    off = bg.claims(attempts, ledger(150, 90), [lost[0] | {"logs_repeated_steps": 9}])
    assert off["sum_within_1pct"] is False and off["lost_steps_match"] is False
    assert bg.claims(attempts, row, [])["lost_steps_match"] is False  # no lost attempt: nothing shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--kill-at", "250"), "need 0 < --kill-at < --preempt-at < --steps"),
        (("--preempt-at", "400"), "need 0 < --kill-at < --preempt-at < --steps"),
    ],
)
def test_bad_steps_are_refused_before_anything_starts(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "bench_goodput.py"), *args],
        cwd=HERE.parents[1],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
