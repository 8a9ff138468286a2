"""A rank's own mount namespace: what its unprivileged user must reach, and only its own devices in ``/dev``.

A gang's user (engine.executor.sandbox) has to read its Python, its code and its inputs, and write its working
folder and checkpoints. On a real node those often sit behind a folder no other user may enter: an interpreter
under ``/root/.pyenv``, the agent's cache under ``/root/.cache/gangflow``, a ``/tmp/pytest-of-root`` (0700). The
agent does what the kubelet does for a pod's volumes: it *delivers* what a rank reads (the code bundle and the
inputs are fetched into the agent's root-owned, read-only cache before the ranks start), *collects* what rank 0
writes (its result, and its File / Directory outputs in the working folder's outbox, published into the store by
the agent: engine.artifacts.store ``OUTBOX_ENV``), and makes exactly these paths reachable in the rank's own mount
namespace, set up as root between fork and exec (or when a warm standby becomes the rank) before the drop to the
gang's user:

- every folder on the way to a needed path that others cannot pass (no ``o+x``) is *covered* by an empty tmpfs
  (mode 0711: passable, not listable), so nothing else behind it (another tenant's working folder, the agent's
  credentials, the node's secrets) exists for the rank;
- each needed path below a covered folder is bind-mounted back at its own path: read-only (the interpreter, the
  code, the cache of the run's store, its secrets) or writable (the attempt's working folder, the checkpoint
  folder), before the covering, through ``O_PATH`` descriptors taken first;
- ``/tmp`` becomes the attempt's own ``<workdir>/tmp`` (``tmp``: bound over it, the rank's ``TMPDIR`` as well),
  as Slurm's ``job_container/tmpfs`` binds a per-job folder over ``/tmp``: what a rank leaves in ``/tmp`` is seen
  by the other processes of its gang on the node (a local rank 0 that downloads for the others still works) and
  by nothing else, lies on the node's disk like the rest of the working folder (a tmpfs would count it against
  the rank's memory request, and split it per rank), and is removed with the working folder. The host's ``/tmp``
  is not there at all; the rank's own paths below it (an interpreter, a working folder under ``/tmp``) are bound
  back onto a scaffold of root-owned folders the agent made in ``<workdir>/tmp`` before any process of the gang
  started (:func:`scaffold`). That folder is the gang's to change: binding onto it creates nothing, follows no
  symlink and mounts onto a descriptor, so a rank that rearranged it only spoils its own mounts;
- ``/dev`` becomes a private tmpfs holding only bind mounts of the allowed device nodes: ``null``, ``zero``,
  ``full``, ``random``, ``urandom``, ``tty``, ``pts``, ``shm``, the NVIDIA control nodes (``nvidiactl``,
  ``nvidia-uvm``, ...), RDMA (``/dev/infiniband``) and the gang's *own* GPUs' nodes. Another GPU's node does not
  exist for the rank, and its user cannot create one (no ``mknod`` without ``CAP_MKNOD``): device isolation on
  cgroup v2 without an eBPF loader, and a second layer on v1 under ``devices.deny``.

The namespace has no cleanup: it ends with its last process. Mount propagation is slave (the host's unmounts
reach it, its mounts never leave it). :func:`supported` probes once whether this node can create one (a container
without ``CAP_SYS_ADMIN`` cannot): where it cannot, ranks whose files are unreachable stay root (said once).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEV_DIRS",
    "DEV_NODES",
    "NVIDIA_NODES",
    "Bind",
    "MountPlan",
    "blocked_folders",
    "isolate",
    "plan_mounts",
    "scaffold",
    "supported",
]

#: the device nodes every rank gets (when they exist on the node)
DEV_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
#: the NVIDIA nodes every GPU process opens besides its GPU's own (shared by all, as Slurm's ConstrainDevices keeps)
NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
#: folders of /dev bound in whole: terminals, shared memory (NCCL's intra-node transport), RDMA, MIG capabilities
DEV_DIRS = ("/dev/pts", "/dev/shm", "/dev/infiniband", "/dev/nvidia-caps", "/dev/hugepages", "/dev/mqueue")
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_SLAVE = 32, 4096, 16384, 1 << 19
#: the folder a private tmp is bound over
TMP = "/tmp"


def _libc() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        libc.unshare.argtypes = [ctypes.c_int]
        return libc
    return None


_LIBC = _libc()  # looked up in the parent: never dlopen in a forked child


@dataclass(frozen=True)
class Bind:
    """A path bound back at its own place below a covered folder; ``folder``: a folder (else a file)."""

    path: str
    writable: bool
    folder: bool = True


@dataclass(frozen=True)
class MountPlan:
    """What :func:`isolate` does: ``tmp`` (a folder) bound over /tmp, tmpfs over ``covers``, ``binds`` back, and
    (``private_dev``) a /dev holding only ``dev_paths`` (nodes and folders that exist on this node)."""

    covers: tuple[str, ...] = ()
    binds: tuple[Bind, ...] = ()
    private_dev: bool = False
    dev_paths: tuple[str, ...] = ()
    tmp: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "covers": list(self.covers),
            "binds": [[b.path, b.writable, b.folder] for b in self.binds],
            "private_dev": self.private_dev,
            "dev_paths": list(self.dev_paths),
            "tmp": self.tmp,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MountPlan:
        tmp = data.get("tmp")
        return cls(
            tuple(str(c) for c in data.get("covers", ())),
            tuple(Bind(str(p), bool(w), bool(f)) for p, w, f in data.get("binds", ())),
            bool(data.get("private_dev")),
            tuple(str(d) for d in data.get("dev_paths", ())),
            None if tmp is None else str(tmp),
        )


def _in_tmp(path: str) -> bool:
    return path != TMP and Path(path).is_relative_to(TMP)


def _passable(folder: Path) -> bool:
    try:
        return bool(folder.stat().st_mode & stat.S_IXOTH)
    except OSError:
        return True  # absent: nothing to cover (the rank gets "not found", as without the namespace)


def blocked_folders(paths: Iterable[str | Path]) -> list[str]:
    """The top-most folders on the way to ``paths`` (their ancestors, not the paths themselves) that another user
    cannot pass: what a rank's namespace covers. One inside another is dropped (covering the outer hides it)."""
    found: set[str] = set()
    for path in paths:
        here = Path(os.path.abspath(path))
        for folder in reversed(here.parents):
            if not _passable(folder):
                found.add(str(folder))
                break
    return sorted(f for f in found if not any(Path(f).is_relative_to(o) and f != o for o in found))


