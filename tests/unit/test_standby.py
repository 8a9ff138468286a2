"""Standby rank runners: a waiting process takes on a rank's environment, working directory and log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.executor.standby import RUNNER, WARM_ENV, StandbyPool, default_warm_modules

_PROBE = (
    "import json, os, sys; from engine.executor.standby import become_rank; argv = become_rank('json,no_such_mod'); "
    "print(json.dumps({'argv': argv, 'cwd': os.getcwd(), 'env': dict(os.environ), 'json': 'json' in sys.modules}))"
)


def test_a_standby_becomes_the_rank_it_is_handed(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE)
    log = tmp_path / "rank0.log"
    order = {"argv": ["spec.msgpack"], "env": {"RANK": "3", "PATH": "/usr/bin"}, "cwd": str(tmp_path), "log": str(log)}
    proc.communicate(json.dumps(order).encode() + b"\n", timeout=60)
    assert proc.returncode == 0
    seen = json.loads(log.read_text())
    assert seen["argv"] == ["spec.msgpack"] and seen["cwd"] == str(tmp_path)
    assert seen["env"] == {"RANK": "3", "PATH": "/usr/bin"}  # replaced whole: nothing of the agent's leaks in
    assert seen["json"] is True  # imported while it waited; a missing warm module is skipped


def test_a_standby_whose_pool_closes_exits_quietly():
    proc = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0 and out == b""


def test_the_pool_refills_hands_out_only_rank_runner_commands_and_closes():
    pool = StandbyPool(2, ["json"])
    try:
        pool.fill()
        assert len(pool.ready) == 2
        assert pool.take(["python", "train.py"], {}, None, "/dev/null") is None  # a plugin's own command
        assert len(pool.ready) == 2
        pool.ready[0].kill()
        pool.ready[0].wait()
        pool.fill()  # the dead one is replaced
        assert len(pool.ready) == 2 and all(p.poll() is None for p in pool.ready)
        procs = list(pool.ready)
    finally:
        pool.close()
    deadline = time.monotonic() + 30
    while any(p.poll() is None for p in procs):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert pool.ready == [] and RUNNER[1:] == ("-P", "-m", "engine.executor.rank")


def test_without_warm_the_agent_imports_what_gangflow_warm_names_else_torch(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    monkeypatch.delenv(WARM_ENV, raising=False)
    assert default_warm_modules() == (("torch",) if importlib.util.find_spec("torch") else ())
    monkeypatch.setenv(WARM_ENV, "")  # nothing ahead: standbys are still kept, they import only gangflow
    assert default_warm_modules() == ()
    monkeypatch.setenv(WARM_ENV, " jax, numpy ,")
    assert default_warm_modules() == ("jax", "numpy")
