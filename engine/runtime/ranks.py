"""What a node agent says about its ranks, while they run and after.

While a node launch runs, :func:`rank_details` is its activity's heartbeat details: the Web UI shows them
under the GangTask's pending activities, and ``Client.gang`` reads them for ``gangflow status``. A GangTask
never sees heartbeats (Temporal keeps them on the pending activity, out of the workflow's reach), and
signalling every report into it would grow its history with each one; so the readable per-rank line lives
in the heartbeat's ``summary``. Besides each rank's latest report (which names the first step the rank reported,
``first_step``), the details say when the node's ranks started (``started``) and when the details were
taken (``at``): what an attempt's first step, last step and duration are read from once it is over.

The details are also saved in the run's artifact store (:class:`RankSaver`), next to the run's logs but
outside the log folder: every few seconds while the ranks run, and once when the launch ends. ``gangflow
status`` reads them where it cannot read the heartbeats: a finished gang (completed activities keep no
heartbeat details in Temporal), and a tenant's gang in the isolated layout (its GangTask lives in the platform's
namespace, which the tenant cannot read; the store is the tenant's own).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from engine.artifacts.store import ArtifactStore
from engine.executor.launcher import NodeGang
from engine.rank.view import rank_rows, summary_line
from engine.runtime.ledger import attempt_ledger

__all__ = [
    "SAVE_EVERY_S",
    "RankSaver",
    "attempt_ranks",
    "attempt_steps",
    "last_attempt_ranks",
    "merge_attempts",
    "rank_details",
    "save_ranks",
]

#: how often a running launch's details are saved to the store (a small JSON file per node)
SAVE_EVERY_S = 10.0

log = logging.getLogger(__name__)


def rank_details(node_id: str, gang: NodeGang, gpus: int = 0) -> dict[str, Any]:
    """The heartbeat details of one node's ranks (the shape ``engine.rank.view`` reads); ``gpus``: how many
    the node launch holds (the goodput ledger's GPU-seconds, engine.runtime.ledger)."""
    ranks = {
        str(launch.context.rank): proc.pid
        for launch, proc in zip(gang.ranks, gang.procs, strict=False)
        if launch.role is None
    }
    now = time.time()
    details: dict[str, Any] = {"node": node_id, "pids": gang.pids, "ranks": ranks, "progress": gang.progress()}
    details["gpus"] = gpus
    details.update(started=gang.started or None, at=now)
    details["summary"] = summary_line(rank_rows([details], now))
    return details


def _folder(store: ArtifactStore, run_id: str) -> str:
    return "/".join([store.root, "ranks", run_id])


def save_ranks(store: ArtifactStore, run_id: str, call: str, attempt: int, node_rank: int, details: Any) -> None:
    """Keep a finished node launch's last details (``<root>/ranks/<run>/<call>.attempt<a>.node<k>.json``)."""
    folder = _folder(store, run_id)
    if store.local:
        store.fs.makedirs(folder, exist_ok=True)
    store.fs.pipe_file(f"{folder}/{call}.attempt{attempt}.node{node_rank}.json", json.dumps(details).encode())


class RankSaver:
    """Saves one node launch's details to the store: at most every ``SAVE_EVERY_S`` while it runs, and at its
    end. A store that cannot be written costs only the per-rank view: logged once, never raised."""

    def __init__(self, store: ArtifactStore, run_id: str, call: str, attempt: int, node_rank: int) -> None:
        self.where = (store, run_id, call, attempt, node_rank)
        self.next_at = time.monotonic() + SAVE_EVERY_S
        self.warned = False

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def save(self, details: Any) -> None:
        self.next_at = time.monotonic() + SAVE_EVERY_S
        try:
            save_ranks(*self.where, details)
        except Exception as exc:
            if not self.warned:
                self.warned = True
                log.warning("could not save the rank reports of %s: %s", self.where[2], exc)


def attempt_ranks(store: ArtifactStore, run_id: str, call: str) -> dict[int, list[dict[str, Any]]]:
    """The saved details of each node of each attempt of a distributed task call, by attempt."""
    folder = _folder(store, run_id)
    if not store.fs.exists(folder):
        return {}
    found: dict[int, list[dict[str, Any]]] = {}
    for path in store.fs.ls(folder, detail=False):
        name = str(path).rsplit("/", 1)[-1]
        head, _, tail = name.removesuffix(".json").rpartition(".attempt")
        attempt, _, node = tail.partition(".node")
        if head != call or not attempt.isdigit() or not node.isdigit():
            continue
        try:
            with store.fs.open(path, "rb") as handle:
                details = json.loads(handle.read())
        except (OSError, ValueError):  # half-written by an agent that died: the others still count
            continue
        if isinstance(details, dict):
            found.setdefault(int(attempt), []).append(details)
    return found


def last_attempt_ranks(store: ArtifactStore, run_id: str, call: str) -> tuple[int, list[dict[str, Any]]] | None:
    """The saved details of each node of a distributed task call's last attempt: (attempt, details per
    node), or None when none were saved (a gang that never started, or ran on an older agent)."""
    found = attempt_ranks(store, run_id, call)
    if not found:
        return None
    last = max(found)
    return last, found[last]


def _steps(values: Any) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def attempt_steps(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """What one attempt's saved details say of it: ``first_step`` (the lowest first step any rank reported),
    ``last_step`` (the highest last report), ``started_at`` and ``ended_at`` (epoch seconds: the earliest
    start of a node's ranks, the latest details; an agent that died mid-attempt saved its last ones earlier).
    None where no node says (no report, or an agent from before these keys)."""
    firsts, lasts, starts, ends = [], [], [], []
    for details in nodes:
        progress = details.get("progress")
        reports = [r for r in progress.values() if isinstance(r, dict)] if isinstance(progress, dict) else []
        firsts += _steps(r.get("first_step") for r in reports)
        lasts += _steps(r.get("step") for r in reports)
        starts += [v for v in [details.get("started")] if isinstance(v, int | float) and v]
        ends += [v for v in [details.get("at")] if isinstance(v, int | float) and v]
    return {
        "first_step": min(firsts) if firsts else None,
        "last_step": max(lasts) if lasts else None,
        "started_at": min(starts) if starts else None,
        "ended_at": max(ends) if ends else None,
    }


def merge_attempts(
    recorded: list[dict[str, Any]], saved: dict[int, list[dict[str, Any]]], status: str
) -> list[dict[str, Any]]:
    """A distributed task call's attempts, oldest first: how each ended as its gang recorded it (``recorded``:
    its attempt list, or the failed ones its failure names), with the steps its node agents saved (``saved``,
    :func:`attempt_ranks`), which also give the times where the gang's own record cannot be read. An attempt
    only the agents saw, last of a finished call, ended as the call did (``status``); an earlier one with no
    record has no cause (``ended`` None)."""
    by_attempt = {int(a["attempt"]): dict(a) for a in recorded if isinstance(a.get("attempt"), int)}
    numbers = sorted(set(by_attempt) | set(saved))
    out: list[dict[str, Any]] = []
    for number in numbers:
        entry = by_attempt.get(number) or {"attempt": number, "kind": None, "ended": None, "reason": None}
        steps = attempt_steps(saved.get(number, []))
        for key in ("started_at", "ended_at"):
            if entry.get(key) is None:
                entry[key] = steps[key]
        begin, end = entry["started_at"], entry["ended_at"]
        if entry.get("duration_s") is None and begin and end and entry.get("kind") != "running":
            entry["duration_s"] = round(end - begin, 3)
        entry["first_step"], entry["last_step"] = steps["first_step"], steps["last_step"]
        entry["ledger"] = attempt_ledger(entry, saved.get(number, []))
        if entry.get("ended") is None and entry.get("reason"):
            entry["ended"] = entry["reason"]
        if entry.get("kind") is None and number == numbers[-1] and status in ("completed", "cancelled", "failed"):
            entry["kind"] = entry["ended"] = entry.get("ended") or status
        entry.setdefault("duration_s", None)
        out.append(entry)
    return out
