"""Launch overhead: the same 2-rank DDP script run by plain torchrun and by gangflow, wall time and steps/s.

    python tests/perf/bench_launch.py [--reps N] [--steps N]

(a) ``torchrun --standalone --nproc_per_node=2 ddp_steps.py --steps N`` and (b) a gangflow run of the
workflow ``bench`` below, whose one task is ``PyTorch(nnodes=1, nproc_per_node=2, script="ddp_steps.py")``,
on a local stack started here (Temporal dev server, one ``gangflow worker``, one ``gangflow node``), all on
127.0.0.1. One warm-up of each, then ``--reps`` runs of each, alternating a/b so drift hits both alike.
gangflow's wall time is ``Client.start`` → ``Client.wait`` returning; torchrun's is its process's life.

Prints ONE JSON line to stdout (medians, gangflow − torchrun, gangflow / torchrun, the samples, and where
the time went) and a table to stderr. Not a test: nothing here asserts on timings.

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
def parse_args(argv: list[str] | None = None) -> Any:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="measured runs per launcher (median reported)")
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per run (default %(default)s)")
    return parser.parse_args(argv)


def main(args: Any) -> None:
    import asyncio
    import json
    import re
    import shutil
    import signal
    import statistics
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    from engine.client import Client
    from engine.runtime import DevServer, Endpoint, connect

    if args.steps != STEPS:
        raise SystemExit(f"set ${STEPS_ENV} before importing {__name__} (it says {STEPS}, --steps says {args.steps})")
    reps = max(1, args.reps)
    here = Path(__file__).resolve().parent
    torchrun = Path(sys.executable).parent / "torchrun"
    torchrun_cmd = [
        str(torchrun) if torchrun.exists() else "torchrun",
        "--standalone",
        f"--nproc_per_node={NPROC}",
        SCRIPT,
        *SCRIPT_ARGS,  # the very arguments the gangflow task passes
    ]
    err = sys.__stderr__ or sys.stderr

    def log(msg: str) -> None:
        print(msg, file=err, flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="gangflow-bench-launch-"))
    artifacts = scratch / "artifacts"
    # the client packs and stores the bundle; keep its cache out of ~/.cache too
    os.environ["GANGFLOW_CACHE"] = str(scratch / "client-cache")
    base_env = dict(os.environ, PYTHONUNBUFFERED="1", GANGFLOW_ARTIFACTS=str(artifacts))
    base_env[STEPS_ENV] = str(args.steps)
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def spawn(name: str, argv: list[str], ready: str | None) -> None:
        home = scratch / name
        home.mkdir(parents=True)
        logfile = home / f"{name}.log"
        env = dict(base_env, GANGFLOW_CACHE=str(home / "cache"), TMPDIR=str(home))
        with open(logfile, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=home,
                start_new_session=True,
            )
        procs.append((name, proc, logfile))
        deadline = time.monotonic() + 60
        while ready is not None and ready.encode() not in logfile.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{logfile.read_text(errors='replace')}")
            time.sleep(0.05)

    def stop_all() -> None:
        for _name, proc, _log in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _name, proc, _log in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def parse_rank0(text: str, where: str) -> tuple[float, dict[str, float]]:
        found = re.search(r"^STEPS_PER_SEC ([0-9.]+)$", text, re.MULTILINE)
        steps = re.search(r" after (\d+) steps ", text)
        phases = re.search(r"^PHASES (\{.*\})$", text, re.MULTILINE)
        if not (found and steps and phases):
            raise RuntimeError(f"{where}: no STEPS_PER_SEC / PHASES line from rank 0:\n{text[-3000:]}")
        if int(steps.group(1)) != args.steps:
            raise RuntimeError(f"{where}: ran {steps.group(1)} steps, expected {args.steps}")
        return float(found.group(1)), json.loads(phases.group(1))

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

    # -- (a) torchrun --------------------------------------------------------------------------------
    def torchrun_once() -> dict[str, Any]:
        env = dict(base_env)
        env.pop("GANGFLOW_ARTIFACTS", None)
        t0 = time.time()
        proc = subprocess.run(torchrun_cmd, cwd=here, env=env, capture_output=True, text=True, check=False)
        t1 = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        sps, stamps = parse_rank0(proc.stdout, "torchrun")
        return {"wall": t1 - t0, "sps": sps, "phases": rank_breakdown(t0, t1, stamps)}

    # -- (b) gangflow --------------------------------------------------------------------------------
    async def gangflow_once(client: Client) -> dict[str, Any]:
        t0 = time.time()
        run_id = await client.start(bench)
        await client.wait(run_id)
        t1 = time.time()
        logs = await client.logs(run_id, TASK, rank=0)
        if not logs:
            raise RuntimeError(f"gangflow run {run_id}: no rank-0 log")
        sps, stamps = parse_rank0(logs[-1][1], f"gangflow run {run_id}")
        phases = rank_breakdown(t0, t1, stamps)
        history = await history_breakdown(client, run_id, t0, t1, stamps)
        return {"wall": t1 - t0, "sps": sps, "phases": phases, "history": history, "run_id": run_id}

    async def history_breakdown(
        client: Client, run_id: str, t0: float, t1: float, stamps: dict[str, float]
    ) -> dict[str, float]:
        """Where a gangflow run's wall time went, from the user run's and its GangRun's histories."""
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
            # completion: GangRun → user run → client.wait
            "run_ranks_completed_to_gangrun_completed": gang_done - ranks_done,
            "gangrun_completed_to_user_wf_completed": user_done - gang_done,
            "user_wf_completed_to_wait_returned": t1 - user_done,
            "completion_total": t1 - ranks_done,
        }

    async def queue_ready(client: Client) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                if int((await client.queue())["totals"]["alive_nodes"]) >= 1:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the node agent did not register")
            await asyncio.sleep(0.3)

    async def run_all() -> dict[str, Any]:
        srv = DevServer(scratch / "temporal", ui=False).start()
        try:
            spawn("worker", ["worker", "--address", srv.address], "gangflow worker on")
            spawn(
                "node",
                [
                    "node",
                    "--node-id",
                    "bench-0",
                    "--gpus",
                    "0",
                    "--cpus",
                    "2",
                    "--address",
                    srv.address,
                    "--advertise-addr",
                    "127.0.0.1",
                ],
                None,
            )
            client = Client(await connect(Endpoint.resolve(srv.address)), artifacts=str(artifacts))
            await queue_ready(client)
            log(f"stack up on {srv.address}; {args.steps} steps per run, {reps} reps (+1 warm-up each)")

            # warm-up (not counted): page cache, bundle extraction on the node, sticky workflow caches
            warm_t = await asyncio.to_thread(torchrun_once)
            warm_g = await gangflow_once(client)
            log(f"  warm-up: torchrun {warm_t['wall']:.2f} s, gangflow {warm_g['wall']:.2f} s")
            samples: dict[str, list[dict[str, Any]]] = {"torchrun": [], "gangflow": []}
            for i in range(reps):  # interleaved a/b
                samples["torchrun"].append(await asyncio.to_thread(torchrun_once))
                samples["gangflow"].append(await gangflow_once(client))
                t, g = samples["torchrun"][-1], samples["gangflow"][-1]
                log(
                    f"  rep {i + 1}/{reps}: torchrun {t['wall']:.2f} s {t['sps']:.1f} steps/s | "
                    f"gangflow {g['wall']:.2f} s {g['sps']:.1f} steps/s"
                )
            return samples
        finally:
            stop_all()
            srv.stop()

    try:
        samples = asyncio.run(run_all())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    def med_dict(rows: list[dict[str, float]]) -> dict[str, float]:
        return {key: med([row[key] for row in rows]) for key in rows[0]}

    tr, gf = samples["torchrun"], samples["gangflow"]
    t_wall, g_wall = med([s["wall"] for s in tr]), med([s["wall"] for s in gf])
    t_sps, g_sps = med([s["sps"] for s in tr]), med([s["sps"] for s in gf])
    result = {
        "steps": args.steps,
        "reps": reps,
        "torchrun_wall_s": t_wall,
        "gangflow_wall_s": g_wall,
        "diff_s": round(g_wall - t_wall, 3),
        "ratio": round(g_wall / t_wall, 3),
        "torchrun_steps_per_s": t_sps,
        "gangflow_steps_per_s": g_sps,
        "steps_per_s_ratio": round(g_sps / t_sps, 3),
        "samples": {
            "torchrun_wall_s": [round(s["wall"], 3) for s in tr],
            "gangflow_wall_s": [round(s["wall"], 3) for s in gf],
            "torchrun_steps_per_s": [round(s["sps"], 2) for s in tr],
            "gangflow_steps_per_s": [round(s["sps"], 2) for s in gf],
        },
        # medians, seconds: the rank-0 script's own stretches (both launchers) and gangflow's path
        "phases": {"torchrun": med_dict([s["phases"] for s in tr]), "gangflow": med_dict([s["phases"] for s in gf])},
        "gangflow_history": med_dict([s["history"] for s in gf]),
        "machine": f"{os.cpu_count()} cores",
    }

    log("")
    log(f"{'':<22}{'torchrun':>12}{'gangflow':>12}{'diff':>10}{'ratio':>8}")
    log(f"{'wall s (median)':<22}{t_wall:>12.3f}{g_wall:>12.3f}{g_wall - t_wall:>+10.3f}{g_wall / t_wall:>8.3f}")
    log(f"{'steps/s (median)':<22}{t_sps:>12.1f}{g_sps:>12.1f}{g_sps - t_sps:>+10.1f}{g_sps / t_sps:>8.3f}")
    log("\nrank-0 timeline, median s")
    for key, value in result["phases"]["torchrun"].items():
        other = result["phases"]["gangflow"][key]
        log(f"  {key:<28}{value:>10.3f}{other:>12.3f}{other - value:>+10.3f}")
    log("\ngangflow path from the run's histories, median s")
    for key, value in result["gangflow_history"].items():
        log(f"  {key:<42}{value:>8.3f}")
    log(f"({reps} reps of {args.steps} steps, {result['machine']})")

    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    # A process that used the temporalio client may abort at interpreter exit (code 134).
    os._exit(0)


if __name__ == "__main__":
    # Run the definitions from the module imported by name (``bench_launch``), not from ``__main__``: that
    # is the name gangflow's code bundle imports it under. The step count must be in the environment
    # before that import (the task's script args are fixed when it is decorated).
    import sys

    _args = parse_args()
    os.environ[STEPS_ENV] = str(_args.steps)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_launch

    bench_launch.main(_args)
