"""engine.checkpoint and engine.report inside a rank (driven through the environment a rank gets)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from engine import checkpoint, report


@pytest.fixture
def rank_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GANGFLOW_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("RANK", "0")
    return tmp_path / "ckpt"


def test_save_and_load_latest_keeps_the_last_k(rank_env):
    assert checkpoint.load_latest() is None
    for step in (10, 20, 30, 40):
        checkpoint.save({"weights": [step]}, step=step, keep=2)
    assert sorted(p.name for p in rank_env.iterdir()) == ["step-000000030.ckpt", "step-000000040.ckpt"]
    assert checkpoint.load_latest() == (40, {"weights": [40]})
    assert not list(rank_env.glob(".partial-*"))  # written under a temporary name, then renamed


def test_only_rank_0_writes_unless_asked(rank_env, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert checkpoint.save({"x": 1}, step=1) is None
    assert checkpoint.save({"x": 1}, step=1, all_ranks=True) is not None


def test_torch_model_and_optimizer_round_trip(rank_env):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    checkpoint.save_torch(model, opt, step=7, optimizer_steps=7)
    fresh = torch.nn.Linear(3, 1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    step, state = checkpoint.load_torch(fresh, fresh_opt)
    assert step == 7 and state["optimizer_steps"] == 7
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["momentum_buffer"] is not None


def test_no_checkpoint_dir_outside_a_rank(monkeypatch):
    monkeypatch.delenv("GANGFLOW_CHECKPOINT_DIR", raising=False)
    with pytest.raises(RuntimeError, match="for the ranks of a distributed task"):
        checkpoint.save({}, step=1)


def test_report_writes_the_latest_step(tmp_path, monkeypatch):
    target = tmp_path / "rank0.json"
    monkeypatch.setenv("GANGFLOW_PROGRESS_FILE", str(target))
    report(step=3, loss=0.5, force=True)
    data = json.loads(target.read_text())
    assert data["step"] == 3 and data["loss"] == 0.5 and data["pid"] == os.getpid()
    monkeypatch.delenv("GANGFLOW_PROGRESS_FILE")
    report(step=4)  # outside a rank: nothing happens


@pytest.mark.parametrize("watching", [True, False])
def test_sigterm_waits_only_for_a_rank_that_checks(tmp_path, watching):
    """A rank that asks stop_requested() gets the grace period to save; any other exits at once."""
    code = (
        "import os, signal, sys, time\n"
        "from engine.checkpoint import stop_requested\n"
        f"watching = {watching}\n"
        "if watching: stop_requested()\n"
        "print('ready', flush=True)\n"
        "for _ in range(100):\n"
        "    time.sleep(0.05)\n"
        "    if watching and stop_requested():\n"
        "        print('saved', flush=True); sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    if watching:
        assert proc.returncode == 0 and "saved" in out
    else:
        assert proc.returncode == -signal.SIGTERM  # SIGTERM's default: gone at once


NOTICE = {
    "deadline": 2_000_000_000.0,
    "grace_s": 120.0,
    "reason": "node n1 is draining (maintenance)",
    "cause": "drain",
    "by": "n1",
    "by_tenant": "",
}


def test_preemption_reads_the_notice_file(tmp_path, monkeypatch):
    notice = tmp_path / "notice.json"
    monkeypatch.setenv(checkpoint.NOTICE_FILE_ENV, str(notice))
    assert checkpoint.preemption() is None  # no notice yet
    notice.write_text("{not json")  # torn or foreign: not a notice
    assert checkpoint.preemption() is None
    notice.write_text(json.dumps(NOTICE))
    got = checkpoint.preemption()
    assert got is not None and (got.cause, got.by, got.grace_s) == ("drain", "n1", 120.0)
    assert got.reason == "node n1 is draining (maintenance)" and got.seconds_left() > 0
    monkeypatch.delenv(checkpoint.NOTICE_FILE_ENV)
    assert checkpoint.preemption() is None  # not a rank


@pytest.mark.parametrize("notice_signal", ["SIGTERM", "SIGUSR1"])
def test_the_notice_signal_and_file_reach_a_rank_that_checks(tmp_path, notice_signal):
    """A rank that checks stop_requested() sees the notice whatever signal the plugin chose, and reads the
    deadline and reason with engine.preemption(); a rank that does not check stops at once."""
    notice = tmp_path / "notice.json"
    code = (
        "import sys, time\n"
        "import engine\n"
        "from engine.checkpoint import stop_requested\n"
        "stop_requested()\n"
        "print('ready', flush=True)\n"
        "for _ in range(200):\n"
        "    time.sleep(0.05)\n"
        "    if stop_requested():\n"
        "        print('saved', engine.preemption().reason, flush=True); sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, checkpoint.NOTICE_FILE_ENV: str(notice), checkpoint.NOTICE_SIGNAL_ENV: notice_signal}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    notice.write_text(json.dumps(NOTICE))  # the node agent writes the file first, then signals
    proc.send_signal(getattr(signal, notice_signal))
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "saved node n1 is draining (maintenance)" in out, out


def test_a_notice_file_alone_is_seen(tmp_path, monkeypatch):
    """Where the signal cannot reach the handler (a framework took the signal over), the file still tells."""
    notice = tmp_path / "notice.json"
    from engine.rank import checkpoint as state  # the module behind the engine.checkpoint facade

    monkeypatch.setenv(state.NOTICE_FILE_ENV, str(notice))
    monkeypatch.setattr(state, "_stop", False)
    monkeypatch.setattr(state, "_watching", True)  # no handler in the test process itself
    assert not checkpoint.stop_requested()
    notice.write_text(json.dumps(NOTICE))
    assert checkpoint.stop_requested()


def test_checkpoints_in_an_object_store_are_uploaded_whole_and_found_again(tmp_path, monkeypatch):
    """GANGFLOW_CHECKPOINT_DIR as a URI (the artifact store is s3://...): save uploads, load_latest downloads,
    from any node. fsspec's file:// stands in for the object store here: the same calls, no server."""
    store = tmp_path / "bucket" / "checkpoints" / "run-1" / "train-1"
    monkeypatch.setenv("GANGFLOW_CHECKPOINT_DIR", f"file://{store}")
    monkeypatch.setenv("RANK", "0")
    assert checkpoint.load_latest() is None and checkpoint.latest_step() is None
    for step in (10, 20, 30, 40):
        where = checkpoint.save({"weights": [step]}, step=step, keep=2)
        assert where == f"file://{store}/step-{step:09d}.ckpt"
    assert sorted(p.name for p in store.iterdir()) == ["step-000000030.ckpt", "step-000000040.ckpt"]
    assert checkpoint.load_latest() == (40, {"weights": [40]})
    with pytest.raises(RuntimeError, match="object store"):
        checkpoint.directory()  # a local folder it is not: say so rather than write into a folder named "file:"


def test_a_throttled_report_is_written_when_the_interval_ends_or_at_flush(tmp_path, monkeypatch):
    """The last report of a fast loop (usually its final step) is the one the file keeps, not the last one
    the throttle let through."""
    from engine.rank import progress

    target = tmp_path / "rank0.json"
    monkeypatch.setenv("GANGFLOW_PROGRESS_FILE", str(target))

    def step() -> int | None:
        return json.loads(target.read_text())["step"] if target.exists() else None

    for n in range(1, 51):
        report(step=n)
    deadline = time.monotonic() + 5
    while step() != 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert step() == 50  # the timer wrote the held-back report
    report(step=51)
    report(step=52, loss=0.25)
    progress.flush()  # what a runner leaving with os._exit calls
    data = json.loads(target.read_text())
    assert (data["step"], data["loss"], data["first_step"]) == (52, 0.25, 1)  # where this rank started
    progress.flush()  # nothing held back: nothing happens
    assert step() == 52
