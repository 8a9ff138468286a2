"""A run executes the code it was started with, also in a multi-file project edited between runs.

A user's project (a workflow file, a sibling module, a package, a config and a data file) is run with
``gangflow run`` on the long-lived session worker and node agents, edited, and run again: each run sees
its own version everywhere (workflow body, plain task, rank process, ``script=``), and a replay of the
first run in a process that already loaded the second version still uses the first.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import make_client, run
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from engine.artifacts.loader import BUNDLE_PREFIX, LOADER
from engine.core.wire import Envelope
from workflows.gang import GangTask
from workflows.scheduler import Scheduler
from workflows.shell import UserWorkflow, configure

FLOW = '''\
"""A user's workflow file: its siblings are imported by absolute name, as in any script."""

import json
import sys
from pathlib import Path
from typing import Any

import helpers
import lib.sub

from engine import Resources, task, workflow
from plugins.pytorch import PyTorch

HERE = Path(__file__).parent  # the bundle's folder, wherever the worker or node agent extracted it


def inspect(where: str) -> dict[str, Any]:
    return {
        "where": where,
        "helpers": helpers.VERSION,
        "lib": lib.sub.describe(),
        "config": json.loads((HERE / "config.json").read_text())["version"],
        "rows": (HERE / "data" / "rows.txt").read_text().split(),
        "ignored_file_present": (HERE / "secret.txt").exists(),
        "plain_modules": sorted(n for n in ("flow", "helpers", "lib", "lib.sub", "lib.consts") if n in sys.modules),
        "bundle_folders_on_sys_path": [p for p in sys.path if str(HERE) in p],
    }


@task
def first_branch(label: str) -> dict[str, Any]:
    return inspect(f"task {label}")


@task
def second_branch(label: str) -> dict[str, Any]:
    return inspect(f"task {label}")


@workflow
async def edited(label: str = "run") -> dict[str, Any]:
    # The body branches on the sibling module, so replaying with another version of it schedules a
    # different task and fails.
    if helpers.VERSION == "v1":
        out = await first_branch(label=label)
    else:
        out = await second_branch(label=label)
    return {"workflow": helpers.VERSION, "workflow_lib": lib.sub.describe(), "task": out}


@task(plugin=PyTorch(nnodes=1, nproc_per_node=1, timeout=120), resources=Resources(gpu=1))
def on_rank() -> dict[str, Any]:
    import torch.distributed as dist

    return {"rank": dist.get_rank(), **inspect("rank")}


@task(plugin=PyTorch(nnodes=1, nproc_per_node=1, script="show_config.py", args=("hello",)), resources=Resources(gpu=1))
def scripted() -> None:
    """Runs show_config.py on the rank (the body is not used)."""


@workflow
async def on_node(label: str = "run") -> dict[str, Any]:
    out = await on_rank()
    await scripted()
    return out
