"""Orchestration overhead: gangflow vs. hand-written temporalio on the same dev server, same run.

    python tests/perf/bench_orchestration.py [--reps N] [--quick] [--sandboxed-baseline] [--markdown] [--profile]
    python tests/perf/bench_orchestration.py --render RESULT.json     # the README rows of a saved JSON line

Measures the per-task cost (ms) of

* ``chain_100``             100 no-op tasks awaited one after another in one workflow,
* ``fanout_200``            200 no-op tasks gathered in one workflow (``asyncio.gather``),
* ``workflows_50``          50 one-task workflows started together (total wall / 50),
* ``chain_100_lightweight`` the chain again with ``lightweight=True`` tasks, against local activities,

each for gangflow and for plain temporalio code doing the same thing: its own worker and task queue, built
from gangflow's worker configuration (the same concurrency, sticky-queue and heartbeat settings) and run
under the same workflow runner as gangflow's user workflows. Those run without Temporal's import sandbox
by design (bundles are loaded once per worker), so the baseline does too; ``--sandboxed-baseline`` adds a
third column, the baseline under the default sandbox, for reference only (no ratio is taken against it).
One warm-up run per item, then the median of ``--reps`` runs, interleaved. Prints ONE JSON line to stdout
and a table to stderr (``--markdown``: the README's rows instead). Not a test: nothing asserts on timings.

This file is also the code bundle gangflow ships to its worker (``Client.start`` packs the folder of the
workflow's module), and the module the temporalio sandbox re-imports for every sandboxed baseline run: keep
its import-time work to the definitions below, everything else inside ``main``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio import workflow as tw

# ---------------------------------------------------------------------------------------------------------
# hand-written temporalio baseline (task queue "baseline"; "baseline-sandboxed" for the reference column).
# No ``sandboxed=`` here: the worker's runner decides, so one set of classes serves both settings.
# ---------------------------------------------------------------------------------------------------------
BASELINE_QUEUE = "baseline"
SANDBOXED_QUEUE = "baseline-sandboxed"
_TIMEOUT = timedelta(seconds=30)


@activity.defn(name="baseline_noop")
async def baseline_noop(i: int) -> int:
    return i


async def _chain(n: int, execute: Any) -> int:
    """``n`` no-op activities one after another, run by ``execute`` (as activities or local activities)."""
    total = 0
    for i in range(n):
        total += await execute(baseline_noop, i, start_to_close_timeout=_TIMEOUT)
    return total


@tw.defn(name="BaselineChain")
class BaselineChain:
    @tw.run
    async def run(self, n: int) -> int:
        return await _chain(n, tw.execute_activity)


@tw.defn(name="BaselineChainLocal")
class BaselineChainLocal:
    @tw.run
    async def run(self, n: int) -> int:
        return await _chain(n, tw.execute_local_activity)


@tw.defn(name="BaselineFanout")
class BaselineFanout:
    @tw.run
    async def run(self, n: int) -> int:
        results = await asyncio.gather(
            *(tw.execute_activity(baseline_noop, k, start_to_close_timeout=_TIMEOUT) for k in range(n))
        )
        return sum(results)


@tw.defn(name="BaselineSingle")
class BaselineSingle:
    @tw.run
    async def run(self, n: int) -> int:
        return await tw.execute_activity(baseline_noop, n, start_to_close_timeout=_TIMEOUT)


BASELINE_WORKFLOWS = [BaselineChain, BaselineChainLocal, BaselineFanout, BaselineSingle]

# ---------------------------------------------------------------------------------------------------------
# gangflow (task queue "gangflow"). Skipped when the temporalio sandbox re-imports this module for a
# sandboxed baseline run, so that baseline pays only for what a hand-written module would hold.
# ---------------------------------------------------------------------------------------------------------
if not tw.unsafe.in_sandbox():
    import engine as gf

    @gf.task
    def noop(i: int) -> int:
        return i

    @gf.task(lightweight=True)
    def noop_light(i: int) -> int:
        return i

    @gf.workflow
    async def chain(n: int) -> int:
        total = 0
        for i in range(n):
            total += await noop(i=i)
        return total

    @gf.workflow
    async def chain_light(n: int) -> int:
        total = 0
        for i in range(n):
            total += await noop_light(i=i)
        return total

    @gf.workflow
    async def fanout(n: int) -> int:
        return sum(await asyncio.gather(*(noop(i=k) for k in range(n))))

    @gf.workflow
    async def single(n: int) -> int:
        return await noop(i=n)


# ---------------------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------------------
CHAIN_N = 100
FANOUT_N = 200
WORKFLOWS_N = 50

#: README labels, in table order
LABELS = {
    "chain_100": f"(a) chain of {CHAIN_N} no-op tasks",
    "fanout_200": f"(b) fan-out of {FANOUT_N} no-op tasks, gathered",
    "workflows_50": f"(c) {WORKFLOWS_N} one-task workflows started together",
    "chain_100_lightweight": f"(d) chain of {CHAIN_N} with `lightweight=True` (baseline: local activities)",
}


def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--reps", type=int, default=3, help="measured runs per item (median reported)")
    parser.add_argument("--quick", action="store_true", help="one measured run per item (same sizes)")
    parser.add_argument(
        "--sandboxed-baseline",
        action="store_true",
        help="also time the baseline under Temporal's default sandbox (a reference column, not compared)",
    )
    output_options(parser)
    parser.add_argument(
        "--profile", action="store_true", help="also print where the time goes (history event gaps) to stderr"
    )
    args = parser.parse_args(argv)
    at_least_one(parser, args, "reps")
    return args


def command_line(result: dict[str, Any]) -> str:
    """The command that reproduces ``result``."""
    settings = result["settings"]
    extra = " --sandboxed-baseline" if settings["sandboxed_baseline_column"] else ""
    return f"python tests/perf/bench_orchestration.py --reps {settings['reps']}{extra}"


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    items: dict[str, dict[str, Any]] = result["items"]
    sandboxed_column = result["settings"]["sandboxed_baseline_column"]
    runner = "sandboxed" if result["settings"]["baseline_sandboxed"] else "unsandboxed"
    header = ["item", "gangflow", f"hand-written temporalio ({runner}, like gangflow)", "ratio"]
    if sandboxed_column:
        header.append("temporalio, sandboxed (reference only)")
    rows = []
    for key, label in LABELS.items():
        entry = items[key]
        row = [label, f"{entry['gangflow_ms']:.1f} ms", f"{entry['temporalio_ms']:.1f} ms", f"{entry['ratio']:.2f}"]
        if sandboxed_column:
            row.append(f"{entry['temporalio_sandboxed_ms']:.1f} ms")
        rows.append(row)
    return [*markdown_table(header, "lrrr" + "r" * sandboxed_column, rows), "", caption(command_line(result), result)]


def table(result: dict[str, Any]) -> list[str]:
    """The plain-text table printed to stderr."""
    sandboxed_column = result["settings"]["sandboxed_baseline_column"]
    lines = [
        f"{'item':<24}{'gangflow ms/task':>18}{'temporalio ms/task':>20}{'ratio':>8}"
        + (f"{'sandboxed ms/task':>19}" if sandboxed_column else "")
    ]
    for key, entry in result["items"].items():
        line = f"{key:<24}{entry['gangflow_ms']:>18.2f}{entry['temporalio_ms']:>20.2f}{entry['ratio']:>8.2f}"
        if sandboxed_column:
            line += f"{entry['temporalio_sandboxed_ms']:>19.2f}"
        lines.append(line)
    load = result["load"]
    lines.append(
        f"(median of {result['settings']['reps']}; baseline sandboxed: {result['settings']['baseline_sandboxed']}, "
        f"like gangflow's user workflows; {result['environment']['cores']} cores, "
        f"load average {load['min']:.1f}–{load['max']:.1f})"
    )
    return lines


def main(args: Any) -> None:
    import contextlib
    import os
    import statistics
    import time
    import uuid
    from pathlib import Path

    from benchenv import log, run_benchmark
    from temporalio.client import Client as TemporalClient
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    from engine.client import Client
    from engine.runtime import DevServer, Endpoint, build_worker, connect
    from workflows.shell import UserWorkflow

    reps = 1 if args.quick else args.reps
    # What decides the runner of gangflow's user workflows: the shell's own definition (``sandboxed=``),
    # read rather than assumed so that the baseline follows if that choice ever changes.
    gangflow_sandboxed = tw._Definition.must_from_class(UserWorkflow).sandboxed

    async def timed(coro_fn) -> float:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        await coro_fn()
        return (time.perf_counter() - t0) * 1000.0

    def baseline_worker(gf_worker: Worker, task_queue: str, sandboxed: bool) -> Worker:
        """A worker with gangflow's settings, the baseline's code, and the given runner."""
        config = gf_worker.config()
        # gangflow's own hooks are part of what is measured, not settings to copy
        for key in ("interceptors", "plugins", "identity"):
            config.pop(key, None)  # type: ignore[misc]
        if sandboxed:
            runner = config.get("workflow_runner") if gangflow_sandboxed else None
            config["workflow_runner"] = runner or SandboxedWorkflowRunner()
        else:
            config["workflow_runner"] = UnsandboxedWorkflowRunner()
        config["task_queue"] = task_queue
        config["workflows"] = BASELINE_WORKFLOWS
        config["activities"] = [baseline_noop]
        return Worker(**config)

    async def bench(scratch: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        srv = DevServer(os.path.join(scratch, "server"), ui=False).start()
        try:
            tc: TemporalClient = await connect(Endpoint.resolve(srv.address))
            gf_worker = build_worker(tc)
            workers = [gf_worker, baseline_worker(gf_worker, BASELINE_QUEUE, gangflow_sandboxed)]
            if args.sandboxed_baseline:
                workers.append(baseline_worker(gf_worker, SANDBOXED_QUEUE, True))
            client = Client(tc, artifacts=os.path.join(scratch, "artifacts"))
            last_ids: dict[str, str] = {}

            # -- one run of each item, per side -----------------------------------------------------
            async def gf_run(wf, n: int, key: str) -> None:  # type: ignore[no-untyped-def]
                run_id = await client.start(wf, {"n": n})
                last_ids[key] = run_id
                await client.wait(run_id)

            async def tp_run(name: str, n: int, key: str, queue: str) -> None:
                wid = f"{name}-{uuid.uuid4().hex[:8]}"
                last_ids[key] = wid
                await tc.execute_workflow(name, n, id=wid, task_queue=queue, result_type=int)

            async def gf_many() -> None:
                ids = await asyncio.gather(*(client.start(single, {"n": k}) for k in range(WORKFLOWS_N)))
                await asyncio.gather(*(client.wait(i) for i in ids))

            async def tp_many(queue: str) -> None:
                handles = await asyncio.gather(
                    *(
                        tc.start_workflow(
                            "BaselineSingle", k, id=f"single-{uuid.uuid4().hex[:8]}", task_queue=queue, result_type=int
                        )
                        for k in range(WORKFLOWS_N)
                    )
                )
                await asyncio.gather(*(h.result() for h in handles))

            def baseline(name: str, n: int, key: str) -> Any:
                """The item's baseline on each queue measured: (unsandboxed-like-gangflow, sandboxed or None)."""

                def on(queue: str, suffix: str) -> Any:
                    if name == "BaselineSingle":
                        return lambda: tp_many(queue)
                    return lambda: tp_run(name, n, key + suffix, queue)

                return on(BASELINE_QUEUE, ""), (on(SANDBOXED_QUEUE, "_sb") if args.sandboxed_baseline else None)

            items = {
                "chain_100": (
                    CHAIN_N,
                    lambda: gf_run(chain, CHAIN_N, "gf_chain"),
                    baseline("BaselineChain", CHAIN_N, "tp_chain"),
                ),
                "fanout_200": (
                    FANOUT_N,
                    lambda: gf_run(fanout, FANOUT_N, "gf_fanout"),
                    baseline("BaselineFanout", FANOUT_N, "tp_fanout"),
                ),
                "workflows_50": (WORKFLOWS_N, gf_many, baseline("BaselineSingle", WORKFLOWS_N, "tp_many")),
                "chain_100_lightweight": (
                    CHAIN_N,
                    lambda: gf_run(chain_light, CHAIN_N, "gf_light"),
                    baseline("BaselineChainLocal", CHAIN_N, "tp_light"),
                ),
            }

            results: dict[str, Any] = {}
            async with contextlib.AsyncExitStack() as stack:
                for worker in workers:
                    await stack.enter_async_context(worker)
                for key, (n, gf_fn, (tp_fn, sb_fn)) in items.items():
                    sides = [("gangflow", gf_fn), ("temporalio", tp_fn)]
                    if sb_fn is not None:
                        sides.append(("temporalio_sandboxed", sb_fn))
                    for _side, fn in sides:  # warm-up: bundle extraction, imports, sticky caches, sqlite pages
                        await fn()
                    samples: dict[str, list[float]] = {side: [] for side, _ in sides}
                    for _ in range(reps):  # interleaved, so drift hits every side alike
                        for side, fn in sides:
                            samples[side].append(await timed(fn) / n)
                    entry: dict[str, Any] = {"n": n}
                    for side, values in samples.items():
                        entry[f"{side}_ms"] = round(statistics.median(values), 3)
                    entry["ratio"] = round(entry["gangflow_ms"] / entry["temporalio_ms"], 3)
                    entry["samples_ms"] = {side: [round(x, 2) for x in values] for side, values in samples.items()}
                    results[key] = entry
                    log(f"  {key}: " + "  ".join(f"{s} {v}" for s, v in entry["samples_ms"].items()))

                if args.profile:
                    for key in ("gf_chain", "tp_chain", "gf_fanout", "tp_fanout", "gf_light", "tp_light"):
                        await profile_history(tc, last_ids[key], key, log)
            knobs = {
                k: str(v)
                for k, v in gf_worker.config().items()
                if k.startswith(("max_concurrent", "sticky", "max_heartbeat", "default_heartbeat")) and v is not None
            }
            return results, knobs
        finally:
            srv.stop()

    def measure(scratch: Path) -> dict[str, Any]:
        results, knobs = asyncio.run(bench(scratch))
        settings = {
            "reps": reps,
            "gangflow_sandboxed": gangflow_sandboxed,
            "baseline_sandboxed": gangflow_sandboxed,
            "sandboxed_baseline_column": bool(args.sandboxed_baseline),
            "server": "temporal dev server (sqlite file), 127.0.0.1",
            "worker_settings": knobs,
        }
        return {"items": results, "settings": settings}

    run_benchmark("orchestration", args, markdown, table, measure)


