"""What every benchmark records next to its figures, and the markdown it prints for the README.

Figures from a shared 2-core machine mean little without the date, the machine and the load they were
measured under, so each benchmark's JSON line carries :func:`environment` and a :class:`LoadSampler`'s
summary, and its ``--markdown`` output ends with :func:`caption`. The README's performance tables are
exactly those markdown lines (``tests/perf/test_readme_figures.py`` checks it against the JSON lines kept
in ``tests/perf/results/``).

The command line every benchmark shares is here too: :func:`arguments`, :func:`output_options` and
:func:`at_least_one` build it, :func:`run_benchmark` runs a measurement the way every benchmark does (a
scratch folder, the load sampled, the JSON line and a table out), and :func:`main_by_name` is the
``__main__`` block of a benchmark whose classes workers import.

Imported by the benchmarks' ``main`` (and ``parse_args``) only, never at their import time: the benchmark
files are also code bundles that workers import.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "LoadSampler",
    "arguments",
    "at_least_one",
    "caption",
    "cpu_model",
    "emit",
    "environment",
    "log",
    "main_by_name",
    "markdown_table",
    "output_options",
    "read_result",
    "render",
    "run_benchmark",
]

#: a benchmark's ``markdown`` or ``table``: the lines of text it makes of a result
Lines = Callable[[dict[str, Any]], list[str]]


def log(msg: str = "") -> None:
    """Progress for the person watching: to the real stderr (a worker in the process reroutes sys.stderr),
    so that stdout holds the JSON line alone."""
    print(msg, file=sys.__stderr__ or sys.stderr, flush=True)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def environment() -> dict[str, Any]:
    """When and where a benchmark ran."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
    }


class LoadSampler:
    """The 1-minute load average, sampled in a background thread while a benchmark runs.

    The load at the start alone says little on a shared machine: another engineer's test suite may start
    halfway through. The range over the run is what qualifies the figures.
    """

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        values = [round(v, 2) for v in self.samples or [os.getloadavg()[0]]]
        return {"start": values[0], "min": min(values), "max": max(values), "end": values[-1]}


def markdown_table(header: Sequence[str], align: str, rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub markdown table; ``align`` holds one ``l`` or ``r`` per column."""
    if len(align) != len(header) or any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row needs {len(header)} cells")
    rule = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(cells) + " |" for cells in (header, rule, *rows)]


def caption(command: str, result: dict[str, Any]) -> str:
    """The line under a README table: the command, when, on what, under which load."""
    env, load = result["environment"], result["load"]
    return (
        f"*`{command}`, {env['date']}, {env['cores']} cores ({env['cpu']}), Python {env['python']}; "
        f"1-minute load average {load['min']:.1f}–{load['max']:.1f} during the run "
        f"(the machine is shared with other work).*"
    )


def read_result(path: str | os.PathLike[str], benchmark: str) -> dict[str, Any]:
    """The last JSON line of a file that ``benchmark``'s stdout went to."""
    try:
        with open(path) as handle:
            lines = [line for line in handle.read().splitlines() if line.strip().startswith("{")]
    except OSError as exc:
        raise SystemExit(f"cannot read {path}: {exc.strerror}") from None
    if not lines:
        raise SystemExit(f"{path}: no JSON line (a benchmark prints one on stdout)")
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}: the last JSON line is not valid JSON ({exc})") from None
    if not isinstance(result, dict) or result.get("benchmark") != benchmark:
        found = result.get("benchmark") if isinstance(result, dict) else type(result).__name__
        raise SystemExit(f"{path}: not a result of bench_{benchmark}.py (benchmark: {found!r})")
    return result


def render(path: str | os.PathLike[str], benchmark: str, markdown: Callable[[dict[str, Any]], list[str]]) -> None:
    """``--render``: print the README's rows of a saved JSON line of ``benchmark``."""
    print("\n".join(markdown(read_result(path, benchmark))), flush=True)


def emit(result: dict[str, Any], lines: Sequence[str]) -> NoReturn:
    """Log a benchmark's table, print its JSON line on stdout, and exit at once: a process that used the
    temporalio client or worker may abort at interpreter exit (code 134)."""
    log()
    log("\n".join(lines))
    print(json.dumps(result), flush=True)
    os._exit(0)


# -- the command line and the run every benchmark shares ---------------------------------------------------
def arguments(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser, described by the first paragraph of its docstring (``doc``)."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], allow_abbrev=False)


def output_options(parser: argparse.ArgumentParser, *, json_flag: bool = False) -> None:
    """``--markdown`` and ``--render FILE`` (what :func:`run_benchmark` reads); ``json_flag``: also ``--json``,
    exclusive with ``--markdown``."""
    out: Any = parser
    if json_flag:
        out = parser.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true", help="print the JSON line only, no table")
    out.add_argument("--markdown", action="store_true", help="print the README's table rows instead of a table")
    parser.add_argument("--render", metavar="FILE", help="print the README's rows of a saved JSON line and exit")


def at_least_one(parser: argparse.ArgumentParser, args: argparse.Namespace, *flags: str) -> None:
    """Refuse (exit 2, argparse's way) an integer option under 1; ``flags`` are attribute names."""
    for flag in flags:
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")


def run_benchmark(
    benchmark: str, args: argparse.Namespace, markdown: Lines, table: Lines, measure: Callable[[Path], dict[str, Any]]
) -> None:
    """A benchmark's run: with ``--render``, the README's rows of a saved line; otherwise ``measure(scratch)``
    in a scratch folder of its own (the client's code cache in it: not in ~/.cache), removed after, under a
    :class:`LoadSampler`; its figures, with when, where and under which load, are the JSON line that
    :func:`emit` prints after the table (``--markdown``: the README's rows; ``--json``: none)."""
    if args.render:
        render(args.render, benchmark, markdown)
        return
    scratch = Path(tempfile.mkdtemp(prefix=f"gangflow-bench-{benchmark}-"))
    os.environ["GANGFLOW_CACHE"] = str(scratch / "cache")
    try:
        with LoadSampler() as load:
            figures = measure(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"benchmark": benchmark, **figures, "environment": environment(), "load": load.summary()}
    lines = [] if getattr(args, "json", False) else markdown(result) if args.markdown else table(result)
    emit(result, lines)


def main_by_name(module: str, args: argparse.Namespace) -> None:
    """Run ``main(args)`` of the benchmark imported by its name (``module``), not of ``__main__``: that is the
    name gangflow's code bundle (and temporalio's sandbox) import it under, so the worker in this process and
    the benchmark name the same classes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    importlib.import_module(module).main(args)
