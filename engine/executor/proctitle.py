"""A process's title as ``ps`` shows it (``ps -o args``, ``top``, ``/proc/<pid>/cmdline``) and its short name
(``ps -o comm``, ``/proc/<pid>/comm``), set as the ``setproctitle`` package does, without it: the argument
area the kernel gave the process (``/proc/self/stat``'s ``arg_start``..``arg_end``) is overwritten in place
(Python keeps copies of its arguments: ``sys.argv`` is unchanged), and ``prctl(PR_SET_NAME)`` sets the name.

A rank adopted from a warm standby was started as ``python -P -m engine.executor.rank --standby torch``, the
same line for every standby: its title says whose it is (run, task, rank, attempt) instead. A title longer
than the original arguments is cut to fit (nothing beyond them is touched). Linux only; elsewhere a no-op."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from pathlib import Path

__all__ = ["set_process_title"]

_PR_SET_NAME = 15
#: /proc/self/stat's fields arg_start and arg_end (48 and 49, 1-based; counted here from the state, field 3)
_ARG_START, _ARG_END = 48 - 3, 49 - 3


def set_process_title(title: str) -> bool:
    """Set this process's title (and its 15-byte short name); False where it could not be."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[_ARG_START]), int(fields[_ARG_END])
    except (OSError, IndexError, ValueError):
        return False
    size = end - start
    if size <= 1:
        return False
    data = title.encode()[: size - 1]
    # NULs after it: the kernel then returns the area as it is, and ps shows the title alone
    ctypes.memmove(start, data + b"\0" * (size - len(data)), size)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    return True
