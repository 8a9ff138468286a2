"""`gangflow run` through the real CLI on the test server: workflow parameters named like prefixes of
gangflow's options (``--n``, ``--a``) or like the options themselves (``--json``) reach the workflow."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import gangflow_cli

FLOW = """
from engine import task, workflow


@task
def repeat(n: int, a: str) -> str:
    return a * n


@workflow
async def short(n: int, a: str, json: int = 0) -> str:
    return f"{await repeat(n=n, a=a)}|json={json}"
"""


@pytest.fixture
def gangflow(server, worker, artifacts, tmp_path):
    (tmp_path / "flow.py").write_text(FLOW)
    env = dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts, COLUMNS="100")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return gangflow_cli(*args, env=env, cwd=tmp_path)

    return cli


def test_short_and_clashing_parameter_names_reach_the_workflow(gangflow):
    done = gangflow("run", "flow.py:short", "--n", "3", "--a", "ab", "--json", "--", "--json", "7")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)  # gangflow's own --json: one JSON object
    assert out["status"] == "COMPLETED" and out["result"] == "ababab|json=7"

    done = gangflow("run", "flow.py:short", "--a=x", "--n=2", "--input-json", '{"json": 5}', "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "xx|json=5"


def test_a_clashing_parameter_taken_by_gangflow_is_refused_before_anything_starts(gangflow):
    done = gangflow("run", "flow.py:short", "--n", "1", "--a", "x", "--json", "7", "--run-id", "clash-e2e-1")
    assert done.returncode == 2
    err = " ".join(done.stderr.split())  # rich folds long lines
    assert "--json is both gangflow run's own option and a parameter of workflow 'short'" in err
    assert "gangflow run flow.py:short -- --json VALUE" in err and "--input-json" in err
    assert "Traceback" not in done.stderr
    unknown = gangflow("status", "clash-e2e-1")
    assert unknown.returncode == 1  # nothing was started
