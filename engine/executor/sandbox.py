"""Confining a gang's processes on a node: their own user, their own cgroup, their own GPUs, their own files.

A node agent that runs as root (as slurmd or the kubelet do) puts every process of a gang attempt in a cgroup of
its own, ``gangflow/<node>/<gang attempt>/p<i>`` under each controller (cgroup v1) or under the unified
hierarchy (v2), and runs it as the gang's own unprivileged user:

- **memory**: each rank's leaf cgroup is limited to its share of the task's ``Resources(mem=...)`` (per node
  for a distributed task: ``mem / nproc_per_node`` each; the gang's cgroup to the sum), so a rank over its
  request is killed by *its own* cgroup, never by the node's OOM killer choosing some other tenant's process.
  The leaf's ``oom_kill`` counter (v1 ``memory.oom_control``, v2 ``memory.events``) tells that kill from any
  other SIGKILL: the attempt then fails as a user error naming the limit.
- **CPU**: a CFS quota (v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``) and a share (``cpu.shares`` / ``cpu.weight``)
  from the gang's CPUs on the node. The levels above weigh what they hold (:func:`weigh_node`, as the kubelet
  weighs ``kubepods``): ``gangflow/<node>`` the CPUs the agent offers, ``gangflow`` the sum of its nodes'.
  With the default share (one process's) there, every rank on the machine together would get one busy
  process's share of the CPU against the processes outside gangflow: on a loaded machine a restarted gang's
  ranks then start many times slower than the same ranks unsandboxed.
- **pids**: ``pids.max`` per gang (a fork bomb stops there).
- **devices**: the gang's GPUs only. Every GPU device node of the node that is not the gang's is denied
  (v1 ``devices.deny``; the rest, ``nvidiactl`` and ``nvidia-uvm`` among them, stays allowed, as Slurm's
  ConstrainDevices does). cgroup v2 has no devices files: access is an eBPF program attached to the cgroup
  (``BPF_PROG_TYPE_CGROUP_DEVICE``). :class:`DeviceRules` is the rule set that program enforces, with the same
  decision function (``allows``) the unit tests check; the v2 driver records it as ``pending_devices`` and does
  *not* attach it (no BPF loader here). On v2 (and as a second layer on v1) the rank's private ``/dev`` (see
  **mounts**) is what keeps it off other GPUs: their nodes do not exist there and its user cannot make one.
- **user**: one per *gang* (``gang_user``): a numeric uid/gid from a reserved range (1,600,000,000 +
  2**24), derived from a hash of the tenant and the gang id, named ``gf-<12 hex digits>`` (Linux names are
  at most 32 characters, tenant names up to 60). Per gang rather than per tenant because ``/proc/<pid>/environ``
  and a rank's files are protected by the uid alone: two gangs of one tenant then cannot read each other's
  rendezvous, secrets or checkpoints either, and one compromised gang reaches only itself. The uid is stable
  across attempts and nodes (the same hash), so a restarted gang still owns its checkpoints on a shared
  filesystem. No passwd entry is created: no ``useradd`` racing between agents, nothing to clean up, and
  PyTorch (gloo, NCCL, inductor's cache through ``getpass.getuser``), JAX, XGBoost and MPICH need none once
  ``USER``, ``LOGNAME`` and ``HOME`` are set, which :meth:`GangSandbox.environment` does.
- **files**: a private ``TMPDIR`` and ``HOME`` (``<workdir>/tmp``, ``<workdir>/home``, 0700, the gang's user),
  the attempt's working folder, checkpoint folder and secret files owned by the gang's user with 0700 / 0600.
  In its mount namespace ``/tmp`` itself is that ``<workdir>/tmp`` too (without one, ``/tmp`` stays the node's,
  shared and sticky, and ``TMPDIR`` is what Python, torch and MPI honour).
- **mounts**: a mount namespace of its own (engine.executor.namespace, where the node supports one): the folders
  it must reach but others may not pass are covered and only its own paths bound back (its interpreter, code,
  the cache of its run's store read-only; its working and checkpoint folders writable), its own ``/tmp`` and a
  private ``/dev`` with only its own GPUs' nodes. Its working directory is its code's folder (relative reads of
  its bundled files work; writing there fails with "Read-only file system": it writes to ``TMPDIR``, ``HOME``,
  its checkpoint folder or its outputs). Its outputs go to ``<workdir>/outbox``, published by the agent.

The process joins its cgroups and drops to its user between fork and exec (:meth:`GangSandbox.preexec`), or, for a
warm standby that already runs, when it becomes the rank (:func:`enter`). An agent not running as root, or on a
machine without a usable memory controller, keeps today's behaviour (:func:`detect` returns None) and logs once
that its ranks are not sandboxed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.artifacts.store import OUTBOX_ENV, cache_dir
from engine.core.protocol import hashed_user
from engine.executor.namespace import MountPlan, isolate, plan_mounts, scaffold

__all__ = [
    "CGROUPS_ONLY",
    "CGROUP_ROOT_ENV",
    "GPU_DEVICES_ENV",
    "PIDS_PER_PROCESS",
    "SANDBOX_ENV",
    "UID_BASE",
    "UID_SPAN",
    "CgroupDriver",
    "CgroupV1",
    "CgroupV2",
    "DeviceRule",
    "DeviceRules",
    "GangSandbox",
    "Limits",
    "SandboxUser",
    "detect",
    "device_rules",
    "enter",
    "gang_user",
    "gpu_devices",
    "memory_text",
    "unreachable",
    "weigh_node",
]

log = logging.getLogger("gangflow.sandbox")

#: "0" turns the sandbox off on a root agent (an operator's choice, and the baseline of the sandbox's cost);
#: "cgroups" keeps the cgroups but leaves the ranks root, in the node's namespace (ranks that must write where a
#: gang's user cannot: the test suite's marker files); anything else: the whole sandbox
SANDBOX_ENV = "GANGFLOW_SANDBOX"
CGROUPS_ONLY = "cgroups"
#: where cgroups are mounted (tests point it at a fake root); default /sys/fs/cgroup
CGROUP_ROOT_ENV = "GANGFLOW_CGROUP_ROOT"
#: comma-separated device nodes standing for GPU slots 0, 1, ... (default: /dev/nvidia<N> that exist)
GPU_DEVICES_ENV = "GANGFLOW_GPU_DEVICES"
#: the gang's pids limit is this many per process it starts (threads count: torch, gloo and data loaders
#: start dozens each), so a rank forking thousands of processes is stopped and a normal one never is
PIDS_PER_PROCESS = 1024
#: the reserved uid/gid range of gangs' users: above any distribution's (and systemd's dynamic users, which end
#: at 65519), below the 2**31 that some tools take as negative
UID_BASE = 1_600_000_000
UID_SPAN = 1 << 24
#: the first folder of our cgroups under each hierarchy
PREFIX = "gangflow"
_CFS_PERIOD_US = 100_000
#: the largest cgroup v1 cpu.shares
_MAX_SHARES = 262_144
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


def _libc_prctl() -> Callable[..., int] | None:
    with contextlib.suppress(OSError, AttributeError):
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        return prctl
    return None


_prctl = _libc_prctl()  # looked up in the parent: never dlopen in a forked child


def memory_text(value: int) -> str:
    """Bytes as a person writes a request: ``2Gi``, ``512Mi``, ``1.5Gi``, ``1000`` (what ``Resources(mem=)``
    accepts back)."""
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= size:
            return f"{value / size:.4g}{unit}"
    return str(value)


# -- users ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SandboxUser:
    """A gang's unprivileged user: a name (for ``USER`` / ``LOGNAME``; no passwd entry) and its uid = gid."""

    name: str
    uid: int

    @property
    def gid(self) -> int:
        return self.uid


