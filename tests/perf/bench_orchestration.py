"""Orchestration overhead: gangflow vs. hand-written temporalio on the same dev server, same run.

    python tests/perf/bench_orchestration.py [--reps N] [--quick] [--profile]

Measures the per-task cost (ms) of

* ``chain_100``             100 no-op tasks awaited one after another in one workflow,
* ``fanout_200``            200 no-op tasks gathered in one workflow (``asyncio.gather``),
* ``workflows_50``          50 one-task workflows started together (total wall / 50),
* ``chain_100_lightweight`` the chain again with ``lightweight=True`` tasks (local activities; gangflow only),

each for gangflow and for plain temporalio code doing the same thing (its own worker and task queue, the
same worker knobs). One warm-up run per item, then the median of ``--reps`` runs. Prints ONE JSON line to
stdout and a table to stderr. Not a test: nothing here asserts on timings.

This file is also the code bundle gangflow ships to its worker (``Client.start`` packs the folder of the
workflow's module), and the module the temporalio sandbox re-imports for every baseline workflow run: keep
its import-time work to the definitions below, everything else inside ``main``.
"""

import asyncio
from datetime import timedelta

from temporalio import activity
from temporalio import workflow as tw

# ---------------------------------------------------------------------------------------------------------
# hand-written temporalio baseline (task queue "baseline")
# ---------------------------------------------------------------------------------------------------------
BASELINE_QUEUE = "baseline"
_TIMEOUT = timedelta(seconds=30)


@activity.defn(name="baseline_noop")
async def baseline_noop(i: int) -> int:
    return i


