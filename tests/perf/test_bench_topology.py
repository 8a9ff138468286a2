"""``bench_scheduler.py --racks``: the topology-aware and the topology-blind sides on racked nodes.

Asserted: both sides report ``gangs_in_one_domain`` and pass the simulation's checks, every required gang
lands in one rack, and the blind side decides exactly as a run without racks (labels and a declared level
change nothing for gangs that ask for none); a bad ``--racks`` or ``--preferred-wait`` is refused. Figures
are not asserted."""

from __future__ import annotations

from typing import Any

import pytest
from test_bench_scheduler import SMALL, bench, json_line


@pytest.fixture(scope="module")
def racked() -> dict[str, Any]:
    return json_line(bench(*SMALL, "--racks", "4", "--fifo-budget-s", "0", "--json", timeout=300))


def test_both_sides_report_gangs_in_one_domain_and_pass_their_checks(racked: dict[str, Any]) -> None:
    assert racked["config"]["racks"] == 4
    for name in ("policy", "blind"):
        side = racked[name]
        assert side["finished"] is True and side["violations"] == [], side["violations"]
        counts = side["one_domain"]
        assert counts["racks"] == 4 and counts["rack_size"] == 5
        assert counts["fit"] > 0 and 0 <= side["gangs_in_one_domain"] <= 1
        assert side["gangs_in_one_domain"] == round(counts["one"] / counts["fit"], 4)
    aware = racked["policy"]["one_domain"]
    assert aware["required_fit"] > 0 and aware["required_one"] == aware["required_fit"]
    assert racked["policy"]["gangs_in_one_domain"] >= racked["blind"]["gangs_in_one_domain"]


def test_the_blind_side_decides_as_a_run_without_racks(racked: dict[str, Any]) -> None:
    plain = json_line(bench(*SMALL, "--fifo-budget-s", "0", "--json", timeout=300))
    assert racked["blind"]["decision_hash"] == plain["policy"]["decision_hash"]


@pytest.mark.parametrize("racks", ["-1", "21"])
def test_a_bad_number_of_racks_is_refused(racks: str) -> None:
    done = bench(*SMALL, "--racks", racks)
    assert done.returncode == 2 and "--racks must be between 0 and the number of nodes (20)" in done.stderr


@pytest.mark.parametrize(("args", "said"), [([], "got 600.0"), (["--racks", "4", "--preferred-wait", "0"], "got 0.0")])
def test_a_preferred_wait_without_racks_or_not_positive_is_refused(args: list[str], said: str) -> None:
    done = bench(*SMALL, *args, *(["--preferred-wait", "600"] if not args else []))
    assert done.returncode == 2 and "--preferred-wait needs --racks and a positive number of seconds" in done.stderr
    assert said in done.stderr
