"""Recovery from a lost node: kill a node agent halfway through a checkpointed DDP run and time the way back.

    python tests/perf/bench_recovery.py [--reps N] [--victim rank1|rank0] [--total-steps 200]
                                        [--checkpoint-every 20] [--step-seconds 0.1] [--no-warmup] [--keep]
                                        [--busy N] [--busy-work K]

A local stack is started here (Temporal dev server, one ``gangflow worker``, three ``gangflow node`` agents
r0, r1, r2 on 127.0.0.1: two for the gang and a spare) and runs ``examples/resilient_training.py:pipeline``
(task ``train`` = ``PyTorch(nnodes=2, nproc_per_node=1)``, a checkpoint every ``--checkpoint-every`` steps,
``engine.report(step=...)`` every step). One unfailed warm-up run (not counted), then per rep one unfailed
run and one run in which the node agent hosting node rank 1 (``--victim rank0``: node rank 0) gets SIGKILL on
its whole process group once the ranks reported about half the steps; its ranks die with it (parent-death
signal). After each killed run the agent is restarted under the same node id.

Measured, from ``time.time()`` at the kill (all clocks are this machine's):

* detection: the dead node declared lost in the GangTask history: its ``gangflow.ping`` probe timed out (sent
  when the survivors' ranks failed on the broken collective), or else its ``gangflow.run_ranks`` activity
  timed out (heartbeat timeout); ``first_failure_seen`` is the first
  ACTIVITY_TASK_FAILED / ACTIVITY_TASK_TIMED_OUT of any node activity (usually the survivor's rank failing
  on the broken collective); every failure-related event is listed with its offset;
* time to resume: the first ``engine.report`` of attempt 1 (written right after the checkpoint is loaded,
  before the first resumed step), read from the ranks' progress files and, as a fallback, from
  ``Client.gang`` (heartbeat details) polled every 0.1 s; both carry the rank's own ``time.time()``;
* steps lost: the last step reported before the kill minus ``Summary.first_step`` of the result;
* slowdown: wall time (``Client.start`` → result) of the killed run vs. the unfailed one.

Prints ONE JSON line to stdout (medians over the reps, the samples, the goals with a boolean each, and where
the time between kill and resume went) and a table to stderr. Not a test: nothing here asserts on timings.

``--busy N`` measures on a busy machine: N other 2-node checkpointed DDP gangs (``recovery_busy.py`` beside
this script, ``--busy-work K`` forward/backward passes per step, the measured gang's step pause and
checkpoint interval) train for the whole measurement on two extra node agents b0, b1 (N logical GPU slots
and N CPUs each, which only the busy gangs ask for: the measured gang never lands there, and the kill never
touches them). The JSON line then carries ``busy`` (the gangs, their steps per second during the
measurement, their restarts) and, always, ``load`` (the 1-minute load average sampled every 5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchenv import LoadSampler, log  # beside this script (on sys.path when it runs)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TASK_CALL = "train-1"  # the GangTask id is "<run id>.train-1"
NODE_IDS = ("r0", "r1", "r2")
RUN_RANKS = "gangflow.run_ranks"
RESERVE_PORT = "gangflow.reserve_port"
PING = "gangflow.ping"  # GangTask's probe of a node when a peer failed
GOAL_RESUME_S = 5.0  # kill → first report of the next attempt, with default settings
GOAL_RESUME_SLACK_S = 5.0  # resume ≤ detection + this
RUN_TIMEOUT_S = 600.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1, help="unfailed + killed runs per rep (medians reported)")
    parser.add_argument("--victim", choices=("rank1", "rank0"), default="rank1", help="node rank whose agent dies")
    parser.add_argument("--total-steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--kill-at", type=float, default=0.5, help="fraction of total steps reported at the kill")
    parser.add_argument("--no-warmup", action="store_true", help="skip the uncounted unfailed warm-up run")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, histories)")
    parser.add_argument("--busy", type=int, default=0, help="other 2-node DDP gangs training meanwhile (default 0)")
    parser.add_argument("--busy-work", type=int, default=1, help="forward/backward passes per busy step")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------
# processes: the worker and the node agents (as in tests/conftest.py: WorkerProcess, NodeAgent)
# ---------------------------------------------------------------------------------------------------------
class Proc:
    """``python -m engine.cli ARGV`` in its own session, output to a log file."""

    def __init__(self, name: str, argv: list[str], home: Path, cache: Path, ready: str | None = None) -> None:
        self.name, self.argv, self.home, self.cache, self.ready = name, argv, home, cache, ready
        self.log = home / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GANGFLOW_CACHE=str(self.cache), PYTHONUNBUFFERED="1", TMPDIR=str(self.home))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.home,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while self.ready is not None and self.ready.encode() not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        self.kill_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGKILL)
            self.proc.wait()


class Stack:
    """A dev server, a worker and three node agents sharing one node cache (bundles unpacked once)."""

    def __init__(self, root: Path) -> None:
        from engine.runtime import DevServer

        self.root = root
        self.artifacts = str(root / "artifacts")
        self.server = DevServer(root / "server", ui=False).start()
        worker_home = root / "worker"
        self.worker = Proc(
            "worker",
            ["worker", "--address", self.server.address, "--task-queue", "gangflow"],
            worker_home,
            worker_home / "cache",
            ready="gangflow worker on",
        ).start()
        self.node_home = root / "nodes"
        self.node_cache = self.node_home / "cache"
        self.nodes: dict[str, Proc] = {}
        for node_id in NODE_IDS:
            self.nodes[node_id] = self._node(node_id).start()

    def _node(self, node_id: str) -> Proc:
        argv = ["node", "--node-id", node_id, "--cpus", "4", "--gpus", "0"]
        argv += ["--address", self.server.address, "--advertise-addr", "127.0.0.1"]
        return Proc(node_id, argv, self.node_home, self.node_cache)

    def restart_node(self, node_id: str) -> None:
        old = self.nodes[node_id]
        if old.proc is not None and old.proc.poll() is None:
            old.stop()
        elif old.proc is not None:
            old.proc.wait()
        self.nodes[node_id] = self._node(node_id).start()

    async def client(self) -> Any:
        from engine.client import Client
        from engine.runtime import Endpoint, connect

        return Client(await connect(Endpoint.resolve(self.server.address)), self.artifacts)

    async def wait_nodes(self, client: Any, count: int | None = None) -> float:
        count = len(self.nodes) if count is None else count  # the busy gangs' agents included
        t0 = time.monotonic()
        while True:
            with contextlib.suppress(Exception):
                if int((await client.queue())["totals"]["alive_nodes"]) >= count:
                    return time.monotonic() - t0
            if time.monotonic() - t0 > 90:
                raise RuntimeError(f"fewer than {count} node agents alive after 90 s")
            await asyncio.sleep(0.2)

    def close(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.stop()
        with contextlib.suppress(Exception):
            self.worker.stop()
        with contextlib.suppress(Exception):
            self.server.stop()


# ---------------------------------------------------------------------------------------------------------
# --busy N: other gangs training on agents of their own for the whole measurement
# ---------------------------------------------------------------------------------------------------------
BUSY_NODE_IDS = ("b0", "b1")
BUSY_TASK_CALL = "busy_train-1"


class Busy:
    """N runs of ``recovery_busy.busy`` (one 2-node DDP gang each) on the agents b0 and b1, which offer N GPU
    slots and N CPUs each: the busy gangs fill them, the measured gang (no GPU) fits only on r0, r1, r2."""

    def __init__(self, stack: Stack, count: int, params: dict[str, Any], work: int) -> None:
        self.stack, self.count, self.work = stack, count, work
        self.params = {"checkpoint_every": params["checkpoint_every"], "step_seconds": params["step_seconds"]}
        self.run_ids: list[str] = []
        self.begin: dict[str, tuple[float, int]] = {}

    def start_agents(self) -> None:
        for node_id in BUSY_NODE_IDS:
            argv = ["node", "--node-id", node_id, "--cpus", str(self.count), "--gpus", str(self.count)]
            argv += ["--standby", "0", "--address", self.stack.server.address, "--advertise-addr", "127.0.0.1"]
            self.stack.nodes[node_id] = Proc(node_id, argv, self.stack.node_home, self.stack.node_cache).start()

    async def _step(self, client: Any, run_id: str) -> tuple[int, int]:
        """(the lowest step any rank of the run's gang reported, the gang's restarts); (-1, 0) before then."""
        from temporalio.service import RPCError

        try:
            gang = await client.gang(f"{run_id}.{BUSY_TASK_CALL}")
        except RPCError:
            return -1, 0
        steps = [
            int(record.get("step", -1))
            for node in gang.get("nodes", [])
            for record in (node.get("progress") or {}).values()
            if isinstance(record, dict)
        ]
        return (min(steps) if len(steps) >= 2 else -1), int(gang.get("restarts") or 0)

    async def start(self, client: Any) -> float:
        """Start the busy runs and wait until every one of them trains; seconds that took."""
        import recovery_busy

        t0 = time.monotonic()
        for _ in range(self.count):
            self.run_ids.append(await client.start(recovery_busy.busy, {**self.params, "work": self.work}))
        while True:
            steps = {run_id: await self._step(client, run_id) for run_id in self.run_ids}
            if all(step >= 1 for step, _ in steps.values()):
                break
            if time.monotonic() - t0 > 600:  # minutes on a machine loaded by other work
                raise RuntimeError(f"the busy gangs did not all train within 600 s: {steps}")
            await asyncio.sleep(0.5)
        self.begin = {run_id: (time.time(), step) for run_id, (step, _r) in steps.items()}
        return time.monotonic() - t0

    async def stop(self, client: Any) -> dict[str, Any]:
        """Cancel the busy runs; how each trained while the measurement ran."""
        gangs = []
        for run_id in self.run_ids:
            step, restarts = await self._step(client, run_id)
            t0, step0 = self.begin.get(run_id, (time.time(), step))
            elapsed = time.time() - t0
            gangs.append(
                {
                    "run_id": run_id,
                    "steps": step - step0,
                    "steps_per_s": round((step - step0) / elapsed, 2) if elapsed > 0 else None,
                    "restarts": restarts,
                }
            )
            with contextlib.suppress(Exception):
                await client.cancel(run_id)
        return {"gangs": len(gangs), "work": self.work, "nodes": list(BUSY_NODE_IDS), "runs": gangs}


# ---------------------------------------------------------------------------------------------------------
# watching one run: Client.gang polls, the ranks' progress files, rank process start times
# ---------------------------------------------------------------------------------------------------------
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_WORKDIR = re.compile(r"\.a(\d+)\.n(\d+)$")
_RANKFILE = re.compile(r"^rank(\d+)\.json$")


def _boot_time() -> float:
    return time.time() - float(Path("/proc/uptime").read_text().split()[0])


def _proc_start(pid: int, boot: float) -> float | None:
    """When process ``pid`` was created (wall clock, ±10 ms), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return boot + int(fields[19]) / _CLK_TCK  # field 22 (starttime), counted from the field after comm


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


