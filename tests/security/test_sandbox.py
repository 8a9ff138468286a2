"""Attacks on a node from a rank, tried as a tenant's code would, against a sandboxing node agent (root, cgroup v1).

On a stack of its own (two node agents with two GPU slots each, whose "GPUs" are two character devices made
here, standing in for ``/dev/nvidia0`` and ``/dev/nvidia1``):
- a rank allocating 3x its memory request is killed by its own cgroup, and the run fails naming the request,
  while another gang on the node finishes and the node agent stays up;
- a rank forking 10,000 processes is stopped by its gang's pids limit;
- a rank opening the device node of a GPU it was not given is refused (its own opens);
- a rank runs as its gang's own user (not root, although this machine's Python lives under ``/root``, 0700: the
  agent gives it a mount namespace reaching its paths only), cannot read the agent's home, another gang's working
  folder, ``/etc/shadow`` or the environment of PID 1, sees no other device node, and its File output still
  reaches the run's store (published by the agent);
- every gang's cgroup is gone once the runs ended.

Without the stack, with real processes dropped to gangs' users (``enter``, as a rank's fork does): a process of
one gang cannot read another gang's ``/proc/<pid>/environ`` or checkpoint folder; and a cgroup left by a killed
node agent (with a process still in it) is removed by the next agent's start.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack, gangflow_cli, run, stack_fixture

from engine.executor.cgroups import CgroupV1, Limits, device_rules
from engine.executor.namespace import plan_mounts
from engine.executor.process import spawn
from engine.executor.sandbox import PIDS_PER_PROCESS, UID_BASE, GangSandbox, detect, enter, gang_user

CGROUP = Path("/sys/fs/cgroup")
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxing ranks needs a node agent running as root"),
    pytest.mark.skipif(
        not (CGROUP / "memory" / "memory.limit_in_bytes").exists(), reason="no cgroup v1 memory controller here"
    ),
]

#: the stand-ins for the nodes' two GPUs: character devices any user may open, made before the first launch (not
#: in /tmp, which a rank does not see: the other GPU's node must be there for the devices cgroup to refuse it)
DEVICES = Path("/var/tmp") / f"gangflow-sandbox-gpus-{os.getpid()}"
GPU_NODES = [str(DEVICES / "gpu0"), str(DEVICES / "gpu1")]

FLOW = """
from dataclasses import dataclass

from engine import File, GangPlugin, Resources, task, workflow