'''

SCRIPT = """\
import json
import sys
from pathlib import Path

import helpers  # a sibling of the script in the bundle

config = json.loads((Path(__file__).parent / "config.json").read_text())
rows = open("data/rows.txt").read().split()  # a script runs in the bundle's folder
print(f"script {sys.argv[1]}: helpers {helpers.VERSION}, config {config['version']}, rows {rows}", flush=True)
"""


def write_version(project: Path, version: str) -> None:
    """The files an edit changes: a sibling module, a module of a package, a config and a data file."""
    (project / "helpers.py").write_text(f"VERSION = {version!r}\n")
    (project / "lib" / "consts.py").write_text(f"LIB_VERSION = 'lib-{version}'\n")
    (project / "config.json").write_text(json.dumps({"version": version}))
    (project / "data" / "rows.txt").write_text(
        " ".join(f"{version}-row{i}" for i in range(2 if version == "v1" else 3))
    )
    time.sleep(0.01)  # a new mtime whatever the filesystem's timestamp granularity


def make_project(folder: Path) -> Path:
    (folder / "lib").mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "flow.py").write_text(FLOW)
    (folder / "show_config.py").write_text(SCRIPT)
    (folder / "lib" / "__init__.py").write_text("")
    (folder / "lib" / "sub.py").write_text(
        "import helpers\n\nfrom .consts import LIB_VERSION\n\n\n"
        "def describe() -> str:\n    return f'{LIB_VERSION}/{helpers.VERSION}'\n"
    )
    (folder / "secret.txt").write_text("never shipped")
    (folder / ".gangflowignore").write_text("# files the runs do not need\nsecret.txt\n")
    write_version(folder, "v1")
    return folder


def gangflow_run(project: Path, target: str, server: Any, artifacts: str, label: str) -> dict[str, Any]:
    """``gangflow run`` as a user types it, in the project's folder."""
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", target, "--label", label, "--json"],
        capture_output=True,
        text=True,
        cwd=project,
        env=dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["status"] == "COMPLETED", out
    return out


def expected(version: str, where: str, leave_out: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    rows = 2 if version == "v1" else 3
    found = {
        "where": where,
        "helpers": version,
        "lib": f"lib-{version}/{version}",
        "config": version,
        "rows": [f"{version}-row{i}" for i in range(rows)],
        "ignored_file_present": False,
        "plain_modules": [],  # nothing cached under its plain name for the next run to pick up
        "bundle_folders_on_sys_path": [],
    }
    return {k: v for k, v in found.items() if k not in leave_out}


def test_an_edited_sibling_module_is_used_by_the_next_run_on_the_same_worker(server, worker, artifacts, tmp_path):
    project = make_project(tmp_path / "project")
    first = gangflow_run(project, "flow.py:edited", server, artifacts, "one")
    write_version(project, "v2")
    second = gangflow_run(project, "flow.py:edited", server, artifacts, "two")
    assert first["result"] == {"workflow": "v1", "workflow_lib": "lib-v1/v1", "task": expected("v1", "task one")}
    assert second["result"] == {"workflow": "v2", "workflow_lib": "lib-v2/v2", "task": expected("v2", "task two")}
    assert worker.proc is not None and worker.proc.poll() is None  # one worker process served both runs

    async def histories() -> tuple[WorkflowHistory, WorkflowHistory]:
        client = await make_client(server, artifacts)
        handles = [client.temporal.get_workflow_handle(out["run_id"]) for out in (first, second)]
        return await handles[0].fetch_history(), await handles[1].fetch_history()

    history, later = run(histories())
    envelope, later_envelope = envelope_of(history), envelope_of(later)
    assert envelope.code.bundle_sha != later_envelope.code.bundle_sha

    # This process loads v2 first, then replays the v1 run: the replay must use v1 throughout.
    LOADER.load(later_envelope.code)
    configure(LOADER)
    replayer = Replayer(workflows=[UserWorkflow, GangTask, Scheduler])
    run(replayer.replay_workflow(history))
    v1 = BUNDLE_PREFIX + str(envelope.code.bundle_sha)[:16]
    assert sys.modules[f"{v1}.helpers"].VERSION == "v1" and sys.modules[f"{v1}.lib.sub"].describe() == "lib-v1/v1"

    # The same history pinned to the v2 code diverges: the check above can tell the versions apart.
    wrong = copy.deepcopy(list(history.events))
    started = wrong[0].workflow_execution_started_event_attributes
    started.input.payloads[0].data = Envelope(later_envelope.code, envelope.inputs, envelope.run).encode("test")
    with pytest.raises(
        NondeterminismError, match=r"scheduled event 'first_branch-1#1' does not match .*'second_branch"
    ):
        run(replayer.replay_workflow(WorkflowHistory(history.workflow_id, wrong)))


def test_the_same_code_run_into_two_stores_on_one_worker(server, worker, artifacts, tmp_path):
    """Two teams (or two roots) uploading identical code get the same bundle sha; the worker, which loaded it
    first for one store, must name each run's own copy in its task calls (a task refuses a reference outside
    its run's store)."""
    project = make_project(tmp_path / "project")
    first = gangflow_run(project, "flow.py:edited", server, str(tmp_path / "store-a"), "one")
    second = gangflow_run(project, "flow.py:edited", server, str(tmp_path / "store-b"), "two")
    assert first["result"]["task"] == expected("v1", "task one")
    assert second["result"]["task"] == expected("v1", "task two")


def envelope_of(history: WorkflowHistory) -> Envelope:
    started = history.events[0].workflow_execution_started_event_attributes
    return Envelope.decode(started.input.payloads[0].data)


def test_an_edited_sibling_module_is_used_by_the_next_run_on_a_node_agent(server, worker, cluster, artifacts, tmp_path):
    project = make_project(tmp_path / "project")
    first = gangflow_run(project, "flow.py:on_node", server, artifacts, "one")
    write_version(project, "v2")
    second = gangflow_run(project, "flow.py:on_node", server, artifacts, "two")
    # A rank process is started in the bundle's folder, which ``python -m`` puts on its sys.path; it lives
    # for one run only, so only the bundle's own imports matter there (plain_modules).
    for out in (first, second):
        out["result"].pop("bundle_folders_on_sys_path")
    rank_only = {"bundle_folders_on_sys_path"}
    assert first["result"] == {"rank": 0, **expected("v1", "rank", leave_out=rank_only)}
    assert second["result"] == {"rank": 0, **expected("v2", "rank", leave_out=rank_only)}
    assert all(node.proc.poll() is None for node in cluster)  # the same node agents ran both

    async def script_logs() -> list[str]:
        client = await make_client(server, artifacts)
        found = []
        for out in (first, second):
            logs = await client.logs(out["run_id"], "scripted", rank=0)
            found.append(" ".join(text for _, text in logs))
        return found

    one, two = run(script_logs())
    assert "script hello: helpers v1, config v1, rows ['v1-row0', 'v1-row1']" in one
    assert "script hello: helpers v2, config v2, rows ['v2-row0', 'v2-row1', 'v2-row2']" in two