class Watch:
    """Everything observed about one run while it runs."""

    def __init__(self, run_id: str, t_start: float) -> None:
        self.run_id = run_id
        self.gang_id = f"{run_id}.{TASK_CALL}"
        self.t_start = t_start
        self.kill_t: float | None = None
        self.victim: str | None = None
        self.placement0: dict[int, str] = {}  # node rank -> node id, attempt 0
        self.pids0: set[int] = set()
        # (attempt, rank) -> {step: (report time, first seen at, source)}
        self.reports: dict[tuple[int, int], dict[int, tuple[float, float, str]]] = {}
        self.rank_procs: dict[int, dict[int, float]] = {}  # attempt -> {pid: process start}
        self.pid_node: dict[int, str] = {}
        self.restart_seen: float | None = None  # first poll showing restarts >= 1
        self.polls = 0
        self.last_gang: dict[str, Any] = {}
        self.phases: list[tuple[float, str]] = []  # (first seen, GangTask phase) at every change

    def add_report(self, attempt: int, rank: int, record: dict[str, Any], source: str) -> None:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            step, when = int(record["step"]), float(record["time"])
            seen = self.reports.setdefault((attempt, rank), {})
            if step not in seen or seen[step][0] > when:
                seen[step] = (when, time.time(), source)

    def first_report(self, attempt: int) -> dict[int, tuple[int, float, str]]:
        """rank -> (step, time, source) of the earliest report of ``attempt``."""
        out = {}
        for (att, rank), steps in self.reports.items():
            if att == attempt and steps:
                step, (when, _seen, source) = min(steps.items(), key=lambda kv: kv[1][0])
                out[rank] = (step, when, source)
        return out

    def last_before(self, moment: float) -> tuple[int, float] | None:
        """(step, time) of the highest step any rank reported at or before ``moment``."""
        best: tuple[int, float] | None = None
        for steps in self.reports.values():
            for step, (when, _seen, _src) in steps.items():
                if when <= moment and (best is None or step > best[0]):
                    best = (step, when)
        return best

    def step_period(self) -> float | None:
        """Seconds per step in attempt 0, from every rank's reports (the training loop's pace)."""
        steps = sorted((s, w[0]) for (att, rank), recs in self.reports.items() if att == 0 for s, w in recs.items())
        steps = [p for p in steps if p[0] > 0]
        if len(steps) < 2 or steps[-1][0] == steps[0][0]:
            return None
        return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])


