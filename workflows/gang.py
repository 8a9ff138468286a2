"""GangTask: one distributed task call, run as a gang of rank processes on the nodes the Scheduler gives.

Each attempt: request a placement → reserve a fresh rendezvous port on node rank 0 → start one activity
per node on that node's own queue (``node/<id>``) → wait; the first failure stops every other node's
ranks → give the placement back (always, also when cancelled). Rank 0's encoded result is the result.

A node that died is found fast: when one node's ranks fail (the survivors of a lost peer see their
collective break within a fraction of a second), every node still running is **probed** with a tiny
activity on its own queue. A node agent answers within a second; one that does not is declared lost at
once, without waiting for its heartbeat timeout, and the gang does not wait for it to confirm its ranks
stopped (a dead machine never confirms). A node whose activity timed out but whose agent answers the
probe (it was restarted) is not reported lost.

When an attempt fails, the failure is classified (workflows.gang_failures). A *system* failure (a node
lost: probe, heartbeat or schedule-to-start timeout; a rank killed by a signal; a hung gang) spends the
restart budget (``max_restarts``): lost nodes are reported to the Scheduler, and every rank is relaunched on
a new placement with ``GANGFLOW_ATTEMPT`` + 1 and the same checkpoint folder. A *user* error (an exception
in the task body) is retried only as far as the task's retry policy says (attempts, backoff capped at
``max_interval``, ``non_retryable`` types; type mismatches never). The budget and the attempt list live
in workflow state, so they survive any crash of workers or server.

A *preemption* (the Scheduler needs the placement for another gang, or a node is drained) is neither: the
gang's node agents get a notice (``NOTICE``, workflows.gang_notice), the ranks checkpoint and exit (the GPUs
are released at once) or are killed when the grace ends (the task's ``preemption_grace`` where shorter than
the Scheduler's notice, else the cluster's), and the gang queues again at its own priority, with
``GANGFLOW_ATTEMPT`` + 1 and the same checkpoint folder. No restart or retry is spent. A failure reported
before the notice went out stays a failure; after it, the attempt is a preemption whatever the ranks' exit
codes say (a node lost meanwhile is still reported lost).

The node activities get no retries from Temporal (``maximum_attempts=1``): a retry would be queued on
the same node's queue, which may belong to a dead machine. This workflow owns every retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType, ActivityHandle

from engine.core.gang import NodeLaunch, notice_of, notice_payload
from engine.core.protocol import (
    ATTEMPTS_MEMO,
    GANG_PROGRESS_SIGNAL,
    GANG_TYPE,
    LEGACY_GANG_TYPE,
    NODE_LOST_SIGNAL,
    NOTICE,
    PENDING_SIGNAL,
    PING,
    PLACEMENT_SIGNAL,
    PREEMPT_SIGNAL,
    REJECTED_SIGNAL,
    RELEASE_SIGNAL,
    REMOTE_COMMAND,
    RESERVE_PORT,
    RUN_RANKS,
    SCHEDULER_ID,
    STATUS_QUERY,
    SUBMIT_SIGNAL,
    node_queue,
)
from engine.core.wire import Envelope
from engine.scheduling import NodeAssignment, Placement, Preempted
from engine.scheduling.lost_work import gpu_minutes
from workflows.gang_checkpoint import CheckpointTeller, checkpoint_of
from workflows.gang_failures import AttemptFailed, Verdict, attempt_record, classify, finish_record
from workflows.gang_ledger import tell_ledger
from workflows.gang_notice import PreemptedAttempt, preempted_outcome, waiting_because
from workflows.gang_spec import GangSpec, gang_request, no_scheduler
from workflows.glance import GangTeller, progress_of

__all__ = ["PROBE_TIMEOUT", "GangTask", "LegacyGangRun"]

#: how long a probed node agent has to answer before it is declared lost
PROBE_TIMEOUT = timedelta(seconds=1)
#: the node agents kill ranks at the grace deadline themselves; GangTask stops waiting this much later (a node
#: agent that cannot kill them is gone: its activity is cancelled, and its heartbeat timeout reports it)
NOTICE_BACKSTOP_S = 15.0
#: while ranks save, the current-details line is refreshed this often ("38 s of 120 s grace")
NOTICE_REFRESH_S = 10.0
#: GangTasks recorded before preemption notices stop their ranks at once when preempted (workflow.patched)
NOTICE_PATCH = "preemption-notice"
#: GangTasks recorded before the platform worker kept the Scheduler running failed at once without one
SUBMIT_PATCH = "submit-waits-for-scheduler"
#: while no Scheduler runs, the submit is tried again this often (the platform worker checks every 10 s)
SUBMIT_RETRY_S = 5.0
#: GangTasks recorded before their attempt list was kept in their memo (``gangflow_attempts``) upsert none
ATTEMPTS_PATCH = "attempts-memo"
#: GangTasks recorded before this took the task's preemption_grace even when longer than the notice's grace
GRACE_PATCH = "grace-capped-by-notice"


def _record(order: list[int], index: int, _: object) -> None:
    order.append(index)


def _rank_map(nodes: list[NodeAssignment], nproc_per_node: int, run_id: str) -> str:
    """The Web UI's current details of a running attempt: which ranks run where (markdown). Their pids and
    reports reach the node activities' heartbeats only, never this workflow: the UI shows them there."""
    lines = ["", "", "| node | node rank | ranks |", "|---|---|---|"]
    for node in nodes:
        first = node.node_rank * nproc_per_node
        ranks = str(first) if nproc_per_node == 1 else f"{first}–{first + nproc_per_node - 1}"
        lines.append(f"| {node.node_id} | {node.node_rank} | {ranks} |")
    lines += [
        "",
        "Each rank's pid, last step, loss and report age: the *summary* in the heartbeat details of this "
        f"gang's pending activities, or `gangflow status {run_id}`.",
    ]
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


