"""What the node sandbox costs a gang: its launch, cold and from warm standbys, and the way back from a killed
node agent, with no sandbox, with cgroups only and with the whole sandbox, in one run.

    python tests/perf/bench_sandbox.py [--repeats N] [--launch-steps N] [--total-steps N] [--micro-reps N]
                                       [--markdown | --json]
    python tests/perf/bench_sandbox.py --render RESULT.json     # the README rows of a saved JSON line

One local stack (``bench_recovery.Stack``: a Temporal dev server, one worker, three node agents r0, r1, r2 on
127.0.0.1, one warm standby each). The sandbox is a node agent's setting (``GANGFLOW_SANDBOX``, read at its
start), so each measurement block restarts the three agents in one mode:

* ``none``: ``GANGFLOW_SANDBOX=0``, ranks run as the agent's root, no cgroup (the baseline);
* ``cgroups``: ``GANGFLOW_SANDBOX=cgroups``, each rank in its gang's cgroups, still root in the node's namespace;
* ``full``: unset, what a root agent does by default: cgroups, the rank's own mount namespace, the gang's user.

and, once every agent's standby waits on its stdin (torch imported), times in that mode:

(a) **launch, cold**: ``bench_launch.bench`` (a 1-node, 2-rank DDP script, ``--launch-steps`` steps), whose
    ranks run a script and so are always new processes (``bench_launch.launch_once``): ``Client.start`` →
    rank 0's first training step;
(b) **launch from standbys**: ``examples/resilient_training.py:pipeline`` (2 nodes x 1 rank, the task body in
    the rank runner, so each rank is one of the agents' standbys; 5 steps): ``Client.start`` → the first
    ``engine.report`` of a rank (after DDP init and the checkpoint load: right before its first step);
(c) **kill → next step**: ``bench_recovery.one_run``: the same pipeline (``--total-steps``, a checkpoint every
    20), the node agent of node rank 1 SIGKILLed halfway: the kill → the first report of the next attempt. A
    run that ended before the kill (the gang's view lagged on a loaded machine) is run again, once
    (``kill_missed`` in the block's sample).

The blocks run in rotating order (rep i starts with mode i mod 3), so that drift in the machine's load hits
every mode alike; one uncounted warm-up of (a) and (b) first fills the node agents' code cache. Before the
stack it times the bare pieces too, ``--micro-reps`` times: one process start (``python -c 'import json'``)
per mode, ``enter`` alone in a forked child (what a standby pays when it becomes a rank) and removing a gang's
cgroups; and the CPU weight of the machine's ``gangflow`` cgroup (:func:`cpu_weights`: under load, what a
sandboxed rank's share is weighed by against the machine's other work). Prints ONE JSON line (medians per mode,
ratios to ``none``, every sample with the 1-minute load average when its block began, the load over the run)
and a table (``--markdown``: the README's rows). Not a test: nothing here asserts on timings. Needs root and a
cgroup memory controller.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("none", "cgroups", "full")
#: GANGFLOW_SANDBOX per mode (None: unset, the default whole sandbox)
MODE_ENV: dict[str, str | None] = {"none": "0", "cgroups": "cgroups", "full": None}
MODE_LABELS = {"none": "no sandbox", "cgroups": "cgroups only", "full": "full sandbox"}
#: the figures of one block (seconds), in the order the tables show them
FIGURES = ("cold_first_step_s", "standby_first_report_s", "resume_s")
GOAL_LAUNCH_RATIO = 1.10  # the full sandbox's launch at most 10 % slower than none
GOAL_RESUME_S = 5.0  # kill → next step, as bench_recovery's goal
STANDBY_STEPS = 5  # (b)'s pipeline: the launch is what counts, not the training
STANDBY_WAIT_S = 180.0  # a standby's torch import on a machine loaded by other work


def parse_args(argv: list[str] | None = None) -> Any:
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="measurement blocks per mode (medians reported)")
    parser.add_argument("--launch-steps", type=int, default=50, help="training steps of the cold launch's gang")
    parser.add_argument("--total-steps", type=int, default=200, help="training steps of the killed run")
    parser.add_argument("--micro-reps", type=int, default=10, help="samples of each bare piece (process start...)")
    output_options(parser, json_flag=True)
    args = parser.parse_args(argv)
    at_least_one(parser, args, "repeats", "launch_steps", "total_steps", "micro_reps")
    if args.total_steps < 40:
        parser.error("--total-steps must be at least 40 (the kill falls halfway, after a checkpoint every 20)")
    return args


# ---------------------------------------------------------------------------------------------------------
# the bare pieces: one process start, enter() in a standby, removing a gang's cgroups
# ---------------------------------------------------------------------------------------------------------
#: the parent of the bare pieces' cgroups
MICRO_CGROUP = "gangflow/bench-sandbox"


def _sandbox(name: str, full: bool) -> Any:
    from engine.executor.cgroups import device_rules
    from engine.executor.sandbox import GangSandbox, detect, gang_user

    driver = detect()
    if driver is None:
        raise SystemExit("needs root and a cgroup memory controller")
    python = (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))
    return GangSandbox(
        driver,
        f"{MICRO_CGROUP}/{name}",
        gang_user("bench", name) if full else None,
        256 << 20,
        1.0,
        1,
        device_rules([], []),
        reads=python if full else None,
        gpu_nodes=(),
    )


def _start(sandbox: Any, workdir: Path) -> float:
    """Seconds from spawn to exit of one process in ``sandbox`` (None: no sandbox)."""
    import subprocess
    import time

    from engine.executor.sandbox import enter

    preexec = None
    if sandbox is not None:
        files = sandbox.prepare(0, rank=True)
        preexec = lambda: enter(files, sandbox.user, None, sandbox.mounts)  # noqa: E731
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import json"], preexec_fn=preexec, check=True, cwd=workdir)
    return time.perf_counter() - started


def _enter_only(sandbox: Any) -> float:
    """Seconds a forked child spends in ``enter`` (a standby becoming the rank)."""
    import time

    from engine.executor.sandbox import enter

    files = sandbox.prepare(0, rank=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        started = time.perf_counter()
        try:
            enter(files, sandbox.user, None, sandbox.mounts)
            os.write(write, str(time.perf_counter() - started).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    took = float(os.read(read, 64) or b"nan")
    os.close(read)
    return took


def micro(reps: int, top: Path) -> dict[str, list[float]]:
    """The bare pieces, ``reps`` times each, the modes interleaved."""
    import time

    top.mkdir(parents=True)
    os.chmod(top, 0o755)  # the gang's user must reach its working folder
    samples: dict[str, list[float]] = {
        k: [] for k in ("start_none", "start_cgroups", "start_full", "enter_cgroups", "enter_full", "remove")
    }
    for i in range(reps):
        samples["start_none"].append(_start(None, top))
        for mode, full in (("cgroups", False), ("full", True)):
            workdir = top / f"{mode}{i}"
            workdir.mkdir()
            sandbox = _sandbox(f"{mode}{i}", full)
            sandbox.setup(workdir)
            samples[f"start_{mode}"].append(_start(sandbox, workdir))
            samples[f"enter_{mode}"].append(_enter_only(sandbox))
            started = time.perf_counter()
            sandbox.remove()
            samples["remove"].append(time.perf_counter() - started)
    sandbox.driver.remove(MICRO_CGROUP)  # their parent, empty now: nothing of the benchmark stays on the machine
    return samples


# ---------------------------------------------------------------------------------------------------------
# the node agents: one mode at a time, measured once their standbys wait
# ---------------------------------------------------------------------------------------------------------
#: the read(2) syscall's number, as /proc/<pid>/syscall shows it (a standby blocked reading its stdin is ready)
_READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(os.uname().machine)


def _standbys(agent_pid: int) -> tuple[int, int]:
    """(standbys of the agent ``agent_pid``, those of them blocked reading their stdin: torch imported)."""
    found = ready = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != agent_pid:
                continue
            if b"--standby" not in (entry / "cmdline").read_bytes():  # an adopted one has a rank's title
                continue
            found += 1
            call = (entry / "syscall").read_text().split()
        except (OSError, ValueError, IndexError):
            continue
        if _READ_SYSCALL is not None and call[:2] == [_READ_SYSCALL, "0x0"]:
            ready += 1
    return found, ready


async def standbys_ready(stack: Any) -> float:
    """Wait until every node agent of ``stack`` has a standby waiting on its stdin; seconds that took. Where
    /proc/<pid>/syscall says nothing (another architecture), waits until each agent has one plus 10 s."""
    import asyncio
    import time

    t0 = time.monotonic()
    while True:
        counts = [_standbys(node.pid) for node in stack.nodes.values()]
        if _READ_SYSCALL is None and all(found >= 1 for found, _ in counts):
            await asyncio.sleep(10)
            return time.monotonic() - t0
        if all(ready >= 1 for _, ready in counts):
            return time.monotonic() - t0
        if time.monotonic() - t0 > STANDBY_WAIT_S:
            raise RuntimeError(f"node agents' standbys not ready after {STANDBY_WAIT_S:.0f} s: {counts}")
        await asyncio.sleep(0.2)


#: what a rank of each mode runs as, as /proc shows it: (as root, in a gangflow cgroup)
EXPECTED_CONFINEMENT = {"none": (True, False), "cgroups": (True, True), "full": (False, True)}


def _confinement(pid: int) -> tuple[bool, bool] | None:
    """(runs as root, is in a gangflow cgroup) of process ``pid``; None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        groups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), "0")
    return uid == "0", any(line.split(":", 2)[-1].startswith("/gangflow/") for line in groups.splitlines())