def scan_progress_files(stack: Stack, watch: Watch) -> None:
    """The ranks' own progress files (engine/runtime/node.py: <cache>/nodes/<node>/<gang>.a<A>.n<N>/progress)."""
    for path in stack.node_cache.glob(f"nodes/*/{watch.gang_id}.a*.n*/progress/rank*.json"):
        work, name = _WORKDIR.search(path.parent.parent.name), _RANKFILE.match(path.name)
        if not work or not name:
            continue
        with contextlib.suppress(OSError, ValueError):
            watch.add_report(int(work.group(1)), int(name.group(1)), json.loads(path.read_text()), "file")


async def watch_files(stack: Stack, watch: Watch) -> None:
    while True:
        scan_progress_files(stack, watch)
        await asyncio.sleep(0.05)


async def poll_gang(
    client: Any, stack: Stack, watch: Watch, kill_step: int | None, victim_rank: int, boot: float
) -> None:
    """Poll ``Client.gang`` every 0.1 s; kill the victim's node agent once every rank reported ``kill_step``."""
    from temporalio.service import RPCError

    while True:
        try:
            gang = await client.gang(watch.gang_id)
        except RPCError:  # the GangTask child is not started yet
            await asyncio.sleep(0.1)
            continue
        watch.polls += 1
        watch.last_gang = gang
        phase = str(gang.get("phase") or "")
        if not watch.phases or watch.phases[-1][1] != phase:
            watch.phases.append((time.time(), phase))
        if watch.kill_t is not None and watch.restart_seen is None and int(gang.get("restarts") or 0) >= 1:
            watch.restart_seen = time.time()
        ranks_steps: list[int] = []
        for node in gang.get("nodes", []):
            pids = [int(p) for p in node.get("pids", [])]
            attempt = 0 if watch.kill_t is None or set(pids) & watch.pids0 else 1
            for pid in pids:
                watch.pid_node.setdefault(pid, str(node.get("node")))
                known = watch.rank_procs.setdefault(attempt, {})
                if pid not in known and (start := _proc_start(pid, boot)) is not None:
                    known[pid] = start
            for rank, record in (node.get("progress") or {}).items():
                watch.add_report(attempt, int(rank), record, "gang")
                if attempt == 0 and isinstance(record, dict):
                    ranks_steps.append(int(record.get("step", -1)))
        placement = gang.get("placement") or {}
        if (
            kill_step is not None
            and watch.kill_t is None
            and int(gang.get("restarts") or 0) == 0
            and len(ranks_steps) == 2
            and min(ranks_steps) >= kill_step
            and placement.get("nodes")
        ):
            watch.placement0 = {int(n["node_rank"]): str(n["node_id"]) for n in placement["nodes"]}
            watch.pids0 = {int(p) for node in gang["nodes"] for p in node.get("pids", [])}
            watch.victim = watch.placement0[victim_rank]
            agent = stack.nodes[watch.victim]
            before = time.time()
            os.killpg(agent.pid, signal.SIGKILL)  # the whole "server" goes away; its ranks die with it
            watch.kill_t = (before + time.time()) / 2
            scan_progress_files(stack, watch)  # the last reports written before the kill
        await asyncio.sleep(0.1)


