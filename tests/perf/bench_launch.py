"""Launch overhead: the same 2-rank DDP script run by plain torchrun and by gangflow, cold and warm.

    python tests/perf/bench_launch.py [--reps N] [--cold-reps N] [--steps N] [--markdown]
    python tests/perf/bench_launch.py --render RESULT.json     # the README rows of a saved JSON line

(a) ``torchrun --standalone --nproc_per_node=2 ddp_steps.py --steps N`` and (b) a gangflow run of the
workflow ``bench`` below, whose one task is ``PyTorch(nnodes=1, nproc_per_node=2, script="ddp_steps.py")``,
on a local stack (Temporal dev server, one ``gangflow worker``, one ``gangflow node``), all on 127.0.0.1.
Each is timed from its launch to the first training step (rank 0's loop start) and to the result in hand
(torchrun's process exit; ``Client.wait`` returning), in two settings, each compared like with like:

* **cold** — nothing of gangflow runs before the launch: its clock starts before the stack is started (server,
  worker and node agent, up to the agent's registration), as a first ``gangflow dev`` + ``gangflow run``
  would. torchrun keeps no state between runs, so every torchrun launch is cold in this sense; both sides
  run with the page cache already warm (the warm phase runs first). ``--cold-reps`` pairs, alternating.
* **warm** — the stack is already up (the everyday case on a cluster), after one warm-up run of each;
  ``--reps`` pairs, alternating, so drift hits both alike.

Prints ONE JSON line to stdout (medians per setting, the samples, the rank-0 timeline and gangflow's path
from the run's histories) and a table to stderr (``--markdown``: the README's rows). Not a test: nothing
here asserts on timings.

This file is also the code bundle gangflow ships (``Client.start`` packs the folder of the workflow's
module, so ``ddp_steps.py`` travels with it) and the module the worker and the node agent import: keep
its import-time work to the definitions below, everything else inside ``main``. The step count is read
from ``$GANGFLOW_BENCH_STEPS`` at import (the task's script args are fixed at decoration time), so the
benchmark sets it for itself and for the worker and node agent it starts.
"""

from __future__ import annotations

import os
from typing import Any

from engine import Resources, task, workflow
from plugins.pytorch import PyTorch

STEPS_ENV = "GANGFLOW_BENCH_STEPS"
DEFAULT_STEPS = 400  # ddp_steps.py's own default: a 2–4 s training loop on a 2-core machine
STEPS = int(os.environ.get(STEPS_ENV, DEFAULT_STEPS))
SCRIPT = "ddp_steps.py"  # relative to the code bundle's root: this folder
SCRIPT_ARGS = ("--steps", str(STEPS))
NPROC = 2
TASK = "run_script"


@task(
    name=TASK,
    plugin=PyTorch(nnodes=1, nproc_per_node=NPROC, backend="gloo", script=SCRIPT, args=SCRIPT_ARGS),
    resources=Resources(cpu=2),
)
def run_script() -> None:
    """Not run: every rank runs ``ddp_steps.py`` instead."""


@workflow
async def bench() -> None:
    await run_script()


# ---------------------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------------------
SETTINGS = ("cold", "warm")
LAUNCHERS = ("torchrun", "gangflow")


def parse_rank0(text: str, where: str, steps: int) -> tuple[float, dict[str, float]]:
    """Rank 0's steps per second and its ``PHASES`` timestamps (ddp_steps.py's last lines), from its output."""
    import json
    import re

    found = re.search(r"^STEPS_PER_SEC ([0-9.]+)$", text, re.MULTILINE)
    ran = re.search(r" after (\d+) steps ", text)
    phases = re.search(r"^PHASES (\{.*\})$", text, re.MULTILINE)
    if not (found and ran and phases):
        raise RuntimeError(f"{where}: no STEPS_PER_SEC / PHASES line from rank 0:\n{text[-3000:]}")
    if int(ran.group(1)) != steps:
        raise RuntimeError(f"{where}: ran {ran.group(1)} steps, expected {steps}")
    return float(found.group(1)), json.loads(phases.group(1))


async def launch_once(client: Any, steps: int) -> tuple[str, float, float, float, dict[str, float]]:
    """One gangflow run of ``bench`` on a stack that is up: (run id, ``time.time()`` before ``Client.start``,
    after ``Client.wait``, rank 0's steps per second, its ``PHASES`` timestamps). Its ranks run the script,
    so they are always new processes, never a node agent's warm standbys (those take rank runners only)."""
    import time

    started = time.time()
    run_id = await client.start(bench)
    await client.wait(run_id)
    done = time.time()
    logs = await client.logs(run_id, TASK, rank=0)
    if not logs:
        raise RuntimeError(f"gangflow run {run_id}: no rank-0 log")
    sps, stamps = parse_rank0(logs[-1][1], f"gangflow run {run_id}", steps)
    return run_id, started, done, sps, stamps


