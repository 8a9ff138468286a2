"""Files a node agent reads or appends to in a gang's working folder, which the gang's user owns.

The agent runs as root; a sandboxed rank owns its working folder and may replace anything in it between its
writes and the agent's reads: its result, its error report, its progress file, its log. Opened by path as root,
a symlink there would make the agent read a file only root may (``/etc/shadow``, the agent's credentials: into
the run's result, its failure message, ``gangflow status`` or its logs) or append to one; a FIFO would hold the
agent's thread. Every such open goes through here: no symlink followed (``O_NOFOLLOW``), never waiting on a FIFO
(``O_NONBLOCK``), a regular file only, and, for a read, one with a single link (a hard link to another file is
another file's content; the kernel's ``protected_hardlinks`` is the node's setting, not ours).
"""

from __future__ import annotations

import os
import stat

__all__ = ["open_log_for_append", "open_rank_file", "read_rank_file"]

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_rank_file(path: str | os.PathLike[str]) -> int:
    """A read descriptor of a regular, singly linked file at ``path`` (not through a symlink). Raises OSError."""
    fd = os.open(path, _READ)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise OSError(f"{os.fspath(path)} is not a regular file of its own: not read")
    os.set_blocking(fd, True)
    return fd


def read_rank_file(path: str | os.PathLike[str], limit: int | None = None, *, tail: bool = False) -> bytes:
    """The content of ``path`` opened by :func:`open_rank_file`: all of it, or at most ``limit`` bytes from its
    start (``tail``: its end). Raises OSError."""
    with os.fdopen(open_rank_file(path), "rb") as handle:
        if limit is None:
            return handle.read()
        if tail:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
        return handle.read(limit)


def open_log_for_append(path: str | os.PathLike[str]) -> int:
    """A descriptor appending to the log at ``path`` (created 0644), not through a symlink and only a regular
    file (a FIFO is refused at once, not waited on). Raises OSError."""
    fd = os.open(path, _APPEND, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{os.fspath(path)} is not a regular file: not opened as a log")
    os.set_blocking(fd, True)
    return fd