async def one_run(client: Any, stack: Stack, params: dict[str, Any], kill: bool, victim_rank: int) -> dict[str, Any]:
    import resilient_training

    boot = _boot_time()
    kill_step = max(1, int(params["total_steps"] * ARGS.kill_at)) if kill else None
    t0 = time.time()
    run_id = await client.start(resilient_training.pipeline, params)
    watch = Watch(run_id, t0)
    tasks = [
        asyncio.create_task(poll_gang(client, stack, watch, kill_step, victim_rank, boot)),
        asyncio.create_task(watch_files(stack, watch)),
    ]
    try:
        result = await asyncio.wait_for(client.result(run_id, resilient_training.pipeline), RUN_TIMEOUT_S)
        t1 = time.time()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    info = await client.gang(watch.gang_id)
    out: dict[str, Any] = {
        "run_id": run_id,
        "wall_s": t1 - t0,
        "result": result.model_dump(),
        "restarts": info.get("restarts"),
        "failed_attempts": [
            {**a, "reason": str(a.get("reason", "")).splitlines()[0][:200]} for a in info.get("failed_attempts") or []
        ],
        "step_period_s": watch.step_period(),
        # start-up (start → first report of attempt 0) and wind-down (last report seen → result)
        "to_first_report_s": min((r[1] for r in watch.first_report(0).values()), default=t0) - t0,
        "last_report_to_end_s": t1 - max((w[0] for recs in watch.reports.values() for w in recs.values()), default=t1),
        "polls": watch.polls,
    }
    if kill:
        if watch.kill_t is None:
            raise RuntimeError(f"{run_id}: finished before the kill (no step {kill_step} seen by every rank)")
        out.update(await analyse(client, watch, result, t0, t1))
        victim_pids = [pid for pid in watch.pids0 if watch.pid_node.get(pid) == watch.victim]
        out["victim_rank_pids_alive_after_run"] = [pid for pid in victim_pids if _alive(pid)]
        last, period = out["last_step_before_kill"], out["step_period_s"]
        if last is not None and period:
            # reports are throttled (one per 0.5 s): extrapolate from the last one to the kill
            out["step_at_kill_est"] = round(last + out["last_report_age_at_kill_s"] / period, 1)
            out["steps_lost_est"] = round(out["step_at_kill_est"] - out["first_step"], 1)
        if out["time_to_resume_s"] is not None and out["steps_lost"] is not None and out["step_period_s"]:
            # what the kill should cost: the gap until the resumed first report + redoing the lost steps
            out["slowdown_expected_s"] = out["time_to_resume_s"] + out["steps_lost"] * out["step_period_s"]
    return out