def gang_user(tenant: str, gang_id: str) -> SandboxUser:
    """The user a gang's ranks run as: the same on every node and in every attempt (see the module docstring)."""
    return SandboxUser(*hashed_user(f"{tenant}\0{gang_id}", UID_BASE, UID_SPAN, uid_bytes=0))


# -- devices ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceRule:
    """One device rule: ``kind`` ``c`` (character) or ``b`` (block), major and minor (None: any), access
    ``rwm``, and whether it allows or denies."""

    kind: str
    major: int | None
    minor: int | None
    access: str = "rwm"
    allow: bool = True

    def line(self) -> str:
        """As v1 ``devices.allow`` / ``devices.deny`` take it: ``c 195:1 rwm``."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.kind} {major}:{minor} {self.access}"

    def matches(self, kind: str, major: int, minor: int, access: str) -> bool:
        return (
            self.kind == kind
            and self.major in (None, major)
            and self.minor in (None, minor)
            and set(access) <= set(self.access)
        )


@dataclass(frozen=True)
class DeviceRules:
    """The devices a gang may open: everything except the listed denials (the node's other GPUs), in the order
    an eBPF device program checks them (first match decides; no match allows)."""

    rules: tuple[DeviceRule, ...]

    def allows(self, kind: str, major: int, minor: int, access: str = "rw") -> bool:
        """What the program attached on cgroup v2 (and the v1 devices controller) answers for one open."""
        for rule in self.rules:
            if rule.matches(kind, major, minor, access):
                return rule.allow
        return True

    @property
    def denied(self) -> tuple[DeviceRule, ...]:
        return tuple(r for r in self.rules if not r.allow)


def gpu_devices(gpus: int, env: Mapping[str, str] | None = None) -> list[str]:
    """The device node of each GPU slot ``0..gpus-1``: ``$GANGFLOW_GPU_DEVICES`` (comma-separated, for nodes
    whose numbering differs, and for tests standing in other character devices), else ``/dev/nvidia<N>``."""
    given = (os.environ if env is None else env).get(GPU_DEVICES_ENV, "")
    if given.strip():
        return [p.strip() for p in given.split(",") if p.strip()][:gpus]
    return [f"/dev/nvidia{i}" for i in range(gpus)]


def _device_number(path: str) -> tuple[str, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(info.st_mode):
        kind = "c"
    elif stat.S_ISBLK(info.st_mode):
        kind = "b"
    else:
        return None
    return kind, os.major(info.st_rdev), os.minor(info.st_rdev)


def device_rules(devices: Sequence[str], own: Iterable[int]) -> DeviceRules:
    """Deny every GPU device node in ``devices`` (slot order) that is not in ``own``; allow the gang's own
    (listed first, so that a GPU exposed twice under one number stays the gang's). Absent nodes are skipped."""
    mine = set(own)
    allowed: list[DeviceRule] = []
    denied: list[DeviceRule] = []
    for slot, path in enumerate(devices):
        number = _device_number(path)
        if number is None:
            continue
        rule = DeviceRule(number[0], number[1], number[2], "rwm", slot in mine)
        (allowed if rule.allow else denied).append(rule)
    return DeviceRules(tuple(allowed + denied))


# -- cgroups ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What one cgroup is limited to: bytes of memory, CPUs (quota and share), process count, device rules."""

    mem: int | None = None
    cpus: float | None = None
    pids: int | None = None
    devices: DeviceRules | None = None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


class CgroupDriver:
    """One interface over cgroup v1 and v2: create a cgroup (``name`` is a relative path such as
    ``gangflow/node-0/gang.a1.n0/p0``) with limits, the files a process writes its pid to to join it, its
    memory kill count, its processes, and removal."""

    version = 0

    def __init__(self, root: Path) -> None:
        self.root = root

    def dirs(self, name: str) -> list[Path]:
        raise NotImplementedError

    def create(self, name: str, limits: Limits) -> None:
        raise NotImplementedError

    def oom_kills(self, name: str) -> int:
        raise NotImplementedError

    def weigh(self, name: str, cpus: float) -> None:
        """Give cgroup ``name`` (created if missing) the CPU share of ``cpus`` busy processes among its siblings;
        no quota."""
        raise NotImplementedError

    def weighed(self, name: str) -> float:
        """The CPUs cgroup ``name``'s share stands for (1.0: the default, or no CPU controller)."""
        raise NotImplementedError

    def procs_files(self, name: str) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs(name)]

    def pids(self, name: str) -> set[int]:
        """The processes in ``name`` and below it."""
        found: set[int] = set()
        for top in self.dirs(name):
            if not top.is_dir():
                continue
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(x) for x in procs.read_text().split())
        return found

    def remove(self, name: str, timeout: float = 5.0) -> bool:
        """Kill what is left in ``name`` and remove it with its children, in every hierarchy. True when gone."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids(name):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            left = False
            for top in self.dirs(name):
                if not top.is_dir():
                    continue
                # deepest first: a cgroup with children cannot be removed
                for sub in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        sub.rmdir()
                try:
                    top.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left = True
            if not left or time.monotonic() >= deadline:
                return not left
            time.sleep(0.05)  # killed processes take a moment to leave their cgroup

    def children(self, name: str) -> list[str]:
        """The names of the cgroups directly below ``name`` (in the first hierarchy)."""
        top = self.dirs(name)[0]
        return sorted(f"{name}/{p.name}" for p in top.iterdir() if p.is_dir()) if top.is_dir() else []


class CgroupV1(CgroupDriver):
    """cgroup v1: one hierarchy per controller, ``<root>/<controller>/<name>``."""

    version = 1
    controllers = ("memory", "cpu", "pids", "devices")

    def present(self) -> list[str]:
        return [c for c in self.controllers if (self.root / c / "cgroup.procs").exists()]

    def dirs(self, name: str) -> list[Path]:
        return [self.root / c / name for c in self.present()]

    def create(self, name: str, limits: Limits) -> None:
        for controller in self.present():
            path = self.root / controller / name
            path.mkdir(parents=True, exist_ok=True)
            if controller == "memory" and limits.mem is not None:
                _write(path / "memory.limit_in_bytes", str(limits.mem))
                if (path / "memory.memsw.limit_in_bytes").exists():  # swap is no way around the limit
                    _write(path / "memory.memsw.limit_in_bytes", str(limits.mem))
            elif controller == "cpu" and limits.cpus is not None:
                _write(path / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
                _write(path / "cpu.cfs_quota_us", str(max(1000, round(limits.cpus * _CFS_PERIOD_US))))
                _write(path / "cpu.shares", str(max(2, round(limits.cpus * 1024))))
            elif controller == "pids" and limits.pids is not None:
                _write(path / "pids.max", str(limits.pids))
            elif controller == "devices" and limits.devices is not None:
                for rule in limits.devices.denied:
                    _write(path / "devices.deny", rule.line())

    def weigh(self, name: str, cpus: float) -> None:
        self.create(name, Limits())  # in every hierarchy: children() lists the first
        if "cpu" in self.present():
            _write(self.root / "cpu" / name / "cpu.shares", str(min(_MAX_SHARES, max(2, round(cpus * 1024)))))

    def weighed(self, name: str) -> float:
        try:
            return int((self.root / "cpu" / name / "cpu.shares").read_text()) / 1024
        except (OSError, ValueError):
            return 1.0

    def oom_kills(self, name: str) -> int:
        try:
            text = (self.root / "memory" / name / "memory.oom_control").read_text()
        except OSError:
            return 0
        match = re.search(r"^oom_kill (\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else 0


class CgroupV2(CgroupDriver):
    """cgroup v2: one unified hierarchy, ``<root>/<name>``; each parent enables its controllers for its children
    (``cgroup.subtree_control``). Device rules become an eBPF program to attach (see the module docstring):
    recorded in ``pending_devices``, not attached."""

    version = 2
    controllers = ("memory", "cpu", "pids")

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.pending_devices: dict[str, DeviceRules] = {}

    def dirs(self, name: str) -> list[Path]:
        return [self.root / name]

    def create(self, name: str, limits: Limits) -> None:
        path = self.root / name
        parent = self.root
        for part in Path(name).parts:  # each level hands the controllers down to the next
            with contextlib.suppress(OSError):
                _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in self.controllers))
            parent = parent / part
            parent.mkdir(exist_ok=True)
        if limits.mem is not None:
            _write(path / "memory.max", str(limits.mem))
            _write(path / "memory.swap.max", "0")
        if limits.cpus is not None:
            _write(path / "cpu.max", f"{max(1000, round(limits.cpus * _CFS_PERIOD_US))} {_CFS_PERIOD_US}")
            _write(path / "cpu.weight", str(min(10_000, max(1, round(limits.cpus * 100)))))
        if limits.pids is not None:
            _write(path / "pids.max", str(limits.pids))
        if limits.devices is not None and limits.devices.denied:
            self.pending_devices[name] = limits.devices

    def weigh(self, name: str, cpus: float) -> None:
        self.create(name, Limits())  # the controllers handed down to it
        _write(self.root / name / "cpu.weight", str(min(10_000, max(1, round(cpus * 100)))))

    def weighed(self, name: str) -> float:
        try:
            return int((self.root / name / "cpu.weight").read_text()) / 100
        except (OSError, ValueError):
            return 1.0

    def oom_kills(self, name: str) -> int:
        try:
            text = (self.root / name / "memory.events").read_text()
        except OSError:
            return 0
        match = re.search(r"^oom_kill (\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else 0


def detect(root: str | Path | None = None) -> CgroupDriver | None:
    """The cgroup driver of this machine, or None where ranks cannot be sandboxed: not root, or no memory
    controller (v1 ``<root>/memory``, or a v2 hierarchy at ``<root>`` whose ``cgroup.controllers`` has memory), or
    ``GANGFLOW_SANDBOX=0``."""
    if os.geteuid() != 0 or os.environ.get(SANDBOX_ENV) == "0":
        return None
    base = Path(root or os.environ.get(CGROUP_ROOT_ENV) or "/sys/fs/cgroup")
    if (base / "memory" / "memory.limit_in_bytes").exists():
        return CgroupV1(base)
    with contextlib.suppress(OSError):
        if "memory" in (base / "cgroup.controllers").read_text().split():
            return CgroupV2(base)
    return None


def weigh_node(driver: CgroupDriver, node_group: str, cpus: float) -> None:
    """Weigh a node agent's cgroup (``gangflow/<node>``) as the ``cpus`` it offers and the machine's gangflow
    cgroup above it as the sum of its node cgroups (the other agents of this machine included: each one adds
    itself when it starts; a stopped agent's stays counted, which only matters while its ranks would run). A
    gang's share is its CPUs (:meth:`GangSandbox.create`): its ranks then weigh against the processes outside
    gangflow about as they would unsandboxed, and each gang's quota still caps it at what it asked for."""
    driver.weigh(node_group, cpus)
    parent = str(Path(node_group).parent)
    driver.weigh(parent, sum(driver.weighed(child) for child in driver.children(parent)))


# -- paths ------------------------------------------------------------------------------------------
def unreachable(paths: Iterable[str | Path]) -> str | None:
    """The first folder on the way to one of ``paths`` that another user cannot pass (no ``o+x``), or None:
    a gang's user must reach its working folder, its code and the Python it runs."""
    for path in paths:
        here = Path(path).resolve()
        for folder in [*reversed(here.parents), here] if here.is_dir() else reversed(here.parents):
            with contextlib.suppress(OSError):
                if not folder.stat().st_mode & stat.S_IXOTH:
                    return str(folder)
    return None


def _own(path: Path, user: SandboxUser, mode: int) -> None:
    os.chown(path, user.uid, user.gid, follow_symlinks=False)
    os.chmod(path, mode)


def _own_tree(top: Path, user: SandboxUser) -> None:
    """``top`` and what is in it owned by ``user``: folders 0700, files 0600 (0700 when executable)."""
    _own(top, user, 0o700)
    for folder, subdirs, files in os.walk(top):
        for sub in subdirs:
            _own(Path(folder, sub), user, 0o700)
        for item in files:
            path = Path(folder, item)
            if path.is_symlink():
                continue
            executable = path.stat().st_mode & stat.S_IXUSR
            _own(path, user, 0o700 if executable else 0o600)


# -- one gang attempt ---------------------------------------------------------------------------------
@dataclass
class GangSandbox:
    """The sandbox of one gang attempt on this node: its cgroup ``name`` (a child ``p<i>`` per process), its
    ``user`` (None: the processes stay root, in their cgroups; see ``NodeActivities``), each rank's memory
    request, the CPUs of the gang on this node, how many ranks it runs here and the device rules of its GPUs.

    The gang's cgroup holds the memory of its ranks plus one rank's worth for a coordinator or launcher (MPI's
    ranks are a launcher's children, in its cgroup: this is their limit), and ``PIDS_PER_PROCESS`` for each
    rank and two helpers."""

    driver: CgroupDriver
    name: str
    user: SandboxUser | None
    mem_per_rank: int | None
    cpus: float
    ranks: int
    devices: DeviceRules
    checkpoint_dir: str | None = None
    secret_dirs: tuple[str, ...] = ()
    created: set[int] = field(default_factory=set)
    #: a mount namespace per process (engine.executor.namespace): None, none (the node cannot make one);
    #: else the paths its processes read, and the device nodes (its own GPUs') its private /dev holds
    reads: tuple[str, ...] | None = None
    gpu_nodes: tuple[str, ...] = ()
    hides: tuple[str, ...] = ()
    mounts: MountPlan | None = None

    def setup(self, workdir: Path) -> None:
        """Before the first process starts: the gang's cgroup, its files made its user's own, its mounts."""
        self.create()
        self.own_files(workdir)
        if self.reads is not None:
            writes: list[str] = [str(workdir)]
            if self.checkpoint_dir and "://" not in self.checkpoint_dir and Path(self.checkpoint_dir).is_dir():
                writes.append(self.checkpoint_dir)
            # its own GPUs' nodes where they are not in /dev (a node's odd layout): bound back like its folders
            writes += [d for d in self.gpu_nodes if not d.startswith("/dev/")]
            # /tmp is the attempt's <workdir>/tmp (its TMPDIR too) for a gang running as its own user: on disk with
            # its working folder and shared by the gang's processes on this node, as Slurm's job_container/tmpfs
            # does; not a tmpfs, which would take its size out of each rank's memory request (namespace.py)
            tmp = workdir / "tmp" if self.user is not None else None
            self.mounts = plan_mounts([*self.reads, *self.secret_dirs], writes, self.gpu_nodes, self.hides, tmp)
            scaffold(self.mounts)  # before any process of the gang exists

    def create(self) -> None:
        """The gang's cgroup: CPU quota, pids limit, device rules and the sum of its ranks' memory."""
        total = None if self.mem_per_rank is None else self.mem_per_rank * (self.ranks + 1)
        limits = Limits(total, self.cpus, PIDS_PER_PROCESS * (self.ranks + 2), self.devices)
        self.driver.create(self.name, limits)

    def leaf(self, index: int) -> str:
        return f"{self.name}/p{index}"

    def prepare(self, index: int, rank: bool) -> list[str]:
        """Create process ``index``'s own cgroup (a rank's limited to its memory request); the files its pid
        goes to."""
        self.driver.create(self.leaf(index), Limits(self.mem_per_rank if rank else None))
        self.created.add(index)
        return [str(p) for p in self.driver.procs_files(self.leaf(index))]

    def oom_killed(self, index: int) -> bool:
        return index in self.created and self.driver.oom_kills(self.leaf(index)) > 0

    def gang_oom_killed(self) -> bool:
        return self.driver.oom_kills(self.name) > 0

    def environment(self, workdir: Path) -> dict[str, str]:
        """What a process of the gang gets on top of its environment: private TMPDIR and HOME, and who it is."""
        if self.user is None:
            return {}
        home, tmp = workdir / "home", workdir / "tmp"
        env = {"HOME": str(home), "TMPDIR": str(tmp), "USER": self.user.name, "LOGNAME": self.user.name}
        # the cache stays the agent's (read-only, what it delivered): under the new HOME a rank would look for
        # its bundle in an empty cache of its own and then in the store, which its namespace does not show
        env["GANGFLOW_CACHE"] = str(cache_dir())
        return {**env, OUTBOX_ENV: str(workdir / "outbox")}  # the store is not its user's to write

    def own_files(self, workdir: Path) -> None:
        """Make the attempt's folders the gang user's own (0700 / 0600): its working folder (with TMPDIR and
        HOME), its checkpoint folder and its secret files."""
        if self.user is None:
            return
        for sub in ("home", "tmp", "outbox"):
            (workdir / sub).mkdir(exist_ok=True)
        _own_tree(workdir, self.user)
        checkpoint_dir = self.checkpoint_dir
        if checkpoint_dir and "://" not in checkpoint_dir and Path(checkpoint_dir).is_dir():
            _own_tree(Path(checkpoint_dir), self.user)
        for folder in self.secret_dirs:
            _own_tree(Path(folder), self.user)

    def remove(self) -> bool:
        return self.driver.remove(self.name)


def enter(
    procs_files: Sequence[str], user: SandboxUser | None, parent_death: int | None, mounts: MountPlan | None = None
) -> None:
    """This process joins the cgroups (writes its pid to each ``cgroup.procs``), takes its own mount namespace
    (``mounts``: engine.executor.namespace) and becomes ``user`` (no groups, no new privileges), then sets
    ``parent_death`` (a change of uid clears it); in a forked child before exec, or in a warm standby becoming a
    rank. Only os calls and libc through ctypes: no imports, no locks."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
    if mounts is not None:
        isolate(mounts)
    if user is not None:
        os.setgroups([])
        os.setresgid(user.gid, user.gid, user.gid)
        os.setresuid(user.uid, user.uid, user.uid)
        if _prctl is not None:
            _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if parent_death is not None and _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, parent_death)
