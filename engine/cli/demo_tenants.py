"""``gangflow demo --tenants``: a reclaim, live, on the demo's throwaway stack (2 node agents × 2 GPU slots).

Team-a borrows the whole cluster with two runs of examples/multitenant.py, team-b submits one and takes its
quota back: a team-a gang gets a preemption notice, saves a checkpoint and releases its GPUs, team-b trains,
and the team-a gang resumes from its checkpoint and finishes. Every event is printed as it is seen (the
runs' GangTask status queries, the Scheduler's queue and the ranks' logs, polled), then the whole timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from engine.client import Client, load_workflow_file, prepare_run
from engine.core.definitions import WorkflowDefinition
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.scheduling.config import QueueConfig, QueueConfigError

from .common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, CliError, read_queue_file
from .render import console, err_console
from .render_queues import show_queues

__all__ = ["TENANTS_DEMO_TIMEOUT_S", "TenantsDemo"]

#: team-a's runs train long enough to still hold their GPUs when team-b arrives (after the policy's
#: min_runtime); team-b's run is shorter, so the whole demo takes about a minute on a 2-core machine
TEAM_A_RUN: dict[str, Any] = {"steps": 200, "checkpoint_every": 10, "step_seconds": 0.1}
TEAM_B_RUN: dict[str, Any] = {"steps": 80, "checkpoint_every": 10, "step_seconds": 0.1}
#: (run id prefix, tenant, inputs): team-a's two runs start first, team-b's once they train
_RUNS = (("a1", "team-a", TEAM_A_RUN), ("a2", "team-a", TEAM_A_RUN), ("b1", "team-b", TEAM_B_RUN))
#: the demo gives up (exit 1, saying what each run was doing) after this long
TENANTS_DEMO_TIMEOUT_S = 300.0
_POLL_S = 0.3
_STARTS = re.compile(r"attempt (\d+): rank 0 starts at step (\d+)")  # examples/multitenant.py's own lines
_SAVED = re.compile(r"saved step (\d+)")
_PREEMPTED_BY = re.compile(r"preempted by (\S+) of (\S+) \((\w+)\)")  # a preempted attempt's reason


@dataclass
class _Run:
    tenant: str
    envelope: Envelope
    started: bool = False
    attempt: int = 0  # the GangTask's attempt now (each preemption starts the next)
    held: list[dict[str, Any]] | None = None  # the placement of this attempt, once admitted
    admitted_at: Any = None  # when the Scheduler admitted it (its clock): tells this placement from the last
    training: bool = False  # this attempt's ranks started their loop
    noticed_at: float | None = None  # when this attempt's preemption notice went out (epoch s)
    phase: str = ""  # the GangTask's phase, last seen
    waiting: str = ""  # the last pending reason reported
    result: Any = None
    error: str | None = None
    done: bool = False
    waiter: asyncio.Task[Any] | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.envelope.run.run_id

    @property
    def gang_id(self) -> str:
        return f"{self.run_id}.train-1"

    def gpus(self) -> int:
        return sum(len(n.get("gpu_ids") or []) for n in self.held or [])


class TenantsDemo:
    """What ``gangflow demo --tenants`` runs, prepared (validated and packed) before any process starts."""

    def __init__(self, queues: QueueConfig, defn: WorkflowDefinition, runs: list[_Run]) -> None:
        self.queues, self.defn, self.runs = queues, defn, runs
        self.timeline: list[tuple[float, str, str, str]] = []
        self.t0 = time.monotonic()

    @property
    def artifacts(self) -> str:
        return self.runs[0].envelope.run.artifacts

    @classmethod
    def prepare(cls, queues_file: Path, example: Path, artifacts: str) -> TenantsDemo:
        """Bad input (a broken queue file or example) ends the command with exit 2 before anything starts."""
        queues = read_queue_file(str(queues_file))
        tenants = {t.name for t in queues.tenants}
        if not {"team-a", "team-b"} <= tenants:
            raise CliError(
                f"{queues_file}: the demo needs tenants team-a and team-b, it has {sorted(tenants)}", EXIT_BAD_INPUT
            )
        suffix = uuid.uuid4().hex[:6]
        try:
            defn = load_workflow_file(f"{example}:pipeline")
            runs = []
            for label, tenant, inputs in _RUNS:
                defn, envelope = prepare_run(
                    defn, inputs, artifacts=artifacts, run_id=f"{label}-{suffix}", tenant=tenant
                )
                runs.append(_Run(tenant, envelope))
        except GangflowError as exc:
            raise CliError(str(exc), EXIT_BAD_INPUT) from None
        return cls(queues, defn, runs)

    # -- running --------------------------------------------------------------------------------
    async def play(self, client: Client, ui_url: str | None = None) -> int:
        try:
            await client.apply_queues(self.queues)
        except (QueueConfigError, GangflowError) as exc:
            raise CliError(f"the queue configuration was not applied: {exc}") from None
        console.print("queue configuration applied: team-a and team-b, 2 GPUs each, in cohort research")
        if ui_url:
            console.print(f"watch it: {ui_url}/namespaces/default/workflows", soft_wrap=True)
        self.t0 = time.monotonic()
        try:
            return await self._play(client)
        finally:
            for run in self.runs:
                if run.waiter is not None:
                    run.waiter.cancel()

    async def _play(self, client: Client) -> int:
        team_a, team_b = self.runs[:2], self.runs[2]
        for run in team_a:
            await self._start(client, run, "submitted: needs 2 GPUs")
        deadline = self.t0 + TENANTS_DEMO_TIMEOUT_S
        while not all(r.done for r in self.runs):
            if time.monotonic() > deadline:
                return self._give_up(f"the runs did not finish within {TENANTS_DEMO_TIMEOUT_S:.0f} s")
            if not team_b.started:
                if any(r.done for r in team_a):  # too early: nothing left for team-b to reclaim
                    ended = ", ".join(r.run_id for r in team_a if r.done)
                    return self._give_up(f"team-a's {ended} ended before team-b was submitted")
                if all(r.training for r in team_a):  # both hold their GPUs: 2 of them are team-b's
                    await self._start(client, team_b, await self._borrowed(client))
            await self._poll(client)
            await asyncio.sleep(_POLL_S)
        return await self._finish(client)

    async def _start(self, client: Client, run: _Run, event: str) -> None:
        try:
            await client.start_prepared(self.defn, run.envelope)
        except GangflowError as exc:
            raise CliError(f"{run.run_id} of {run.tenant} did not start: {exc}") from None
        run.started = True
        run.waiter = asyncio.ensure_future(client.result(run.run_id, self.defn))
        self._event(run, event)

    async def _borrowed(self, client: Client) -> str:
        with contextlib.suppress(GangflowError, KeyError, AttributeError):
            borrowed = (await client.queues())["tenants"]["team-a"]["borrowed"].get("gpu", 0)
            return f"submitted: needs 2 GPUs, its quota; team-a borrows {borrowed:g} of them"
        return "submitted: needs 2 GPUs, its quota"

    async def _poll(self, client: Client) -> None:
        try:
            queue = await client.queue()
        except (RPCError, TemporalError):  # the Scheduler is continuing as new: next time
            queue = {}
        running = {g["gang_id"]: g for g in queue.get("running", [])}
        pending = {g["gang_id"]: g for g in queue.get("pending", [])}
        for run in self.runs:
            if not run.started or run.done:
                continue
            with contextlib.suppress(RPCError, TemporalError):
                await self._observe(client, run, running.get(run.gang_id), pending.get(run.gang_id))
            if run.waiter is not None and run.waiter.done():
                self._ended(run, run.waiter)

    async def _observe(
        self, client: Client, run: _Run, running: dict[str, Any] | None, pending: dict[str, Any] | None
    ) -> None:
        status = await client.gang(run.gang_id)
        run.phase = str(status.get("phase") or run.phase)
        # the GangTask's notice, or the Scheduler's decision about this attempt's placement (the Scheduler shows
        # the decision until the release reaches it, which may be after the GangTask said it released)
        ours = running is not None and run.held is not None and running.get("admitted_at") == run.admitted_at
        notice = status.get("preemption") or (running.get("preempted") if running and ours else None)
        if isinstance(notice, dict) and run.noticed_at is None:
            self._event(run, self._noticed(notice))
            run.noticed_at = notice.get("noticed_at") or notice.get("since") or time.time()
        attempts = status.get("failed_attempts") or []
        if len(attempts) > run.attempt:  # this attempt ended: the gang released its GPUs and queued again
            ended = attempts[-1]
            if ended.get("kind") != "preempted":  # not what this demo is about, but say so
                self._event(
                    run, f"attempt {run.attempt} failed ({ended.get('kind')}): {_gist(str(ended.get('reason')))}"
                )
            else:
                if run.noticed_at is None:  # noticed and released between two polls: the attempt says by whom
                    said = _PREEMPTED_BY.match(str(ended.get("reason", "")))
                    by = dict(zip(("by", "by_tenant", "cause"), said.groups(), strict=True)) if said else {}
                    self._event(run, self._noticed(by))
                self._event(run, await self._released(client, run, str(ended.get("reason", ""))))
            run.attempt, run.held, run.training, run.noticed_at = len(attempts), None, False, None
        if pending and pending.get("reason") and pending["reason"] != run.waiting:
            run.waiting = pending["reason"]
            # the gang's shape ("; needs 2 GPUs on 1 node ...") is the same every time: left out here
            self._event(run, "waiting: " + run.waiting.removeprefix("pending: ").split("; needs ", 1)[0])
        if running and not running.get("preempting") and run.held is None:
            run.held, run.admitted_at = list(running.get("nodes") or []), running.get("admitted_at")
            where = ", ".join(n["node_id"] for n in run.held)
            again = f" again (attempt {run.attempt})" if run.attempt else ""
            self._event(run, f"admitted{again} on {where} ({run.gpus()} GPUs)")
        if run.held is not None and not run.training:
            step = await self._start_step(client, run)
            if step is not None:
                run.training = True
                self._event(run, f"resumed from step {step}" if run.attempt else "running from step 0")

    def _noticed(self, notice: dict[str, Any]) -> str:
        """``preempted (reclaim by team-b's b1-…): saving a checkpoint, 120 s grace``."""
        by = str(notice.get("by") or "").split(".", 1)[0]  # a gang id names its run: <run>.<task>-<n>
        cause, tenant = notice.get("cause") or "preemption", notice.get("by_tenant")
        if not by:
            who = ""
        elif cause == "drain":
            who = f" (drain of node {by})"
        else:
            who = f" ({cause} by {tenant}'s {by})" if tenant else f" ({cause} by {by})"
        grace = notice.get("grace_s")
        return f"preempted{who}: saving a checkpoint" + (
            f", {grace:g} s grace" if isinstance(grace, int | float) else ""
        )

    async def _released(self, client: Client, run: _Run, reason: str) -> str:
        """``released 2 GPUs 0.4 s after the notice, checkpoint at step 50``: the seconds as the node agents
        measured them (the attempt's reason says), the step as the example's rank 0 printed it."""
        gpus = run.gpus() or 2
        seconds = re.search(r"exited ([\d.]+) s after", reason)
        after = f" {float(seconds.group(1)):.1f} s after the notice" if seconds else ""
        if not after and run.noticed_at is not None:
            after = f" {time.time() - run.noticed_at:.1f} s after the notice"
        if "killed" in reason:
            return f"released {gpus} GPUs{after}: the ranks were killed at the grace deadline"
        saved = await self._log_match(client, run, run.attempt, _SAVED)
        return f"released {gpus} GPUs{after}" + (f", checkpoint at step {saved}" if saved is not None else "")

    async def _start_step(self, client: Client, run: _Run) -> int | None:
        return await self._log_match(client, run, run.attempt, _STARTS, group=2)

    async def _log_match(
        self, client: Client, run: _Run, attempt: int, pattern: re.Pattern[str], group: int = 1
    ) -> int | None:
        """A number from rank 0's log of one attempt (the example prints where it starts and what it saved)."""
        for name, text in await client.logs(run.run_id, "train", rank=0):
            if f".attempt{attempt}." in name:
                found = pattern.search(text)
                return int(found.group(group)) if found else None
        return None

    def _ended(self, run: _Run, waiter: asyncio.Task[Any]) -> None:
        run.done = True
        failure = waiter.exception()
        if failure is None:
            run.result = result = waiter.result()
            resumed = f", {result.steps - result.first_step} after resuming at step {result.first_step}"
            self._event(run, f"done: {result.steps} steps" + (resumed if result.first_step else ""))
        else:
            cause = failure.cause if isinstance(failure, WorkflowFailureError) else failure
            run.error = _gist(str(getattr(cause, "message", None) or cause))
            self._event(run, f"failed: {run.error}")

    def _event(self, run: _Run, text: str) -> None:
        at = time.monotonic() - self.t0
        self.timeline.append((at, run.tenant, run.run_id, text))
        console.print(f"{at:6.1f} s  {run.tenant}  {run.run_id}  {text}", soft_wrap=True, markup=False)

    # -- the end --------------------------------------------------------------------------------
    async def _finish(self, client: Client) -> int:
        self._show_timeline()
        with contextlib.suppress(GangflowError):
            console.print("\nusage at the end (gangflow queues show):")
            show_queues(await client.queues())
        failed = [r for r in self.runs if r.error is not None]
        if failed:
            return self._verdict("; ".join(f"{r.run_id} of {r.tenant} failed: {r.error}" for r in failed))
        victims = [r for r in self.runs if r.result is not None and r.result.attempt > 0]
        if [r.tenant for r in victims] != ["team-a"]:
            return self._verdict(
                "expected exactly one team-a run to be preempted and resumed, got "
                + (", ".join(f"{r.run_id} of {r.tenant}" for r in victims) or "none")
            )
        (victim,) = victims
        if victim.result.first_step <= 0:
            return self._verdict(f"{victim.run_id} started over instead of resuming from its checkpoint")
        twice = [r for r in self.runs if r.result.optimizer_steps != r.result.steps]
        if twice:  # a step lost or applied twice: the checkpoint was not where the ranks stopped
            return self._verdict(
                ", ".join(
                    f"{r.run_id} applied {r.result.optimizer_steps} updates for {r.result.steps} steps" for r in twice
                )
            )
        console.print(
            f"\n[green]all three runs completed[/]: {victim.run_id} of team-a was preempted, saved its checkpoint "
            f"and resumed from step {victim.result.first_step} (attempt {victim.result.attempt})",
            soft_wrap=True,
        )
        return EXIT_OK

    def _show_timeline(self) -> None:
        table = Table(title="timeline", show_edge=False, header_style="bold")
        table.add_column("t (s)", justify="right", no_wrap=True)
        table.add_column("tenant", no_wrap=True)
        table.add_column("run", no_wrap=True)
        table.add_column("event", overflow="fold")
        for at, tenant, run_id, text in self.timeline:
            table.add_row(f"{at:.1f}", tenant, run_id, escape(text))
        console.print()
        console.print(table)

    def _verdict(self, problem: str) -> int:
        err_console.print(f"[bold red]the demo did not go as planned:[/] {escape(problem)}", soft_wrap=True)
        err_console.print("(with --keep the stack stays up to look into it: gangflow status RUN, gangflow logs RUN)")
        return EXIT_FAILED

    def _give_up(self, problem: str) -> int:
        self._show_timeline()
        states = [
            f"{r.run_id} of {r.tenant} failed: {r.error}"
            if r.error
            else f"{r.run_id} of {r.tenant}: {r.phase or 'starting'}"
            for r in self.runs
            if r.error or (r.started and not r.done)
        ]
        return self._verdict(problem + "".join(f"; {state}" for state in states))


def _gist(error: str) -> str:
    """A failure in one line: its first, and the last failure it names (a rank's traceback is in its log)."""
    lines = error.strip().splitlines() or [""]
    last = next((line.strip() for line in lines[1:] if line.strip().startswith("last failure:")), None)
    return lines[0].rstrip(":") + (f"; {last}" if last else "")
