"""The README's performance tables are exactly what the benchmarks print for the results kept in results/.

Re-running a benchmark and pasting its ``--markdown`` output into the README means saving its JSON line
here too (``python tests/perf/bench_X.py --markdown > tests/perf/results/X.json``); these tests fail when
the two drift apart. They run no benchmark: ``--render`` turns a saved JSON line back into the rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchenv import markdown_table, read_result

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE.parents[1] / "README.md"
BENCHMARKS = [
    "orchestration",
    "launch",
    "scheduler",
    "scheduler_workflow",
    "preemption",
    "isolation",
    "map",
    "sandbox",
    "goodput",
]
#: the benchmarks that repeat their measurement (``--reps``); the scheduler's is one deterministic simulation
REPEATED = ["orchestration", "launch", "preemption", "isolation", "map"]


def bench(benchmark: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python tests/perf/bench_<benchmark>.py ...`` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, str(HERE / f"bench_{benchmark}.py"), *args],
        cwd=HERE.parents[1],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(benchmark: str, *args: str) -> subprocess.CompletedProcess[str]:
    return bench(benchmark, "--render", *args)


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_readme_tables_are_what_the_benchmark_prints(benchmark: str) -> None:
    saved = RESULTS / f"{benchmark}.json"
    done = render(benchmark, str(saved))
    assert done.returncode == 0, done.stderr
    rows = done.stdout.strip()
    assert rows.startswith("| "), rows
    assert rows in README.read_text(), (
        f"README.md does not hold the rows of {saved.relative_to(HERE.parents[1])}; paste them:\n{rows}"
    )


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_saved_results_say_when_where_and_under_which_load(benchmark: str) -> None:
    result = read_result(RESULTS / f"{benchmark}.json", benchmark)
    assert {"date", "cores", "cpu", "python"} <= result["environment"].keys()
    assert {"start", "min", "max", "end"} <= result["load"].keys()


def test_orchestration_baseline_runs_like_gangflow() -> None:
    """The ratio is taken against a baseline under the same workflow runner as gangflow's user workflows."""
    settings = read_result(RESULTS / "orchestration.json", "orchestration")["settings"]
    assert settings["baseline_sandboxed"] == settings["gangflow_sandboxed"]


def test_launch_reports_cold_and_warm_for_both_launchers() -> None:
    result = read_result(RESULTS / "launch.json", "launch")
    for setting in ("cold", "warm"):
        for launcher in ("torchrun", "gangflow"):
            assert {"first_step_s", "result_s", "steps_per_s"} <= result[setting][launcher].keys()
    assert result["cold"]["gangflow"]["stack_up_s"] > 0


# -- bad input: a clear message, no traceback ------------------------------------------------------------
def test_render_of_a_missing_file_says_so(tmp_path: Path) -> None:
    done = render("orchestration", str(tmp_path / "nope.json"))
    assert done.returncode == 1
    assert "cannot read" in done.stderr and "nope.json" in done.stderr
    assert "Traceback" not in done.stderr


def test_render_of_a_file_without_a_json_line_says_so(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("a table, no JSON\n")
    done = render("launch", str(path))
    assert done.returncode == 1
    assert "no JSON line" in done.stderr and "Traceback" not in done.stderr


def test_render_of_another_benchmarks_result_names_it(tmp_path: Path) -> None:
    path = tmp_path / "launch.json"
    path.write_text(json.dumps({"benchmark": "launch"}) + "\n")
    done = render("orchestration", str(path))
    assert done.returncode == 1
    assert "not a result of bench_orchestration.py" in done.stderr and "'launch'" in done.stderr


@pytest.mark.parametrize("benchmark", REPEATED)
def test_zero_reps_are_refused_before_anything_starts(benchmark: str) -> None:
    done = bench(benchmark, "--reps", "0")
    assert done.returncode == 2
    assert "--reps must be at least 1, got 0" in done.stderr


def test_sandbox_compares_every_mode_against_no_sandbox() -> None:
    """One run measured launch (cold, from standbys) and kill → next step in each mode, with the load."""
    result = read_result(RESULTS / "sandbox.json", "sandbox")
    for mode in ("none", "cgroups", "full"):
        assert {"cold_first_step_s", "standby_first_report_s", "resume_s"} <= result["median_s"][mode].keys()
    blocks = result["samples"]["blocks"]
    assert {b["mode"] for b in blocks} == {"none", "cgroups", "full"}
    assert all(isinstance(b["load_1min"], float) for b in blocks)


def test_goodput_figure_shows_both_claims_held_on_a_kill_and_a_preemption() -> None:
    """The README's goodput figure: one run, a node lost and a preemption, each losing steps the logs confirm."""
    result = read_result(RESULTS / "goodput.json", "goodput")
    assert result["claims"]["sum_within_1pct"] and result["claims"]["lost_steps_match"]
    assert {x["cause"] for x in result["lost"]} == {"lost_failure", "lost_preemption"}


def test_sandbox_zero_repeats_are_refused_before_anything_starts() -> None:
    done = bench("sandbox", "--repeats", "0")
    assert done.returncode == 2
    assert "--repeats must be at least 1, got 0" in done.stderr


def test_abbreviated_flags_are_not_guessed() -> None:
    done = bench("launch", "--cold", "2")
    assert done.returncode == 2 and "unrecognized arguments: --cold" in done.stderr


def test_markdown_table_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        markdown_table(["a", "b"], "lr", [["1"]])