# ---------------------------------------------------------------------------------------------------------
# the GangTask history: what happened after the kill
# ---------------------------------------------------------------------------------------------------------
async def analyse(client: Any, watch: Watch, result: Any, t0: float, t1: float) -> dict[str, Any]:
    from temporalio.api.enums.v1 import EventType, TimeoutType

    assert watch.kill_t is not None and watch.victim is not None
    kill = watch.kill_t
    events = [e async for e in client.temporal.get_workflow_handle(watch.gang_id).fetch_history_events()]

    def when(event: Any) -> float:
        return float(event.event_time.ToDatetime().timestamp())

    def name(event: Any) -> str:
        return str(EventType.Name(event.event_type)).removeprefix("EVENT_TYPE_")

    # scheduled event id -> (activity, node, attempt)
    activities: dict[int, tuple[str, str, int]] = {}
    run_ranks_count, port_count = 0, 0
    heartbeat_timeout_s: float | None = None
    nnodes = max(1, len(watch.placement0))
    timeline: list[dict[str, Any]] = []
    for event in events:
        kind = name(event)
        detail = ""
        if kind == "ACTIVITY_TASK_SCHEDULED":
            attrs = event.activity_task_scheduled_event_attributes
            node = attrs.task_queue.name.removeprefix("node/")
            act = attrs.activity_type.name
            if act == PING:
                attempt = -1  # a liveness probe, not part of an attempt's launch
            elif act == RUN_RANKS:
                attempt = run_ranks_count // nnodes
                run_ranks_count += 1
                if heartbeat_timeout_s is None and attrs.HasField("heartbeat_timeout"):
                    heartbeat_timeout_s = attrs.heartbeat_timeout.ToTimedelta().total_seconds()
            else:
                attempt = port_count
                port_count += 1
            activities[int(event.event_id)] = (act, node, attempt)
            detail = f"{act} a{attempt} on {node}"
        elif kind.startswith("ACTIVITY_TASK_"):
            attrs = getattr(event, f"{kind.lower()}_event_attributes")
            act, node, attempt = activities.get(int(attrs.scheduled_event_id), ("?", "?", -1))
            detail = f"{act} a{attempt} on {node}"
            if kind in ("ACTIVITY_TASK_FAILED", "ACTIVITY_TASK_TIMED_OUT") and attrs.HasField("failure"):
                failure = attrs.failure
                message = failure.message
                if failure.HasField("timeout_failure_info"):
                    timeout_type = TimeoutType.Name(failure.timeout_failure_info.timeout_type)
                    message = f"{message} ({timeout_type.removeprefix('TIMEOUT_TYPE_').lower()})"
                detail += ": " + message.splitlines()[0][:160] if message else ""
        elif kind == "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED":
            detail = event.signal_external_workflow_execution_initiated_event_attributes.signal_name
        elif kind == "WORKFLOW_EXECUTION_SIGNALED":
            detail = event.workflow_execution_signaled_event_attributes.signal_name
        timeline.append({"t": when(event), "event": kind, "detail": detail, "id": int(event.event_id)})

    def activity_events(kind: str, act: str | None = None, attempt: int | None = None) -> list[dict[str, Any]]:
        found = []
        for row in timeline:
            if row["event"] != kind:
                continue
            if kind == "ACTIVITY_TASK_SCHEDULED":
                meta = activities[row["id"]]
            else:
                attrs = getattr(events[row["id"] - 1], f"{kind.lower()}_event_attributes")
                meta = activities.get(int(attrs.scheduled_event_id), ("?", "?", -1))
            if (act is None or meta[0] == act) and (attempt is None or meta[2] == attempt):
                found.append({**row, "activity": meta[0], "node": meta[1], "attempt": meta[2]})
        return found

    failure_kinds = ("ACTIVITY_TASK_FAILED", "ACTIVITY_TASK_TIMED_OUT", "ACTIVITY_TASK_CANCEL_REQUESTED")
    failures = sorted(
        (row for kind in (*failure_kinds, "ACTIVITY_TASK_CANCELED") for row in activity_events(kind)),
        key=lambda r: r["t"],
    )
    failures = [r for r in failures if r["t"] >= kill - 1.0]
    failure_events = [
        {
            "event": r["event"],
            "activity": r["activity"],
            "node": r["node"],
            "attempt": r["attempt"],
            "offset_s": round(r["t"] - kill, 3),
            "detail": r["detail"],
        }
        for r in failures
    ]
    detected = [
        r
        for r in failures
        if r["event"] == "ACTIVITY_TASK_TIMED_OUT" and r["activity"] in (RUN_RANKS, PING) and r["node"] == watch.victim
    ]
    first_failure = next((r for r in failures if r["event"] in failure_kinds[:2]), None)
    first_cancel = next((r for r in failures if r["event"] == "ACTIVITY_TASK_CANCEL_REQUESTED"), None)

    def first_after(kind: str, moment: float, detail: str | None = None) -> float | None:
        for row in timeline:
            if row["event"] == kind and row["t"] >= moment and (detail is None or row["detail"] == detail):
                return float(row["t"])
        return None

    detection = detected[0]["t"] if detected else None
    anchor = detection if detection is not None else kill
    placement1 = first_after("WORKFLOW_EXECUTION_SIGNALED", anchor, "placement")
    submit1 = first_after("SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED", anchor, "submit")
    port1 = activity_events("ACTIVITY_TASK_SCHEDULED", RESERVE_PORT, 1)
    port1_done = activity_events("ACTIVITY_TASK_COMPLETED", RESERVE_PORT, 1)
    ranks1_sched = activity_events("ACTIVITY_TASK_SCHEDULED", RUN_RANKS, 1)
    ranks1_started = activity_events("ACTIVITY_TASK_STARTED", RUN_RANKS, 1)
    first_wft_done = first_after("WORKFLOW_TASK_COMPLETED", anchor)
    procs1 = watch.rank_procs.get(1, {})
    # a rank taken from a node agent's warm standby (engine/executor/standby.py) was created before its
    # launch: it "starts" when its run_ranks activity starts
    first_ranks_started = min((r["t"] for r in activity_events("ACTIVITY_TASK_STARTED", RUN_RANKS, 1)), default=None)
    standby1 = sum(1 for t in procs1.values() if first_ranks_started is not None and t < first_ranks_started)
    if first_ranks_started is not None:
        procs1 = {pid: max(t, first_ranks_started) for pid, t in procs1.items()}
    reports1 = watch.first_report(1)
    last = watch.last_before(kill)
    first_step = int(result.first_step)

    def off(moment: float | None) -> float | None:
        return None if moment is None else round(moment - kill, 3)

    resume_first = min((r[1] for r in reports1.values()), default=None)
    resume_all = max((r[1] for r in reports1.values()), default=None) if len(reports1) >= 2 else None
    ranks_sched_t = max((r["t"] for r in ranks1_sched), default=None)
    ranks_started_t = max((r["t"] for r in ranks1_started), default=None)
    proc_t = max(procs1.values(), default=None) if procs1 else None

    def gap(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 3)

    breakdown = {
        # kill → the dead node declared lost (its probe timed out, else its run_ranks heartbeat timeout)
        "detection_wait": gap(kill, detection),
        # the GangTask reacts: node_lost + release signals to the Scheduler, submit, the placement comes back
        "detection_to_placement": gap(detection, placement1),
        # reserve_port on node rank 0, then run_ranks scheduled on every node
        "placement_to_run_ranks_scheduled": gap(placement1, ranks_sched_t),
        "run_ranks_scheduled_to_started": gap(ranks_sched_t, ranks_started_t),
        # the node agent loads the bundle, writes the spec and spawns the rank processes
        "run_ranks_started_to_rank_process": gap(ranks_started_t, proc_t),
        # imports (engine, bundle, torch), init_process_group (rendezvous), DDP init, checkpoint load
        "rank_process_to_first_report": gap(proc_t, resume_all if resume_all is not None else resume_first),
    }
    details = {
        "gangrun_workflow_task_after_detection": gap(detection, first_wft_done),
        "detection_to_submit_signal": gap(detection, submit1),
        "submit_to_placement_signal": gap(submit1, placement1),
        "reserve_port_activity": gap(port1[0]["t"] if port1 else None, port1_done[0]["t"] if port1_done else None),
        "rank_process_start_spread": round(max(procs1.values()) - min(procs1.values()), 3) if procs1 else None,
        "first_report_spread": gap(resume_first, resume_all),
        "ranks_from_standby": standby1,
    }
    # the milestones between kill and resume, from the history (offsets from the kill)
    milestones = [
        {"offset_s": off(r["t"]), "event": r["event"], "detail": r["detail"]}
        for r in timeline
        if kill - 1.0 <= r["t"] <= (resume_all or resume_first or t1)
        and r["event"] not in ("WORKFLOW_TASK_SCHEDULED", "WORKFLOW_TASK_STARTED")
    ]
    for pid, start in sorted(procs1.items(), key=lambda kv: kv[1]):
        where = f"pid {pid} on {watch.pid_node.get(pid, '?')}"
        milestones.append({"offset_s": off(start), "event": "RANK_PROCESS_START", "detail": where})
    for rank, (step, moment, source) in sorted(reports1.items()):
        milestones.append(
            {"offset_s": off(moment), "event": "FIRST_REPORT_A1", "detail": f"rank {rank} at step {step} ({source})"}
        )
    milestones.append({"offset_s": off(watch.restart_seen), "event": "STATUS_SHOWS_RESTART", "detail": "gang poll"})
    for seen, phase in watch.phases:  # what `gangflow status` says, as polled (every 0.1 s)
        if kill - 1.0 <= seen <= (resume_all or resume_first or t1):
            milestones.append({"offset_s": off(seen), "event": "STATUS_PHASE", "detail": phase[:100]})
    milestones.sort(key=lambda m: m["offset_s"] if m["offset_s"] is not None else 1e9)
    return {
        "kill_time": kill,
        "victim_node": watch.victim,
        "placement_attempt0": {str(k): v for k, v in sorted(watch.placement0.items())},
        "placement_attempt1": sorted({r["node"] for r in ranks1_sched}),
        "heartbeat_timeout_s": heartbeat_timeout_s,
        "detection_s": off(detection),
        "first_failure_seen_s": off(first_failure["t"]) if first_failure else None,
        "first_failure_seen": f"{first_failure['event']} {first_failure['detail']}" if first_failure else None,
        "first_cancel_requested_s": off(first_cancel["t"]) if first_cancel else None,
        "restart_visible_in_status_s": off(watch.restart_seen),
        "time_to_resume_s": off(resume_first),
        "time_to_resume_all_ranks_s": off(resume_all),
        "resume_source": sorted({r[2] for r in reports1.values()}),
        "resumed_at_step_reported": sorted({r[0] for r in reports1.values()}),
        "last_step_before_kill": last[0] if last else None,
        "last_report_age_at_kill_s": round(kill - last[1], 3) if last else None,
        "first_step": first_step,
        "steps_lost": (last[0] - first_step) if last else None,
        "failure_events": failure_events,
        "breakdown_s": breakdown,
        "details_s": details,
        "milestones": milestones,
        "kill_offset_in_run_s": round(kill - t0, 3),
    }