async def probe_ranks(stack: Any, seen: set[tuple[bool, bool]]) -> None:
    """Until cancelled: how the node agents' rank processes (children that are not waiting standbys) run, added
    to ``seen``, so that a block proves its agents ran their ranks in the mode it names."""
    import asyncio

    while True:
        agents = {node.pid for node in stack.nodes.values() if node.proc is not None}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) not in agents:
                    continue
                if b"--standby" in (entry / "cmdline").read_bytes():
                    continue
            except (OSError, ValueError, IndexError):
                continue
            if (found := _confinement(int(entry.name))) is not None:
                seen.add(found)
        await asyncio.sleep(0.25)


def check_confinement(mode: str, seen: set[tuple[bool, bool]]) -> None:
    """Refuse a block whose ranks did not run as ``mode`` says (an agent that kept another mode's setting)."""
    expected = EXPECTED_CONFINEMENT[mode]
    if expected not in seen or (mode == "none" and any(in_cgroup for _root, in_cgroup in seen)):
        raise RuntimeError(f"mode {mode}: ranks seen as (root, in a gangflow cgroup) {sorted(seen)}, not {expected}")


def set_mode(mode: str) -> None:
    """What the node agents started from now on read: ``GANGFLOW_SANDBOX`` for ``mode``."""
    from engine.executor.sandbox import SANDBOX_ENV

    value = MODE_ENV[mode]
    if value is None:
        os.environ.pop(SANDBOX_ENV, None)
    else:
        os.environ[SANDBOX_ENV] = value