def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--reps", type=int, default=5, help="warm runs per launcher (median reported)")
    parser.add_argument(
        "--cold-reps", type=int, default=3, help="cold runs per launcher, each on a fresh gangflow stack"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per run (default %(default)s)")
    output_options(parser)
    args = parser.parse_args(argv)
    at_least_one(parser, args, "reps", "cold_reps", "steps")
    return args


def command_line(result: dict[str, Any]) -> str:
    """The command that reproduces ``result``."""
    s = result["settings"]
    return f"python tests/perf/bench_launch.py --reps {s['reps']} --cold-reps {s['cold_reps']} --steps {s['steps']}"


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    cold, warm = result["cold"], result["warm"]

    def row(label: str, setting: dict[str, Any], key: str, unit: str = " s", digits: int = 2) -> list[str]:
        t, g = setting["torchrun"][key], setting["gangflow"][key]
        return [label, f"{t:.{digits}f}{unit}", f"{g:.{digits}f}{unit}", f"{g / t:.2f}"]

    rows = [
        row("cold: launch → first training step", cold, "first_step_s"),
        row("cold: launch → result", cold, "result_s"),
        ["cold: of which starting gangflow's stack", "–", f"{cold['gangflow']['stack_up_s']:.2f} s", "–"],
        row("warm: launch → first training step", warm, "first_step_s"),
        row("warm: launch → result", warm, "result_s"),
        row("training steps/s (rank 0's loop, warm)", warm, "steps_per_s", unit="", digits=1),
    ]
    header = ["median", "torchrun", "gangflow", "gangflow / torchrun"]
    phases = result["phases"]
    note = (
        f"Warm, rank 0's process starts {phases['gangflow']['to_rank_process']:.2f} s after the launch under "
        f"gangflow and {phases['torchrun']['to_rank_process']:.2f} s under torchrun (which first starts its own "
        f"Python process and elastic agent); after that both spend the same time importing torch "
        f"({phases['gangflow']['python_torch_import']:.2f} s vs {phases['torchrun']['python_torch_import']:.2f} s) "
        f"and in the training loop ({phases['gangflow']['train_loop']:.2f} s vs "
        f"{phases['torchrun']['train_loop']:.2f} s)."
    )
    return [*markdown_table(header, "lrrr", rows), "", note, "", caption(command_line(result), result)]


def table(result: dict[str, Any]) -> list[str]:
    """The plain-text table printed to stderr."""
    lines = [f"{'median':<34}{'torchrun':>10}{'gangflow':>10}{'diff':>9}{'ratio':>8}"]
    for setting in SETTINGS:
        for key in ("first_step_s", "result_s", "steps_per_s"):
            t, g = result[setting]["torchrun"][key], result[setting]["gangflow"][key]
            lines.append(f"{setting + ' ' + key:<34}{t:>10.3f}{g:>10.3f}{g - t:>+9.3f}{g / t:>8.3f}")
    lines.append(f"{'cold stack_up_s (gangflow)':<34}{'':>10}{result['cold']['gangflow']['stack_up_s']:>10.3f}")
    lines.append("\nrank-0 timeline (warm), median s")
    for key, value in result["phases"]["torchrun"].items():
        other = result["phases"]["gangflow"][key]
        lines.append(f"  {key:<28}{value:>10.3f}{other:>12.3f}{other - value:>+10.3f}")
    if result["gangflow_history"]:
        lines.append("\ngangflow path from the run's histories (warm), median s")
        for key, value in result["gangflow_history"].items():
            lines.append(f"  {key:<42}{value:>8.3f}")
    s, load = result["settings"], result["load"]
    lines.append(
        f"({s['reps']} warm and {s['cold_reps']} cold runs of {s['steps']} steps each, "
        f"{result['environment']['cores']} cores, load average {load['min']:.1f}–{load['max']:.1f})"
    )
    return lines


def main(args: Any) -> None:
    import asyncio
    import shutil
    import statistics
    import subprocess
    import sys
    import tempfile
    import time
    from dataclasses import dataclass, field
    from pathlib import Path

    from benchenv import LoadSampler, emit, environment, log, render

    from engine.client import Client
    from engine.executor.process import spawn, stop_processes
    from engine.runtime import DevServer, Endpoint, connect

    if args.render:
        render(args.render, "launch", markdown)
        return

    if args.steps != STEPS:
        raise SystemExit(f"set ${STEPS_ENV} before importing {__name__} (it says {STEPS}, --steps says {args.steps})")
    here = Path(__file__).resolve().parent
    torchrun = Path(sys.executable).parent / "torchrun"
    torchrun_cmd = [
        str(torchrun) if torchrun.exists() else "torchrun",
        "--standalone",
        f"--nproc_per_node={NPROC}",
        SCRIPT,
        *SCRIPT_ARGS,  # the very arguments the gangflow task passes
    ]

    scratch = Path(tempfile.mkdtemp(prefix="gangflow-bench-launch-"))
    # the client packs and stores the bundle; keep its cache out of ~/.cache too
    os.environ["GANGFLOW_CACHE"] = str(scratch / "client-cache")
    base_env = dict(os.environ, PYTHONUNBUFFERED="1")
    base_env[STEPS_ENV] = str(args.steps)

    @dataclass
    class Stack:
        """One local gangflow stack: a dev server, a worker and a node agent, each with its own state."""

        home: Path
        server: DevServer
        client: Client
        procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

        def spawn(self, name: str, argv: list[str]) -> None:
            home = self.home / name
            home.mkdir(parents=True)
            logfile = home / f"{name}.log"
            env = dict(
                base_env,
                GANGFLOW_ARTIFACTS=str(self.home / "artifacts"),
                GANGFLOW_CACHE=str(home / "cache"),
                TMPDIR=str(home),
            )
            proc = spawn([sys.executable, "-m", "engine.cli", *argv], log=logfile, env=env, cwd=home, new_session=True)
            self.procs.append((name, proc, logfile))

        def check_alive(self) -> None:
            for name, proc, logfile in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{logfile.read_text(errors='replace')}")

        def stop(self) -> None:
            stop_processes([proc for _name, proc, _log in reversed(self.procs)], 30, group=True)
            self.server.stop()

    async def start_stack(home: Path) -> Stack:
        """Start a stack the way ``gangflow dev --nodes 1`` does and return once its node has registered."""
        server = DevServer(home / "temporal", ui=False)
        await asyncio.to_thread(server.start)
        try:
            client = Client(await connect(Endpoint.resolve(server.address)), artifacts=str(home / "artifacts"))
        except BaseException:
            server.stop()
            raise
        stack = Stack(home, server, client)
        try:
            # worker and node agent start together: the agent's registration waits for the worker anyway
            stack.spawn("worker", ["worker", "--address", server.address])
            node = ["node", "--node-id", "bench-0", "--gpus", "0", "--cpus", str(NPROC)]
            stack.spawn("node", [*node, "--address", server.address, "--advertise-addr", "127.0.0.1"])
            deadline = time.monotonic() + 60
            while True:
                stack.check_alive()
                try:
                    if int((await client.queue())["totals"]["alive_nodes"]) >= 1:
                        return stack
                except Exception:  # the Scheduler is not up until the first agent registers
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the node agent did not register within 60 s")
                await asyncio.sleep(0.1)
        except BaseException:
            await asyncio.to_thread(stack.stop)
            raise

    def rank_breakdown(t0: float, t1: float, stamps: dict[str, float]) -> dict[str, float]:
        """Seconds of each stretch of one run, from the launcher's start (t0) to its return (t1)."""
        return {
            "to_rank_process": stamps["proc_start"] - t0,
            "python_torch_import": stamps["imported"] - stamps["proc_start"],
            "init_process_group": stamps["pg_ready"] - stamps["imported"],
            "model_ddp_setup": stamps["loop_start"] - stamps["pg_ready"],
            "train_loop": stamps["loop_end"] - stamps["loop_start"],
            "destroy_pg": stamps["pg_destroyed"] - stamps["loop_end"],
            "after_script": t1 - stamps["pg_destroyed"],
        }

    def sample(t0: float, t1: float, sps: float, stamps: dict[str, float]) -> dict[str, Any]:
        return {
            "first_step_s": stamps["loop_start"] - t0,
            "result_s": t1 - t0,
            "steps_per_s": sps,
            "phases": rank_breakdown(t0, t1, stamps),
        }

    # -- (a) torchrun --------------------------------------------------------------------------------
    def torchrun_once() -> dict[str, Any]:
        t0 = time.time()
        proc = subprocess.run(torchrun_cmd, cwd=here, env=base_env, capture_output=True, text=True, check=False)
        t1 = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        sps, stamps = parse_rank0(proc.stdout, "torchrun", args.steps)
        return sample(t0, t1, sps, stamps)

    # -- (b) gangflow --------------------------------------------------------------------------------
    async def gangflow_once(client: Client, t0: float | None = None, history: bool = True) -> dict[str, Any]:
        """One run on a stack that is up; ``t0`` (when the stack start began) for a cold run."""
        run_id, started, t1, sps, stamps = await launch_once(client, args.steps)
        result = sample(started if t0 is None else t0, t1, sps, stamps)
        if history:
            try:
                result["history"] = await history_breakdown(client, run_id, started, t1, stamps)
            except LookupError as exc:  # GangTask's events changed shape: the figures stand without it
                log(f"  (no history breakdown: {exc})")
        return result

    async def gangflow_cold_once(home: Path) -> dict[str, Any]:
        t0 = time.time()
        stack = await start_stack(home)
        try:
            up = time.time() - t0
            result = await gangflow_once(stack.client, t0=t0, history=False)
            result["stack_up_s"] = up
            return result
        finally:
            await asyncio.to_thread(stack.stop)

    async def history_breakdown(
        client: Client, run_id: str, t0: float, t1: float, stamps: dict[str, float]
    ) -> dict[str, float]:
        """Where a gangflow run's wall time went, from the user run's and its GangTask's histories."""
        from temporalio.api.enums.v1 import EventType

        def when(event: Any) -> float:
            return float(event.event_time.ToDatetime().timestamp())

        def first(events: list[Any], kind: str, after: float = 0.0, activity: str | None = None) -> float:
            code = EventType.Value(f"EVENT_TYPE_{kind}")
            for event in events:
                if event.event_type != code or when(event) < after:
                    continue
                if activity is not None and event.activity_task_scheduled_event_attributes.activity_type.name != (
                    activity
                ):
                    continue
                return when(event)
            raise LookupError(f"no {kind} event in the history of {run_id}")

        def scheduled_id(events: list[Any], activity: str) -> int:
            code = EventType.Value("EVENT_TYPE_ACTIVITY_TASK_SCHEDULED")
            for event in events:
                if event.event_type == code and event.activity_task_scheduled_event_attributes.activity_type.name == (
                    activity
                ):
                    return int(event.event_id)
            raise LookupError(f"{activity} was never scheduled in {run_id}")

        def activity_event(events: list[Any], kind: str, sched: int) -> float:
            code = EventType.Value(f"EVENT_TYPE_ACTIVITY_TASK_{kind}")
            attr = f"activity_task_{kind.lower()}_event_attributes"
            for event in events:
                if event.event_type == code and getattr(event, attr).scheduled_event_id == sched:
                    return when(event)
            raise LookupError(f"no ACTIVITY_TASK_{kind} for event {sched} in {run_id}")

        user = [e async for e in client.handle(run_id).fetch_history_events()]
        child_id = f"{run_id}.{TASK}-1"
        gang = [e async for e in client.temporal.get_workflow_handle(child_id).fetch_history_events()]
        port_id = scheduled_id(gang, "gangflow.reserve_port")
        ranks_id = scheduled_id(gang, "gangflow.run_ranks")
        user_started = first(user, "WORKFLOW_EXECUTION_STARTED")
        gang_started = first(gang, "WORKFLOW_EXECUTION_STARTED")
        placed = first(gang, "WORKFLOW_EXECUTION_SIGNALED")
        port_scheduled = first(gang, "ACTIVITY_TASK_SCHEDULED", activity="gangflow.reserve_port")
        port_done = activity_event(gang, "COMPLETED", port_id)
        ranks_scheduled = first(gang, "ACTIVITY_TASK_SCHEDULED", activity="gangflow.run_ranks")
        ranks_started = activity_event(gang, "STARTED", ranks_id)
        ranks_done = activity_event(gang, "COMPLETED", ranks_id)
        gang_done = first(gang, "WORKFLOW_EXECUTION_COMPLETED")
        user_done = first(user, "WORKFLOW_EXECUTION_COMPLETED")
        return {
            # client.start → run_ranks handed to the node agent
            "client_start_to_user_wf_started": user_started - t0,
            "user_wf_to_gangrun_started": gang_started - user_started,
            "gangrun_to_placement_signal": placed - gang_started,
            "placement_to_reserve_port_scheduled": port_scheduled - placed,
            "reserve_port_activity": port_done - port_scheduled,
            "port_to_run_ranks_scheduled": ranks_scheduled - port_done,
            "run_ranks_scheduled_to_started": ranks_started - ranks_scheduled,
            "start_to_run_ranks_started": ranks_started - t0,
            # the node agent's activity: spawn ranks, the script, poll, upload logs
            "run_ranks_started_to_rank_process": stamps["proc_start"] - ranks_started,
            "run_ranks_activity": ranks_done - ranks_started,
            "rank0_destroyed_to_run_ranks_completed": ranks_done - stamps["pg_destroyed"],
            # completion: GangTask → user run → client.wait
            "run_ranks_completed_to_gangrun_completed": gang_done - ranks_done,
            "gangrun_completed_to_user_wf_completed": user_done - gang_done,
            "user_wf_completed_to_wait_returned": t1 - user_done,
            "completion_total": t1 - ranks_done,
        }

    async def run_all() -> dict[str, dict[str, list[dict[str, Any]]]]:
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {s: {k: [] for k in LAUNCHERS} for s in SETTINGS}

        def show(setting: str, i: int, n: int) -> None:
            t, g = samples[setting]["torchrun"][-1], samples[setting]["gangflow"][-1]
            log(
                f"  {setting} {i + 1}/{n}: torchrun {t['first_step_s']:.2f} / {t['result_s']:.2f} s | gangflow "
                f"{g['first_step_s']:.2f} / {g['result_s']:.2f} s (first step / result)"
                + (f", stack up in {g['stack_up_s']:.2f} s" if "stack_up_s" in g else "")
            )

        # warm first: it also warms the page cache (torch, temporalio, the server binary) for the cold runs
        stack = await start_stack(scratch / "warm")
        try:
            log(f"stack up on {stack.server.address}; {args.steps} steps per run")
            # warm-up (not counted): bundle extraction on the node, sticky workflow caches
            warm_t = await asyncio.to_thread(torchrun_once)
            warm_g = await gangflow_once(stack.client, history=False)
            log(f"  warm-up: torchrun {warm_t['result_s']:.2f} s, gangflow {warm_g['result_s']:.2f} s")
            for i in range(args.reps):  # interleaved a/b
                samples["warm"]["torchrun"].append(await asyncio.to_thread(torchrun_once))
                samples["warm"]["gangflow"].append(await gangflow_once(stack.client))
                show("warm", i, args.reps)
        finally:
            await asyncio.to_thread(stack.stop)
        for i in range(args.cold_reps):
            samples["cold"]["torchrun"].append(await asyncio.to_thread(torchrun_once))
            samples["cold"]["gangflow"].append(await gangflow_cold_once(scratch / f"cold-{i}"))
            show("cold", i, args.cold_reps)
        return samples

    try:
        with LoadSampler() as load:
            samples = asyncio.run(run_all())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    def med_dict(rows: list[dict[str, float]]) -> dict[str, float]:
        return {key: med([row[key] for row in rows]) for key in rows[0]} if rows else {}

    figures = ("first_step_s", "result_s", "steps_per_s", "stack_up_s")
    result: dict[str, Any] = {"benchmark": "launch"}
    for setting in SETTINGS:
        entry: dict[str, Any] = {}
        for launcher in LAUNCHERS:
            runs = samples[setting][launcher]
            entry[launcher] = {k: med([s[k] for s in runs]) for k in figures if k in runs[0]}
        for key in ("first_step_s", "result_s"):
            entry[f"{key.removesuffix('_s')}_ratio"] = round(entry["gangflow"][key] / entry["torchrun"][key], 3)
        result[setting] = entry
    result.update(
        settings={"steps": args.steps, "reps": args.reps, "cold_reps": args.cold_reps, "nproc": NPROC},
        samples={
            setting: {
                launcher: {k: [round(s[k], 3) for s in runs] for k in figures if k in runs[0]}
                for launcher, runs in by_launcher.items()
            }
            for setting, by_launcher in samples.items()
        },
        # medians, seconds: the rank-0 script's own stretches (both launchers, warm) and gangflow's path
        phases={k: med_dict([s["phases"] for s in samples["warm"][k]]) for k in LAUNCHERS},
        gangflow_history=med_dict([s["history"] for s in samples["warm"]["gangflow"] if "history" in s]),
        environment=environment(),
        load=load.summary(),
    )
    emit(result, markdown(result) if args.markdown else table(result))


if __name__ == "__main__":
    from benchenv import main_by_name

    _args = parse_args()
    # the step count must be in the environment before the import by name (the task's script args are fixed
    # when it is decorated)
    os.environ[STEPS_ENV] = str(_args.steps)
    main_by_name("bench_launch", _args)
