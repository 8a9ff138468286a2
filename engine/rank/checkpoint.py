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
a torn checkpoint; the last ``keep`` are kept. When the artifact store is an object store
(``GANGFLOW_CHECKPOINT_DIR`` is a URI such as ``s3://bucket/gangflow/checkpoints/...``), each checkpoint is
written locally first and uploaded whole (an object appears whole or not at all), so a gang resumes from it
on any node. Payloads are pickled (``torch.save`` when torch is
present, so tensors are stored efficiently). ``save_torch`` / ``load_torch`` handle a model and its
optimizer.

A rank asked to stop gets a grace period before SIGKILL, and ``stop_requested()`` turns true so the
training loop can save and return. A *preemption* (the cluster needs the GPUs: a reclaim, a
higher-priority gang, a drained node) comes with a notice: the plugin's notice signal (SIGTERM unless the
plugin says otherwise) and a notice file that ``preemption()`` reads (deadline, reason). Its grace is the
task's ``preemption_grace`` (default 120 s); ranks that exit earlier release the GPUs at once, and the
gang resumes from its checkpoint later without spending a restart. Any other stop (a peer failed, the run
was cancelled) is SIGTERM with 5 s of grace.

    while step < total and not checkpoint.stop_requested():
        ...
    checkpoint.save(state, step=step)          # then return: the gang resumes from here
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.atomic import write_atomic
from engine.rank import progress

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

_NAME = re.compile(r"^step-(\d+)\.ckpt$")
#: where the node agent writes a preemption notice for this rank (set in every rank's environment)
NOTICE_FILE_ENV = "GANGFLOW_PREEMPTION_FILE"
#: the signal that carries the notice (a name, e.g. SIGTERM; the plugin's ``notice_signal``)
NOTICE_SIGNAL_ENV = "GANGFLOW_NOTICE_SIGNAL"
_stop = False
_watching = False  # set once the body asks stop_requested(): only then does a stop signal wait for it


def _location() -> str:
    path = os.environ.get("GANGFLOW_CHECKPOINT_DIR")
    if not path:
        raise RuntimeError("no GANGFLOW_CHECKPOINT_DIR: checkpoints are for the ranks of a distributed task")
    return path


def _remote(location: str) -> bool:
    return "://" in location


def directory() -> Path:
    """This task call's checkpoint folder (``GANGFLOW_CHECKPOINT_DIR``), created if missing. Only for a folder
    on a (shared) filesystem: with an object store, use ``save`` and ``load_latest``."""
    location = _location()
    if _remote(location):
        raise RuntimeError(
            f"the checkpoint folder is in an object store ({location}): use checkpoint.save / load_latest, "
            "which upload and download whole files"
        )
    folder = Path(location)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _name(step: int) -> str:
    return f"step-{step:09d}.ckpt"


def _steps(location: str) -> list[int]:
    if _remote(location):
        import fsspec  # only where checkpoints go to an object store: a rank without fsspec still checkpoints

        fs, root = fsspec.core.url_to_fs(location)
        names = [str(p).rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)] if fs.exists(root) else []
    else:
        names = [p.name for p in directory().iterdir()]
    return sorted(int(m.group(1)) for name in names if (m := _NAME.match(name)))


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


def save(state: Any, *, step: int, keep: int = 3, all_ranks: bool = False) -> Path | str | None:
    """Write ``state`` as the checkpoint of ``step`` (by default on rank 0 only: data-parallel replicas
    are identical). Returns where it was written (a path, or a URI in an object store), or None on ranks
    that do not write."""
    if not all_ranks and _rank() != 0:
        return None
    began = time.monotonic()
    where = _save(state, step, keep)
    # the goodput ledger counts the save's time as checkpoint badput, and the work before it as kept
    progress.checkpointed(step, time.monotonic() - began)
    return where


