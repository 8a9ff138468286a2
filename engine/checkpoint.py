"""Checkpoints of a distributed task: every attempt of a task call sees the same
``GANGFLOW_CHECKPOINT_DIR``, so a restarted, resumed or re-admitted gang continues from the latest one.

    from engine import checkpoint

    start = 0
    if (latest := checkpoint.load_latest()) is not None:
        start, state = latest
        model.load_state_dict(state["model"])
    for step in range(start, total):
        ...
        if step % 50 == 0:
            checkpoint.save({"model": model.state_dict()}, step=step + 1)   # rank 0 writes, atomically

Files are ``step-<n>.ckpt`` written to a temporary name and renamed, so a crash mid-save never leaves
a torn checkpoint; the last ``keep`` are kept. Payloads are pickled (``torch.save`` when torch is
present, so tensors are stored efficiently). ``save_torch`` / ``load_torch`` handle a model and its
optimizer. A rank asked to stop (SIGTERM: preemption, a peer failed, a cancel) gets a grace period
before SIGKILL; ``stop_requested()`` turns true so the training loop can save and return.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
from pathlib import Path
from typing import Any

from engine.atomic import write_atomic

__all__ = [
    "directory",
    "latest_step",
    "load_latest",
    "load_torch",
    "save",
    "save_torch",
    "stop_requested",
]

_NAME = re.compile(r"^step-(\d+)\.ckpt$")
_stop = False
_watching = False  # set once the body asks stop_requested(): only then does SIGTERM wait for it


def directory() -> Path:
    """This task call's checkpoint folder (``GANGFLOW_CHECKPOINT_DIR``), created if missing."""
    path = os.environ.get("GANGFLOW_CHECKPOINT_DIR")
    if not path:
        raise RuntimeError("no GANGFLOW_CHECKPOINT_DIR: checkpoints are for the ranks of a distributed task")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _steps(folder: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _NAME.match(p.name)))


def _file(folder: Path, step: int) -> Path:
    return folder / f"step-{step:09d}.ckpt"


def _dump(obj: Any, handle: Any) -> None:
    try:
        import torch
    except ImportError:
        pickle.dump(obj, handle, protocol=pickle.HIGHEST_PROTOCOL)
    else:
        torch.save(obj, handle)


def _load(path: Path) -> Any:
    try:
        import torch
    except ImportError:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    return torch.load(path, weights_only=False)


def save(state: Any, *, step: int, keep: int = 3, all_ranks: bool = False) -> Path | None:
    """Write ``state`` as the checkpoint of ``step`` (by default on rank 0 only: data-parallel replicas
    are identical). Returns the file written, or None on ranks that do not write."""
    if not all_ranks and _rank() != 0:
        return None
    folder = directory()
    target = _file(folder, step)
    write_atomic(target, lambda handle: _dump(state, handle))
    for old in _steps(folder)[:-keep] if keep > 0 else []:
        _file(folder, old).unlink(missing_ok=True)
    return target


def latest_step() -> int | None:
    steps = _steps(directory())
    return steps[-1] if steps else None


def load_latest() -> tuple[int, Any] | None:
    """``(step, state)`` of the newest checkpoint, or None when there is none yet."""
    step = latest_step()
    if step is None:
        return None
    return step, _load(_file(directory(), step))


def save_torch(model: Any, optimizer: Any = None, *, step: int, keep: int = 3, **extra: Any) -> Path | None:
    """Checkpoint a model (DDP-wrapped or not) and its optimizer."""
    module = getattr(model, "module", model)
    state = {"model": module.state_dict(), "step": step, **extra}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    return save(state, step=step, keep=keep)


def load_torch(model: Any, optimizer: Any = None) -> tuple[int, dict[str, Any]]:
    """Restore the newest checkpoint into ``model`` / ``optimizer``; returns ``(step, state)`` with
    step 0 and an empty state when there is no checkpoint yet."""
    latest = load_latest()
    if latest is None:
        return 0, {}
    step, state = latest
    getattr(model, "module", model).load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return step, state


def stop_requested() -> bool:
    """True once this rank was asked to stop (SIGTERM: preemption, a failed peer, a cancel); the training
    loop should then save and return within the grace period (5 s) before SIGKILL.

    The first call installs the SIGTERM handler (from the main thread), so only a rank that asks gets
    the grace period; any other rank keeps SIGTERM's default and stops at once, even inside a blocking
    collective, where a Python handler could not run.
    """
    global _watching
    if not _watching:
        with contextlib.suppress(ValueError):  # not the main thread: keep the default behaviour
            signal.signal(signal.SIGTERM, _on_sigterm)
        _watching = True
    return _stop


def _on_sigterm(signum: int, frame: Any) -> None:
    global _stop
    _stop = True