async def restart_agents(stack: Any, client: Any, mode: str) -> float:
    """Restart every node agent of ``stack`` in ``mode`` (under their node ids) and wait for their standbys;
    seconds that took."""
    import asyncio
    import signal
    import time

    t0 = time.monotonic()
    set_mode(mode)
    for node in stack.nodes.values():  # all at once: each drains on SIGTERM (idle: at once)
        node.kill_group(signal.SIGTERM)
    for node_id in list(stack.nodes):
        await asyncio.to_thread(stack.restart_node, node_id)
    await stack.wait_nodes(client)
    await standbys_ready(stack)
    return time.monotonic() - t0


async def block(stack: Any, client: Any, mode: str, args: Any, params: dict[str, Any]) -> dict[str, Any]:
    """(a), (b) and (c) in ``mode``, on agents restarted in it."""
    import asyncio

    import bench_launch
    import bench_recovery
    from benchenv import log

    out: dict[str, Any] = {"mode": mode, "load_1min": round(os.getloadavg()[0], 2)}
    out["agents_up_s"] = round(await restart_agents(stack, client, mode), 3)
    seen: set[tuple[bool, bool]] = set()
    probe = asyncio.create_task(probe_ranks(stack, seen))
    _run, started, _done, _sps, stamps = await bench_launch.launch_once(client, args.launch_steps)
    out["cold_first_step_s"] = stamps["loop_start"] - started
    out["cold_phases_s"] = {  # where (a)'s time went, from rank 0's own timestamps
        "start_to_rank_process": stamps["proc_start"] - started,
        "torch_import": stamps["imported"] - stamps["proc_start"],
        "init_process_group": stamps["pg_ready"] - stamps["imported"],
        "ddp_setup": stamps["loop_start"] - stamps["pg_ready"],
    }
    await standbys_ready(stack)
    short = {**params, "total_steps": STANDBY_STEPS}
    warm = await bench_recovery.one_run(client, stack, short, kill=False, victim_rank=1)
    out["standby_first_report_s"] = warm["to_first_report_s"]
    probe.cancel()
    await asyncio.gather(probe, return_exceptions=True)
    check_confinement(mode, seen)
    out["ranks_seen_as"] = [{"root": root, "in_cgroup": in_cgroup} for root, in_cgroup in sorted(seen)]
    await standbys_ready(stack)  # the two it took are replaced on the agents' next registration tick
    out["kill_missed"] = 0
    while True:
        try:
            killed = await bench_recovery.one_run(client, stack, params, kill=True, victim_rank=1)
            break
        except RuntimeError as exc:
            # on a loaded machine the gang's view (a query its worker answers) can lag past the kill's window:
            # that run is not a sample; run it again, once
            if "finished before the kill" not in str(exc) or out["kill_missed"]:
                raise
            out["kill_missed"] += 1
            log(f"  {mode}: {exc}; once more")
            await standbys_ready(stack)
    out["resume_s"] = killed["time_to_resume_s"]
    out["detection_s"] = killed["detection_s"]
    out["resume_breakdown_s"] = killed["breakdown_s"]
    out["ranks_from_standby"] = killed["details_s"]["ranks_from_standby"]
    out["steps_lost"] = killed["steps_lost"]
    log(
        f"  {mode:<8} load {out['load_1min']:5.1f}: cold launch → first step {out['cold_first_step_s']:.2f} s, "
        f"from standbys → first report {out['standby_first_report_s']:.2f} s, kill → next step "
        f"{out['resume_s']} s (detection {out['detection_s']} s); agents up in {out['agents_up_s']:.1f} s"
    )
    return out


