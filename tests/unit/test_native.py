"""The compiled policy (``engine.scheduling.native``): used only while it matches the sources, deciding the same.

The loader's tests need no build. The comparison with the Python policy needs one (``make native``, a C compiler
and three minutes): CI runs the Python policy only, so it is skipped there, saying so.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.scheduling import native

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build directory named by ``GANGFLOW_NATIVE_DIR``, without a build in it yet."""
    monkeypatch.setenv("GANGFLOW_NATIVE_DIR", str(tmp_path))
    monkeypatch.delenv("GANGFLOW_NATIVE", raising=False)
    return tmp_path


def test_without_a_build_the_policy_runs_as_python(built: Path) -> None:
    path = ["src"]
    assert native.load(path) == f"not built ({built / native.STAMP} is absent: make native)"
    assert path == ["src"]


def test_a_build_of_other_sources_is_never_loaded_and_says_it_is_stale(
    built: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stamp = native._stamp()
    (built / native.STAMP).write_text(json.dumps({**stamp, "sources": "0" * 64}))  # a module edited since
    path = ["src"]
    with caplog.at_level(logging.WARNING, logger="engine.scheduling"):
        why = native.load(path)
    assert why is not None and why.startswith("stale:") and path == ["src"]
    assert "the policy runs as Python" in caplog.text
    (built / native.STAMP).write_text(json.dumps({**stamp, "python": "cpython-36"}))  # another interpreter
    assert native.load(path) is not None and path == ["src"]


def test_a_fresh_build_goes_ahead_of_the_sources_unless_turned_off(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (built / native.STAMP).write_text(json.dumps(native._stamp()))
    monkeypatch.setenv("GANGFLOW_NATIVE", "0")
    path = ["src"]
    assert native.load(path) == "turned off (GANGFLOW_NATIVE=0)" and path == ["src"]
    monkeypatch.delenv("GANGFLOW_NATIVE")
    assert native.load(path) is None
    assert path == [str(built / "engine" / "scheduling"), "src"]


def _hashes(env: dict[str, str]) -> tuple[bool, dict[str, str]]:
    """Whether the policy ran compiled, and each side's decision hash, on a small fleet trace."""
    cmd = [sys.executable, str(ROOT / "tests/perf/bench_scheduler.py"), "--gangs", "600", "--fifo-budget-s", "0"]
    cmd += ["--flavors", "h100:40,a100:60", "--racks", "10", "--checkpoint-interval", "600", "--json"]
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.splitlines()[0])
    sides = {k: v["decision_hash"] for k, v in result.items() if isinstance(v, dict) and v.get("decision_hash")}
    return result["config"]["policy_compiled"], sides


@pytest.mark.skipif(
    native.load([]) is not None,
    reason="the compiled policy is not built or stale (make native builds it; CI runs the Python policy)",
)
def test_the_compiled_policy_decides_exactly_as_the_python_one() -> None:
    compiled, decided = _hashes({})
    python, expected = _hashes({"GANGFLOW_NATIVE": "0"})
    assert compiled and not python
    assert decided == expected and len(decided) >= 2  # the policy and its topology-blind side, at least
