"""Checkpoints of a distributed task, the stop request and the preemption notice: the public face of
``engine.rank.checkpoint`` (see its docstring for the whole story)::

    from engine import checkpoint

    if (latest := checkpoint.load_latest()) is not None:
        start, state = latest
    ...
    checkpoint.save({"model": model.state_dict()}, step=step + 1)
"""

from engine.rank.checkpoint import (
    NOTICE_FILE_ENV,
    NOTICE_SIGNAL_ENV,
    Preemption,
    directory,
    latest_step,
    load_latest,
    load_torch,
    preemption,
    save,
    save_torch,
    stop_requested,
)

__all__ = [
    "NOTICE_FILE_ENV",
    "NOTICE_SIGNAL_ENV",
    "Preemption",
    "directory",
    "latest_step",
    "load_latest",
    "load_torch",
    "preemption",
    "save",
    "save_torch",
    "stop_requested",
]
