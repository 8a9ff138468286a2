"""The cgroups of a gang's processes, v1 and v2: the files a node agent writes to limit them, and the GPU device
rules it enforces there (engine.executor.sandbox puts a gang in them).

One :class:`CgroupDriver` interface over both versions: :class:`CgroupV1` (a hierarchy per controller,
``<root>/<controller>/<name>``, as this machine mounts it) and :class:`CgroupV2` (the unified hierarchy most
current GPU nodes mount, ``<root>/<name>``, each level handing its controllers down through
``cgroup.subtree_control``). Both write, from a :class:`Limits`:

- **memory**: v1 ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted: swap
  is no way around the limit), v2 ``memory.max`` with ``memory.swap.max`` 0; the ``oom_kill`` counter (v1
  ``memory.oom_control``, v2 ``memory.events``) tells a kill by the limit from any other SIGKILL;
- **CPU**: a CFS quota (v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``) and a share (``cpu.shares`` / ``cpu.weight``);
  :func:`weigh_node` weighs the levels above the gangs (why: engine.executor.sandbox);
- **pids**: ``pids.max``;
- **devices**: v1 ``devices.deny`` for every GPU device node that is not the gang's (the rest, ``nvidiactl`` and
  ``nvidia-uvm`` among them, stays allowed, as Slurm's ConstrainDevices does). cgroup v2 has no devices files:
  access is an eBPF program attached to the cgroup (``BPF_PROG_TYPE_CGROUP_DEVICE``). :class:`DeviceRules` is
  the rule set that program enforces, with the same decision function (``allows``) the unit tests check; the
  v2 driver records it as ``pending_devices`` and does *not* attach it (no BPF loader here): on v2 the rank's
  private ``/dev`` (engine.executor.namespace) is what keeps it off other GPUs.

Kept apart from engine.executor.sandbox (users, files, mounts, entering a sandbox) because these are the only
paths that differ between the two versions: the unit tests check them against fake cgroup roots.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CGROUP_ROOT_ENV",
    "GPU_DEVICES_ENV",
    "CgroupDriver",
    "CgroupV1",
    "CgroupV2",
    "DeviceRule",
    "DeviceRules",
    "Limits",
    "device_rules",
    "gpu_devices",
    "weigh_node",
]

#: where cgroups are mounted (tests point it at a fake root); default /sys/fs/cgroup
CGROUP_ROOT_ENV = "GANGFLOW_CGROUP_ROOT"
#: comma-separated device nodes standing for GPU slots 0, 1, ... (default: /dev/nvidia<N> that exist)
GPU_DEVICES_ENV = "GANGFLOW_GPU_DEVICES"
_CFS_PERIOD_US = 100_000
#: the largest cgroup v1 cpu.shares
_MAX_SHARES = 262_144


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


def weigh_node(driver: CgroupDriver, node_group: str, cpus: float, machine_cpus: float | None = None) -> None:
    """Weigh a node agent's cgroup (``gangflow/<node>``) as the ``cpus`` it offers and the machine's gangflow
    cgroup above it as the sum of its node cgroups (the other agents of this machine included: each one adds
    itself when it starts), at most the machine's cores (``machine_cpus``, default ``os.cpu_count()``): every
    rank of the machine together could not keep more busy unsandboxed either, and a stopped agent's node cgroup
    stays counted (a machine where many agents have come and gone weighed its gangflow cgroup as 130 CPUs on 2
    cores: sandboxed ranks ran ahead of everything else). A gang's share is its CPUs
    (engine.executor.sandbox.GangSandbox.create): its ranks then weigh against the processes outside gangflow
    about as they would unsandboxed, and each gang's quota still caps it at what it asked for."""
    driver.weigh(node_group, cpus)
    parent = str(Path(node_group).parent)
    cores = float(machine_cpus if machine_cpus is not None else os.cpu_count() or 1)
    driver.weigh(parent, min(cores, sum(driver.weighed(child) for child in driver.children(parent))))
