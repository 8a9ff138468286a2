"""The recorded histories and the code bundles they need: layout, scenario list and bundle install.

Shared by ``record.py`` (which writes them) and ``tests/test_replay.py`` (which replays them):

    tests/histories/<scenario>/<workflow-id>.json     one per workflow execution of the scenario
    tests/histories/<scenario>/<workflow-id>~<n>.json  the n-th run (1 = first) when a workflow id has
                                                       several (the Scheduler's continue-as-new runs)
    tests/histories/bundles/<sha256>.zip               each code bundle the histories reference, once

A replay runs the *current* workflow code (workflows/) on each recorded history; the user's own code
comes from the bundle the run was pinned to, installed where the worker's loader finds an extracted
bundle (the local cache of the store the bundle's URI points into, see engine.artifacts.loader.install_bundle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from engine.artifacts.loader import install_bundle
from engine.core.protocol import TenantRoute
from engine.core.wire import CodeRef, Envelope

__all__ = [
    "BUNDLES",
    "HERE",
    "SCENARIOS",
    "Recorded",
    "bundle_refs",
    "code_refs",
    "install_bundles",
    "recorded",
    "workflow_id_of",
]

HERE = Path(__file__).resolve().parent
BUNDLES = HERE / "bundles"

#: every scenario record.py knows, with what it exercises (the replay test checks each was recorded)
SCENARIOS: dict[str, str] = {
    "quickstart": "examples/quickstart.py: plain tasks, Directory/File results, a retrain branch",
    "ddp_pipeline": "examples/ddp_pipeline.py: a 2 × 2 PyTorch DDP gang between plain tasks",
    "jax_pipeline": "examples/jax_pipeline.py: a 2-process JAX gang",
    "xgboost_pipeline": "examples/xgboost_pipeline.py: a 2-worker XGBoost gang",
    "mpi_pipeline": "examples/mpi_pipeline.py: an MPI gang (remote commands relayed through GangTask)",
    "resilient_training": "examples/resilient_training.py: a checkpointing DDP gang, no failure",
    "child_workflows": "a workflow calling a child workflow of lightweight (local activity) tasks",
    "node_loss": "a node agent SIGKILLed mid-gang: node lost, new placement, resume from checkpoint",
    "rank_kill": "one rank SIGKILLed mid-gang: system failure, restart of every rank",
    "cancel_task": "a run cancelled while a plain task runs",
    "cancel_gang": "a run cancelled while its gang runs (ranks stopped, GPUs released)",
    "user_error_task": "an exception in a plain task fails the run",
    "user_error_rank": "an exception in one rank fails the gang without a restart",
    "task_retries": "a plain task that fails twice, then succeeds under its retry policy",
    "worker_lost": "the worker SIGKILLed mid-task: the task is started again (worker lost, not a retry)",
    "reclaim": "two tenants: team-a borrows, team-b reclaims (a gang preempted, resumed from its checkpoint)",
    "drain": "a node drained under a gang: preemption notice, checkpoint at the notice, resumed on the other node",
    "scheduler_continue_as_new": "two gangs while the Scheduler continues as new every few events",
    "cached": "examples/cached_pipeline.py with cache=True tasks: a filling run, an all-hit run, a run where one "
    "input changed (a hit, then misses recorded), and a run with the cache skipped",
    "map": "examples/map_pipeline.py: engine.map in 3 chunks with one failed item, a map of lightweight tasks, and "
    "a run cancelled mid-map",
    "waits": "examples/approval_pipeline.py: an input and an approval answered, an approval rejected, an input "
    "timed out",
    "scheduled": "examples/scheduled_report.py started by a Temporal schedule (the run takes its own id)",
    "node_lease": "node leases: a node reported lost by a gang while its lease lives (the lease pings the agent "
    "and registers it again), then its agent SIGKILLed (the lease times out and reports it lost)",
    "isolated": "the isolated layout: team-a's runs in gf-team-a, their gangs in gangflow-system through Nexus "
    "(one completes, one is cancelled while its ranks run)",
}

#: scenarios recorded in the isolated layout (record.py's ``isolated=True``)
ISOLATED = frozenset({"isolated"})

_SCANNED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "workflow_execution_started_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity_task_scheduled_event_attributes",
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: (
        "start_child_workflow_execution_initiated_event_attributes"
    ),
}


@dataclass(frozen=True)
class Recorded:
    scenario: str
    path: Path

    @property
    def workflow_id(self) -> str:
        return workflow_id_of(self.path)

    @property
    def test_id(self) -> str:
        return f"{self.scenario}/{self.path.stem}"

    def history(self) -> WorkflowHistory:
        return WorkflowHistory.from_json(self.workflow_id, self.path.read_text())

    def route(self) -> TenantRoute | None:
        """A user run recorded in the isolated layout replays on a tenant's worker: that worker's tenant and
        root, which the recording's client named too (a worker's are pinned; the bundle lies under them)."""
        if self.scenario not in ISOLATED:
            return None
        first = next(_envelopes(WorkflowHistory(self.workflow_id, self.history().events[:1])), None)
        if first is None:  # the Scheduler or a GangTask: the platform's
            return None
        return TenantRoute(first.run.tenant, first.run.artifacts)


def workflow_id_of(path: Path) -> str:
    """A history file's workflow id: ``~N`` numbers the runs of one id, ``+`` stands for ``/`` (node leases)."""
    return path.stem.split("~", 1)[0].replace("+", "/")


def recorded(root: Path = HERE) -> list[Recorded]:
    """Every recorded history, in a stable order."""
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name in SCENARIOS):
        found += [Recorded(folder.name, path) for path in sorted(folder.glob("*.json"))]
    return found


def _envelopes(history: WorkflowHistory) -> Iterator[Envelope]:
    """The gangflow envelopes (workflow starts, task calls, gang launches) among a history's inputs."""
    for event in history.events:
        field = _SCANNED.get(event.event_type)
        if field is None:
            continue
        for payload in getattr(event, field).input.payloads:
            if payload.metadata.get("encoding") != b"binary/plain":
                continue
            try:
                yield Envelope.decode(payload.data)
            except Exception:  # another bytes argument, not an envelope
                continue


def code_refs(history: WorkflowHistory) -> set[CodeRef]:
    """The code of every workflow and task call in the history."""
    return {e.code for e in _envelopes(history)}


def bundle_refs(history: WorkflowHistory) -> dict[str, str]:
    """sha256 → URI of every code bundle the history's runs and task calls were pinned to."""
    return {ref.bundle_sha: ref.bundle for ref in code_refs(history) if ref.bundle_sha and ref.bundle}


def install_bundles(refs: dict[str, set[str]], source: Path = BUNDLES) -> None:
    """Extract the saved bundles (sha → the URIs the histories name them by) where the worker's loader finds an
    extracted bundle before fetching it from the artifact store (gone since the recording): the local cache of
    the store each URI points into (``$GANGFLOW_CACHE``, set by the caller)."""
    missing = sorted(sha for sha in refs if not (source / f"{sha}.zip").is_file())
    if missing:
        raise FileNotFoundError(
            f"code bundle(s) {', '.join(s[:12] for s in missing)} referenced by the recorded histories are not in "
            f"{source}: record again with 'python tests/histories/record.py'"
        )
    for sha, uris in sorted(refs.items()):
        data = (source / f"{sha}.zip").read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            raise ValueError(f"{source / sha}.zip is corrupt: its sha256 is not its name")
        for uri in sorted(uris):
            install_bundle(uri, data)
