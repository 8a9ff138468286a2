"""`gangflow dev` as a user runs it: start, run a detached pipeline, stop the whole stack mid-run,
start it again on the same state dir, and the run completes; no process is left behind."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import ROOT, alive, gangflow_cli
from prometheus_client.parser import text_string_to_metric_families

from engine.runtime import free_port


def _children(pid: int) -> list[int]:
    """Every live descendant of pid (from /proc)."""
    found, frontier = [], [pid]
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    while frontier:
        kids = parents.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


class DevStack:
    def __init__(self, state: Path, port: int, ui_port: int) -> None:
        self.state, self.port, self.ui_port = state, port, ui_port
        self.env = dict(
            os.environ,
            GANGFLOW_ADDRESS=f"127.0.0.1:{port}",
            GANGFLOW_ARTIFACTS=str(state / "artifacts"),
            GANGFLOW_CACHE=str(state / "cache"),
            PYTHONUNBUFFERED="1",
        )
        self.proc: subprocess.Popen[str] | None = None

    def start(self, *extra: str) -> None:
        cmd = [
            sys.executable,
            "-m",
            "engine.cli",
            "dev",
            "--headless",
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--state-dir",
            str(self.state),
            *extra,
        ]
        self.log = open(self.state.parent / f"dev-{self.port}.log", "a")  # noqa: SIM115
        offset = self.log.tell()  # a restart appends: wait for this start's banner, not the last one's
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True, env=self.env, cwd=ROOT)
        deadline = time.monotonic() + 180  # with node agents the ready line waits for them: minutes when loaded
        while "gangflow run" not in Path(self.log.name).read_text()[offset:]:
            assert self.proc.poll() is None and time.monotonic() < deadline, Path(self.log.name).read_text()
            time.sleep(0.1)
        time.sleep(0.5)  # the worker starts polling right after the banner

    def stop(self) -> list[int]:
        """SIGTERM, as a service manager would; returns the descendants that were alive before."""
        assert self.proc is not None
        kids = _children(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(20) == 0
        self.log.close()
        return kids

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return gangflow_cli(*args, env=self.env, timeout=timeout)


def test_dev_stack_restart_keeps_detached_run_and_leaves_no_orphans(tmp_path):
    stack = DevStack(tmp_path / "state", free_port(), free_port())
    stack.start()
    markers = tmp_path / "markers"
    markers.mkdir()
    started = stack.cli(
        "run",
        "tests/fixtures/flows.py:steps",
        "--marker-dir",
        str(markers),
        "--count",
        "4",
        "--seconds",
        "1",
        "--detach",
        "--json",
    )
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    deadline = time.monotonic() + 30
    while not list(markers.glob("step1.*")):
        assert time.monotonic() < deadline
        time.sleep(0.1)

    before = stack.stop()  # the whole stack goes down mid-run
    assert before, "gangflow dev should have started the temporal server as a child"
    time.sleep(0.5)
    assert [pid for pid in before if alive(pid)] == []  # no orphan server or worker

    stack.start()  # same state dir: history, search attributes and artifacts are all still there
    # the run was mid-way when the stack stopped (step 1 of 4 started); the new worker may already have
    # finished it by the time the banner shows, on a quiet machine: either state proves it survived
    listed = stack.cli("list", "--json")
    assert run_id in [r["run_id"] for r in json.loads(listed.stdout)], listed.stdout + listed.stderr
    assert {r["user"] for r in json.loads(listed.stdout)} == {getpass.getuser()}, listed.stdout  # who started them
    status = stack.cli("status", run_id, "--json")
    assert json.loads(status.stdout)["status"] in ("RUNNING", "COMPLETED")
    deadline = time.monotonic() + 60
    while json.loads(stack.cli("status", run_id, "--json").stdout)["status"] == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    final = json.loads(stack.cli("status", run_id, "--json").stdout)
    assert final["status"] == "COMPLETED" and final["result"] == [0, 1, 2, 3]
    assert len(list(markers.glob("step0.*"))) == 1  # finished before the restart: not run again
    assert final["user"] == getpass.getuser()  # who started it: the client's login name, without a gateway
    human = stack.cli("status", run_id)
    assert "COMPLETED" in human.stdout and "step" in human.stdout
    assert f"started by {getpass.getuser()}" in human.stdout

    cancelled = stack.cli(
        "run", "tests/fixtures/flows.py:steps", "--marker-dir", str(markers), "--count", "9", "--detach", "--json"
    )
    other = json.loads(cancelled.stdout)["run_id"]
    assert stack.cli("cancel", other).returncode == 0
    deadline = time.monotonic() + 30
    while json.loads(stack.cli("status", other, "--json").stdout)["status"] == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert json.loads(stack.cli("status", other, "--json").stdout)["status"] == "CANCELED"
    assert stack.cli("status", "no-such-run").returncode == 1
    stack.stop()


def test_failed_run_exits_1_with_the_error(server, worker, artifacts):
    env = dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=artifacts)
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", "tests/fixtures/flows.py:failing"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1
    assert "task 'boom' failed: ValueError: bad things" in done.stderr
    # the author's own frames, under the file they wrote; the SDK's and the bundle cache's paths behind --verbose
    assert 'flows.py", line' in done.stderr and "/bundles/" not in done.stderr, done.stderr
    assert "temporalio" not in done.stderr and "--verbose shows" in done.stderr


def test_unreachable_server_is_a_clear_error():
    env = dict(os.environ, GANGFLOW_ADDRESS=f"127.0.0.1:{free_port()}")
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "list"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.returncode == 1 and "cannot reach Temporal" in done.stderr


GANG = """
import os
import time
from dataclasses import dataclass
from pathlib import Path

