"""engine.checkpoint and engine.report inside a rank (driven through the environment a rank gets)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

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
