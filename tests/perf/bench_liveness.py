"""Node liveness at cluster scale: what N live node agents cost the Scheduler, then gangs placed on them.

    python tests/perf/bench_liveness.py [--nodes 1000] [--minutes 10] [--procs 2] [--gangs 1500]
                                        [--hold-s 0.5] [--json | --markdown]
    python tests/perf/bench_liveness.py --render RESULT.json   # the README rows of a saved JSON line

A Temporal dev server (its sqlite file in RAM, its limit of concurrent long polls per namespace raised: each
agent holds its own polls, as on a real cluster), the Scheduler in a real ``gangflow worker`` process, and
``--procs`` processes of simulated node agents, ``--nodes`` in all. Each simulated agent is
``engine.runtime.node.run_node``, the real agent's code: its own worker on ``node/<id>``, its lease started
and held (workflows.node_lease: the heartbeated ``HOLD_LEASE`` activity), no rank processes (unsandboxed,
as a non-root agent). Once the Scheduler counts every node alive, for ``--minutes``:

* ``scheduler_events`` / ``events_per_min`` — events added to the Scheduler's histories (every run of its
  continue-as-new chain) in the window; ``max_history_events`` — the longest run's history;
* ``signals_per_s`` — signals the Scheduler received in the window;
* ``worker_core`` — the Scheduler's worker's CPU in the window, as a fraction of one core (/proc/<pid>/stat);
  ``server_core`` and ``agents_core`` likewise, and ``agents_core_per_node``: what one simulated node costs
  its process (its polls, its lease's heartbeat every 5 s), so the figure extrapolates;
* ``lost`` — nodes the Scheduler counted lost at the end of the window (should be 0).

Then ``--gangs`` single-node gangs (1 GPU each, held ``--hold-s``) are started at once
(``bench_scheduler_workflow.BenchGang``: submit, placement, hold, release) and ``gangs_wall_s`` is the time
from the first start until none runs. Then (unless ``--no-floor``) the Scheduler is replaced by
``bench_scheduler_workflow``'s echo scheduler (it places every gang at once, on no node) and the same gangs
run again, the agents and their leases still live: ``floor_gangs_wall_s`` is what Temporal alone takes for
them on this server under that load, so the difference is the Scheduler's.

Prints ONE JSON line on stdout and a table on stderr. Not a test: nothing here asserts on figures
(run it with ``--nodes 50 --minutes 0.5 --gangs 50`` to check it still works).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["agents_main", "liveness_window", "main", "markdown", "table"]

HERE = Path(__file__).resolve().parent
#: GPUs and CPUs of each simulated node
GPUS, CPUS = 8, 32
#: agents started per second in each process: a real cluster's agents do not all start in the same second
START_RATE = 50


def node_ids(count: int) -> list[str]:
    return [f"n{i:05d}" for i in range(count)]


# -- the simulated agents (a child process) -------------------------------------------------------------
async def _agents(address: str, ids: list[str], polls: int) -> None:
    from engine.runtime import Endpoint, connect
    from engine.runtime.node import NodeConfig, run_node

    endpoint = Endpoint.resolve(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    tasks = []
    for index, node_id in enumerate(ids):
        config = NodeConfig(
            node_id=node_id, address=f"{node_id}.bench", gpus=GPUS, cpus=CPUS, drain_timeout_s=0, activity_polls=polls
        )
        # a connection of its own, as a real agent has: one shared by hundreds of workers' long polls starves
        # their other calls (HTTP/2 streams of one connection)
        tasks.append(asyncio.create_task(run_node(await connect(endpoint), config, stop)))
        if index % START_RATE == START_RATE - 1:
            await asyncio.sleep(1.0)
    print(f"agents started: {len(ids)}", flush=True)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        print(f"{len(failed)} agents failed, the first: {failed[0]!r}", flush=True)


def agents_main(address: str, first: int, count: int, polls: int) -> None:
    """``--agents ADDRESS FIRST COUNT POLLS``: run simulated agents n<FIRST>.. until SIGTERM."""
    import logging

    logging.basicConfig(level=logging.ERROR)
    os.environ["GANGFLOW_SANDBOX"] = "0"
    asyncio.run(_agents(address, node_ids(first + count)[first:], polls))


# -- the measurement --------------------------------------------------------------------------------------
def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _describe(client: Any) -> dict[str, Any]:
    from datetime import timedelta

    from engine.core.protocol import DESCRIBE_QUERY, SCHEDULER_ID

    answer: dict[str, Any] = await client.get_workflow_handle(SCHEDULER_ID).query(
        DESCRIBE_QUERY, rpc_timeout=timedelta(seconds=30)
    )
    return answer


async def _wait_alive(client: Any, count: int, timeout_s: float, log: Any) -> float:
    started = time.monotonic()
    shown = -1
    while True:
        try:
            alive = int((await _describe(client))["totals"]["alive_nodes"])
        except Exception:  # the Scheduler is starting
            alive = 0
        if alive != shown and (alive - shown >= max(1, count // 10) or alive == count):
            log(f"  {alive}/{count} nodes alive after {time.monotonic() - started:.0f} s")
            shown = alive
        if alive >= count:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"only {alive} of {count} nodes registered within {timeout_s:.0f} s")
        await asyncio.sleep(1.0)


async def _chain_events(client: Any, start: float, end: float) -> dict[str, Any]:
    """Events and received signals of every Scheduler run with an event in [start, end] (wall clock)."""
    from temporalio.api.enums.v1 import EventType

    from engine.core.protocol import SCHEDULER_ID

    events = signals = runs = longest = 0
    async for execution in client.list_workflows(f"WorkflowId = '{SCHEDULER_ID}'"):
        history = await client.get_workflow_handle(SCHEDULER_ID, run_id=execution.run_id).fetch_history()
        longest = max(longest, len(history.events))
        inside = [e for e in history.events if start <= e.event_time.ToMicroseconds() / 1e6 <= end]
        runs += bool(inside)
        events += len(inside)
        signals += sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED for e in inside)
    return {"events": events, "signals": signals, "runs": runs, "max_history_events": longest}


async def liveness_window(client: Any, minutes: float, pids: dict[str, list[int]], log: Any) -> dict[str, Any]:
    """Watch the live cluster for ``minutes``: the Scheduler's events and signals, each process's CPU."""
    start_wall, start = time.time(), time.monotonic()
    before = {name: sum(_cpu_seconds(p) for p in group) for name, group in pids.items()}
    deadline = start + minutes * 60
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, 60.0))
        log(f"  {(time.monotonic() - start) / 60:.1f} of {minutes:g} min")
    after = {name: sum(_cpu_seconds(p) for p in group) for name, group in pids.items()}
    window = time.monotonic() - start
    end_wall = time.time()
    chain = await _chain_events(client, start_wall, end_wall)
    totals = (await _describe(client))["totals"]
    core = {name: round((after[name] - before[name]) / window, 4) for name in pids}
    return {
        "window_s": round(window, 1),
        "scheduler_events": chain["events"],
        "events_per_min": round(chain["events"] / (window / 60), 1),
        "scheduler_runs": chain["runs"],
        "max_history_events": chain["max_history_events"],
        "signals": chain["signals"],
        "signals_per_s": round(chain["signals"] / window, 3),
        "worker_core": core["worker"],
        "server_core": core["server"],
        "agents_core": core["agents"],
        "alive": totals["alive_nodes"],
        "lost": totals["nodes"] - totals["alive_nodes"],
    }


async def _gangs(client: Any, count: int, hold_s: float, floor: bool) -> dict[str, Any]:
    """The gangs through the Scheduler, then (``floor``) the same gangs through the echo scheduler on the same
    server, beside the same live agents and leases: what Temporal alone takes for them under that load."""
    import bench_scheduler_workflow as sw
    from temporalio.common import WorkflowIDConflictPolicy

    from engine.core.protocol import SCHEDULER_ID

    jobs = {
        f"g{i:05d}": {"request": {"nnodes": 1, "gpus_per_node": 1, "cpus_per_node": 1.0}, "hold_s": hold_s}
        for i in range(count)
    }
    figures: dict[str, Any] = {"gangs": count}
    async with sw.gang_worker(client, count):
        for echo in (False, True) if floor else (False,):
            if echo:  # replaces the Scheduler in one call: the platform worker's keeper then finds one running
                await client.start_workflow(
                    sw.ECHO_TYPE,
                    id=SCHEDULER_ID,
                    task_queue=sw.GANG_QUEUE,
                    id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
                )
            prefix = "floor" if echo else "live"
            results, wall = await sw._run_gangs(client, jobs, prefix, 600.0, 120.0, echo, "")
            done = sum(1 for r in results.values() if "error" not in r and not r.get("rejected") and r.get("holds"))
            figures.update({f"{prefix}_gangs_done": done, f"{prefix}_gangs_wall_s": round(wall, 2)})
    # the names the README's earlier runs used
    figures["gangs_done"], figures["gangs_wall_s"] = figures.pop("live_gangs_done"), figures.pop("live_gangs_wall_s")
    return figures


def run(args: Any, log: Any) -> dict[str, Any]:
    import bench_scheduler_workflow as sw

    from engine.executor.process import spawn, stop_processes
    from engine.runtime import DevServer, Endpoint, connect

    scratch = sw.server_root(None)
    os.environ["GANGFLOW_CACHE"] = os.path.join(scratch, "cache")
    server = DevServer(os.path.join(scratch, "server"), ui=False, dynamic_config=server_config(args.nodes)).start()
    processes: list[Any] = []
    try:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        worker_log = Path(scratch) / "worker.log"
        worker = spawn(
            [sys.executable, "-m", "engine.cli", "worker", "--address", server.address],
            log=worker_log,
            env=env,
            new_session=True,
        )
        processes.append(worker)
        deadline = time.monotonic() + 60
        while b"gangflow worker on" not in worker_log.read_bytes():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the gangflow worker did not start:\n{worker_log.read_text()[-3000:]}")
            time.sleep(0.1)
        share = -(-args.nodes // args.procs)
        agents = []
        for first in range(0, args.nodes, share):
            count = min(share, args.nodes - first)
            command = [sys.executable, str(Path(__file__)), "--agents", server.address, str(first), str(count)]
            command.append(str(args.polls))
            agents.append(spawn(command, log=Path(scratch) / f"agents-{first}.log", env=env, new_session=True))
        processes.extend(agents)
        pids = {"worker": [worker.pid], "server": [server.process.pid], "agents": [a.pid for a in agents]}

        async def drive() -> dict[str, Any]:
            client = await connect(Endpoint.resolve(server.address))
            ramp = await _wait_alive(client, args.nodes, max(120.0, args.nodes / 5), log)
            log(f"all {args.nodes} nodes alive after {ramp:.0f} s; watching for {args.minutes:g} min ...")
            figures = {"nodes": args.nodes, "procs": len(agents), "polls": args.polls, "ramp_s": round(ramp, 1)}
            figures.update(await liveness_window(client, args.minutes, pids, log))
            figures["agents_core_per_node"] = round(figures["agents_core"] / args.nodes, 6)
            log(f"starting {args.gangs:,} gangs ...")
            figures.update(await _gangs(client, args.gangs, args.hold_s, args.floor))
            return figures

        return asyncio.run(drive())
    finally:
        stop_processes(processes, 15, group=True)
        server.stop()


def server_config(nodes: int) -> dict[str, int]:
    """The dev server's settings for ``nodes`` agents. Every agent holds its own long polls: the default limit
    (1,200 per namespace) is for a laptop, not a cluster. And one partition per task queue, not four: a node's
    queue has one consumer, and four partitions of each of a thousand queues are four thousand partition
    managers persisting their state (each a write into the one sqlite file) and forwarding polls to their
    root; with four, half of 1,000 simulated agents never got their lease within the dev server's deadlines.
    A production cluster sets the same for ``node/*`` queues (a per-queue constraint of its dynamic config)."""
    return {
        "frontend.namespaceCount": 10 * nodes + 2000,
        "matching.numTaskqueueReadPartitions": 1,
        "matching.numTaskqueueWritePartitions": 1,
    }


def _rows(result: dict[str, Any]) -> list[list[str]]:
    f = result["figures"]
    rows = [
        [
            "simulated node agents",
            f"{f['nodes']:,} in {f['procs']} processes, {f.get('polls', 5)} long poll(s) each"
            f" (all alive after {f['ramp_s']:.0f} s)",
        ],
        ["window", f"{f['window_s'] / 60:.1f} min, {f['lost']} nodes lost"],
        [
            "Scheduler events",
            f"{f['scheduler_events']:,} ({f['events_per_min']:g}/min), longest run {f['max_history_events']:,}",
        ],
        ["signals into the Scheduler", f"{f['signals_per_s']:g}/s"],
        ["Scheduler worker CPU", f"{f['worker_core'] * 100:.1f} % of a core"],
        ["dev server CPU", f"{f['server_core'] * 100:.1f} % of a core"],
        ["agents' CPU", f"{f['agents_core'] * 100:.1f} % of a core ({f['agents_core_per_node'] * 100:.3f} % per node)"],
        ["gangs submit → release", f"{f['gangs_done']:,}/{f['gangs']:,} in {f['gangs_wall_s']:.1f} s"],
    ]
    if "floor_gangs_wall_s" in f:
        rows.append(
            [
                "floor: the same gangs, echo scheduler",
                f"{f['floor_gangs_done']:,}/{f['gangs']:,} in {f['floor_gangs_wall_s']:.1f} s",
            ]
        )
    return rows


def markdown(result: dict[str, Any]) -> list[str]:
    from benchenv import caption, markdown_table

    f = result["figures"]
    command = f"python tests/perf/bench_liveness.py --nodes {f['nodes']} --minutes {f['window_s'] / 60:.0f}"
    return [*markdown_table(["", "measured"], "lr", _rows(result)), "", caption(command, result)]


def table(result: dict[str, Any]) -> list[str]:
    width = max(len(r[0]) for r in _rows(result))
    return [f"{name:<{width}}  {value}" for name, value in _rows(result)]


def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="simulated node agents (default 1000)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long they stay alive (default 10)")
    parser.add_argument("--procs", type=int, default=2, help="processes the agents are spread over (default 2)")
    parser.add_argument("--gangs", type=int, default=1500, help="gangs submitted afterwards (default 1500)")
    parser.add_argument(
        "--polls", type=int, default=1, help="long polls per simulated agent (default 1; a real agent keeps 5)"
    )
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="skip the same gangs through the echo scheduler"
    )
    parser.add_argument("--hold-s", type=float, default=0.5, help="how long each gang holds its GPU (default 0.5)")
    output_options(parser, json_flag=True)
    args = parser.parse_args(argv)
    at_least_one(parser, args, "nodes", "procs", "gangs", "polls")
    if not 0 < args.minutes <= 24 * 60:
        parser.error(f"--minutes must be in (0, 1440], got {args.minutes}")
    if not 0 <= args.hold_s <= 60:
        parser.error(f"--hold-s must be in [0, 60], got {args.hold_s}")
    return args


def main(args: Any) -> None:
    from benchenv import LoadSampler, emit, environment, log, render

    if args.render:
        render(args.render, "liveness", markdown)
        return
    with LoadSampler() as load:
        figures = run(args, log)
    result = {"benchmark": "liveness", "figures": figures, "environment": environment(), "load": load.summary()}
    emit(result, markdown(result) if args.markdown else [] if args.json else table(result))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    if len(sys.argv) == 6 and sys.argv[1] == "--agents":
        agents_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main(parse_args())