def plan_mounts(
    read: Iterable[str | Path],
    write: Iterable[str | Path],
    devices: Sequence[str] | None = None,
    hide: Iterable[str | Path] = (),
    tmp: str | Path | None = None,
) -> MountPlan:
    """The namespace of a rank that reads ``read`` and writes ``write`` (paths on this node; symlinks resolved)
    and may open ``devices`` besides :data:`DEV_NODES` / :data:`NVIDIA_NODES` (None: the node's /dev as it is).
    ``hide``: folders covered even where others may pass them (the node's cache: other stores' copies, other
    gangs' working folders), their needed paths bound back like the rest. ``tmp``: the folder that is its /tmp
    (None: the node's); its paths below /tmp are then bound back, nothing there is covered."""
    private_tmp = tmp is not None and os.path.realpath(TMP) == TMP  # (a /tmp that is a symlink: left alone)
    wanted: dict[str, bool] = {}
    for path, writable in [*((p, False) for p in read), *((p, True) for p in write)]:
        real = os.path.realpath(path)
        if os.path.exists(real):
            wanted[real] = wanted.get(real, False) or writable
    found = [*blocked_folders(wanted), *(os.path.realpath(h) for h in hide if os.path.isdir(h))]
    if private_tmp:  # the whole of /tmp is replaced: covering a folder in it would cover the rank's own tmp
        found = [c for c in found if c != TMP and not _in_tmp(c)]
    covers = sorted({c for c in found if not any(Path(c).is_relative_to(o) and c != o for o in found)})
    binds = [
        Bind(path, writable, os.path.isdir(path))
        for path, writable in sorted(wanted.items(), key=lambda item: (item[0].count("/"), item[0]))
        if any(Path(path).is_relative_to(c) for c in covers) or (private_tmp and _in_tmp(path))
    ]
    dev: list[str] = []
    if devices is not None:
        for path in (*DEV_NODES, *NVIDIA_NODES, *devices, *DEV_DIRS):
            if path.startswith("/dev/") and os.path.lexists(path) and path not in dev:
                dev.append(path)
    chosen = os.path.realpath(tmp) if private_tmp and tmp is not None else None
    return MountPlan(tuple(covers), tuple(binds), devices is not None, tuple(dev), chosen)