def cpu_weights() -> dict[str, Any]:
    """What a sandboxed rank's CPU share is weighed against (cgroup ``cpu.shares`` / 1024, in CPUs; a process
    outside any cgroup weighs 1): the machine's ``gangflow`` cgroup (engine.executor.cgroups.weigh_node: the sum
    of every node cgroup below it, those of agents that ran here before included) and this stack's nodes'."""
    import bench_recovery

    from engine.executor.sandbox import SANDBOX_ENV, detect

    saved = os.environ.pop(SANDBOX_ENV, None)  # the driver of this machine, whatever mode the agents run in
    try:
        driver = detect()
    finally:
        if saved is not None:
            os.environ[SANDBOX_ENV] = saved
    if driver is None:
        return {}
    return {
        "gangflow_cpus": driver.weighed("gangflow"),
        "node_cgroups": len(driver.children("gangflow")),
        "stack_nodes_cpus": {node: driver.weighed(f"gangflow/{node}") for node in bench_recovery.NODE_IDS},
    }


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 3) if isinstance(value, float) else value


def measure(args: Any, scratch: Path) -> dict[str, Any]:
    """Everything, in ``scratch``: the bare pieces, then the stack's blocks."""
    import asyncio
    import statistics

    import bench_launch
    import bench_recovery
    from benchenv import log

    def med(values: list[Any]) -> float | None:
        vals = [v for v in values if v is not None]
        return round(statistics.median(vals), 4) if vals else None

    log(f"bare pieces, {args.micro_reps} samples each")
    bare = micro(args.micro_reps, scratch / "micro")
    bench_recovery.ARGS = bench_recovery.parse_args([])  # one_run reads its defaults (the kill at half)
    examples = str(bench_recovery.EXAMPLES)
    if examples not in sys.path:
        sys.path.insert(0, examples)
    params = {"total_steps": args.total_steps, "checkpoint_every": 20, "step_seconds": 0.1}
    set_mode(MODES[0])
    stack = bench_recovery.Stack(scratch / "stack")
    blocks: list[dict[str, Any]] = []
    weights: dict[str, Any] = {}

    async def run_all() -> None:
        client = await stack.client()
        await stack.wait_nodes(client)
        await standbys_ready(stack)
        log(f"stack up on {stack.server.address}; warm-up (not counted)")
        await bench_launch.launch_once(client, args.launch_steps)
        await bench_recovery.one_run(client, stack, {**params, "total_steps": STANDBY_STEPS}, False, 1)
        for rep in range(args.repeats):
            log(f"repeat {rep + 1}/{args.repeats}")
            for k in range(len(MODES)):
                blocks.append(await block(stack, client, MODES[(rep + k) % len(MODES)], args, params))
        # read once sandboxed agents have run: each weighs the machine's gangflow cgroup as it starts
        weights.update(cpu_weights())

    try:
        asyncio.run(run_all())
    finally:
        stack.close()
    median: dict[str, dict[str, Any]] = {
        mode: {key: med([b[key] for b in blocks if b["mode"] == mode]) for key in (*FIGURES, "detection_s")}
        for mode in MODES
    }
    for mode in MODES:
        for key in ("resume_breakdown_s", "cold_phases_s"):
            parts = [b[key] for b in blocks if b["mode"] == mode]
            median[mode][key] = {k: med([p[k] for p in parts]) for k in parts[0]}

    def ratio_of(mode: str, key: str) -> float | None:
        value, base = median[mode][key], median["none"][key]
        return None if value is None or not base else round(value / base, 3)

    ratio = {mode: {key: ratio_of(mode, key) for key in FIGURES} for mode in MODES}
    resume_full = median["full"]["resume_s"]
    goals = {
        f"{key}_full_le_{GOAL_LAUNCH_RATIO}x_none": (r := ratio["full"][key]) is not None and r <= GOAL_LAUNCH_RATIO
        for key in FIGURES[:2]
    }
    goals[f"resume_full_le_{GOAL_RESUME_S:.0f}s"] = resume_full is not None and resume_full <= GOAL_RESUME_S
    return {
        "median_s": median,
        "ratio_to_none": ratio,
        "goals": goals,
        "micro_median_s": {k: med(v) for k, v in bare.items()},
        "cpu_weight": weights,
        "samples": {
            "blocks": [_rounded(b) for b in blocks],
            "micro_s": {k: [round(x, 4) for x in v] for k, v in bare.items()},
        },
        "settings": {
            "repeats": args.repeats,
            "launch_steps": args.launch_steps,
            "total_steps": args.total_steps,
            "micro_reps": args.micro_reps,
            "standby_steps": STANDBY_STEPS,
            "checkpoint_every": 20,
            "step_seconds": 0.1,
        },
    }


