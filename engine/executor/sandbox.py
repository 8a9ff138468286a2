"""Confining a gang's processes on a node: their own user, their own cgroup, their own GPUs, their own files.

A node agent that runs as root (as slurmd or the kubelet do) puts every process of a gang attempt in a cgroup of
its own, ``gangflow/<node>/<gang attempt>/p<i>`` under each controller (cgroup v1) or under the unified
hierarchy (v2; the files each version is written: engine.executor.cgroups), and runs it as the gang's own
unprivileged user:

- **memory**: each rank's leaf cgroup is limited to its share of the task's ``Resources(mem=...)`` (per node
  for a distributed task: ``mem / nproc_per_node`` each; the gang's cgroup to the sum), so a rank over its
  request is killed by *its own* cgroup, never by the node's OOM killer choosing some other tenant's process.
  The leaf's ``oom_kill`` counter tells that kill from any other SIGKILL: the attempt then fails as a user
  error naming the limit.
- **CPU**: a CFS quota and a share from the gang's CPUs on the node. The levels above weigh what they hold
  (``engine.executor.cgroups.weigh_node``, as the kubelet weighs ``kubepods``): ``gangflow/<node>`` the CPUs
  the agent offers, ``gangflow`` the sum of its nodes' (at most the machine's cores). With the default share
  (one process's) there, every rank on the machine together would get one busy process's share of the CPU
  against the processes outside gangflow: on a loaded machine a restarted gang's ranks then start many times
  slower than the same ranks unsandboxed.
- **pids**: ``pids.max`` per gang (a fork bomb stops there).
- **devices**: the gang's GPUs only. Every GPU device node of the node that is not the gang's is denied (v1's
  devices controller; on v2 the same :class:`DeviceRules` is recorded for an eBPF program, not attached: see
  engine.executor.cgroups). On v2 (and as a second layer on v1) the rank's private ``/dev`` (see **mounts**) is
  what keeps it off other GPUs: their nodes do not exist there and its user cannot make one.
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
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.artifacts.store import OUTBOX_ENV, cache_dir
from engine.core.protocol import hashed_user

# the cgroup v1 / v2 files and device rules live in engine.executor.cgroups (import them from there)
from engine.executor.cgroups import CGROUP_ROOT_ENV, CgroupDriver, CgroupV1, CgroupV2, DeviceRules, Limits
from engine.executor.namespace import MountPlan, isolate, plan_mounts, scaffold

__all__ = [
    "CGROUPS_ONLY",
    "PIDS_PER_PROCESS",
    "SANDBOX_ENV",
    "UID_BASE",
    "UID_SPAN",
    "GangSandbox",
    "SandboxUser",
    "detect",
    "enter",
    "gang_user",
    "memory_text",
    "unreachable",
]

log = logging.getLogger("gangflow.sandbox")

#: "0" turns the sandbox off on a root agent (an operator's choice, and the baseline of the sandbox's cost);
#: "cgroups" keeps the cgroups but leaves the ranks root, in the node's namespace (ranks that must write where a
#: gang's user cannot: the test suite's marker files); anything else: the whole sandbox
SANDBOX_ENV = "GANGFLOW_SANDBOX"
CGROUPS_ONLY = "cgroups"
#: the gang's pids limit is this many per process it starts (threads count: torch, gloo and data loaders
#: start dozens each), so a rank forking thousands of processes is stopped and a normal one never is
PIDS_PER_PROCESS = 1024
#: the reserved uid/gid range of gangs' users: above any distribution's (and systemd's dynamic users, which end
#: at 65519), below the 2**31 that some tools take as negative
UID_BASE = 1_600_000_000
UID_SPAN = 1 << 24
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