async def profile_history(client, workflow_id: str, label: str, log) -> None:  # type: ignore[no-untyped-def]
    """Mean gap (ms) between consecutive history events, by (previous, next) event type: shows whether
    time goes to the worker (workflow task / activity processing) or to the server."""
    from collections import defaultdict
    from itertools import pairwise

    from temporalio.api.enums.v1 import EventType

    def name(event) -> str:  # type: ignore[no-untyped-def]
        return str(EventType.Name(event.event_type)).removeprefix("EVENT_TYPE_")

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    events = list(history.events)
    gaps: dict[tuple[str, str], list[float]] = defaultdict(list)
    for prev, cur in pairwise(events):
        dt = (cur.event_time.ToDatetime() - prev.event_time.ToDatetime()).total_seconds() * 1000
        gaps[(name(prev), name(cur))].append(dt)
    total = (events[-1].event_time.ToDatetime() - events[0].event_time.ToDatetime()).total_seconds() * 1000
    log(f"\n[{label}] {workflow_id}: {len(events)} events, {total:.0f} ms first→last event")
    for (a, b), vals in sorted(gaps.items(), key=lambda kv: -sum(kv[1])):
        log(f"  {a:>32} → {b:<32} n={len(vals):<4} mean {sum(vals) / len(vals):7.2f} ms  sum {sum(vals):8.1f} ms")


if __name__ == "__main__":
    from benchenv import main_by_name

    main_by_name("bench_orchestration", parse_args())
