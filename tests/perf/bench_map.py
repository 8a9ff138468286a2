"""engine.map at scale: a no-op map of N items vs. the same activities in a hand-written temporalio fan-out.

    python tests/perf/bench_map.py [--items N] [--concurrency C] [--reps R] [--markdown]
    python tests/perf/bench_map.py --render RESULT.json     # the README rows of a saved JSON line

gangflow: ``await engine.map(noop, range(N), concurrency=C)`` in one workflow run (chunks of 1000 items, each a
MapChunk child workflow). Baseline: a plain temporalio workflow that runs the same N no-op activities, C at a
time (C workers taking the next item), on its own worker and task queue built from gangflow's worker
configuration, on the same dev server. Reports wall time, items/s, the ratio (gangflow / hand-written time; the
goal is at most 2) and the history events per workflow (max and total over the run and its chunks): the
baseline's single workflow grows ~3.7 events per item (measured), so it passes Temporal's 10 K event warning at
~2,800 items and would fail at its 51,200-event limit near 14,000 (the figure then says so); gangflow's largest
workflow stays one chunk's (~3,700 events). One warm-up run per side, then the
median of ``--reps`` runs, interleaved. Prints ONE JSON line to stdout and a table to stderr (``--markdown``:
the README's rows instead). Not a test: nothing asserts on timings.

This file is also the code bundle gangflow ships to its worker: keep its import-time work to the definitions.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio import workflow as tw

BASELINE_QUEUE = "baseline-map"
_TIMEOUT = timedelta(seconds=60)


@activity.defn(name="baseline_noop")
async def baseline_noop(i: int) -> int:
    return i


@tw.defn(name="BaselineMap")
class BaselineMap:
    """The hand-written fan-out: ``n`` activities, ``concurrency`` at a time, in one workflow."""

    @tw.run
    async def run(self, n: int, concurrency: int) -> int:
        pending = iter(range(n))
        done = 0

        async def worker() -> None:
            nonlocal done
            for k in pending:
                await tw.execute_activity(baseline_noop, k, start_to_close_timeout=_TIMEOUT)
                done += 1

        await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
        return done


if not tw.unsafe.in_sandbox():
    import engine as gf

    @gf.task
    def noop(i: int) -> int:
        return i

    @gf.workflow
    async def noop_map(n: int, concurrency: int) -> int:
        results = await gf.map(noop, list(range(n)), concurrency=concurrency)
        return len(results)


def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--items", type=int, default=10_000, help="items in the map (default 10000)")
    parser.add_argument("--concurrency", type=int, default=16, help="items in flight (default 16, engine.map's)")
    parser.add_argument("--reps", type=int, default=1, help="measured runs per side (median reported)")
    output_options(parser)
    args = parser.parse_args(argv)
    at_least_one(parser, args, "items", "concurrency", "reps")
    return args


def command_line(result: dict[str, Any]) -> str:
    s = result["settings"]
    return f"python tests/perf/bench_map.py --items {s['items']} --concurrency {s['concurrency']} --reps {s['reps']}"


def _cells(side: dict[str, Any]) -> list[str]:
    if side.get("error"):
        return ["failed", "—", "—", "—"]
    return [
        f"{side['seconds']:.1f} s",
        f"{side['items_per_s']:,.0f}",
        f"{side['events_max']:,}",
        f"{side['events_total']:,} in {side['workflows']} workflow{'s' if side['workflows'] > 1 else ''}",
    ]


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    s = result["settings"]
    header = ["no-op map", "wall time", "items/s", "history events, largest workflow", "history events, total"]
    rows = [
        [f"gangflow `engine.map` ({s['items']:,} items, concurrency {s['concurrency']})", *_cells(result["gangflow"])],
        ["hand-written temporalio fan-out, one workflow", *_cells(result["temporalio"])],
    ]
    ratio = result["ratio"]
    note = f"Ratio gangflow / hand-written time: **{ratio:.2f}**." if ratio is not None else ""
    baseline_error = result["temporalio"].get("error")
    if baseline_error:
        note += f" The hand-written workflow failed: {baseline_error}."
    return [*markdown_table(header, "lrrrr", rows), "", note.strip(), "", caption(command_line(result), result)]


def table(result: dict[str, Any]) -> list[str]:
    lines = [f"{'side':<12}{'seconds':>10}{'items/s':>10}{'events max':>12}{'events total':>14}{'workflows':>11}"]
    for side in ("gangflow", "temporalio"):
        entry = result[side]
        if entry.get("error"):
            lines.append(f"{side:<12} failed: {entry['error']}")
            continue
        lines.append(
            f"{side:<12}{entry['seconds']:>10.2f}{entry['items_per_s']:>10.0f}{entry['events_max']:>12}"
            f"{entry['events_total']:>14}{entry['workflows']:>11}"
        )
    ratio = result["ratio"]
    load = result["load"]
    lines.append(
        f"ratio gangflow/temporalio: {ratio if ratio is None else f'{ratio:.2f}'} (goal <= 2); "
        f"median of {result['settings']['reps']}; {result['environment']['cores']} cores, "
        f"load average {load['min']:.1f}–{load['max']:.1f}"
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
    from temporalio.client import WorkflowFailureError
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    from engine.client import Client
    from engine.core.mapping import DEFAULT_CHUNK_SIZE
    from engine.runtime import DevServer, Endpoint, build_worker, connect

    n, concurrency = args.items, args.concurrency

    async def events(tc: TemporalClient, workflow_id: str) -> int:
        count = 0
        async for _ in tc.get_workflow_handle(workflow_id).fetch_history_events():
            count += 1
        return count

    async def bench(scratch: Path) -> dict[str, Any]:
        srv = DevServer(os.path.join(scratch, "server"), ui=False).start()
        try:
            tc = await connect(Endpoint.resolve(srv.address))
            gf_worker = build_worker(tc)
            config = gf_worker.config()
            for key in ("interceptors", "plugins", "identity"):  # gangflow's own hooks are what is measured
                config.pop(key, None)  # type: ignore[misc]
            config["workflow_runner"] = UnsandboxedWorkflowRunner()  # like gangflow's workflows
            config["task_queue"] = BASELINE_QUEUE
            config["workflows"] = [BaselineMap]
            config["activities"] = [baseline_noop]
            client = Client(tc, artifacts=os.path.join(scratch, "artifacts"))

            async def gf_run(items: int) -> tuple[float, list[str]]:
                t0 = time.perf_counter()
                run_id = await client.start(noop_map, {"n": items, "concurrency": concurrency})
                assert await client.wait(run_id) == items
                seconds = time.perf_counter() - t0
                chunks = -(-items // DEFAULT_CHUNK_SIZE)
                return seconds, [run_id, *(f"{run_id}.map-noop-1.{c}" for c in range(chunks))]

            async def tp_run(items: int) -> tuple[float, list[str]]:
                wid = f"baseline-map-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                await tc.execute_workflow(
                    "BaselineMap", args=[items, concurrency], id=wid, task_queue=BASELINE_QUEUE, result_type=int
                )
                return time.perf_counter() - t0, [wid]

            sides = {"gangflow": gf_run, "temporalio": tp_run}
            samples: dict[str, list[tuple[float, list[str]]]] = {side: [] for side in sides}
            errors: dict[str, str] = {}
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(gf_worker)
                await stack.enter_async_context(Worker(**config))
                for fn in sides.values():  # warm-up: bundle extraction, imports, sticky caches
                    await fn(min(n, 200))
                for rep in range(args.reps):  # interleaved, so drift hits both sides alike
                    for side, fn in sides.items():
                        if side in errors:
                            continue
                        try:
                            samples[side].append(await fn(n))
                        except WorkflowFailureError as exc:
                            errors[side] = f"{exc.cause}" if exc.cause else str(exc)
                        log(f"  rep {rep + 1} {side}: " + (errors.get(side) or f"{samples[side][-1][0]:.2f} s"))
                out: dict[str, Any] = {}
                for side in sides:
                    if not samples[side]:
                        out[side] = {"error": errors[side]}
                        continue
                    seconds = statistics.median(s for s, _ in samples[side])
                    counts = [await events(tc, wid) for wid in samples[side][-1][1]]
                    out[side] = {
                        "seconds": round(seconds, 3),
                        "items_per_s": round(n / seconds, 1),
                        "samples_s": [round(s, 2) for s, _ in samples[side]],
                        "events_max": max(counts),
                        "events_total": sum(counts),
                        "workflows": len(counts),
                    }
                    if side in errors:
                        out[side]["error"] = errors[side]
            return out
        finally:
            srv.stop()

    def measure(scratch: Path) -> dict[str, Any]:
        sides = asyncio.run(bench(scratch))
        gf, tp = sides["gangflow"], sides["temporalio"]
        ratio = round(gf["seconds"] / tp["seconds"], 3) if "seconds" in gf and "seconds" in tp else None
        settings = {
            "items": n,
            "concurrency": concurrency,
            "reps": args.reps,
            "chunk_size": DEFAULT_CHUNK_SIZE,
            "server": "temporal dev server (sqlite file), 127.0.0.1",
        }
        return {"gangflow": gf, "temporalio": tp, "ratio": ratio, "settings": settings}

    run_benchmark("map", args, markdown, table, measure)


if __name__ == "__main__":
    from benchenv import main_by_name

    main_by_name("bench_map", parse_args())
