"""What the node sandbox adds to starting a rank and to clearing a gang away, as root on this machine.

    python tests/perf/bench_sandbox.py [--reps N]

One process is started and waited for per sample (``python -c 'import json'``, this machine's interpreter: its
start-up is a rank's first cost), in three settings, interleaved so that drift hits all alike:

* ``none``: no sandbox (what ``GANGFLOW_SANDBOX=0`` gives: the baseline);
* ``cgroups``: the gang's cgroup made and joined, the process stays root (``GANGFLOW_SANDBOX=cgroups``);
* ``full``: cgroup, the rank's own mount namespace (its interpreter bound back from under ``/root``, a
  private ``/dev``) and the gang's user, as a node agent now launches every rank.

It also times ``enter`` alone in a forked child (what a warm standby pays when it becomes the rank: the launch
path from standbys) and the removal of a gang's cgroups (on the way from a killed rank to the next attempt).
Prints ONE JSON line to stdout and a table to stderr. Not a test: nothing here asserts on timings. Needs root
and a cgroup memory controller.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _sandbox(name: str, workdir: Path, full: bool) -> Any:
    from engine.executor.sandbox import GangSandbox, detect, device_rules, gang_user

    driver = detect()
    if driver is None:
        raise SystemExit("needs root and a cgroup memory controller")
    python = (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))
    return GangSandbox(
        driver,
        f"gangflow/bench-sandbox/{name}",
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


def main() -> None:
    from benchenv import LoadSampler, environment

    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 20
    samples: dict[str, list[float]] = {k: [] for k in ("none", "cgroups", "full", "enter_cgroups", "enter_full")}
    samples["remove"] = []
    top = Path(tempfile.mkdtemp(prefix="gangflow-bench-sandbox-"))
    os.chmod(top, 0o755)
    with LoadSampler() as load:
        for i in range(reps):
            samples["none"].append(_start(None, top))
            for mode, full in (("cgroups", False), ("full", True)):
                workdir = top / f"{mode}{i}"
                workdir.mkdir()
                sandbox = _sandbox(f"{mode}{i}", workdir, full)
                sandbox.setup(workdir)
                samples[mode].append(_start(sandbox, workdir))
                samples[f"enter_{mode}"].append(_enter_only(sandbox))
                started = time.perf_counter()
                sandbox.remove()
                samples["remove"].append(time.perf_counter() - started)
    median = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "benchmark": "sandbox",
        "median_s": median,
        "samples_s": samples,
        "reps": reps,
        "environment": environment(),
        "load": load.summary(),
    }
    import json

    print(json.dumps(result))
    base = median["none"]
    print(f"{'median per rank':<44}{'seconds':>10}{'vs none':>10}", file=sys.stderr)
    for key, label in (
        ("none", "process start, no sandbox (GANGFLOW_SANDBOX=0)"),
        ("cgroups", "process start, cgroups only"),
        ("full", "process start, full sandbox"),
    ):
        print(f"{label:<44}{median[key]:>10.4f}{median[key] / base:>10.2f}", file=sys.stderr)
    print(f"{'enter() in a standby, cgroups only':<44}{median['enter_cgroups']:>10.4f}", file=sys.stderr)
    print(f"{'enter() in a standby, full sandbox':<44}{median['enter_full']:>10.4f}", file=sys.stderr)
    print(f"{'removing a gang cgroup':<44}{median['remove']:>10.4f}", file=sys.stderr)
    summary = result["load"]
    print(f"({reps} reps, load average {summary['min']:.1f}-{summary['max']:.1f})", file=sys.stderr)


if __name__ == "__main__":
    main()
