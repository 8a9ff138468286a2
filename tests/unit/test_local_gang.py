"""A distributed task runs under engine.run_local as a single process (world size 1)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

import gangs  # noqa: E402

from engine import run_local  # noqa: E402


def test_ddp_task_runs_as_one_process():
    result = run_local(gangs.ddp, steps=2)
    assert result["identical"] is True
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in result["envs"]] == [("0", "1", "0")]