# ---------------------------------------------------------------------------------------------------------
# reference: what a rank spends before its first report, measured outside gangflow (same interpreter)
# ---------------------------------------------------------------------------------------------------------
_REFERENCE = r"""
import json, sys, time
from datetime import timedelta
t = {"proc": time.time()}
sys.path.insert(0, sys.argv[1])
import engine.executor.rank, plugins.pytorch, resilient_training  # what the rank runner loads first
from engine import checkpoint, report
t["engine_and_bundle_imports"] = time.time()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
t["torch_import"] = time.time()
dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # PyTorch.setup: env:// rendezvous
t["init_process_group"] = time.time()
torch.manual_seed(0)  # resilient_training.train's prologue, up to its first report
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
t["ddp_model"] = time.time()
start, state = checkpoint.load_torch(model, opt)
t["checkpoint_load"] = time.time()
dist.destroy_process_group()
print(json.dumps(t))
"""
_PHASES = ["proc", "engine_and_bundle_imports", "torch_import", "init_process_group", "ddp_model", "checkpoint_load"]


def reference_costs(checkpoint_dir: str) -> dict[str, Any]:
    """Two ranks started together by hand (what attempt 1 does), each timing the stretches of its way from
    process start to the first report: per stretch, the slower rank's seconds."""
    from engine.executor.ports import free_port

    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GANGFLOW_CHECKPOINT_DIR=checkpoint_dir)
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _REFERENCE, str(EXAMPLES)],
            env=dict(env, RANK=str(rank), LOCAL_RANK="0"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    stamps = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            return {"error": err[-500:]}
        stamps.append(json.loads(out.strip().splitlines()[-1]))
    result: dict[str, Any] = {
        "process_start_to_first_report": round(max(s[_PHASES[-1]] - s["proc"] for s in stamps), 3)
    }
    result["interpreter_start"] = round(max(s["proc"] for s in stamps) - t0, 3)
    for prev, key in itertools.pairwise(_PHASES):
        result[key] = round(max(s[key] - s[prev] for s in stamps), 3)
    return result


# ---------------------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------------------
ARGS = argparse.Namespace()


def med(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return round(m, 3) if isinstance(m, float) else m


async def bench(stack: Stack, params: dict[str, Any], reps: int, victim_rank: int) -> dict[str, Any]:
    client = await stack.client()
    busy = Busy(stack, ARGS.busy, params, ARGS.busy_work) if ARGS.busy > 0 else None
    if busy is not None:
        busy.start_agents()
    await stack.wait_nodes(client)
    log(f"stack up on {stack.server.address}: nodes {', '.join(stack.nodes)}; params {params}")
    if busy is not None:
        took = await busy.start(client)
        log(f"  {ARGS.busy} busy gang(s) training on {', '.join(BUSY_NODE_IDS)} after {took:.1f} s")
    if not ARGS.no_warmup:
        warm = await one_run(client, stack, params, kill=False, victim_rank=victim_rank)
        log(f"  warm-up (not counted): {warm['wall_s']:.2f} s")
    unfailed: list[dict[str, Any]] = []
    killed: list[dict[str, Any]] = []
    failed_runs: list[dict[str, Any]] = []
    for i in range(reps):
        try:
            unfailed.append(await one_run(client, stack, params, kill=False, victim_rank=victim_rank))
            killed.append(await one_run(client, stack, params, kill=True, victim_rank=victim_rank))
        except Exception as exc:  # e.g. a run that failed for good on an overloaded machine
            if not ARGS.busy:
                raise
            # under --busy, a rep whose run failed is reported, not the end of the measurement
            failed_runs.append(
                {"rep": i + 1, "error": str(exc).splitlines()[0][:300], "cause": repr(exc.__cause__)[:300]}
            )
            log(f"  rep {i + 1}/{reps}: a run FAILED: {failed_runs[-1]}")
            for node_id, node in list(stack.nodes.items()):
                if node.proc is not None and node.proc.poll() is not None:
                    stack.restart_node(node_id)
            await stack.wait_nodes(client)
            continue
        k = killed[-1]
        stack.restart_node(k["victim_node"])
        back = await stack.wait_nodes(client)
        log(
            f"  rep {i + 1}/{reps}: unfailed {unfailed[-1]['wall_s']:.2f} s | killed {k['wall_s']:.2f} s "
            f"(victim {k['victim_node']}, detection {k['detection_s']} s, resume {k['time_to_resume_s']} s, "
            f"steps lost {k['steps_lost']}); {k['victim_node']} back in {back:.1f} s"
        )
        for m in k["milestones"]:
            offset = "    ?   " if m["offset_s"] is None else f"{m['offset_s']:+8.3f}"
            log(f"      {offset}  {m['event']:<44} {m['detail']}")
    ckpt_dir = Path(stack.artifacts) / "checkpoints" / killed[-1]["run_id"] / TASK_CALL
    reference = await asyncio.to_thread(reference_costs, str(ckpt_dir))  # still under the busy gangs' load
    busy_summary = await busy.stop(client) if busy is not None else None
    if busy_summary is not None:
        busy_summary["failed_runs"] = failed_runs
    return {"unfailed": unfailed, "killed": killed, "reference": reference, "busy": busy_summary}


def summarise(data: dict[str, Any], params: dict[str, Any], reps: int) -> dict[str, Any]:
    unfailed, killed = data["unfailed"], data["killed"]
    u_wall = med([r["wall_s"] for r in unfailed])
    k_wall = med([r["wall_s"] for r in killed])
    hb = med([r["heartbeat_timeout_s"] for r in killed])
    detection = med([r["detection_s"] for r in killed])
    resume = med([r["time_to_resume_s"] for r in killed])
    lost = med([r["steps_lost"] for r in killed])
    period = med([r["step_period_s"] for r in unfailed + killed])
    every = params["checkpoint_every"]

    def goal(value: Any, limit: Any, per_rep: list[bool]) -> dict[str, Any]:
        ok = value is not None and limit is not None and value <= limit
        return {"value": value, "limit": limit, "ok": bool(ok), "ok_every_rep": all(per_rep)}

    def ok(v: Any, lim: Any) -> bool:
        return v is not None and lim is not None and v <= lim

    goals = {
        "detection_le_heartbeat_timeout": goal(
            detection, hb, [ok(r["detection_s"], r["heartbeat_timeout_s"]) for r in killed]
        ),
        "resume_le_detection_plus_5s": goal(
            resume,
            None if detection is None else round(detection + GOAL_RESUME_SLACK_S, 3),
            [
                ok(r["time_to_resume_s"], None if r["detection_s"] is None else r["detection_s"] + GOAL_RESUME_SLACK_S)
                for r in killed
            ],
        ),
        "steps_lost_le_checkpoint_interval": goal(lost, every, [ok(r["steps_lost"], every) for r in killed]),
        "resume_le_5s": goal(resume, GOAL_RESUME_S, [ok(r["time_to_resume_s"], GOAL_RESUME_S) for r in killed]),
    }
    breakdown_keys = list(killed[0]["breakdown_s"])
    details_keys = list(killed[0]["details_s"])
    return {
        "bench": "recovery",
        "victim": ARGS.victim,
        "reps": reps,
        "params": params,
        "heartbeat_timeout_s": hb,
        "checkpoint_interval_steps": every,
        "checkpoint_interval_s_est": None if period is None else round(period * every, 3),
        "step_period_s": period,
        "detection_s": detection,
        "first_failure_seen_s": med([r["first_failure_seen_s"] for r in killed]),
        "first_cancel_requested_s": med([r["first_cancel_requested_s"] for r in killed]),
        "restart_visible_in_status_s": med([r["restart_visible_in_status_s"] for r in killed]),
        "time_to_resume_s": resume,
        "time_to_resume_all_ranks_s": med([r["time_to_resume_all_ranks_s"] for r in killed]),
        "resume_after_detection_s": None if resume is None or detection is None else round(resume - detection, 3),
        "last_step_before_kill": med([r["last_step_before_kill"] for r in killed]),
        "resumed_from_step": med([r["first_step"] for r in killed]),
        "steps_lost": lost,
        "steps_lost_est": med([r.get("steps_lost_est") for r in killed]),
        "unfailed_wall_s": u_wall,
        "killed_wall_s": k_wall,
        "slowdown_ratio": None if not u_wall else round(k_wall / u_wall, 3),
        "slowdown_diff_s": round(k_wall - u_wall, 3),
        # time_to_resume + steps_lost × step period: the kill's own cost; the rest of slowdown_diff_s is
        # run-to-run noise, mostly in the start-up (start → first report), shown per run in the samples
        "slowdown_expected_s": med([r.get("slowdown_expected_s") for r in killed]),
        "startup_unfailed_s": med([r["to_first_report_s"] for r in unfailed]),
        "startup_killed_s": med([r["to_first_report_s"] for r in killed]),
        "goals": goals,
        "breakdown_s": {key: med([r["breakdown_s"][key] for r in killed]) for key in breakdown_keys},
        "details_s": {key: med([r["details_s"][key] for r in killed]) for key in details_keys},
        "reference_rank_startup_s": data["reference"],
        "failure_events": [r["failure_events"] for r in killed] if reps > 1 else killed[0]["failure_events"],
        "samples": {
            "unfailed": [
                {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "polls"}
                for r in unfailed
            ],
            "killed": [
                {
                    k: (round(v, 3) if isinstance(v, float) and k != "kill_time" else v)
                    for k, v in r.items()
                    if k not in ("breakdown_s", "details_s", "failure_events", "polls")
                }
                for r in killed
            ],
        },
        "uncertainty": {
            "clock": "one machine's wall clock for the kill (time.time()), Temporal event times and rank reports",
            "kill_time_s": 0.001,
            "history_event_time_s": 0.001,
            "first_report_s": "exact rank time.time() when read from the progress file (polled every 0.05 s), "
            "else the heartbeat-throttled Client.gang view (up to ~1 s late)",
            "rank_process_start_s": 0.01,
            "last_step_before_kill": "reports are throttled to one per 0.5 s, so the true last step may be up to "
            "~0.5 s / step_period higher; steps_lost_est extrapolates by last_report_age_at_kill_s / step_period",
            "detection": "the survivors' ranks fail on the broken collective, then the dead node's agent is probed "
            "(1 s to answer); without a survivor it is the heartbeat timeout, within ~1 s (heartbeat throttle)",
        },
        "machine": f"{os.cpu_count()} cores, no GPU",
        "busy": data.get("busy"),
        "samples_time_to_resume_s": [r["time_to_resume_s"] for r in killed],
    }


def print_table(s: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    log("")
    log(f"recovery after SIGKILL of the node agent hosting node {s['victim']} ({s['reps']} rep(s), medians)")
    rows = [
        ("heartbeat timeout in force", s["heartbeat_timeout_s"], "s"),
        ("checkpoint interval", f"{s['checkpoint_interval_steps']} steps ≈ {fmt(s['checkpoint_interval_s_est'])}", "s"),
        ("first failure seen", s["first_failure_seen_s"], "s after kill"),
        ("first cancel requested", s["first_cancel_requested_s"], "s after kill"),
        ("detection (node declared lost)", s["detection_s"], "s after kill"),
        ("restart visible in status", s["restart_visible_in_status_s"], "s after kill"),
        ("time to resume (first report a1)", s["time_to_resume_s"], "s after kill"),
        ("time to resume (all ranks)", s["time_to_resume_all_ranks_s"], "s after kill"),
        ("last step before kill", s["last_step_before_kill"], ""),
        ("resumed from step", s["resumed_from_step"], ""),
        ("steps lost", s["steps_lost"], "steps"),
        ("  extrapolated to the kill", s["steps_lost_est"], "steps"),
        ("unfailed wall", s["unfailed_wall_s"], "s"),
        ("killed wall", s["killed_wall_s"], "s"),
        ("slowdown", f"{fmt(s['slowdown_ratio'])}x, {fmt(s['slowdown_diff_s'])}", "s"),
        ("  expected: resume + lost steps", s["slowdown_expected_s"], "s"),
        ("  start-up unfailed / killed", f"{fmt(s['startup_unfailed_s'])} / {fmt(s['startup_killed_s'])}", "s"),
    ]
    for label, value, unit in rows:
        log(f"  {label:<36}{fmt(value):>20} {unit}")
    log("  goals:")
    for name, g in s["goals"].items():
        log(f"    {name:<40} {fmt(g['value']):>8} ≤ {fmt(g['limit']):<8} {'OK' if g['ok'] else 'MISSED'}")
    log("  kill → resume, median s:")
    for key, value in s["breakdown_s"].items():
        log(f"    {key:<40}{fmt(value):>10}")
    for key, value in s["details_s"].items():
        log(f"      ({key:<38}{fmt(value):>10})")
    log("  reference, two ranks started together by hand (slower rank per stretch), s:")
    for key, value in s["reference_rank_startup_s"].items():
        log(f"    {key:<40}{fmt(value):>10}")
    log(f"  ({s['machine']})")
    if s.get("busy"):
        b = s["busy"]
        rates = ", ".join(f"{g['steps_per_s']} steps/s ({g['restarts']} restarts)" for g in b["runs"])
        log(f"  busy: {b['gangs']} other gang(s) on {', '.join(b['nodes'])}, {b['work']} pass(es)/step: {rates}")
    if s.get("load"):
        load = s["load"]
        log(f"  1-minute load average {load['min']:.2f}–{load['max']:.2f} (start {load['start']}, end {load['end']})")
    log(f"  time to resume per rep: {s['samples_time_to_resume_s']}")


def main() -> None:
    global ARGS
    ARGS = parse_args()
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    reps = max(1, ARGS.reps)
    params = {
        "total_steps": ARGS.total_steps,
        "checkpoint_every": ARGS.checkpoint_every,
        "step_seconds": ARGS.step_seconds,
    }
    victim_rank = 1 if ARGS.victim == "rank1" else 0
    scratch = Path(tempfile.mkdtemp(prefix="gangflow-bench-recovery-"))
    os.environ["GANGFLOW_CACHE"] = str(scratch / "client-cache")  # the client packs bundles here
    stack: Stack | None = None
    code = 0
    try:
        stack = Stack(scratch)
        with LoadSampler() as load:
            data = asyncio.run(bench(stack, params, reps, victim_rank))
        summary = summarise(data, params, reps)
        summary["load"] = load.summary()
        print_table(summary)
        print(json.dumps(summary), flush=True)
    except BaseException:
        log(traceback.format_exc())
        if stack is not None:
            log(f"logs under {scratch} (kept)" if ARGS.keep else "")
        code = 1
    finally:
        if stack is not None:
            stack.close()
        if ARGS.keep:
            log(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # A process that used the temporalio client may abort at interpreter exit (code 134).
    os._exit(code)


if __name__ == "__main__":
    main()