@dataclass(frozen=True)
class Two(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 2


@dataclass(frozen=True)
class One(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 1


@task(plugin=Two(), resources=Resources(gpu=2, mem="512Mi"))  # per node: 256Mi for each rank
def hog() -> int:
    import os, time

    if os.environ["RANK"] == "1":
        block = bytearray(3 * 256 << 20)  # 3x its request, every page touched
        return len(block)
    time.sleep(60)  # rank 0 is stopped when rank 1 fails
    return 0


@task(plugin=One(), resources=Resources(gpu=1, mem="256Mi"))
def neighbour(seconds: float) -> str:
    import time

    time.sleep(seconds)
    return "unharmed"


@task(plugin=One(), resources=Resources(mem="2Gi"))
def forker(count: int) -> str:
    import os

    started, error = 0, ""
    try:
        for _ in range(count):
            # processes as a fork bomb makes them, without copying the rank's page tables each time: pids.max
            # counts them alike (3,071 fork() + exec of the rank took 40.7 s here; the whole test now takes 6-7 s)
            os.posix_spawn("/bin/sleep", ["sleep", "120"], {})
            started += 1
    except OSError as exc:
        error = exc.strerror or str(exc)
    return f"{started}:{error}"


@task(plugin=One(), resources=Resources(gpu=1, mem="256Mi"))
def devices(paths: list[str]) -> str:
    import os

    mine = int(os.environ["CUDA_VISIBLE_DEVICES"])
    seen = []
    for slot, path in enumerate(paths):
        try:
            os.close(os.open(path, os.O_RDWR))
            seen.append(f"{slot}=ok")
        except OSError as exc:
            seen.append(f"{slot}={exc.errno}")
    return f"{mine}:{','.join(seen)}"


@task(plugin=One(), resources=Resources(mem="256Mi"))
def snoop(paths: list[str]) -> File:
    import json, os

    seen = {}
    for path in [*paths, "/proc/1/environ"]:
        try:
            with open(path, "rb") as handle:
                seen[path] = "read:" + handle.read(40).decode(errors="replace")
        except OSError as exc:
            seen[path] = f"errno:{exc.errno}"
    report = os.path.join(os.environ["TMPDIR"], "report.json")  # a File output, published by the node agent
    with open(report, "w") as handle:
        json.dump({"uid": os.getuid(), "seen": seen, "dev": sorted(os.listdir("/dev"))}, handle)
    return File(report)


@task(plugin=One(), resources=Resources(mem="256Mi"))
def scratch(marker: str) -> str:
    import json, os, time

    from engine import report

    with open(f"/tmp/{marker}", "w") as handle:  # the rank's own /tmp
        handle.write("scratch of one gang")
    try:
        open("out.txt", "w")  # its working directory: its code's folder, read-only
        cwd = "written"
    except OSError as exc:
        cwd = f"errno:{exc.errno}"
    said = {"cwd": cwd, "tmp_is_tmpdir": os.path.samefile("/tmp", os.environ["TMPDIR"])}
    print("scratch:", json.dumps(said), flush=True)
    deadline = time.monotonic() + 120
    step = 0
    while not os.path.exists("/tmp/release") and time.monotonic() < deadline:  # the test lets it go
        step += 1
        report(step=step)
        time.sleep(0.2)
    return json.dumps(said)


@task(plugin=One(), resources=Resources(mem="256Mi"))
def planter(target: str) -> str:
    import os
    from pathlib import Path

    # its working folder is its own: what the agent (root) reads there is made to point at the node's secret
    work = Path(os.environ["GANGFLOW_PROGRESS_FILE"]).parent.parent
    (work / "errors").mkdir(exist_ok=True)
    os.symlink(target, work / "errors" / f"rank{os.environ['RANK']}")
    for log in work.glob("*.log"):
        log.unlink()
        os.symlink(target, log)
    os.symlink(target, work / "progress" / "rank0.json")
    os._exit(1)  # no error report of its own: the planted one is all there is


@workflow
async def planter_run(target: str) -> str:
    return await planter(target=target)


@workflow
async def scratch_run(marker: str) -> str:
    return await scratch(marker=marker)


@task
def read_report(report: File) -> str:
    with open(report.path) as handle:
        return handle.read()


@workflow
async def snoop_run(paths: list[str]) -> str:
    return await read_report(report=await snoop(paths=paths))


@workflow
async def hog_run() -> int:
    return await hog()


@workflow
async def neighbour_run(seconds: float = 10.0) -> str:
    return await neighbour(seconds=seconds)


@workflow
async def forker_run(count: int = 10000) -> str:
    return await forker(count=count)


@workflow
async def devices_run(paths: list[str]) -> str:
    return await devices(paths=paths)
"""

#: the whole sandbox (conftest's other stacks keep ranks as root in their cgroups: their ranks write markers into
#: pytest's folders, which a gang's user cannot reach)
stack = stack_fixture(
    "sbx", count=2, gpus=2, env={"GANGFLOW_GPU_DEVICES": ",".join(GPU_NODES), "GANGFLOW_SANDBOX": "1"}
)


@pytest.fixture(scope="module", autouse=True)
def gpu_stand_ins() -> Iterator[None]:
    DEVICES.mkdir(mode=0o755, exist_ok=True)
    os.chmod(DEVICES, 0o755)
    for path, minor in zip(GPU_NODES, (229, 200), strict=True):  # the numbers of /dev/fuse and /dev/net/tun
        if not os.path.exists(path):
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(10, minor))
        os.chmod(path, 0o666)
    yield
    shutil.rmtree(DEVICES, ignore_errors=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sandbox-project")
    (folder / "flow.py").write_text(FLOW)
    return folder


def cli(stack: Stack, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return gangflow_cli(
        *args, cwd=project, GANGFLOW_ADDRESS=stack.server.address, GANGFLOW_ARTIFACTS=stack.artifacts, COLUMNS="200"
    )


def start(stack: Stack, project: Path, target: str, *args: str) -> str:
    done = cli(stack, project, "run", f"flow.py:{target}", "--detach", "--json", *args)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["run_id"])


def finished(stack: Stack, project: Path, run_id: str, timeout: float = 90) -> dict[str, Any]:
    """``gangflow status RUN --json`` once the run has ended: waited for in this process (a ``gangflow status``
    process per poll cost about 1.7 s of CPU each), then read through the CLI, as a user reads it."""

    async def ended() -> None:
        client = await stack.client()
        deadline = time.monotonic() + timeout
        while (await client.status(run_id, with_tasks=False)).status == "RUNNING":
            assert time.monotonic() < deadline, f"{run_id} still running after {timeout} s"
            await asyncio.sleep(0.5)

    run(ended())
    done = cli(stack, project, "status", run_id, "--json")
    assert done.returncode == 0, done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    assert status["status"] != "RUNNING", status
    return status


def leftover_cgroups() -> list[str]:
    nodes = [CGROUP / "memory" / "gangflow" / node for node in ("sbx0", "sbx1")]
    return [str(p) for node in nodes for p in node.glob("*") if p.is_dir()]


def test_the_nodes_say_they_sandbox(stack: Stack, project: Path) -> None:
    done = cli(stack, project, "cluster", "--json")
    assert done.returncode == 0, done.stderr
    assert {n["node_id"]: n["sandboxed"] for n in json.loads(done.stdout)["nodes"]} == {"sbx0": True, "sbx1": True}


def test_a_rank_over_its_memory_is_killed_by_its_cgroup_and_the_neighbour_is_unharmed(
    stack: Stack, project: Path
) -> None:
    neighbour = start(stack, project, "neighbour_run", "--seconds", "12")
    hog = start(stack, project, "hog_run")
    status = finished(stack, project, hog)
    assert status["status"] == "FAILED", status
    assert "rank 1" in str(status["error"]) and "exceeded its memory request of 256Mi" in str(status["error"]), status
    assert "RankKilled" not in str(status["error"])  # a user error: never retried as a system failure
    other = finished(stack, project, neighbour)
    assert (other["status"], other["result"]) == ("COMPLETED", "unharmed"), other
    assert all(node.proc.poll() is None for node in stack.nodes.values())  # no agent was taken down


def test_a_fork_bomb_is_stopped_by_the_pids_limit(stack: Stack, project: Path) -> None:
    status = finished(stack, project, start(stack, project, "forker_run", "--count", "10000"), timeout=120)
    assert status["status"] == "COMPLETED", status
    started, error = str(status["result"]).split(":", 1)
    assert int(started) < 3 * PIDS_PER_PROCESS, status  # one rank and two helpers' worth, its threads counted
    assert error == os.strerror(11), status  # EAGAIN: fork refused by pids.max


def test_a_rank_opens_its_own_gpu_and_not_another(stack: Stack, project: Path) -> None:
    paths = json.dumps(GPU_NODES)
    status = finished(stack, project, start(stack, project, "devices_run", "--paths", paths))
    assert status["status"] == "COMPLETED", status
    mine, seen = str(status["result"]).split(":")
    other = 1 - int(mine)
    assert f"{mine}=ok" in seen.split(","), status
    assert f"{other}=1" in seen.split(","), status  # EPERM from the devices cgroup, whatever the file mode says


def test_a_rank_runs_as_its_gangs_user_and_reaches_nothing_else(stack: Stack, project: Path) -> None:
    # what a rank must not read: the agent's home, another gang's (or tenant's) working folder and the node
    # agent's cache of other stores, the node's own secrets
    others = [stack.root / "nodes" / "cache" / "nodes" / node / "other-gang.a0.n0" for node in stack.nodes]
    for folder in others:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "spec.msgpack").write_text("another gang's envelope")
    targets = ["/root/.bashrc", "/root/.pyenv/version", "/etc/shadow", *(str(f / "spec.msgpack") for f in others)]
    status = finished(stack, project, start(stack, project, "snoop_run", "--paths", json.dumps(targets)))
    assert status["status"] == "COMPLETED", status
    got = json.loads(status["result"])  # it came back through a File output: the agent published it
    assert got["uid"] >= UID_BASE, got  # not root: the gang's own user
    for path in [*targets, "/proc/1/environ"]:
        assert not got["seen"][path].startswith("read"), (path, got)
    assert not any(name.startswith("nvidia") for name in got["dev"]) and "null" in got["dev"], got
    for folder in others:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_ranks_log_and_progress_show_while_it_runs_and_its_tmp_is_its_own(stack: Stack, project: Path) -> None:
    marker = f"gangflow-scratch-{os.getpid()}"
    host_note = Path("/tmp") / f"gangflow-host-note-{os.getpid()}"  # the node's /tmp, readable by all
    host_note.write_text("the node's own")
    os.chmod(host_note, 0o644)
    run_id = start(stack, project, "scratch_run", "--marker", marker)
    try:
        # its log reaches `gangflow logs` while it runs (the full sandbox once showed it only at the end: the
        # tenants demo then saw no gang start before it finished)
        deadline = time.monotonic() + 90
        while "scratch:" not in (logs := cli(stack, project, "logs", run_id, "--task", "scratch")).stdout:
            assert time.monotonic() < deadline, (logs.stdout, logs.stderr)
            time.sleep(0.5)
        said = json.loads(logs.stdout.split("scratch:", 1)[1].splitlines()[0])
        status = cli(stack, project, "status", run_id, "--json")
        assert json.loads(status.stdout)["status"] == "RUNNING", status.stdout
        assert "step" in cli(stack, project, "status", run_id).stdout  # and its engine.report progress
        # its /tmp is <workdir>/tmp: the file is there on the node's disk, not in the node's /tmp
        found = list((stack.root / "nodes").rglob(f"tmp/{marker}"))
        assert len(found) == 1 and found[0].read_text() == "scratch of one gang", found
        assert not (Path("/tmp") / marker).exists()
        assert said == {"cwd": "errno:30", "tmp_is_tmpdir": True}, said  # EROFS: a clear "Read-only file system"
        # another gang's rank finds neither its /tmp file nor the node's
        targets = [f"/tmp/{marker}", str(found[0]), str(host_note)]
        other = finished(stack, project, start(stack, project, "snoop_run", "--paths", json.dumps(targets)))
        assert other["status"] == "COMPLETED", other
        seen = json.loads(other["result"])["seen"]
        assert all(not seen[path].startswith("read") for path in targets), seen
        assert json.loads(cli(stack, project, "status", run_id, "--json").stdout)["status"] == "RUNNING"
        (found[0].parent / "release").touch()  # from the node: only what is in <workdir>/tmp reaches it
        done = finished(stack, project, run_id)
        assert done["status"] == "COMPLETED", done
    finally:
        host_note.unlink(missing_ok=True)


def test_symlinks_a_rank_plants_in_its_working_folder_leak_nothing_the_agent_reads(stack: Stack, project: Path) -> None:
    secret = stack.root / "node-secret.json"  # root's only, and JSON: a progress file could have shown it
    secret.write_text('{"step": 1, "token": "the-nodes-secret-token"}')
    os.chmod(secret, 0o600)
    run_id = start(stack, project, "planter_run", "--target", str(secret))
    status = finished(stack, project, run_id)
    assert status["status"] == "FAILED", status
    said = json.dumps(status) + cli(stack, project, "status", run_id).stdout
    said += cli(stack, project, "logs", run_id).stdout
    assert "the-nodes-secret-token" not in said, said


def test_no_cgroup_outlives_its_gang(stack: Stack) -> None:
    deadline = time.monotonic() + 10
    while leftover_cgroups() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftover_cgroups() == []
    logs = "".join(node.log.read_text() for node in stack.nodes.values())
    assert "ranks are NOT sandboxed" not in logs
    if "ranks run in their cgroups but as root" in logs:  # said once per reason, not per launch
        assert logs.count("ranks run in their cgroups but as root") <= 2 * len(stack.nodes), logs


# -- without the stack: real processes of two gangs, each dropped to its own user ---------------------------
def _gang(name: str, workdir: Path, checkpoint: Path | None = None) -> GangSandbox:
    driver = detect()
    assert isinstance(driver, CgroupV1)
    sandbox = GangSandbox(
        driver,
        f"gangflow/sbx-local/{name}",
        gang_user("team-a" if name == "a" else "team-b", name),
        256 << 20,
        1.0,
        1,
        device_rules([], []),
        checkpoint_dir=str(checkpoint) if checkpoint else None,
    )
    workdir.mkdir(parents=True)
    sandbox.setup(workdir)
    return sandbox


def _run_as(sandbox: GangSandbox, index: int, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    files = sandbox.prepare(index, rank=True)
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: enter(files, sandbox.user, signal.SIGKILL),
    )


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="gangflow-sandbox-"))  # not pytest's tmp_path: its parent is 0700
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_a_gang_cannot_read_another_gangs_environment_or_checkpoints(open_tmp: Path) -> None:
    checkpoint = open_tmp / "ckpt-b"
    checkpoint.mkdir()
    (checkpoint / "step-1.pt").write_text("team-b's weights")
    a = _gang("a", open_tmp / "a")
    b = _gang("b", open_tmp / "b", checkpoint)
    try:
        victim = _run_as(b, 0, ["/bin/sleep", "30"], {"MASTER_PORT": "29500", "TEAM_B_TOKEN": "secret-b"})
        time.sleep(0.2)
        assert os.stat(f"/proc/{victim.pid}").st_uid == b.user.uid  # type: ignore[union-attr]
        assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o700
        assert stat.S_IMODE((checkpoint / "step-1.pt").stat().st_mode) == 0o600
        for target in (f"/proc/{victim.pid}/environ", str(checkpoint / "step-1.pt"), str(open_tmp / "b" / "tmp")):
            attacker = _run_as(a, 0, ["/bin/cat", target], {})
            out = attacker.communicate(timeout=10)[0].decode()
            assert attacker.returncode != 0 and "Permission denied" in out, (target, out)
            assert "secret-b" not in out and "weights" not in out
        victim.kill()
        victim.wait()
    finally:
        assert a.remove() and b.remove()


def test_a_killed_agents_cgroups_are_removed_at_its_next_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.runtime.node import NodeActivities, NodeConfig

    driver = detect()
    assert driver is not None
    name = "gangflow/sbx-restart/gang.a1.n0"
    driver.create(f"{name}/p0", Limits())
    files = [str(p) for p in driver.procs_files(f"{name}/p0")]
    left = spawn(["/bin/sleep", "60"], new_session=True, parent_death=None, preexec=lambda: enter(files, None, None))
    assert driver.pids(name) == {left.pid}
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path))
    NodeActivities(NodeConfig("sbx-restart", "127.0.0.1", 0, 1.0))
    assert left.wait(10) == -signal.SIGKILL
    assert not (CGROUP / "memory" / name).exists()


def test_a_standby_starts_without_credentials_and_takes_the_gangs_sandbox(
    open_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.executor.standby import RUNNER
    from engine.runtime.node import NodeActivities, NodeConfig

    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path))
    monkeypatch.setenv("GANGFLOW_SECRETS_DIR", str(tmp_path / "all-tenants-secrets"))
    monkeypatch.setenv("GANGFLOW_API_KEY", "the-platforms-token")
    pool = NodeActivities(NodeConfig("sbx-standby", "127.0.0.1", 0, 1.0, standby=1)).standby
    assert pool is not None
    gang = _gang("s", open_tmp / "s")
    try:
        pool.fill()
        waiting = pool.ready[0]
        time.sleep(0.3)
        environ = Path(f"/proc/{waiting.pid}/environ").read_bytes()
        assert b"GANGFLOW_SECRETS_DIR" not in environ and b"the-platforms-token" not in environ
        spec = open_tmp / "spec"  # a FIFO: the rank blocks reading it, so that we can look at it
        os.mkfifo(spec, 0o666)
        os.chmod(spec, 0o666)
        files = gang.prepare(0, rank=True)
        mounts = plan_mounts([], [], [])  # a private /dev, nothing else to reach
        proc = pool.take(
            [*RUNNER, str(spec)],
            {"PATH": "/usr/bin:/bin"},
            None,
            str(open_tmp / "rank.log"),
            (files, gang.user, mounts),
        )
        assert proc is waiting
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{proc.pid}").st_uid != gang.user.uid:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the standby never dropped to the gang's user"
            time.sleep(0.05)
        assert gang.driver.pids(gang.name) == {proc.pid}  # in the gang's cgroup
        assert os.readlink(f"/proc/{proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")  # its own mounts
        proc.kill()
        proc.wait()
    finally:
        pool.close()
        assert gang.remove()
