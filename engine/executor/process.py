"""Process helpers shared by the dev server launcher and the rank launcher."""

from __future__ import annotations

import contextlib
import ctypes
import signal

__all__ = ["set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (call it in a preexec_fn).

    The signal follows the *thread* that forked the child, so spawn from a long-lived thread (the
    agent's event loop thread), never from a short-lived pool thread.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
