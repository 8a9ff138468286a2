"""``gangflow demo --tenants`` as a user runs it, from the repository root: a throwaway stack of its own (dev
server, worker, two node agents with two GPU slots each) on which team-a borrows the whole cluster, team-b
reclaims its quota, and the preempted team-a run resumes from its checkpoint; the timeline says so.

Also what it refuses before anything starts (exit 2), and exit 1 saying what went wrong when the runs do not
play their part (here: an example whose training fails at once, found in the working directory first).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, gangflow_cli, gangflow_main

pytestmark = pytest.mark.slow

#: the demo itself gives up after 300 s; the stack takes a while to start and stop on a busy 2-core machine
DEMO_TIMEOUT = 480

QUEUES = (ROOT / "examples" / "queues.yaml").read_text()

# stands in for examples/multitenant.py: same workflow name, and a gang whose ranks fail at once
FAILING_EXAMPLE = """
from dataclasses import dataclass

from engine import GangPlugin, Resources, task, workflow


@dataclass(frozen=True)
class Gang(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 2


@task(plugin=Gang(), resources=Resources(gpu=2))
def train(steps: int = 200, checkpoint_every: int = 10, step_seconds: float = 0.1) -> dict:
    raise ValueError("no training data here")


@workflow
async def pipeline(steps: int = 200, checkpoint_every: int = 10, step_seconds: float = 0.1) -> dict:
    return await train(steps=steps, checkpoint_every=checkpoint_every, step_seconds=step_seconds)
"""


def demo(*args: str, cwd: Path = ROOT, timeout: float = DEMO_TIMEOUT) -> subprocess.CompletedProcess[str]:
    # wide enough that no table row folds: one event a line
    return gangflow_cli("demo", "--tenants", *args, cwd=cwd, timeout=timeout, COLUMNS="250")


def refused(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``demo`` in this process, for what it refuses before anything starts (no process start)."""
    return gangflow_main("demo", "--tenants", *args, cwd=cwd, COLUMNS="250")


def timeline(stdout: str) -> list[tuple[float, str, str, str]]:
    """The rows of the timeline table printed at the end: (seconds, tenant, run, event)."""
    table = stdout.split("timeline", 1)[1].split("usage at the end", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 4 and re.fullmatch(r"\d+\.\d", cells[0]):
            rows.append((float(cells[0]), cells[1], cells[2], cells[3]))
    return rows


def first(rows: list[tuple[float, str, str, str]], tenant: str, pattern: str) -> tuple[int, re.Match[str], str]:
    """(row index, match, run) of the first event of ``tenant`` that matches ``pattern``."""
    for index, (_, who, run, event) in enumerate(rows):
        found = re.search(pattern, event)
        if who == tenant and found:
            return index, found, run
    raise AssertionError(f"no {tenant} event matches {pattern!r} in {rows}")


@pytest.mark.timeout(DEMO_TIMEOUT + 60)
def test_the_tenants_demo_plays_a_reclaim_and_the_borrower_resumes_from_its_checkpoint() -> None:
    started = time.monotonic()
    done = demo("--headless")
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout, done.stderr)
    rows = timeline(done.stdout)
    assert [t for t, *_ in rows] == sorted(t for t, *_ in rows), rows  # in the order it happened

    notice, _, victim = first(rows, "team-a", r"^preempted \(reclaim by team-b's b1-\w+\): saving a checkpoint")
    released, saved, run = first(
        rows, "team-a", r"^released 2 GPUs [\d.]+ s after the notice, checkpoint at step (\d+)"
    )
    b_running, _, _ = first(rows, "team-b", r"^running from step 0$")
    resumed, step, resumed_run = first(rows, "team-a", r"^resumed from step (\d+)$")
    assert run == resumed_run == victim, rows
    assert notice < released < b_running < resumed, rows  # team-b trained on the GPUs team-a gave back
    assert int(step.group(1)) == int(saved.group(1)) > 0, rows  # from the checkpoint saved at the notice
    _, finished, _ = first(rows, "team-a", rf"^done: 200 steps, (\d+) after resuming at step {step.group(1)}$")
    assert int(finished.group(1)) == 200 - int(step.group(1)), rows
    first(rows, "team-b", r"^done: 80 steps$")
    # the other team-a run kept its GPUs (team-a's own quota) and finished in one go
    others = [event for _, tenant, r, event in rows if tenant == "team-a" and r != victim]
    assert "done: 200 steps" in others and not any("preempted" in e for e in others), rows

    said = " ".join(done.stdout.split())
    assert f"all three runs completed: {victim} of team-a was preempted" in said, done.stdout
    assert f"resumed from step {step.group(1)} (attempt 1)" in said, done.stdout
    assert "usage at the end (gangflow queues show)" in said and "cohort research" in said, done.stdout
    # live, one line per event as it happens, before the table
    assert re.search(rf"^\s*[\d.]+ s\s+team-a\s+{victim}\s+resumed from step", done.stdout, re.M), done.stdout
    print(f"gangflow demo --tenants took {took:.0f} s")


def test_the_tenants_demo_takes_no_file_and_starts_nothing() -> None:
    started = time.monotonic()
    done = demo("--file", "examples/ddp_pipeline.py:pipeline", timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--tenants runs its own pipelines" in done.stderr and "it takes no --file" in done.stderr, done.stderr
    assert done.stdout == "" and time.monotonic() - started < 30  # refused before any server started

    done = refused("--nodes", "3")
    assert done.returncode == 2 and "--tenants needs 2 node agents" in done.stderr, (done.stdout, done.stderr)


def test_the_tenants_demo_refuses_a_queue_file_it_cannot_play(tmp_path: Path) -> None:
    # the demo takes examples/ from the working directory first, as `gangflow demo` does
    (tmp_path / "examples").mkdir()
    queues = tmp_path / "examples" / "queues.yaml"
    queues.write_text(QUEUES.replace("quota: {gpu: 2, cpu: 8, mem: 32Gi}", "quota: {gpu: -2}", 1))
    done = demo("--headless", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert "tenants[0].quota.gpu" in done.stderr, done.stderr

    queues.write_text(QUEUES.replace("team-b", "team-c"))
    done = refused("--headless", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    said = " ".join(done.stderr.split())
    assert "the demo needs tenants team-a and team-b, it has ['team-a', 'team-c']" in said, done.stderr


@pytest.mark.timeout(DEMO_TIMEOUT)
def test_the_tenants_demo_exits_1_saying_what_went_wrong(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "multitenant.py").write_text(FAILING_EXAMPLE)
    done = demo("--headless", cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = " ".join(done.stderr.split())
    assert "the demo did not go as planned: team-a's" in said and "ended before team-b was submitted" in said, said
    assert "failed:" in said and "no training data here" in said, said
    rows = timeline(done.stdout)
    assert rows and {tenant for _, tenant, _, _ in rows} == {"team-a"}, rows  # team-b never had a reason to start
