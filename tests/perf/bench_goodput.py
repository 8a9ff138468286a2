"""The goodput ledger checked on a real run: a 2-node DDP run with one node kill and one preemption.

    python tests/perf/bench_goodput.py [--steps 300] [--checkpoint-every 25] [--step-seconds 0.1]
                                       [--kill-at 110] [--preempt-at 202] [--grace 5] [--markdown] [--keep]
    python tests/perf/bench_goodput.py --render RESULT.json      # the README's rows of a saved JSON line

A local stack is started here (Temporal dev server, one ``gangflow worker``, three ``gangflow node`` agents
g0, g1, g2 on 127.0.0.1 with one GPU slot each: the ranks train on CPU with gloo) with one tenant whose quota
is 2 GPUs and two priority classes. The **victim** (class ``low``) trains ``--steps`` steps with DDP on 2
nodes x 1 GPU, a checkpoint every ``--checkpoint-every`` steps, ``engine.report(step=...)`` every step, and
prints each step it finished to its log. Once its rank 0 reported ``--kill-at``, the agent of its node rank 1
gets SIGKILL (its ranks die with it): the gang restarts on the spare node from its last checkpoint. Once
attempt 1 reported ``--preempt-at``, an **urgent** run (class ``high``, 1 node x 1 GPU) arrives: over the
tenant's quota, the Scheduler preempts the victim (SIGTERM, ``--grace`` s), which resumes from its last
checkpoint once the urgent run is done.

Then it checks the issue's two claims, from what ``gangflow status`` and ``gangflow usage`` show:

* **the causes sum to the allocated GPU-seconds within 1 %**: for each attempt's ledger and for the run's
  (``gangflow usage --by run --json``, as a user reads it);
* **the lost steps match the steps the ranks' own logs show were repeated**: for each attempt that lost work,
  the steps the ledger counted as lost (its last reported step minus the step of the checkpoint it kept:
  the work after that checkpoint is ``lost_failure`` / ``lost_preemption``) against rank 0's logs (the last
  step it logged in that attempt minus the step the next attempt logged starting from).

Prints ONE JSON line to stdout (``claims``: each a boolean) and a table to stderr (``--markdown``: the README's
rows); a claim that does not hold is also said on stderr.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

TENANT = "team-a"
CALL = "train-1"
NODES = ("g0", "g1", "g2")
PHASE_TIMEOUT_S = 300.0

FLOWS = """
import os
import time

from engine import Gang, Resources, checkpoint, report, task, workflow
from plugins.pytorch import PyTorch