def _save(state: Any, step: int, keep: int) -> Path | str:
    location = _location()
    if not _remote(location):
        folder = directory()
        write_atomic(folder / _name(step), lambda handle: _dump(state, handle))
        for old in _steps(location)[:-keep] if keep > 0 else []:
            (folder / _name(old)).unlink(missing_ok=True)
        return folder / _name(step)
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    target = f"{location.rstrip('/')}/{_name(step)}"
    with tempfile.TemporaryDirectory(prefix="gangflow-checkpoint-") as tmp:
        local = Path(tmp) / _name(step)
        write_atomic(local, lambda handle: _dump(state, handle), durable=False)
        fs.makedirs(root, exist_ok=True)
        fs.put_file(str(local), f"{root.rstrip('/')}/{_name(step)}")
    for old in _steps(location)[:-keep] if keep > 0 else []:
        fs.rm_file(f"{root.rstrip('/')}/{_name(old)}")
    return target


def latest_step() -> int | None:
    steps = _steps(_location())
    return steps[-1] if steps else None


def load_latest() -> tuple[int, Any] | None:
    """``(step, state)`` of the newest checkpoint, or None when there is none yet."""
    location = _location()
    step = latest_step()
    if step is None:
        return None
    if not _remote(location):
        return step, _load(directory() / _name(step))
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    with tempfile.TemporaryDirectory(prefix="gangflow-checkpoint-") as tmp:
        local = Path(tmp) / _name(step)
        fs.get_file(f"{root.rstrip('/')}/{_name(step)}", str(local))
        return step, _load(local)


def save_torch(model: Any, optimizer: Any = None, *, step: int, keep: int = 3, **extra: Any) -> Path | str | None:
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


@dataclass(frozen=True)
class Preemption:
    """A preemption notice: the gang must stop by ``deadline`` (epoch seconds) and will resume later."""

    deadline: float
    grace_s: float
    reason: str  # e.g. "preempted by gang 'b.train-1' of team-b (reclaim)"
    cause: str  # reclaim | priority | backfill | defrag | drain
    by: str  # the gang it makes room for (for a drain: the node)
    by_tenant: str

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.time())


def preemption() -> Preemption | None:
    """The preemption notice this rank got, or None (no notice, or not a rank). Reading it installs no signal
    handler, so it also works beside a framework that handles the notice signal itself (JAX with SIGTERM)."""
    path = os.environ.get(NOTICE_FILE_ENV)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        return Preemption(
            deadline=float(data["deadline"]),
            grace_s=float(data["grace_s"]),
            reason=str(data["reason"]),
            cause=str(data["cause"]),
            by=str(data["by"]),
            by_tenant=str(data["by_tenant"]),
        )
    except (OSError, ValueError, KeyError, TypeError):  # none yet (or being replaced): no notice
        return None


def stop_requested() -> bool:
    """True once this rank was asked to stop: a preemption notice (``preemption()`` says until when), a
    failed peer or a cancel (SIGTERM, 5 s). The training loop should then save and return.

    The first call installs handlers for SIGTERM and the notice signal (from the main thread), so only a rank
    that asks gets the grace period; any other rank keeps the signals' default and stops at once, even inside
    a blocking collective, where a Python handler could not run. A notice file is noticed even where the
    handler could not be installed.
    """
    global _watching
    if not _watching:
        names = {"SIGTERM", os.environ.get(NOTICE_SIGNAL_ENV) or "SIGTERM"}
        for name in sorted(names):
            sig = getattr(signal, name, None)
            if isinstance(sig, signal.Signals):
                with contextlib.suppress(ValueError, OSError):  # not the main thread: keep the default behaviour
                    signal.signal(sig, _on_stop)
        _watching = True
    if not _stop and os.environ.get(NOTICE_FILE_ENV) and os.path.exists(os.environ[NOTICE_FILE_ENV]):
        return True
    return _stop


def _on_stop(signum: int, frame: Any) -> None:
    global _stop
    _stop = True