# ---------------------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------------------
ROWS = (
    ("cold_first_step_s", "launch, new rank processes: start → rank 0's first step", f"≤ {GOAL_LAUNCH_RATIO:.2f}x"),
    ("standby_first_report_s", "launch from warm standbys: start → first report", f"≤ {GOAL_LAUNCH_RATIO:.2f}x"),
    ("resume_s", "node agent SIGKILLed → first report of the next attempt", f"≤ {GOAL_RESUME_S:.0f} s"),
)


def command_line(result: dict[str, Any]) -> str:
    s = result["settings"]
    return (
        f"python tests/perf/bench_sandbox.py --repeats {s['repeats']} --launch-steps {s['launch_steps']} "
        f"--total-steps {s['total_steps']} --micro-reps {s['micro_reps']}"
    )


def _s(value: float | None, unit: str = " s", digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}{unit}"


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    med, ratio, micro_med = result["median_s"], result["ratio_to_none"], result["micro_median_s"]
    rows = [
        [
            label,
            *(_s(med[mode][key]) for mode in MODES),
            _s(ratio["cgroups"][key], "x"),
            _s(ratio["full"][key], "x"),
            goal,
        ]
        for key, label, goal in ROWS
    ]
    rows.append(
        [
            "of which: detection (the dead node declared lost)",
            *(_s(med[mode]["detection_s"]) for mode in MODES),
            "",
            "",
            "",
        ]
    )
    rows.append(
        [
            "bare process start (`python -c 'import json'`)",
            *(_s(micro_med[f"start_{mode}"], " s", 3) for mode in MODES),
            _s(micro_med["start_cgroups"] / micro_med["start_none"], "x"),
            _s(micro_med["start_full"] / micro_med["start_none"], "x"),
            "",
        ]
    )
    rows.append(
        [
            "`enter` in a standby (joining the cgroup, namespace, user)",
            "–",
            _s(micro_med["enter_cgroups"] * 1000, " ms", 1),
            _s(micro_med["enter_full"] * 1000, " ms", 1),
            "",
            "",
            "",
        ]
    )
    header = [f"median of {result['settings']['repeats']}", *(MODE_LABELS[m] for m in MODES)]
    header += ["cgroups / none", "full / none", "goal (full)"]
    loads = [b["load_1min"] for b in result["samples"]["blocks"]]
    note = (
        f"Each column's blocks ran interleaved with the others' on one stack, its three node agents restarted in "
        f"that mode before each block; the 1-minute load average when a block began ranged "
        f"{min(loads):.1f}–{max(loads):.1f}. Removing a gang's cgroups took "
        f"{micro_med['remove'] * 1000:.0f} ms (median)."
    )
    if weight := result.get("cpu_weight"):
        note += (
            f" The machine's `gangflow` cgroup weighed {weight['gangflow_cpus']:g} CPUs (`cpu.shares`: its node "
            f"cgroups' sum, at most the machine's cores) against 1 for a process outside it, and each gang's cgroup "
            f"caps its ranks at the CPUs they asked for (`examples/resilient_training.py`: 1 per rank), which an "
            f"unsandboxed rank may exceed."
        )
    return [*markdown_table(header, "lrrrrrr", rows), "", note, "", caption(command_line(result), result)]