@task(
    plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=60),
    resources=Resources(gpu=1, cpu=1),
    gang=Gang(max_restarts=3),
)
def train(steps: int, checkpoint_every: int, step_seconds: float) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = DistributedDataParallel(layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start, _ = checkpoint.load_torch(model, opt)
    attempt = int(os.environ["GANGFLOW_ATTEMPT"])
    print(f"attempt {attempt} starts at step {start}", flush=True)
    report(step=start, force=True)
    for step in range(start, steps):
        x = torch.randn(32, 8)
        loss = ((model(x) - x.sum(1, keepdim=True).sin()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step + 1}", flush=True)
        report(step=step + 1, force=True, loss=loss.item())
        time.sleep(step_seconds)
        if (step + 1) % checkpoint_every == 0:
            checkpoint.save_torch(model, opt, step=step + 1)
    return {"first_step": start, "attempt": attempt, "world_size": dist.get_world_size()}


@task(plugin=PyTorch(nnodes=1, nproc_per_node=1, timeout=60), resources=Resources(gpu=1, cpu=1))
def urgent(steps: int) -> int:
    for step in range(steps):
        report(step=step + 1)
        time.sleep(0.1)
    return steps


@workflow
async def victim(steps: int, checkpoint_every: int, step_seconds: float) -> dict:
    return await train(steps=steps, checkpoint_every=checkpoint_every, step_seconds=step_seconds)


@workflow
async def urgent_run(steps: int = 20) -> int:
    return await urgent(steps=steps)
"""

_START = re.compile(r"^attempt (\d+) starts at step (\d+)$", re.M)
_STEP = re.compile(r"^step (\d+)$", re.M)
_LOG_ATTEMPT = re.compile(r"\.attempt(\d+)\.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchenv import arguments, output_options

    parser = arguments(__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--kill-at", type=int, default=110, help="rank 0's step at which node rank 1's agent dies")
    parser.add_argument("--preempt-at", type=int, default=202, help="attempt 1's step at which the urgent run comes")
    parser.add_argument("--grace", type=float, default=5.0, help="the cluster's preemption grace (s)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, histories)")
    output_options(parser)
    args = parser.parse_args(argv)
    if not 0 < args.kill_at < args.preempt_at < args.steps:
        parser.error("need 0 < --kill-at < --preempt-at < --steps")
    return args


# -- the two claims, from what the run left (pure: tests/perf/test_readme_figures.py calls them) --------------
def logged_steps(logs: list[tuple[str, str]]) -> dict[int, dict[str, int]]:
    """Per attempt, from rank 0's logs: the step it started from and the last step it logged."""
    found: dict[int, dict[str, int]] = {}
    for name, text in logs:
        named = _LOG_ATTEMPT.search(name)
        started = _START.search(text)
        if named is None or started is None:
            continue
        steps = [int(s) for s in _STEP.findall(text)]
        found[int(named.group(1))] = {"start": int(started.group(2)), "last": max(steps, default=int(started.group(2)))}
    return found


def kept_step(nodes: list[dict[str, Any]]) -> int | None:
    """The checkpoint step an attempt's ledger kept: that of its ranks' latest checkpoint (``ckpt_time``)."""
    reports = [r for n in nodes for r in (n.get("progress") or {}).values() if isinstance(r, dict)]
    saved = [r for r in reports if isinstance(r.get("ckpt_time"), int | float) and isinstance(r.get("ckpt_step"), int)]
    return int(max(saved, key=lambda r: r["ckpt_time"])["ckpt_step"]) if saved else None


def lost_steps(attempts: list[dict[str, Any]], saved: dict[int, list[dict[str, Any]]], logs: Any) -> list[dict]:
    """For each attempt whose ledger lost work: the steps the ledger counts as lost and the steps rank 0's logs
    show were done again by the next attempt."""
    out = []
    for entry in attempts:
        number, ledger = int(entry["attempt"]), entry.get("ledger") or {}
        badput = ledger.get("badput") or {}
        cause = next((c for c in ("lost_failure", "lost_preemption", "lost_drain") if badput.get(c)), None)
        if cause is None:
            continue
        kept = kept_step(saved.get(number, [])) or 0
        logged, after = logs.get(number), logs.get(number + 1)
        out.append(
            {
                "attempt": number,
                "cause": cause,
                "lost_gpu_s": badput[cause],
                "ledger_lost_steps": int(entry.get("last_step") or 0) - kept,
                "logs_repeated_steps": logged["last"] - after["start"] if logged and after else None,
            }
        )
    return out


def claims(attempts: list[dict[str, Any]], row: dict[str, Any], lost: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the parts add up (each attempt's ledger, and the run's usage row) and the lost steps match."""

    def error(ledger: dict[str, Any]) -> float:
        whole = float(ledger["allocated_gpu_s"])
        parts = float(ledger["productive_gpu_s"]) + sum(float(v) for v in ledger["badput"].values())
        return abs(parts - whole) / whole if whole else 0.0

    errors = [error(a["ledger"]) for a in attempts if a.get("ledger")] + [error(row)]
    return {
        "sum_within_1pct": max(errors) <= 0.01,
        "max_sum_error": round(max(errors), 6),
        "lost_steps_match": bool(lost) and all(x["ledger_lost_steps"] == x["logs_repeated_steps"] for x in lost),
    }


# -- output ---------------------------------------------------------------------------------------------------
def _h(gpu_s: float) -> str:
    return f"{gpu_s:.1f}"


def markdown(result: dict[str, Any]) -> list[str]:
    from benchenv import caption, markdown_table

    run, checks = result["run"], result["claims"]
    causes = [("productive", run["productive_gpu_s"]), *run["badput"].items()]
    rows = [[c, _h(v), f"{100 * v / run['allocated_gpu_s']:.1f} %"] for c, v in causes if v]
    rows.append(["**allocated**", f"**{_h(run['allocated_gpu_s'])}**", f"sum error {checks['max_sum_error']:.2%}"])
    lines = markdown_table(["cause", "GPU-s", "share"], "lrr", rows)
    lines.append("")
    lost = [
        [f"attempt {x['attempt']}", x["cause"], str(x["ledger_lost_steps"]), str(x["logs_repeated_steps"])]
        for x in result["lost"]
    ]
    lines += markdown_table(
        ["attempt", "ended by", "lost steps (ledger)", "steps redone (rank 0's logs)"], "llrr", lost
    )
    lines += ["", caption("python tests/perf/bench_goodput.py", result)]
    return lines


def table(result: dict[str, Any]) -> list[str]:
    lines = markdown(result)
    checks = result["claims"]
    lines.append(f"causes sum to the allocated GPU-seconds within 1 %: {checks['sum_within_1pct']}")
    lines.append(f"lost steps match the steps the ranks' logs show were redone: {checks['lost_steps_match']}")
    return lines


# -- the run --------------------------------------------------------------------------------------------------
def measure(args: argparse.Namespace, scratch: Any) -> dict[str, Any]:
    import asyncio
    import contextlib
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from benchenv import log

    from engine.artifacts.store import ArtifactStore
    from engine.client import Client, load_workflow_file
    from engine.executor.process import spawn, stop_processes
    from engine.runtime import DevServer, Endpoint, connect
    from engine.runtime.ranks import attempt_ranks

    flows = scratch / "goodput_flows.py"
    flows.write_text(FLOWS)
    artifacts = scratch / "artifacts"
    node_cache = scratch / "nodes" / "cache"
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str], home: Any) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GANGFLOW_CACHE=str(home / "cache"), PYTHONUNBUFFERED="1", TMPDIR=str(home))
        log_file = scratch / f"{name}.log"
        procs[name] = spawn(
            [sys.executable, "-m", "engine.cli", *argv], log=log_file, env=env, cwd=home, new_session=True
        )

    def rank0_step(gang_id: str, attempt: int) -> int:
        for path in node_cache.glob(f"nodes/*/{gang_id}.a{attempt}.n*/progress/rank0.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                return int(json.loads(path.read_text())["step"])
        return -1

    def node_of(gang_id: str, attempt: int, node_rank: int) -> str:
        (work,) = node_cache.glob(f"nodes/*/{gang_id}.a{attempt}.n{node_rank}")
        return work.parent.name

    async def until(what: str, probe: Any, timeout: float = PHASE_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not probe():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout:g} s")
            await asyncio.sleep(0.05)

    async def run() -> dict[str, Any]:
        server = DevServer(scratch / "temporal", ui=False)
        await asyncio.to_thread(server.start)
        try:
            start("worker", ["worker", "--address", server.address], scratch / "worker")
            for node in NODES:
                argv = ["node", "--node-id", node, "--gpus", "1", "--cpus", "4", "--address", server.address]
                start(node, [*argv, "--advertise-addr", "127.0.0.1"], scratch / "nodes")
            client = Client(await connect(Endpoint.resolve(server.address)), artifacts=str(artifacts))
            for _ in range(900):
                with contextlib.suppress(Exception):
                    if int((await client.queue())["totals"]["alive_nodes"]) >= len(NODES):
                        break
                await asyncio.sleep(0.1)
            await client.apply_queues(
                {
                    "tenants": [{"name": TENANT, "quota": {"gpu": 2}}],
                    "priority_classes": [{"name": "low", "value": 10}, {"name": "high", "value": 100}],
                    "policy": {
                        "within_tenant": "lower_priority",
                        "min_runtime": "1s",
                        "preemption_grace": f"{args.grace:g}s",
                    },
                }
            )
            log(f"stack up on {server.address}: nodes {', '.join(NODES)}, 1 GPU slot each; {vars(args)}")
            victim, urgent = load_workflow_file(f"{flows}:victim"), load_workflow_file(f"{flows}:urgent_run")
            began = time.monotonic()
            inputs = {"steps": args.steps, "checkpoint_every": args.checkpoint_every, "step_seconds": args.step_seconds}
            run_id = await client.start(victim, inputs, tenant=TENANT, priority="low")
            gang_id = f"{run_id}.{CALL}"
            await until(f"rank 0 at step {args.kill_at}", lambda: rank0_step(gang_id, 0) >= args.kill_at)
            dead = node_of(gang_id, 0, 1)
            os.killpg(procs[dead].pid, signal.SIGKILL)
            log(
                f"  {time.monotonic() - began:.1f} s: killed node agent {dead} (node rank 1), rank 0 at step "
                f"{rank0_step(gang_id, 0)}"
            )
            await until(f"attempt 1 at step {args.preempt_at}", lambda: rank0_step(gang_id, 1) >= args.preempt_at)
            urgent_id = await client.start(urgent, {"steps": 20}, tenant=TENANT, priority="high")
            log(f"  {time.monotonic() - began:.1f} s: urgent run submitted at step {rank0_step(gang_id, 1)}")
            await asyncio.wait_for(client.result(urgent_id, urgent), PHASE_TIMEOUT_S)
            done = await asyncio.wait_for(client.result(run_id, victim), PHASE_TIMEOUT_S)
            wall = time.monotonic() - began
            log(f"  {wall:.1f} s: the victim finished: {done}")
            await asyncio.sleep(1.0)  # the agents' last saved details
            info = await client.status(run_id)
            (task,) = [t for t in info.tasks if t.kind == "gang"]
            logs = logged_steps(await client.logs(run_id, task="train", rank=0))
            saved = attempt_ranks(ArtifactStore(str(artifacts)), run_id, CALL)
            usage = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "engine.cli", "usage", "--json", "--by", "run", "--since", "1h"],
                capture_output=True,
                text=True,
                env=dict(os.environ, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=str(artifacts)),
                check=True,
            )
            (row,) = [r for r in json.loads(usage.stdout)["rows"] if r["run"] == run_id]
            attempts = [
                {k: a.get(k) for k in ("attempt", "kind", "first_step", "last_step", "ledger")}
                | {"reason": str(a.get("reason") or a.get("ended") or "").splitlines()[0][:160]}
                for a in task.attempts
            ]
            lost = lost_steps(task.attempts, saved, logs)
            return {
                "run": row,
                "attempts": attempts,
                "lost": lost,
                "logged": {str(k): v for k, v in logs.items()},
                "claims": claims(task.attempts, row, lost),
                "wall_s": round(wall, 1),
                "killed_node": dead,
                "result": done,
            }
        finally:
            stop_processes(list(procs.values()), 30, group=True)
            await asyncio.to_thread(server.stop)

    figures = asyncio.run(run())
    figures["settings"] = {
        **{
            k: getattr(args, k) for k in ("steps", "checkpoint_every", "step_seconds", "kill_at", "preempt_at", "grace")
        },
        "nodes": "3 node agents with 1 GPU slot each (ranks on CPU, gloo)",
        "task": "PyTorch(nnodes=2, nproc_per_node=1), Resources(gpu=1)",
    }
    return figures


def main(args: argparse.Namespace) -> None:
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from benchenv import LoadSampler, emit, environment, log, render

    if args.render:
        render(args.render, "goodput", markdown)
        return
    scratch = Path(tempfile.mkdtemp(prefix="gangflow-bench-goodput-"))
    os.environ["GANGFLOW_CACHE"] = str(scratch / "client-cache")
    try:
        with LoadSampler() as load:
            figures = measure(args, scratch)
    finally:
        if args.keep:
            log(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    result = {"benchmark": "goodput", **figures, "environment": environment(), "load": load.summary()}
    held = result["claims"]["sum_within_1pct"] and result["claims"]["lost_steps_match"]
    if not held:
        log("A CLAIM DOES NOT HOLD: see the table")
    emit(result, markdown(result) if args.markdown else table(result))


if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(parse_args())
