"""The local cache a machine keeps of each store's objects: safe for any number of processes at once, crash-safe,
and trusted only as far as it is verified against the digest a run's reference names.

The rules every writer and reader of ``stores/<key>/...`` (engine.artifacts.store.cache_path) follows:

- **One writer per object.** Downloading or extracting an object and publishing it run under an exclusive
  ``flock`` on ``<object>.lock`` beside it (:func:`object_lock`). The kernel releases it when the holder dies, so
  a writer killed mid-way blocks nobody, and its leftovers (hidden ``.partial-`` names, never trusted) are swept
  by the next holder (:func:`sweep`).
- **A published object is never replaced or changed in place.** A file appears by ``os.link`` of a complete,
  verified temporary (which fails when the name exists), a folder by ``rename`` of a complete staging folder onto
  an absent name (:func:`publish`). So a path one process hands out is never removed or swapped by another
  because the other fetched the same content at the same time: the only removal (:func:`discard`, under the lock)
  is of an object that failed its digest check, i.e. one that is damaged for every reader anyway.
- **Verified by digest, on first use in each process.** Readers take no lock: they hash what is there (a file,
  or an extracted folder against the archive it came from, itself checked against the reference's sha256) the
  first time a process uses it, and later compare the inode, size and change times recorded then
  (:class:`Verified`): no manifest or stamp beside the object is believed.
- **Owned by root and read-only to others where the agent runs as root** (:func:`secure_dirs`, :func:`harden`):
  folders 0755, files 0644 (0755 when executable), every folder on the way owned by root and none a symlink, so
  ranks running as unprivileged users can read the cache but never plant anything in it. A process that is not
  root keeps the modes its umask gives (a laptop, ``gangflow dev`` as a user).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from engine.core.atomic import TEMP_PREFIX

__all__ = ["Verified", "discard", "harden", "object_lock", "publish", "secure_dirs", "sweep", "temp_path"]

#: folders already checked (owner, mode, no symlink) by this process: once is enough, a root-owned 0755 folder
#: cannot be changed by anyone else
_secured: set[Path] = set()


def _is_root() -> bool:
    return os.geteuid() == 0


def secure_dirs(folder: Path, top: Path) -> None:
    """Create ``folder`` (under ``top``, the machine's cache folder) and, as root, make it and every folder from
    ``top`` down to it root-owned and 0755, refusing a symlink among them (a rank could have planted one to make
    root write elsewhere)."""
    if not _is_root():
        folder.mkdir(parents=True, exist_ok=True)
        return
    if folder in _secured:
        return
    top.mkdir(parents=True, exist_ok=True)
    chain = [folder, *[p for p in folder.parents if p.is_relative_to(top)]]
    for path in reversed(chain):  # top down, one level at a time: never through a symlink
        if path in _secured:
            continue
        with suppress(FileExistsError):
            os.mkdir(path, 0o755)
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise OSError(f"refusing the cache folder {path}: it is not a plain folder (a symlink?)")
        if info.st_uid != 0 or info.st_gid != 0:
            os.chown(path, 0, 0, follow_symlinks=False)
        if stat.S_IMODE(info.st_mode) != 0o755:
            os.chmod(path, 0o755)
        _secured.add(path)


def harden(path: Path) -> None:
    """As root, make a staged object read-only to others before it is published: folders 0755, files 0644
    (0755 when executable), links left as they are. Nothing for a process that is not root."""
    if not _is_root():
        return
    paths = [path] if not path.is_dir() or path.is_symlink() else [path, *path.rglob("*")]
    for item in paths:
        info = os.lstat(item)
        if stat.S_ISLNK(info.st_mode):
            continue
        mode = 0o755 if stat.S_ISDIR(info.st_mode) or info.st_mode & 0o111 else 0o644
        if info.st_uid != 0 or info.st_gid != 0:
            os.chown(item, 0, 0, follow_symlinks=False)
        if stat.S_IMODE(info.st_mode) != mode:
            os.chmod(item, mode)


@contextmanager
def object_lock(target: Path) -> Iterator[None]:
    """Hold the exclusive lock of the object at ``target`` (``<target>.lock``, never removed: removing a lock
    file another process waits on would let two writers in)."""
    fd = os.open(target.with_name(f"{target.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def temp_path(target: Path) -> Path:
    """A fresh hidden name beside ``target`` to build it at (swept by :func:`sweep` if its writer dies)."""
    return target.with_name(f"{TEMP_PREFIX}{target.name}.{os.getpid()}.{os.urandom(4).hex()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep(target: Path) -> None:
    """Remove what writers of ``target`` killed mid-way left beside it. Only under :func:`object_lock`: then no
    other writer of it is alive."""
    prefix = f"{TEMP_PREFIX}{target.name}."
    try:
        leftovers = [p for p in target.parent.iterdir() if p.name.startswith(prefix)]
    except FileNotFoundError:
        return
    for path in leftovers:
        _remove(path)


def discard(target: Path) -> None:
    """Take a damaged object away (under :func:`object_lock`): renamed aside first, so no reader ever finds half
    of it under its name, then removed."""
    if not os.path.lexists(target):
        return
    aside = temp_path(target)
    os.rename(target, aside)
    _remove(aside)


def publish(staged: Path, target: Path) -> None:
    """Put a complete, verified object built at ``staged`` under ``target``, which must be absent (the caller holds
    the lock and has discarded a damaged copy): a file by ``os.link`` (fails rather than replace), a folder by
    ``rename`` (fails onto a non-empty folder). ``staged`` is gone afterwards."""
    harden(staged)
    try:
        if staged.is_dir() and not staged.is_symlink():
            os.rename(staged, target)
        else:
            os.link(staged, target)
    except OSError:
        # only a writer that takes no lock (a gangflow from before it took one) can have put something there:
        # keep it; the caller verifies what is under the name before handing it out
        if not os.path.lexists(target):
            raise
    finally:
        if os.path.lexists(staged):
            _remove(staged)


def _signature(path: Path) -> tuple[int, ...]:
    info = os.lstat(path)
    return (info.st_dev, info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class Verified:
    """What this process has verified by digest, and how each object looked then (each file's inode, mode, size,
    modification and change times: a rewrite, even with its times put back, moves the change time)."""

    def __init__(self) -> None:
        self._seen: dict[Path, list[tuple[int, ...]]] = {}

    @staticmethod
    def _look(target: Path, files: list[Path]) -> list[tuple[int, ...]] | None:
        try:
            return [_signature(target), *(_signature(f) for f in files)]
        except OSError:
            return None

    def still(self, target: Path, files: list[Path]) -> bool:
        """``target`` (and ``files``, an extracted folder's) looks as it did when this process verified it."""
        seen = self._seen.get(target)
        return seen is not None and self._look(target, files) == seen

    def record(self, target: Path, files: list[Path]) -> None:
        looked = self._look(target, files)
        if looked is not None:
            self._seen[target] = looked

    def forget(self, target: Path) -> None:
        self._seen.pop(target, None)