@tw.defn(name="BaselineChain")
class BaselineChain:
    @tw.run
    async def run(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += await tw.execute_activity(baseline_noop, i, start_to_close_timeout=_TIMEOUT)
        return total


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


# ---------------------------------------------------------------------------------------------------------
# gangflow (task queue "gangflow"). Skipped when the temporalio sandbox re-imports this module for a
# baseline run, so the baseline pays only for what a hand-written module would hold.
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


def main() -> None:
    import argparse
    import json
    import os
    import shutil
    import statistics
    import sys
    import tempfile
    import time
    import uuid

    from temporalio.client import Client as TemporalClient
    from temporalio.worker import Worker

    from engine.client import Client
    from engine.runtime import DevServer, Endpoint, build_worker, connect

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="measured runs per item (median reported)")
    parser.add_argument("--quick", action="store_true", help="one measured run per item (same sizes)")
    parser.add_argument(
        "--profile", action="store_true", help="also print where the time goes (history event gaps) to stderr"
    )
    args = parser.parse_args()
    reps = 1 if args.quick else max(1, args.reps)

    scratch = tempfile.mkdtemp(prefix="gangflow-bench-")
    # The worker extracts code bundles into the cache: keep them out of ~/.cache.
    os.environ["GANGFLOW_CACHE"] = os.path.join(scratch, "cache")
    err = sys.__stderr__ or sys.stderr

    def log(msg: str) -> None:
        print(msg, file=err, flush=True)

    async def timed(coro_fn) -> float:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        await coro_fn()
        return (time.perf_counter() - t0) * 1000.0

    async def bench() -> dict:  # type: ignore[type-arg]
        srv = DevServer(os.path.join(scratch, "server"), ui=False).start()
        try:
            tc: TemporalClient = await connect(Endpoint.resolve(srv.address))
            gf_worker = build_worker(tc)
            base_worker = Worker(
                tc,
                task_queue=BASELINE_QUEUE,
                workflows=[BaselineChain, BaselineFanout, BaselineSingle],
                activities=[baseline_noop],
                max_concurrent_activities=100,
                max_concurrent_workflow_tasks=100,
                graceful_shutdown_timeout=timedelta(seconds=5),
            )
            client = Client(tc, artifacts=os.path.join(scratch, "artifacts"))
            last_ids: dict[str, str] = {}

            # -- one run of each item, per side -----------------------------------------------------
            async def gf_run(wf, n: int, key: str) -> None:  # type: ignore[no-untyped-def]
                run_id = await client.start(wf, {"n": n})
                last_ids[key] = run_id
                await client.wait(run_id)

            async def tp_run(name: str, n: int, key: str) -> None:
                wid = f"{name}-{uuid.uuid4().hex[:8]}"
                last_ids[key] = wid
                await tc.execute_workflow(name, n, id=wid, task_queue=BASELINE_QUEUE, result_type=int)

            async def gf_many() -> None:
                ids = await asyncio.gather(*(client.start(single, {"n": k}) for k in range(WORKFLOWS_N)))
                await asyncio.gather(*(client.wait(i) for i in ids))

            async def tp_many() -> None:
                handles = await asyncio.gather(
                    *(
                        tc.start_workflow(
                            "BaselineSingle",
                            k,
                            id=f"single-{uuid.uuid4().hex[:8]}",
                            task_queue=BASELINE_QUEUE,
                            result_type=int,
                        )
                        for k in range(WORKFLOWS_N)
                    )
                )
                await asyncio.gather(*(h.result() for h in handles))

            items = {
                "chain_100": (
                    CHAIN_N,
                    lambda: gf_run(chain, CHAIN_N, "gf_chain"),
                    lambda: tp_run("BaselineChain", CHAIN_N, "tp_chain"),
                ),
                "fanout_200": (
                    FANOUT_N,
                    lambda: gf_run(fanout, FANOUT_N, "gf_fanout"),
                    lambda: tp_run("BaselineFanout", FANOUT_N, "tp_fanout"),
                ),
                "workflows_50": (WORKFLOWS_N, gf_many, tp_many),
                "chain_100_lightweight": (CHAIN_N, lambda: gf_run(chain_light, CHAIN_N, "gf_light"), None),
            }

            results: dict = {}  # type: ignore[type-arg]
            async with gf_worker, base_worker:
                for key, (n, gf_fn, tp_fn) in items.items():
                    # warm-up: code bundle extraction, imports, sticky caches, sqlite pages
                    await gf_fn()
                    if tp_fn is not None:
                        await tp_fn()
                    gf_ms: list[float] = []
                    tp_ms: list[float] = []
                    for _ in range(reps):  # interleaved, so drift hits both sides alike
                        gf_ms.append(await timed(gf_fn) / n)
                        if tp_fn is not None:
                            tp_ms.append(await timed(tp_fn) / n)
                    entry = {"gangflow_ms": round(statistics.median(gf_ms), 3)}
                    if tp_ms:
                        entry["temporalio_ms"] = round(statistics.median(tp_ms), 3)
                        entry["ratio"] = round(entry["gangflow_ms"] / entry["temporalio_ms"], 3)
                    results[key] = entry
                    log(f"  {key}: gangflow {[round(x, 2) for x in gf_ms]}  temporalio {[round(x, 2) for x in tp_ms]}")

                if args.profile:
                    for key in ("gf_chain", "tp_chain", "gf_fanout", "tp_fanout", "gf_light"):
                        await profile_history(tc, last_ids[key], key, log)
            return results
        finally:
            srv.stop()

    try:
        results = asyncio.run(bench())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    results["reps"] = reps
    results["machine"] = f"{os.cpu_count()} cores"

    log("")
    log(f"{'item':<24}{'gangflow ms/task':>18}{'temporalio ms/task':>20}{'ratio':>8}")
    for key, entry in results.items():
        if isinstance(entry, dict):
            tp = entry.get("temporalio_ms")
            ratio = entry.get("ratio")
            log(
                f"{key:<24}{entry['gangflow_ms']:>18.2f}"
                + (f"{tp:>20.2f}{ratio:>8.2f}" if tp is not None else f"{'-':>20}{'-':>8}")
            )
    log(f"(median of {reps}, {results['machine']})")

    print(json.dumps(results), flush=True)
    sys.stdout.flush()
    # A process that used the temporalio client / worker may abort at interpreter exit (code 134).
    os._exit(0)


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
    # Run the definitions from the module imported by name (``bench_orchestration``), not from
    # ``__main__``: that is the name gangflow's code bundle and the temporalio sandbox import it under.
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_orchestration

    bench_orchestration.main()
