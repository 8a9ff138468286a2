"""A soak: pipelines under load while random faults hit the stack, then a check that nothing was lost.

    python tests/soak/soak.py [--minutes 12] [--concurrency 6] [--seed 1] [--fault-gap 10:25]
                              [--steps 80:200] [--step-seconds 0.1] [--checkpoint-every 20] [--keep]

A local stack is started (tests/conftest.py's ``Stack``: a Temporal dev server, one ``gangflow worker`` and
three ``gangflow node`` agents s0..s2 with 2 GPU slots each, on 127.0.0.1, sharing one node cache as agents of
one machine do) with a queue configuration of two tenants, ``soak-a`` and ``soak-b`` (one cohort, 4 GPUs of
nominal quota each, no reclaim: the soak is about faults, not preemption). For ``--minutes``, ``--concurrency``
pipelines are kept in flight, alternating between the tenants; each is

    prepare (plain task: writes the run's plan as a File)
      → train (2-node gang, 1 rank per node, 1 GPU slot each: a counter trained in lockstep, one gloo
               all-reduce per step, a checkpoint every --checkpoint-every steps, cooperative on a stop)
      → verify (plain task: the gang's result against what the run asked).

Meanwhile, every --fault-gap seconds (drawn from the seeded RNG, as are the kinds and targets), one fault:
SIGKILL, SIGTERM (a drain) or SIGSTOP (SIGCONT 5-20 s later) of a node agent, SIGKILL of a rank, or SIGKILL
of the worker's process group. What was killed is restarted 1-3 s later, as an operator's supervisor would.

Then every run is waited for (up to --drain-minutes), and checked: every GPU is free again (the Scheduler's
view, ``Client.queue()``), no rank process of this stack is left running (/proc: ``engine.executor.rank``
processes carrying this stack's node cache in their environment; idle standbys do not count), and every
completed run's final step equals what it asked, with no step applied twice. After the stack is stopped no
process of it may remain.

Prints ONE JSON line to stdout (runs submitted / completed / failed / unfinished, faults by kind, GPUs still
allocated, rank processes left, steps lost, the failures' first lines and causes, where and under which load
it ran) and a short table to stderr; exits 1 when a check failed (the scratch folder with every log is then
kept and named in the line). This file is also the code bundle the worker and the ranks import: its
import-time work is the definitions; the harness imports tests/conftest.py and tests/perf/benchenv.py only
when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import File, Gang, Resources, checkpoint, report, task, workflow
from plugins.pytorch import PyTorch

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
NODES, GPUS_PER_NODE = 3, 2
TENANTS = ("soak-a", "soak-b")
QUEUES: dict[str, Any] = {
    "cohorts": [{"name": "soak"}],
    "tenants": [{"name": name, "cohort": "soak", "quota": {"gpu": 4}} for name in TENANTS],
    "policy": {"reclaim_within_cohort": "never"},
}
FAULTS = ("agent_sigkill", "agent_sigterm", "agent_sigstop", "rank_sigkill", "worker_sigkill")
STOP_HOLD_S = (5.0, 20.0)  # SIGSTOP → SIGCONT: around the 10 s heartbeat timeout, on either side of it
RESTART_DELAY_S = (1.0, 3.0)  # a supervisor's restart delay (systemd's RestartSec)
SIGTERM_WAIT_S = 180.0  # a drain may take the agent's --drain-timeout (150 s); a supervisor waits longer
SETTLE_S = 180.0  # after the last run: how long the cluster may take to show every GPU free
TRAIN_CALL = "train-1"  # the GangRun id is "<run id>.train-1"


# ---------------------------------------------------------------------------------------------------------
# the workload (what the worker and the ranks import)
# ---------------------------------------------------------------------------------------------------------
@task
def prepare(steps: int, checkpoint_every: int) -> File:
    """The run's plan, as a File the gang's ranks fetch (both at once, from the node cache they share)."""
    path = Path(os.environ.get("TMPDIR", "/tmp"), f"soak-plan-{os.getpid()}-{time.monotonic_ns()}.json")
    path.write_text(json.dumps({"steps": steps, "checkpoint_every": checkpoint_every}))
    return File(path)


@task(
    plugin=PyTorch(nnodes=2, nproc_per_node=1, backend="gloo", timeout=60),
    resources=Resources(gpu=1, cpu=1),
    # a run may meet several faults; the budget is not what the soak tests (the runs met up to 3)
    gang=Gang(max_restarts=10, hang_timeout=120),
)
def train(plan: File, step_seconds: float) -> dict[str, int]:
    """A counter trained in lockstep: one all-reduce per step (also how the ranks agree to stop), a
    checkpoint of ``(applied)`` every ``checkpoint_every`` steps and at a stop request."""
    import torch
    import torch.distributed as dist

    spec = json.loads(plan.read_bytes())
    steps, every = int(spec["steps"]), int(spec["checkpoint_every"])
    latest = checkpoint.load_latest()
    start, applied = (int(latest[0]), int(latest[1])) if latest is not None else (0, 0)
    report(step=start, force=True)
    step = start
    while step < steps:
        flags = torch.tensor([float(checkpoint.stop_requested()), 1.0])
        dist.all_reduce(flags)
        if flags[0].item() > 0:  # a rank was asked to stop (a drain, a preemption): save here and leave
            checkpoint.save(applied, step=step)
            return {}
        step += 1
        applied += 1
        report(step=step)
        time.sleep(step_seconds)
        if step % every == 0:
            checkpoint.save(applied, step=step)
    return {"steps": step, "applied": applied, "first": start, "attempt": int(os.environ["GANGFLOW_ATTEMPT"])}


@task
def verify(asked: int, result: dict[str, int]) -> dict[str, int]:
    return {**result, "asked": asked}


@workflow
async def pipeline(steps: int, checkpoint_every: int = 20, step_seconds: float = 0.1) -> dict[str, int]:
    plan = await prepare(steps=steps, checkpoint_every=checkpoint_every)
    result = await train(plan=plan, step_seconds=step_seconds)
    return await verify(asked=steps, result=result)


# ---------------------------------------------------------------------------------------------------------
# the fault plan: drawn from the seed alone, before anything runs
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the soak's start
    kind: str
    pick: float  # in [0, 1): which node agent or rank (among those there are then)
    hold: float  # SIGSTOP: seconds until SIGCONT
    delay: float  # seconds before the supervisor restarts what was killed


def fault_plan(seed: int, seconds: float, gap: tuple[float, float]) -> list[Fault]:
    """The faults of a soak of ``seconds``: one every ``gap`` (uniform), the first one gap in."""
    rng = random.Random(f"soak-faults-{seed}")
    plan: list[Fault] = []
    at = rng.uniform(*gap)
    while at < seconds:
        plan.append(
            Fault(at, rng.choice(FAULTS), rng.random(), rng.uniform(*STOP_HOLD_S), rng.uniform(*RESTART_DELAY_S))
        )
        at += rng.uniform(*gap)
    return plan


def parse_range(text: str, what: str, cast: type[float] | type[int] = float) -> tuple[Any, Any]:
    """``LO:HI`` (or one number) as (lo, hi); ValueError naming ``what`` otherwise."""
    parts = text.split(":")
    try:
        lo, hi = (cast(parts[0]), cast(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo:
        raise ValueError(f"{what} must be LO:HI with 0 < LO <= HI, got {text!r}")
    return lo, hi


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--minutes", type=float, default=12.0, help="how long pipelines are submitted and faults injected"
    )
    parser.add_argument("--concurrency", type=int, default=6, help="pipelines kept in flight")
    parser.add_argument("--seed", type=int, default=1, help="seeds the faults and the runs' step counts")
    parser.add_argument("--fault-gap", default="10:25", help="seconds between faults, LO:HI (default 10:25)")
    parser.add_argument("--steps", default="80:200", help="training steps per run, LO:HI (default 80:200)")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="sleep per training step")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--drain-minutes", type=float, default=10.0, help="how long the last runs may take to end")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (every process's log)")
    args = parser.parse_args(argv)
    try:
        args.fault_gap = parse_range(args.fault_gap, "--fault-gap")
        args.steps = parse_range(args.steps, "--steps", int)
    except ValueError as exc:
        parser.error(str(exc))
    for flag in ("minutes", "drain_minutes", "step_seconds"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be a positive number, got {value}")
    for flag in ("concurrency", "checkpoint_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    return args


# ---------------------------------------------------------------------------------------------------------
# this stack's rank processes, from /proc
# ---------------------------------------------------------------------------------------------------------
def rank_processes(root: Path, *, active_only: bool) -> list[int]:
    """Live ``engine.executor.rank`` processes started by this stack's node agents (their environment names
    its node cache). ``active_only``: those that are a rank (a spawned rank, or a standby that became one and
    moved into its bundle folder), not standbys still waiting for a launch."""
    root = root.resolve()
    marker = f"GANGFLOW_CACHE={root / 'nodes' / 'cache'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if b"engine.executor.rank" not in cmdline or marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rindex(")") + 2 :].split()[0] == "Z":  # exited, waiting to be reaped
                continue
            if active_only and b"--standby" in cmdline and not os.readlink(entry / "cwd").startswith(str(root)):
                continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(int(entry.name))
    return sorted(found)


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


# ---------------------------------------------------------------------------------------------------------
# the harness
# ---------------------------------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(msg, file=sys.__stderr__ or sys.stderr, flush=True)


@dataclass
class Tally:
    runs: list[dict[str, Any]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    submit_errors: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)  # node agents (and "worker") stopped or not restarted yet
    #: processes that exited with no fault sent to them (restarted like the others): a defect to look into
    unexpected_exits: Counter[str] = field(default_factory=Counter)


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path, stack: Any, client: Any) -> None:
        self.args, self.root, self.stack, self.client = args, root, stack, client
        self.tally = Tally()
        self.t0 = time.monotonic()
        self.seconds = args.minutes * 60
        self.recoveries: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- faults ----------------------------------------------------------------------------------------------
    async def inject(self, plan: list[Fault]) -> None:
        for fault in plan:
            await asyncio.sleep(max(0.0, fault.at - self.now()))
            kind, target = await self.fault(fault)
            self.tally.faults[kind] += 1
            self.tally.fault_log.append({"at_s": round(self.now(), 1), "kind": kind, "target": target})
            log(f"[{self.now():6.1f} s] fault: {kind} of {target}")

    async def fault(self, fault: Fault) -> tuple[str, str]:
        """Inflict ``fault``; returns (its kind, its target). A rank kill with no rank running becomes a node
        agent's SIGKILL, a fault on an agent when every one is down or stopped the worker's."""
        kind = fault.kind
        if kind == "rank_sigkill":
            ranks = rank_processes(self.root, active_only=True)
            if ranks:
                pid = ranks[int(fault.pick * len(ranks))]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return kind, f"rank pid {pid}"
            kind = "agent_sigkill"
        free = [n for n in sorted(self.stack.nodes) if n not in self.tally.busy]
        if kind == "worker_sigkill" or not free:
            self.tally.busy.add("worker")
            await asyncio.to_thread(self.stack.worker.kill, signal.SIGKILL)
            self.later(self.restart_worker(fault.delay))
            return "worker_sigkill", "the worker"
        node_id = free[int(fault.pick * len(free))]
        agent = self.stack.nodes[node_id]
        self.tally.busy.add(node_id)
        hosted = sum(1 for pid in rank_processes(self.root, active_only=True) if parent_of(pid) == agent.proc.pid)
        sig = {"agent_sigkill": signal.SIGKILL, "agent_sigterm": signal.SIGTERM, "agent_sigstop": signal.SIGSTOP}
        os.kill(agent.proc.pid, sig[kind])
        if kind == "agent_sigstop":
            self.later(self.resume_agent(node_id, fault.hold))
            return kind, f"node {node_id} ({hosted} rank(s)) for {fault.hold:.0f} s"
        self.later(self.restart_agent(node_id, fault.delay))
        return kind, f"node {node_id} ({hosted} rank(s))"

    def later(self, coro: Any) -> None:
        self.recoveries.append(asyncio.create_task(coro))

    async def resume_agent(self, node_id: str, hold: float) -> None:
        await asyncio.sleep(hold)
        os.kill(self.stack.nodes[node_id].proc.pid, signal.SIGCONT)
        self.tally.busy.discard(node_id)

    async def restart_agent(self, node_id: str, delay: float) -> None:
        agent = self.stack.nodes[node_id]
        try:
            await asyncio.to_thread(agent.proc.wait, SIGTERM_WAIT_S)
        except Exception:  # subprocess.TimeoutExpired: a drain that never ends; the supervisor kills it
            log(f"[{self.now():6.1f} s] node {node_id} still running {SIGTERM_WAIT_S:.0f} s after SIGTERM: SIGKILL")
            self.tally.faults["agent_sigterm_escalated"] += 1
            await asyncio.to_thread(agent.stop, signal.SIGKILL)
        await asyncio.sleep(delay)
        agent.start()
        self.tally.busy.discard(node_id)

    async def restart_worker(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await asyncio.to_thread(self.stack.worker.start)
        self.tally.busy.discard("worker")

    async def watchdog(self) -> None:
        """The supervisor's other half: restart a node agent or the worker that exited by itself."""
        while True:
            await asyncio.sleep(2.0)
            parts = {"worker": self.stack.worker, **self.stack.nodes}
            for name, part in parts.items():
                if name in self.tally.busy or part.proc is None or part.proc.poll() is None:
                    continue
                self.tally.unexpected_exits[name] += 1
                log(f"[{self.now():6.1f} s] {name} exited by itself (code {part.proc.returncode}): restarted")
                await asyncio.to_thread(part.start)

    # -- the pipelines ---------------------------------------------------------------------------------------
    async def slot(self, index: int, rng: random.Random, until: float) -> None:
        """Keep one pipeline in flight until the soak's end; its tenant alternates with the slot's index."""
        tenant = TENANTS[index % len(TENANTS)]
        while self.now() < self.seconds:
            steps = rng.randint(*self.args.steps)
            inputs = {"steps": steps, "checkpoint_every": self.args.checkpoint_every}
            inputs["step_seconds"] = self.args.step_seconds
            run_id = await self.submit(inputs, tenant)
            if run_id is None:
                continue
            record: dict[str, Any] = {"run_id": run_id, "tenant": tenant, "asked": steps}
            self.tally.runs.append(record)
            await self.outcome(record, until)

    async def submit(self, inputs: dict[str, Any], tenant: str) -> str | None:
        """Start a run; a refused start (the Scheduler not answering while the worker restarts) is counted
        and tried again, as a user would."""
        try:
            run_id: str = await self.client.start(pipeline, inputs, tenant=tenant)
            return run_id
        except Exception as exc:
            self.tally.submit_errors.append(first_line(exc))
            log(f"[{self.now():6.1f} s] submit refused: {first_line(exc)}")
            await asyncio.sleep(5)
            return None

    async def outcome(self, record: dict[str, Any], until: float) -> None:
        from temporalio.client import WorkflowFailureError

        run_id = record["run_id"]
        try:
            result = await asyncio.wait_for(self.client.result(run_id, pipeline), max(1.0, until - self.now()))
        except WorkflowFailureError:
            error = str((await self.client.status(run_id)).error or "")
            record.update(status="failed", first_line=error.strip().splitlines()[0][:400] if error.strip() else "")
            record["cause"] = cause_of(error)
        except TimeoutError:
            record["status"] = "unfinished"
        except Exception as exc:  # the client could not tell (an RPC error): counted as not finished
            record.update(status="unfinished", first_line=first_line(exc))
        else:
            record.update(status="completed", **{k: result.get(k) for k in ("steps", "applied", "first", "attempt")})
        with contextlib.suppress(Exception):
            gang = await self.client.gang(f"{run_id}.{TRAIN_CALL}")
            record["restarts"] = int(gang.get("restarts") or 0)
            record["preemptions"] = int(gang.get("preemptions") or 0)
            record["attempt_ends"] = [str(a.get("kind")) for a in gang.get("failed_attempts") or []]
        log(
            f"[{self.now():6.1f} s] {run_id} ({record['tenant']}): {record['status']}, {record.get('steps')} of "
            f"{record['asked']} steps, {record.get('restarts', '?')} restart(s)"
        )

    # -- the end ---------------------------------------------------------------------------------------------
    async def settle(self) -> dict[str, Any]:
        """The Scheduler's view once every node agent is back: poll until every GPU is free (or SETTLE_S)."""
        deadline = time.monotonic() + SETTLE_S
        view: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                view = await self.client.queue()
                totals = view["totals"]
                if (
                    totals["alive_nodes"] == NODES
                    and totals["gpus_free"] == NODES * GPUS_PER_NODE
                    and totals["running"] == totals["pending"] == 0
                    and not view.get("drained")
                ):
                    break
            await asyncio.sleep(1.0)
        nodes = view.get("nodes", [])
        return {
            "gpus_allocated": sum(len(n.get("used_gpu_ids", [])) for n in nodes),
            "gpus_free": view.get("totals", {}).get("gpus_free"),
            "gangs_running": view.get("totals", {}).get("running"),
            "gangs_pending": view.get("totals", {}).get("pending"),
            "nodes_alive": view.get("totals", {}).get("alive_nodes"),
            "nodes_drained": list(view.get("drained", [])),
        }

    async def ranks_gone(self, wait_s: float = 30.0) -> list[int]:
        deadline = time.monotonic() + wait_s
        while (left := rank_processes(self.root, active_only=True)) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
        return left


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def cause_of(error: str) -> str:
    """The innermost error of a failure text: its last line that names an exception."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    named = [line for line in lines if ("Error" in line or "Exception" in line or "Failed" in line) and ":" in line]
    return (named or lines or [""])[-1][:400]


def summarise(tally: Tally, end: dict[str, Any], left: list[int], after_stop: list[int]) -> dict[str, Any]:
    """The JSON line's figures (without settings, environment and load)."""
    by_status = Counter(str(r.get("status")) for r in tally.runs)
    completed = [r for r in tally.runs if r.get("status") == "completed"]
    wrong = [r["run_id"] for r in completed if r.get("steps") != r["asked"] or r.get("applied") != r["asked"]]
    lost_steps = sum(max(0, r["asked"] - int(r.get("steps") or 0)) for r in completed)
    result = {
        "runs": {
            "submitted": len(tally.runs),
            "completed": by_status["completed"],
            "failed": by_status["failed"],
            "unfinished": by_status["unfinished"],
        },
        "submit_errors": len(tally.submit_errors),
        "unexpected_exits": dict(sorted(tally.unexpected_exits.items())),
        "faults": dict(sorted(tally.faults.items())),
        "faults_total": sum(n for kind, n in tally.faults.items() if kind in FAULTS),
        **end,
        "rank_processes_left": len(left),
        "processes_left_after_stop": len(after_stop),
        "steps_lost": lost_steps,
        "runs_with_wrong_steps": wrong,
        "gang_restarts": sum(int(r.get("restarts") or 0) for r in tally.runs),
        "gang_preemptions": sum(int(r.get("preemptions") or 0) for r in tally.runs),
        "attempt_ends": dict(Counter(kind for r in tally.runs for kind in r.get("attempt_ends", []))),
        "failures": [
            {k: r.get(k) for k in ("run_id", "tenant", "first_line", "cause")}
            for r in tally.runs
            if r.get("status") == "failed"
        ],
        "submit_error_lines": sorted(set(tally.submit_errors))[:5],
        "fault_log": tally.fault_log,
    }
    result["ok"] = (
        result["runs"]["completed"] == result["runs"]["submitted"] > 0
        and not wrong
        and end["gpus_allocated"] == 0
        and not left
        and not after_stop
    )
    return result