@workflow.defn(name=GANG_TYPE, sandboxed=False)
class GangTask:
    def __init__(self) -> None:
        self.placement: Placement | None = None
        self.flavor: str | None = None  # the flavor of the placement (Admitted.flavor), None without flavors
        self.rejected: str | None = None
        self.pending: str | None = None
        self.phase = "submitted"
        self.attempts: list[dict[str, Any]] = []  # one entry per attempt (workflows.gang_failures attempt_record)
        self.restarts = 0
        self.remote: dict[str, list[str]] = {}  # "<attempt>/<node rank>" -> command
        self.preempt: Preempted | None = None  # the Scheduler's notice while this gang holds a placement
        self.preemptions = 0
        #: the notice as the ranks got it (with the grace that applies and when), while they stop
        self.noticed: dict[str, Any] | None = None
        self.requeued: str | None = None  # why a preempted gang waits again, until it is placed
        self.call, self.attempt, self.max_restarts, self.ended = "", 0, 0, ""
        self.progress: dict[str, Any] | None = None  # the ranks' last step, as node rank 0's agent told it
        self.teller = GangTeller()  # its current details, and its run's (workflows.glance)
        self.checkpoints = CheckpointTeller()  # what the Scheduler hears of its checkpoints (.gang_checkpoint)

    # A signal handler that raises fails the workflow task again and again: every payload is checked
    # here, and a malformed one is logged and dropped.
    @workflow.signal(name=PLACEMENT_SIGNAL)
    def on_placement(self, placement: Any) -> None:
        try:
            # the flavor it was admitted on rides beside the placement (only when the queue file names flavors)
            flavor = placement.get("flavor") if isinstance(placement, dict) else None
            fields = {k: v for k, v in placement.items() if k != "flavor"} if isinstance(placement, dict) else placement
            self.placement = Placement.model_validate(fields)
            self.flavor = flavor if isinstance(flavor, str) else None
        except (ValidationError, TypeError, ValueError) as exc:
            workflow.logger.warning("ignoring a malformed placement %r: %s", placement, exc)

    @workflow.signal(name=REJECTED_SIGNAL)
    def on_rejected(self, reason: Any) -> None:
        self.rejected = reason if isinstance(reason, str) else f"rejected by the scheduler: {reason!r}"

    @workflow.signal(name=PENDING_SIGNAL)
    def on_pending(self, reason: Any) -> None:
        if isinstance(reason, str):
            self.pending = reason
            self._say(f"waiting: {self.requeued}; {reason}" if self.requeued else reason)

    @workflow.signal(name=PREEMPT_SIGNAL)
    def on_preempt(self, notice: Any) -> None:
        # Only a gang holding a placement can be preempted; a notice that crosses the gang's own release
        # (it failed or finished meanwhile) concerns a placement it no longer has, and is dropped.
        if self.placement is None or self.preempt is not None:
            return
        read = notice_of(notice, workflow.info().workflow_id)
        if read is None:
            workflow.logger.warning("ignoring a malformed preemption notice %r", notice)
            return
        self.preempt = read

    @workflow.signal(name=GANG_PROGRESS_SIGNAL)
    def on_progress(self, payload: Any) -> None:
        progress = progress_of(payload)
        if progress is None or progress["attempt"] != self.attempt or self.placement is None:
            return  # malformed, or a late report of an attempt that has ended
        self.progress = progress
        self.teller.show(self._glance())
        ckpt = checkpoint_of(payload)
        if ckpt is not None and self.attempts:  # a new durable checkpoint: the Scheduler costs victims by it
            placed = self.attempts[-1]["started_at"]
            self.checkpoints.tell(workflow.info().workflow_id, self.attempt, placed, ckpt)

    @workflow.signal(name=REMOTE_COMMAND)
    def on_remote_command(self, payload: Any) -> None:
        try:
            attempt, node_rank, command = int(payload["attempt"]), int(payload["node_rank"]), payload["command"]
            if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
                raise TypeError("command must be a list of strings")
        except (KeyError, TypeError, ValueError) as exc:
            workflow.logger.warning("ignoring a malformed remote command %r: %s", payload, exc)
            return
        self.remote[f"{attempt}/{node_rank}"] = command

    @workflow.query(name=REMOTE_COMMAND)
    def remote_command(self, attempt: int, node_rank: int) -> list[str] | None:
        return self.remote.get(f"{attempt}/{node_rank}")

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "pending": self.pending,
            "attempt": self.attempt,
            "max_restarts": self.max_restarts,
            "progress": self.progress,
            "placement": self.placement.model_dump(mode="json") if self.placement else None,
            "restarts": self.restarts,
            "preemptions": self.preemptions,
            "preemption": self.noticed,
            "failed_attempts": self._failed(),
            "attempts": self.attempts,
            "flavor": self.flavor,
        }

    def _failed(self) -> list[dict[str, Any]]:
        return [a for a in self.attempts if a["kind"] in ("preempted", "system", "user")]

    def _ended(self, record: dict[str, Any], at: datetime, kind: str, reason: str, ended: str | None = None) -> None:
        """End the attempt's record at ``at``, and keep the list in the memo where a finished gang's status reads
        it without a worker to answer a query (gangs recorded before it replay without the upsert)."""
        finish_record(record, kind, reason, at, ended)
        if workflow.patched(ATTEMPTS_PATCH):
            workflow.upsert_memo({ATTEMPTS_MEMO: self.attempts})

    def _say(self, text: str, more: str = "", *, tell: bool = True) -> None:
        """``tell``: whether the run hears of it too (not of a phase that lasts a moment: each is 4 events there)."""
        self.phase = text
        self.teller.show(self._glance(), more, tell=tell)

    def _glance(self) -> dict[str, Any]:
        """What the run's current details and ``gangflow status`` show of this gang (engine.core.glance)."""
        return {
            "call": self.call,
            "phase": self.phase,
            "placed": self.placement is not None,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "max_restarts": self.max_restarts,
            "progress": self.progress,
            "ended": self.ended,
            # only with flavors: a state without one is what it was before (the run's details, replayed)
            **({"flavor": self.flavor} if self.flavor is not None else {}),
        }

    @workflow.run
    async def run(self, spec: GangSpec, envelope: bytes) -> bytes:
        gang_id = workflow.info().workflow_id
        scheduler = workflow.get_external_workflow_handle(SCHEDULER_ID)
        retry = spec.retry
        user_failures = 0
        attempt = 0
        self.call, self.max_restarts = spec.call, spec.max_restarts
        while True:
            self.attempt, self.progress = attempt, None
            placement = await self._place(spec, scheduler)
            nodes = [n.node_id for n in sorted(placement.nodes, key=lambda n: n.node_rank)]
            record = attempt_record(attempt, nodes, workflow.now(), self.flavor)
            self.attempts.append(record)
            failure: AttemptFailed | None = None
            preempted: PreemptedAttempt | None = None
            result: bytes | None = None
            try:
                result = await self._attempt(spec, envelope, placement, attempt)
            except AttemptFailed as failed:
                failure = failed
            except PreemptedAttempt as notice:
                preempted = notice
            finally:
                # The attempt ends now, not after the signals below: the Scheduler may place the next gang on
                # these GPUs before a signal's completion comes back (a read of the time, no command: replays).
                let_go = workflow.now()
                # Always hand the GPUs back (also when this run is being cancelled), after reporting
                # lost nodes so the Scheduler never offers them again.
                lost = failure.lost_nodes if failure else preempted.lost_nodes if preempted else []
                for node_id in lost:
                    await scheduler.signal(NODE_LOST_SIGNAL, node_id)
                await scheduler.signal(RELEASE_SIGNAL, gang_id)
                self.noticed = None
                if preempted is not None:
                    reason = f"{preempted.summary}: {preempted.outcome}" if preempted.outcome else preempted.summary
                    self._ended(record, let_go, "preempted", reason, preempted.summary)
                elif failure is not None:
                    self._ended(record, let_go, "system" if failure.system else "user", failure.reason)
                elif result is not None:
                    self._ended(record, let_go, "completed", "completed")
                else:  # the run is being cancelled (nothing else leaves _attempt without a result)
                    self._ended(record, let_go, "cancelled", "cancelled")
                await tell_ledger(spec, envelope, record)  # where its GPU-seconds went, for the cluster's goodput
            if result is not None:
                self.ended = "completed"
                self._say(f"completed attempt {attempt} on {', '.join(nodes)}", "")
                await self.teller.flush()
                return result
            if preempted is not None:
                # a preemption is the cluster's decision, not a failure: no restart or retry is spent, and the
                # gang queues again at its own priority (and its old place) to resume from its checkpoint
                self.preemptions += 1
                attempt += 1
                self.requeued = waiting_because(preempted.notice)
                continue
            if failure is None:  # pragma: no cover - _attempt returns, or raises one of the two
                raise ApplicationError("internal error: attempt ended without a result", non_retryable=True)
            kind = "system" if failure.system else "user"
            if failure.system:
                self.restarts += 1
                if self.restarts > spec.max_restarts:
                    raise ApplicationError(
                        self._summary(f"restart budget exhausted ({spec.max_restarts} restarts) after system failures"),
                        type="RestartBudgetExhausted",
                        non_retryable=True,
                    )
            else:
                user_failures += 1
                if not retry.retries(failure.error_type, user_failures):
                    if user_failures < spec.user_attempts:
                        why = f"{failure.error_type} is not retried"
                    else:
                        why = f"{spec.user_attempts} attempt(s) allowed by the task's retry policy"
                    raise ApplicationError(
                        self._summary(f"user error in the task body, not restarted ({why})"),
                        type="RankFailed",
                        non_retryable=True,
                    )
                await workflow.sleep(retry.delay(user_failures))
            attempt += 1
            self._say(f"restarting (attempt {attempt}) after {kind} failure: {_first_line(failure.reason)}")

    def _summary(self, headline: str) -> str:
        lines = [headline + ":"]
        failed = self._failed()
        lines += [f"  attempt {a['attempt']} [{a['kind']}] {_first_line(a['reason'])}" for a in failed]
        lines.append(f"last failure: {failed[-1]['reason']}")
        return "\n".join(lines)

    async def _submit_when_scheduled(self, scheduler: Any, request: dict[str, Any], spec: GangSpec) -> None:
        """No Scheduler runs (its worker restarts, an operator terminated it): the platform worker starts
        it again within seconds, so wait for it as for a lost node, up to ``lost_node_wait``."""
        deadline = workflow.now() + timedelta(seconds=spec.lost_node_wait_s)
        while True:
            self._say("waiting: no Scheduler is running yet (the platform's worker starts it); submitting again")
            await workflow.sleep(SUBMIT_RETRY_S)
            try:
                await scheduler.signal(SUBMIT_SIGNAL, request)
                return
            except Exception as exc:
                if workflow.now() >= deadline:
                    raise no_scheduler(spec) from exc

    async def _place(self, spec: GangSpec, scheduler: Any) -> Placement:
        gang_id = workflow.info().workflow_id
        self.placement, self.rejected, self.pending, self.preempt, self.flavor = None, None, None, None, None
        request = gang_request(spec, gang_id)
        # said before the submit: the Scheduler's answer (a pending reason) can arrive before the submit's own
        # acknowledgement, and must not be overwritten by this line
        if self.requeued:
            self._say(f"waiting: {self.requeued} (the next attempt resumes from the last checkpoint)")
        else:
            shape = f"{spec.shape.nnodes} node(s) × {spec.shape.nproc_per_node} rank(s)"
            self._say(f"waiting for a placement: {shape}", tell=False)  # (the Scheduler's reason follows if it waits)
        try:
            await scheduler.signal(SUBMIT_SIGNAL, request)  # a GangRequest, as the Scheduler reads it
        except Exception as exc:
            if not workflow.patched(SUBMIT_PATCH):
                raise no_scheduler(spec) from exc
            await self._submit_when_scheduled(scheduler, request, spec)
        try:
            await workflow.wait_condition(lambda: self.placement is not None or self.rejected is not None)
        except asyncio.CancelledError:
            await scheduler.signal(RELEASE_SIGNAL, gang_id)  # withdraw the queued request
            raise
        if self.placement is None:
            await scheduler.signal(RELEASE_SIGNAL, gang_id)
            raise ApplicationError(self.rejected or "rejected", type="Unschedulable", non_retryable=True)
        self.requeued = None
        return self.placement

    async def _attempt(self, spec: GangSpec, envelope: bytes, placement: Placement, attempt: int) -> bytes:
        run = Envelope.decode(envelope).run
        nodes = sorted(placement.nodes, key=lambda n: n.node_rank)
        where = ", ".join(n.node_id for n in nodes)
        self._say(f"attempt {attempt}: starting on {where}", tell=False)
        try:
            port: int = await workflow.execute_activity(
                RESERVE_PORT,
                task_queue=node_queue(nodes[0].node_id),
                result_type=int,
                start_to_close_timeout=timedelta(seconds=10),
                schedule_to_close_timeout=timedelta(seconds=spec.heartbeat_timeout_s + 5),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise  # the run is being cancelled while the port is reserved: nothing runs yet
            verdict = classify(err, nodes[0].node_id)
            reason = verdict.reason if verdict else f"node {nodes[0].node_id} did not reserve a port: {err}"
            raise AttemptFailed(True, reason, [nodes[0].node_id]) from err
        if self.preempt is not None:  # preempted while the port was reserved: start nothing
            raise PreemptedAttempt(self.preempt, outcome="no rank had started")
        checkpoint_dir = f"{run.artifacts}/checkpoints/{run.run_id}/{spec.checkpoint_key}"
        handles: list[ActivityHandle[bytes]] = []
        for node in nodes:
            launch = NodeLaunch(
                gang_id=workflow.info().workflow_id,
                task=spec.task,
                node_id=node.node_id,
                node_rank=node.node_rank,
                nnodes=spec.shape.nnodes,
                nproc_per_node=spec.shape.nproc_per_node,
                gpu_ids=list(node.gpu_ids),
                cpus_per_node=spec.shape.cpus_per_node,
                master_addr=nodes[0].address,
                master_port=port,
                attempt=attempt,
                checkpoint_dir=checkpoint_dir,
                log_name=spec.files_key,
                hang_timeout_s=spec.hang_timeout_s,
                hosts=[n.node_id for n in nodes],
            )
            handles.append(
                workflow.start_activity(
                    RUN_RANKS,
                    args=[launch, envelope],
                    task_queue=node_queue(node.node_id),
                    result_type=bytes,
                    start_to_close_timeout=timedelta(seconds=spec.timeout_s),
                    # a node that never picks its work up is as lost as one that stops heartbeating
                    schedule_to_start_timeout=timedelta(seconds=max(30.0, spec.heartbeat_timeout_s)),
                    heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout_s),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"{spec.task} attempt {attempt}: ranks on {node.node_id} (node rank {node.node_rank})",
                )
            )
        self._say(
            f"attempt {attempt}: {spec.shape.nnodes * spec.shape.nproc_per_node} ranks running on {where}",
            _rank_map(nodes, spec.shape.nproc_per_node, run.run_id),
        )
        finished: list[int] = []  # node indexes in the order their activities ended (deterministic on replay)
        for index, handle in enumerate(handles):
            handle.add_done_callback(functools.partial(_record, finished, index))
        lost: set[str] = set()
        notice = asyncio.ensure_future(self._preempted(handles))
        try:
            await workflow.wait([*handles, notice], return_when=asyncio.FIRST_EXCEPTION)
            if all(h.done() and h.exception() is None for h in handles):
                return handles[0].result()
            failed_first = any(h.done() and h.exception() is not None for h in handles)
            if notice.done() and self.preempt is not None and not failed_first:
                if not workflow.patched(NOTICE_PATCH):  # preempted before notices existed: replays as it ran
                    await self._stop(handles, nodes, set())
                    raise PreemptedAttempt(self.preempt)
                lost = await self._honour(spec, handles, nodes, attempt)
                if all(h.done() and h.exception() is None for h in handles):
                    return handles[0].result()  # every rank had finished before the notice reached it
                raise PreemptedAttempt(self.preempt, sorted(lost), preempted_outcome(handles, lost))
            # Stop the survivors first, then judge: the root cause (a node that vanished, a rank killed
            # from outside) often reports after its peers' collective errors ("connection closed by peer").
            self._say(f"attempt {attempt}: a rank failed; probing the other nodes and stopping their ranks", tell=False)
            lost = await self._probe([n.node_id for n, h in zip(nodes, handles, strict=True) if not h.done()])
        finally:
            notice.cancel()
            if notice.done() and not notice.cancelled():
                notice.exception()  # retrieved: asyncio would otherwise log it as never retrieved
            await self._stop(handles, nodes, lost)  # on success a no-op; on cancel, also stop every rank
        verdicts: list[Verdict] = [
            Verdict(node_id, True, f"node {node_id} lost (its agent did not answer a probe after a peer failed)", True)
            for node_id in sorted(lost)
        ]
        for index in finished:  # earliest failure first: it is the likely root cause among equals
            failure = handles[index].exception()
            verdict = classify(failure, nodes[index].node_id) if failure is not None else None
            if verdict is not None and verdict.node_id not in lost:
                verdicts.append(verdict)
        suspects = [v.node_id for v in verdicts if v.suspect]
        alive = set(suspects) - await self._probe(suspects)  # e.g. its agent was restarted meanwhile
        if not verdicts:  # every node reported cancellation: treat as lost contact
            raise AttemptFailed(True, "the gang's node activities were cancelled", [])
        system = [v for v in verdicts if v.system]
        root = system[0] if system else verdicts[0]
        lost_nodes = [v.node_id for v in verdicts if v.node_lost and v.node_id not in alive]
        raise AttemptFailed(bool(system), root.reason, lost_nodes, root.error_type)

    async def _honour(
        self, spec: GangSpec, handles: list[ActivityHandle[bytes]], nodes: list[NodeAssignment], attempt: int
    ) -> set[str]:
        """Give every node the preemption notice and wait until the ranks have left (each node agent kills
        them at the grace deadline), refreshing the current details meanwhile. Returns the nodes found lost
        while waiting: a node that dies during the grace period does not hold up the release."""
        notice = self.preempt
        if notice is None:  # pragma: no cover - only called once preempted
            return set()
        grace = notice.grace_s if spec.preemption_grace_s is None else spec.preemption_grace_s
        # the task's own grace never stretches a reclaim past the notice grace the Scheduler gave
        if grace > notice.grace_s and workflow.patched(GRACE_PATCH):
            grace = notice.grace_s
        started = workflow.now()
        # what the node agents get (and `gangflow status` shows): the notice, with the grace that applies
        self.noticed = notice_payload(notice, grace_s=grace, noticed_at=started.timestamp())
        gang_id = workflow.info().workflow_id
        head = f"attempt {attempt}: preempted ({notice.cause} by {notice.by_tenant or notice.by}"
        head += f", costs {gpu_minutes(notice.cost_gpu_s)})" if notice.cost_gpu_s is not None else ")"
        sends = [
            workflow.start_activity(
                NOTICE,
                args=[gang_id, attempt, self.noticed],
                task_queue=node_queue(node.node_id),
                schedule_to_close_timeout=timedelta(seconds=max(10.0, spec.heartbeat_timeout_s)),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"preemption notice to {node.node_id}",
            )
            for node, handle in zip(nodes, handles, strict=True)
            if not handle.done()
        ]
        lost: set[str] = set()

        def waiting() -> list[str]:
            return [n.node_id for n, h in zip(nodes, handles, strict=True) if not h.done() and n.node_id not in lost]

        try:
            while waiting():
                elapsed = (workflow.now() - started).total_seconds()
                if elapsed >= grace + NOTICE_BACKSTOP_S:
                    break  # the finally of _attempt cancels what is left
                self._say(f"{head}: saving checkpoint, {elapsed:.0f} s of {grace:.0f} s grace")
                before = len(waiting())
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda before=before: len(waiting()) < before,  # type: ignore[misc]
                        timeout=min(NOTICE_REFRESH_S, grace + NOTICE_BACKSTOP_S - elapsed),
                    )
                still = waiting()
                if still and len(still) < len(nodes):  # some nodes are done: are the others still there?
                    lost |= await self._probe(still)
        finally:
            for send in sends:
                if not send.done():
                    send.cancel()
        for node, handle in zip(nodes, handles, strict=True):
            failure = handle.exception() if handle.done() else None
            verdict = classify(failure, node.node_id) if failure is not None else None
            if verdict is not None and verdict.node_lost:
                lost.add(node.node_id)
        return lost

    async def _preempted(self, handles: list[ActivityHandle[bytes]]) -> None:
        """Raises once the Scheduler preempts this gang, so that ``workflow.wait(FIRST_EXCEPTION)`` wakes up;
        returns when every node is done (FIRST_EXCEPTION also waits for this one to end)."""
        await workflow.wait_condition(lambda: self.preempt is not None or all(h.done() for h in handles))
        if self.preempt is not None and not all(h.done() for h in handles):
            raise PreemptedAttempt(self.preempt)

    async def _probe(self, node_ids: list[str]) -> set[str]:
        """The nodes whose agent does not answer a ping within PROBE_TIMEOUT (declared lost)."""

        async def silent(node_id: str) -> bool:
            try:
                await workflow.execute_activity(
                    PING,
                    task_queue=node_queue(node_id),
                    schedule_to_close_timeout=PROBE_TIMEOUT,
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    summary=f"probe {node_id}",
                )
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                return True
            return False

        answers = await asyncio.gather(*(silent(node_id) for node_id in node_ids))
        return {node_id for node_id, no_answer in zip(node_ids, answers, strict=True) if no_answer}

    async def _stop(self, handles: list[ActivityHandle[bytes]], nodes: list[NodeAssignment], lost: set[str]) -> None:
        """Cancel every node's ranks and wait until each node agent still alive confirms they are gone."""
        for handle in handles:
            if not handle.done():
                handle.cancel()
        waited = [h for h, n in zip(handles, nodes, strict=True) if n.node_id not in lost]
        await asyncio.gather(*waited, return_exceptions=True)


@workflow.defn(name=LEGACY_GANG_TYPE, sandboxed=False)
class LegacyGangRun(GangTask):
    """GangTask under its old type name, for the gangs started before the rename (and by runs in flight
    then, which keep starting this type): the same code, so their histories replay unchanged."""

    @workflow.run
    async def run(self, spec: GangSpec, envelope: bytes) -> bytes:
        return await super().run(spec, envelope)
