"""A node launch's logs written in its working folder, mirrored into the run's store while its ranks run.

A rank's log goes where ``gangflow logs`` reads it (the run's store, ``<store>/logs/<run>/``) when the node agent
can open it there for the rank. Where it cannot, the log is written in the attempt's working folder instead: a
gang running as its own user (engine.executor.sandbox) may not write the store, and a remote store (S3, GCS) has
no file to append to. Copying those logs only when the attempt ended left ``gangflow logs`` (and what reads it:
the tenants demo's "running from step N", read from rank 0's log) empty for as long as the ranks ran, although
``engine.report`` progress came through: the full sandbox showed a 40 s gang's first line at its end.

:class:`RankLogs` keeps a local store's copies current: every ``MIRROR_EVERY_S`` it appends what each log grew by
since the last look (bounded per look, so that a rank printing without pause cannot hold the agent's loop), and
once more, in full, when the launch ends. A remote store gets each log once, at the end, as before (rewriting a
whole object every second is not what an object store is for).

The working folder is the gang's user's own: a rank may replace its log with a symlink to a file only root may
read, a FIFO, or a hard link. A log is therefore opened without following symlinks and copied only when it is a
regular file with a single link; anything else is skipped (and said once).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from engine.executor.rankfiles import open_rank_file

__all__ = ["MIRROR_CHUNK", "MIRROR_EVERY_S", "RankLogs", "open_log"]

log = logging.getLogger(__name__)

#: how often a running launch's logs are appended to a local store's copies (what `gangflow logs` lags by)
MIRROR_EVERY_S = 1.0
#: the most bytes one look copies from one log (the rest follows at the next look, or at the end)
MIRROR_CHUNK = 4 << 20


def open_log(path: str | Path) -> int | None:
    """A read descriptor of a log in a working folder a rank may have tampered with, or None: not there, a
    symlink (not followed), not a regular file (a FIFO is never waited on), or a file with more than one link."""
    try:
        return open_rank_file(path)
    except OSError:
        return None


class RankLogs:
    """The logs of one node launch in ``workdir`` (``*.log``), mirrored into ``store``'s log folder of
    ``run_id``: :meth:`sync` while the ranks run (a local store only), :meth:`finish` once they are gone."""

    def __init__(self, store: Any, run_id: str, workdir: Path) -> None:
        self.store, self.run_id, self.workdir = store, run_id, workdir
        self.copied: dict[str, int] = {}  # log name -> bytes already in the store's copy
        self.next_at = 0.0
        self.skipped: set[str] = set()
        self.failed = False

    def due(self) -> bool:
        return self.store.local and time.monotonic() >= self.next_at

    def sync(self, limit: int | None = MIRROR_CHUNK) -> None:
        """Append what each log grew by to its copy in the store (a local store), at most ``limit`` bytes per
        log (None: all). A store that cannot be written is said once, never raised."""
        self.next_at = time.monotonic() + MIRROR_EVERY_S
        try:
            folder = self.store.log_path(self.run_id)
            os.makedirs(folder, exist_ok=True)
            for path in sorted(self.workdir.glob("*.log")):
                self._append(path, Path(folder, path.name), limit)
        except OSError as exc:
            self._said(exc)

    def _append(self, path: Path, target: Path, limit: int | None) -> None:
        fd = open_log(path)
        if fd is None:
            if path.name not in self.skipped and (path.is_symlink() or path.exists()):
                self.skipped.add(path.name)
                log.warning("not copying %s into the run's store: not a regular file of its own", path)
            return
        with os.fdopen(fd, "rb") as source:
            done = self.copied.get(path.name)
            size = os.fstat(source.fileno()).st_size
            if done is None or size < done:  # first look, or the rank replaced its log: start the copy over
                done, mode = 0, "wb"
            else:
                mode = "ab"
            left = size - done if limit is None else min(size - done, limit)
            if mode == "ab" and left <= 0:
                return
            source.seek(done)
            with open(target, mode) as copy:  # created even when empty: the rank has started
                while left > 0 and (chunk := source.read(min(left, 1 << 20))):
                    copy.write(chunk)
                    done += len(chunk)
                    left -= len(chunk)
            self.copied[path.name] = done

    def finish(self) -> None:
        """Once the launch's processes are gone: every log in full into the store (local or remote)."""
        if self.store.local:
            self.sync(limit=None)
            return
        try:
            self.store.fs.makedirs(self.store.log_path(self.run_id), exist_ok=True)
            for path in sorted(self.workdir.glob("*.log")):
                fd = open_log(path)
                if fd is None:
                    continue
                with (
                    os.fdopen(fd, "rb") as source,
                    self.store.fs.open(self.store.log_path(self.run_id, path.name), "wb") as copy,
                ):
                    while chunk := source.read(1 << 20):
                        copy.write(chunk)
        except OSError as exc:
            self._said(exc)

    def _said(self, exc: OSError) -> None:
        if not self.failed:
            self.failed = True
            log.warning("could not copy the logs of run %s from %s into its store: %s", self.run_id, self.workdir, exc)