from engine import GangPlugin, Resources, task, workflow


@dataclass(frozen=True)
class Ranks(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 2


@task(plugin=Ranks(), resources=Resources(gpu=2))
def hold(marker_dir: str) -> int:
    Path(marker_dir, f"pid.{os.getpid()}").write_text(os.environ["RANK"])
    time.sleep(600)
    return 0


@task
def wait(marker_dir: str) -> int:
    Path(marker_dir, "plain").write_text(str(os.getpid()))
    time.sleep(600)
    return 0


@workflow
async def holding(marker_dir: str) -> int:
    return await hold(marker_dir=marker_dir)


@workflow
async def waiting(marker_dir: str) -> int:
    return await wait(marker_dir=marker_dir)
"""


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` read with prometheus_client's own parser: every sample by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_sigterm_stops_the_dev_stack_and_every_child_within_seconds(tmp_path: Path) -> None:
    """What a service manager (or ``kill``) does, not Ctrl-C to the whole terminal's process group: SIGTERM to
    ``gangflow dev`` alone, while a gang's ranks run on its node agent and a plain task on its worker. It stops
    them all at once, not one after the other (its worker's shutdown, then each node agent's: over 27 s).
    Meanwhile its ``--metrics-port`` is scraped as Prometheus would (the same stack: one fewer to start)."""
    stack = DevStack(tmp_path / "state", free_port(), free_port())
    metrics_port = free_port()
    stack.start("--nodes", "1", "--gpus-per-node", "2", "--metrics-port", str(metrics_port))
    (tmp_path / "flow.py").write_text(GANG)
    markers = tmp_path / "markers"
    markers.mkdir()
    for flow in ("holding", "waiting"):  # a gang's ranks on the node agent, a plain task on the dev worker
        started = gangflow_cli(
            "run", f"flow.py:{flow}", "--marker-dir", str(markers), "--detach", "--json", env=stack.env, cwd=tmp_path
        )
        assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 120
    while len(list(markers.glob("pid.*"))) < 2 or not (markers / "plain").exists():
        assert time.monotonic() < deadline, Path(stack.log.name).read_text()
        time.sleep(0.2)
    ranks = [int(p.name.split(".")[1]) for p in markers.glob("pid.*")]
    scraped = _scrape(metrics_port)
    assert scraped[("gangflow_scheduler_up", ())] == 1
    assert scraped[("gangflow_node_gpus", (("node", "node-0"),))] == 2
    assert scraped[("gangflow_node_allocated_gpus", (("node", "node-0"),))] == 2  # the holding gang's
    assert scraped[("gangflow_node_alive", (("node", "node-0"),))] == 1
    labels = (("cohort", ""), ("flavor", ""), ("resource", "gpu"), ("tenant", "default"))
    usage = ("gangflow_tenant_resource_usage", labels)
    assert scraped[usage] == 2 and scraped[("gangflow_admitted_active_gangs", (("tenant", "default"),))] == 1
    # the holding gang's admission, in the Scheduler's own histogram (its wait is under a minute)
    wait = ("gangflow_admission_wait_seconds_bucket", (("le", "60.0"), ("tenant", "default")))
    assert scraped[wait] >= 1 and scraped[("gangflow_admission_wait_seconds_count", (("tenant", "default"),))] >= 1
    assert any(name.startswith("temporal_") for name, _ in scraped), "the Temporal SDK's own metrics"
    assert stack.proc is not None
    before = _children(stack.proc.pid)
    assert set(ranks) <= set(before), (ranks, before)  # the ranks are the stack's own descendants
    signalled = time.monotonic()
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(60) == 0
    took = time.monotonic() - signalled
    stack.log.close()
    left = [pid for pid in before if alive(pid)]
    assert took < 10 and not left, (f"{took:.1f} s", left, Path(stack.log.name).read_text()[-3000:])