def scaffold(plan: MountPlan) -> None:
    """As root in the node's namespace, before any process of the gang runs: in the plan's ``tmp``, the folders
    (root's, 0711: passable, not listable) and empty targets of the binds below /tmp, for :func:`isolate` to
    mount onto. Made before the gang can touch ``tmp``, so that no folder on the way is a rank's symlink."""
    if plan.tmp is None:
        return
    for bind in plan.binds:
        if not _in_tmp(bind.path):
            continue
        target = os.path.join(plan.tmp, os.path.relpath(bind.path, TMP))
        os.makedirs(target if bind.folder else os.path.dirname(target), mode=0o711, exist_ok=True)
        if not bind.folder and not os.path.lexists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(_LIBC.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {source} on {target}")


def _make_target(path: str, folder: bool) -> None:
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    if folder:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o711)
    elif not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def _existing_target(path: str) -> int:
    """An ``O_PATH`` descriptor of ``path`` below the private /tmp, opened one component at a time without
    following a symlink: the scaffold lies in a folder the gang's user owns, and a mount must never be steered out
    of it (nor anything created). Raises OSError where a component is missing or a symlink."""
    fd = os.open(TMP, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in Path(os.path.relpath(path, TMP)).parts:
            step = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = step
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(f"{path}: a symlink on the way to a mount in the private /tmp")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _bind_in_tmp(source: int, bind: Bind) -> None:
    """Bind ``source`` (a descriptor) at ``bind.path`` below the private /tmp: onto its scaffold target, and made
    read-only through the mount just made (never by a path the gang could have redirected)."""
    target = _existing_target(bind.path)
    try:
        _mount(f"/proc/self/fd/{source}", f"/proc/self/fd/{target}", None, _MS_BIND | _MS_REC)
    finally:
        os.close(target)
    if not bind.writable:
        mounted = _existing_target(bind.path)  # now the root of the bind mount
        try:
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
            _mount(None, f"/proc/self/fd/{mounted}", None, flags)
        finally:
            os.close(mounted)


def isolate(plan: MountPlan) -> None:
    """As root in the process to confine (a forked child before exec, or a standby): a mount namespace of its own
    laid out by ``plan``. Raises OSError when the kernel refuses (the caller's spawn then fails)."""
    if _LIBC is None:
        raise OSError("no libc: cannot create a mount namespace")
    # a forked child has its working directory already (subprocess changes it before the preexec hook): that
    # directory is the node's, not the read-only bind laid over it below, and from it ``..`` would walk into what
    # the covers hide. Taken again by name once the namespace is laid out (or / where it is not there).
    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
    _check(_LIBC.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_SLAVE)  # nothing done here reaches the node's namespace
    # descriptors of what is bound back, taken before covering hides it (bound from /proc/self/fd/N)
    held = [os.open(b.path, os.O_PATH | os.O_CLOEXEC) for b in plan.binds]
    devs = [os.open(d, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW) for d in plan.dev_paths] if plan.private_dev else []
    if plan.tmp is not None:
        held.append(os.open(plan.tmp, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
    try:
        if plan.tmp is not None:
            _mount(f"/proc/self/fd/{held[-1]}", TMP, None, _MS_BIND)
            _mount(None, TMP, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)
        for cover in plan.covers:
            _mount("tmpfs", cover, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0711,size=1m")
        for bind, fd in zip(plan.binds, held, strict=False):
            if plan.tmp is not None and _in_tmp(bind.path):
                _bind_in_tmp(fd, bind)
                continue
            _make_target(bind.path, bind.folder)
            _mount(f"/proc/self/fd/{fd}", bind.path, None, _MS_BIND | _MS_REC)
            if not bind.writable:
                _mount(None, bind.path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID)
        if plan.private_dev:
            _mount("tmpfs", "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=1m")
            for path, fd in zip(plan.dev_paths, devs, strict=True):
                folder = stat.S_ISDIR(os.fstat(fd).st_mode)
                _make_target(path, folder)
                _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | (_MS_REC if folder else 0))
            for name, target in _DEV_LINKS:
                with contextlib.suppress(FileExistsError):
                    os.symlink(target, f"/dev/{name}")
    finally:
        for fd in (*held, *devs):
            os.close(fd)
    try:
        os.chdir(cwd or "/")
    except OSError:
        os.chdir("/")


_SUPPORTED: bool | None = None


def supported() -> bool:
    """Whether this node can give a process a mount namespace (probed once, with a short-lived child)."""
    global _SUPPORTED
    if _SUPPORTED is None:
        if os.geteuid() != 0 or _LIBC is None:
            _SUPPORTED = False
        else:
            try:
                subprocess.run(["/bin/true"], preexec_fn=lambda: isolate(MountPlan()), check=True, timeout=30)
                _SUPPORTED = True
            except (OSError, subprocess.SubprocessError):
                _SUPPORTED = False
    return _SUPPORTED