def table(result: dict[str, Any]) -> list[str]:
    runs, faults, exits = result["runs"], result["faults"], result["unexpected_exits"]
    rows = [
        (
            "runs submitted / completed / failed / unfinished",
            f"{runs['submitted']} / {runs['completed']} / {runs['failed']} / {runs['unfinished']}",
        ),
        ("faults", f"{result['faults_total']} ({', '.join(f'{n} {k}' for k, n in faults.items()) or 'none'})"),
        ("gang restarts / preemptions", f"{result['gang_restarts']} / {result['gang_preemptions']}"),
        ("GPUs still allocated", str(result["gpus_allocated"])),
        (
            "rank processes left (running / after stop)",
            f"{result['rank_processes_left']} / {result['processes_left_after_stop']}",
        ),
        (
            "steps lost (runs with a wrong final step)",
            f"{result['steps_lost']} ({len(result['runs_with_wrong_steps'])})",
        ),
        ("exits with no fault sent (restarted)", ", ".join(f"{k} {n}" for k, n in exits.items()) or "none"),
        ("verdict", "ok" if result["ok"] else "FAILED"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"  failed: {f['run_id']}: {f['first_line']}\n    cause: {f['cause']}" for f in result["failures"]]
    return lines


async def run_soak(args: argparse.Namespace, root: Path, stack: Any) -> dict[str, Any]:
    client = await stack.client()
    await stack.wait_nodes()
    await client.apply_queues(QUEUES)
    runner = Soak(args, root, stack, client)
    plan = fault_plan(args.seed, runner.seconds, args.fault_gap)
    log(
        f"soak: {args.minutes:g} min, {args.concurrency} pipelines in flight, "
        f"{len(plan)} faults planned (seed {args.seed})"
    )
    until = runner.seconds + args.drain_minutes * 60
    rng = random.Random(f"soak-runs-{args.seed}")
    slots = [asyncio.create_task(runner.slot(i, random.Random(rng.random()), until)) for i in range(args.concurrency)]
    injector = asyncio.create_task(runner.inject(plan))
    watchdog = asyncio.create_task(runner.watchdog())
    await asyncio.gather(*slots)
    await injector  # done by now: every fault lies within the minutes, and the slots submit until they end
    await asyncio.gather(*runner.recoveries, return_exceptions=True)  # every agent and the worker are back
    watchdog.cancel()
    await asyncio.gather(watchdog, return_exceptions=True)
    log(f"[{runner.now():6.1f} s] every run ended; waiting for the cluster to settle")
    end = await runner.settle()
    left = await runner.ranks_gone()
    return {"tally": runner.tally, "end": end, "left": left, "wall_s": round(runner.now(), 1)}


def main(args: argparse.Namespace) -> None:
    import shutil
    import tempfile

    sys.path[:0] = [str(TESTS), str(TESTS / "perf")]
    from benchenv import LoadSampler, environment
    from conftest import Stack

    root = Path(tempfile.mkdtemp(prefix="gangflow-soak-"))
    os.environ["GANGFLOW_CACHE"] = str(root / "client-cache")  # the client's code cache: not ~/.cache
    with LoadSampler() as load:
        stack = Stack(root, "s", count=NODES, gpus=GPUS_PER_NODE)
        try:
            outcome = asyncio.run(run_soak(args, root, stack))
        finally:
            for agent in stack.nodes.values():  # a stopped agent handles SIGTERM only once resumed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent.proc.pid, signal.SIGCONT)
            stack.close()
        deadline = time.monotonic() + 20
        while (after_stop := rank_processes(root, active_only=False)) and time.monotonic() < deadline:
            time.sleep(0.5)
    result = {
        "benchmark": "soak",
        "settings": {
            "minutes": args.minutes,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "fault_gap_s": list(args.fault_gap),
            "steps": list(args.steps),
            "step_seconds": args.step_seconds,
            "checkpoint_every": args.checkpoint_every,
            "nodes": NODES,
            "gpus_per_node": GPUS_PER_NODE,
            "tenants": list(TENANTS),
        },
        **summarise(outcome["tally"], outcome["end"], outcome["left"], after_stop),
        "wall_s": outcome["wall_s"],
        "environment": environment(),
        "load": load.summary(),
    }
    keep = args.keep or not result["ok"]
    result["scratch"] = str(root) if keep else None
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    log("\n" + "\n".join(table(result)))
    print(json.dumps(result), flush=True)
    os._exit(0 if result["ok"] else 1)  # a process that used the temporalio client may abort at exit


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import soak as _by_name  # the module the code bundle names: the worker and this process share its classes

    _by_name.main(_by_name.parse_args())
