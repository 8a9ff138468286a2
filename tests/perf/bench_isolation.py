"""The isolated layout's cost: a gang started through a tenant's Nexus endpoint vs a GangTask child in one namespace.

    python tests/perf/bench_isolation.py [--reps N] [--markdown]
    python tests/perf/bench_isolation.py --render RESULT.json     # the README rows of a saved JSON line

Two local stacks, one after the other, in this one run (Temporal dev server, workers and ONE ``gangflow node``
agent with 2 GPU slots, all on 127.0.0.1; the recorder's stacks, tests/histories/record.py): **shared** (one
namespace, one worker: the run's gang is a child workflow) and **isolated** (the run in ``gf-team-a`` on the
tenant's worker, its gang a Nexus operation on ``gf-team-a-gangs``, a GangTask in ``gangflow-system`` on the
platform's worker). The pipeline: one 1-rank PyTorch task that returns at once, so what is measured is the
orchestration around it. One uncounted warm-up run per stack first; between runs a pause of 6 s lets the
node agent refill its warm standby rank process (its 5 s tick), so every counted run starts its rank from a
standby in both layouts.

Measured per run, from the run's own history (server timestamps): ``gang_start_s``, the task call scheduled
(``StartChildWorkflowExecutionInitiated`` / ``NexusOperationScheduled``) to the GangTask running (the child's
``Started`` / the operation's ``Started``); ``gang_s``, scheduled to the gang's result back in the run
(placement, rank, result); and, on the client's clock, ``run_s``: ``Client.start`` to the result. Medians.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _path in (ROOT, ROOT / "tests", ROOT / "tests" / "histories", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

LAYOUTS = ("shared", "isolated")
PAUSE_S = 6.0
FLOW = """
from engine import Resources, task, workflow
from plugins.pytorch import PyTorch


@task(plugin=PyTorch(nnodes=1, nproc_per_node=1), resources=Resources(gpu=1))
def one() -> int:
    return 1


@workflow
async def pipeline() -> int:
    return await one()
"""
QUEUES = "tenants:\n  - {name: team-a, quota: {gpu: 2}}\n"


def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--reps", type=int, default=5, help="counted runs per layout (median reported)")
    output_options(parser)
    args = parser.parse_args(argv)
    at_least_one(parser, args, "reps")
    return args


def command_line(result: dict[str, Any]) -> str:
    return f"python tests/perf/bench_isolation.py --reps {result['settings']['reps']}"


def markdown(result: dict[str, Any]) -> list[str]:
    from benchenv import caption, markdown_table

    def row(label: str, key: str) -> list[str]:
        shared, isolated = result["shared"][key], result["isolated"][key]
        return [label, f"{shared:.3f} s", f"{isolated:.3f} s", f"{isolated - shared:+.3f} s"]

    rows = [
        row("task call → GangTask running", "gang_start_s"),
        row("task call → the gang's result back in the run", "gang_s"),
        row("`Client.start` → the run's result", "run_s"),
    ]
    header = ["median", "one namespace (child GangTask)", "isolated (Nexus)", "difference"]
    return [*markdown_table(header, "lrrr", rows), "", caption(command_line(result), result)]


def table(result: dict[str, Any]) -> list[str]:
    lines = [f"{'median':<16}{'shared':>10}{'isolated':>10}{'diff':>9}"]
    for key in ("gang_start_s", "gang_s", "run_s"):
        shared, isolated = result["shared"][key], result["isolated"][key]
        lines.append(f"{key:<16}{shared:>10.3f}{isolated:>10.3f}{isolated - shared:>+9.3f}")
    return lines


def _seconds(history: Any) -> tuple[float, float]:
    """(scheduled → started, scheduled → closed) of the one gang call in a run's history."""
    from temporalio.api.enums.v1 import EventType as E

    scheduled = {E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED, E.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED}
    started = {E.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED, E.EVENT_TYPE_NEXUS_OPERATION_STARTED}
    closed = {E.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED, E.EVENT_TYPE_NEXUS_OPERATION_COMPLETED}
    times: dict[str, float] = {}
    for event in history.events:
        when = event.event_time.ToDatetime().timestamp()
        for name, kinds in (("scheduled", scheduled), ("started", started), ("closed", closed)):
            if event.event_type in kinds:
                times.setdefault(name, when)
    return times["started"] - times["scheduled"], times["closed"] - times["scheduled"]


def main(args: Any) -> None:
    from benchenv import run_benchmark

    run_benchmark("isolation", args, markdown, table, lambda scratch: _layouts(args, scratch))


def _layouts(args: Any, scratch: Path) -> dict[str, Any]:
    """Both layouts, one after the other, each on a stack of its own under ``scratch``."""
    import asyncio
    import statistics
    import time

    import record
    from benchenv import log

    from engine.client import load_workflow_file
    from engine.core.protocol import PLATFORM_NAMESPACE

    (scratch / "flow").mkdir()
    (scratch / "flow" / "bench_flow.py").write_text(FLOW)
    wf = load_workflow_file(f"{scratch / 'flow' / 'bench_flow.py'}:pipeline")

    async def measure(layout: str) -> dict[str, float]:
        isolated = layout == "isolated"
        stack = record.Stack(scratch / layout, nodes=1, isolated=isolated)
        try:
            await stack.wait_nodes()
            if isolated:
                platform = await stack.client(PLATFORM_NAMESPACE)
                await platform.apply_queues(QUEUES)
            client = await stack.client()
            tenant = record.TENANT if isolated else None
            samples: dict[str, list[float]] = {"gang_start_s": [], "gang_s": [], "run_s": []}
            for rep in range(args.reps + 1):  # the first: warm-up (bundle extraction, first connections)
                await asyncio.sleep(PAUSE_S)
                started = time.monotonic()
                run_id = await client.start(wf, {}, run_id=f"{layout}-{rep}", tenant=tenant)
                if await client.result(run_id, wf) != 1:
                    raise SystemExit(f"{layout}: run {run_id} returned the wrong result")
                run_s = time.monotonic() - started
                gang_start, gang = _seconds(await client.handle(run_id).fetch_history())
                if rep:
                    samples["gang_start_s"].append(gang_start)
                    samples["gang_s"].append(gang)
                    samples["run_s"].append(run_s)
                log(f"{layout} {rep if rep else 'warm-up'}: gang started {gang_start:.3f} s, run {run_s:.2f} s")
            return {key: statistics.median(values) for key, values in samples.items()}
        finally:
            stack.close()

    measured = {layout: asyncio.run(measure(layout)) for layout in LAYOUTS}
    return {"settings": {"reps": args.reps, "pause_s": PAUSE_S, "nodes": 1}, **measured}


if __name__ == "__main__":
    main(parse_args())