def table(result: dict[str, Any]) -> list[str]:
    """The plain-text table printed to stderr."""
    med, ratio = result["median_s"], result["ratio_to_none"]

    def per_mode(value: Any) -> str:
        return "".join(f"{_s(value(m), ''):>{w}}" for m, w in zip(MODES, (8, 9, 8), strict=True))

    lines = [f"{'median, s':<58}{'none':>8}{'cgroups':>9}{'full':>8}{'cg/none':>9}{'full/none':>10}"]
    for key, label, _goal in ROWS:
        cells = per_mode(lambda m: med[m][key])  # noqa: B023 - called at once
        lines.append(f"{label:<58}{cells}{_s(ratio['cgroups'][key], ''):>9}{_s(ratio['full'][key], ''):>10}")
    lines.append(f"{'  of which detection':<58}{per_mode(lambda m: med[m]['detection_s'])}")
    lines.append("cold launch, where the time went (rank 0, median s):")
    for key in med["none"]["cold_phases_s"]:
        lines.append(f"  {key:<56}{per_mode(lambda m: med[m]['cold_phases_s'][key])}")  # noqa: B023
    lines.append("kill → next step, where the time went (median s):")
    for key in med["none"]["resume_breakdown_s"]:
        lines.append(f"  {key:<56}{per_mode(lambda m: med[m]['resume_breakdown_s'][key])}")  # noqa: B023
    micro_med = result["micro_median_s"]
    lines.append("bare pieces (median s):")
    for key, value in micro_med.items():
        lines.append(f"  {key:<56}{value:>8.4f}")
    lines.append(f"goals: {result['goals']}")
    load = result["load"]
    lines.append(
        f"({result['settings']['repeats']} blocks per mode, 1-minute load average {load['min']:.1f}–{load['max']:.1f}"
        f" over the run; per block: {[b['load_1min'] for b in result['samples']['blocks']]})"
    )
    return lines


def main() -> None:
    args = parse_args()
    from benchenv import render, run_benchmark

    if args.render:
        render(args.render, "sandbox", markdown)
        return
    # bench_launch reads its step count at import, here and in the worker and node agents the stack starts
    os.environ["GANGFLOW_BENCH_STEPS"] = str(args.launch_steps)
    run_benchmark("sandbox", args, markdown, table, lambda scratch: measure(args, scratch))


if __name__ == "__main__":
    main()
