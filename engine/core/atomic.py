"""Atomic writes on a local filesystem: a file or folder appears whole under its name, or not at all.

Readers poll these paths while they are written (a node agent reads a rank's progress and result files,
a restarted gang reads the latest checkpoint, concurrent fetches share one cache), so each is built under
a hidden temporary name in the same folder and renamed into place, which POSIX makes atomic. Standard
library only: any package may import it, the pure ones included.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["TEMP_PREFIX", "write_atomic"]

#: temporary names start with this (hidden, and never matched by a reader's ``rank*`` or ``step-*`` glob)
TEMP_PREFIX = ".partial-"


def write_atomic(
    path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], object], *, durable: bool = True
) -> None:
    """Write ``data`` (bytes, or a function that writes to the open binary file) to ``path`` atomically.

    ``durable`` fsyncs before the rename, so a machine crash cannot leave an empty file under the final
    name; a file rewritten every fraction of a second and worthless after a crash (a progress report)
    skips it. A failed write leaves the previous content of ``path`` and no temporary file.
    """
    target = Path(path)
    # O_EXCL with mode 0o666: a unique name, and the permissions the umask gives a plain open() (mkstemp's 0600
    # would hide a result or checkpoint from another user on a shared filesystem)
    tmp = target.with_name(f"{TEMP_PREFIX}{target.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            else:
                data(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
