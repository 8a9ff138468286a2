"""The scheduler benchmark's harness: a small run end to end, its checks, its determinism, its bad input.

The figures themselves are not asserted (a benchmark is not a timed test); what is asserted is that the
harness measures what it says: every key is there, the simulation's own checks pass for both schedulers,
the same seed gives the same decisions, and the checks do catch a scheduler that double-allocates or
preempts in a cycle (a scripted scheduler, driven through the same simulation).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import bench_scheduler as bs
import pytest

from engine.scheduling import Admitted, NodeAssignment, Placement, Preempted

HERE = Path(__file__).resolve().parent
SMALL = ("--nodes", "20", "--gpus-per-node", "8", "--gangs", "300", "--tenants", "3", "--seed", "7")
METRICS = {
    "events_per_s",
    "p50_ms",
    "p99_ms",
    "p99_cpu_ms",
    "makespan_over_bound",
    "gpu_allocated_under_backlog",
    "jain",
    "preemptions_per_gang",
    "gpu_seconds_lost",
    "queue_delay_s",
}


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python tests/perf/bench_scheduler.py ...`` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, str(HERE / "bench_scheduler.py"), *args],
        cwd=HERE.parents[1],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_line(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout[-2000:]
    result: dict[str, Any] = json.loads(lines[0])
    return result


@pytest.fixture(scope="module")
def small() -> dict[str, Any]:
    return json_line(bench(*SMALL, "--json"))


# -- a small run end to end ---------------------------------------------------------------------------------
def test_small_run_reports_every_metric_for_both_schedulers(small: dict[str, Any]) -> None:
    assert small["benchmark"] == "scheduler"
    for name in bs.SCHEDULERS:
        entry = small[name]
        assert "skipped" not in entry, entry.get("skipped")
        assert entry.keys() >= METRICS, sorted(METRICS - entry.keys())
        assert entry["finished"] is True
        assert set(entry["queue_delay_s"]) == {"team-0", "team-1", "team-2"}
        for delays in entry["queue_delay_s"].values():
            assert delays["p50"] is not None and delays["p50"] <= delays["p99"]
        assert entry["p50_ms"] <= entry["p99_ms"] and entry["p50_cpu_ms"] <= entry["p99_cpu_ms"]
        assert 0 < entry["gpu_allocated_under_backlog"] <= 1
        assert 0 < entry["jain"] <= 1
        assert entry["makespan_over_bound"] >= 1  # the bound is a lower bound
        # every node registration, submission and release went through the scheduler
        assert entry["events"] >= 20 + 2 * 300
    assert {"environment", "load", "config"} <= small.keys()
    assert small["config"]["gangs"] == 300 and small["config"]["queue"]["tenants"][2]["weight"] == 3


def test_small_run_passes_every_check_for_both_schedulers(small: dict[str, Any]) -> None:
    for name in bs.SCHEDULERS:
        checks = small[name]["checks"]
        assert {"no_double_allocation", "all_finished"} <= checks.keys()
        assert all(checks.values()), (name, checks, small[name]["violations"])
        assert small[name]["gangs_finished"] == 300
        assert small[name]["rejections"] == 0


def test_the_trace_yields_a_ledger_whose_parts_add_up(small: dict[str, Any]) -> None:
    for name in bs.SCHEDULERS:
        ledger = small[name]["ledger"]
        parts = ledger["productive_gpu_s"] + sum(ledger["badput_gpu_s"].values())
        assert parts == pytest.approx(ledger["allocated_gpu_s"], rel=1e-6)
        assert set(ledger["goodput_by_tenant"]) == {"team-0", "team-1", "team-2"}
        # preempted work is what the ledger calls lost and saving: the benchmark's own figure
        lost = ledger["badput_gpu_s"]["lost_preemption"] + ledger["badput_gpu_s"]["checkpoint"]
        assert lost == pytest.approx(small[name]["gpu_seconds_lost"], abs=1.0)
    assert small["fifo"]["ledger"]["goodput"] == 1.0  # FIFO never preempts: nothing is thrown away
    assert small["policy"]["counters_us_per_event"] > 0 and "counters_us_per_event" not in small["fifo"]
    assert "goodput per tenant" in "\n".join(bs.markdown(small))


def test_the_same_seed_gives_the_same_decisions(small: dict[str, Any]) -> None:
    again = json_line(bench(*SMALL, "--json"))
    for name in bs.SCHEDULERS:
        assert len(small[name]["decision_hash"]) == 64
        assert again[name]["decision_hash"] == small[name]["decision_hash"], name
        assert again[name]["gpu_seconds_lost"] == small[name]["gpu_seconds_lost"]


def test_the_table_and_the_markdown_show_both_schedulers(small: dict[str, Any], tmp_path: Path) -> None:
    table = "\n".join(bs.table(small))
    assert "fifo" in table and "policy" in table and "team-2" in table
    saved = tmp_path / "scheduler.json"
    saved.write_text(json.dumps(small) + "\n")
    done = bench("--render", str(saved))
    assert done.returncode == 0, done.stderr
    rows = done.stdout.strip().splitlines()
    assert rows[0].endswith("| FIFO (before) | Policy | goal |")
    assert any(row.startswith("| p99 per call |") for row in rows)
    assert "python tests/perf/bench_scheduler.py --nodes 20 --gpus-per-node 8 --gangs 300" in rows[-1]


def test_the_saved_full_size_result_passes_its_checks() -> None:
    result = json.loads((HERE / "results" / "scheduler.json").read_text().splitlines()[-1])
    assert result["config"]["nodes"] == 1000 and result["config"]["gangs"] == 15000
    assert all(result["policy"]["checks"].values()), result["policy"]["violations"]
    assert {"date", "cores", "cpu", "python"} <= result["environment"].keys()


# -- the FIFO baseline --------------------------------------------------------------------------------------
def test_fifo_out_of_budget_says_how_far_it_got() -> None:
    result = json_line(bench(*SMALL, "--fifo-budget-s", "0.01", "--json"))
    fifo = result["fifo"]
    assert fifo["finished"] is False
    assert 0 < fifo["events"] < 620
    assert fifo["checks"]["all_finished"] is False
    assert fifo["makespan_over_bound"] is None
    assert "FIFO stopped at its wall-clock budget" in bs.fifo_note(fifo)
    assert bs.command_line(result).endswith("--tenants 3 --seed 7 --fifo-budget-s 0.01")  # reproducible
    assert "> " in bs.cell(fifo, "cpu_s", "{:.1f} s") and bs.cell(fifo, "jain", "{:.3f}") == "–"
    assert result["policy"]["finished"] is True


def test_fifo_budget_zero_skips_it() -> None:
    result = json_line(bench(*SMALL, "--fifo-budget-s", "0", "--json"))
    assert result["fifo"] == {"skipped": "--fifo-budget-s 0"}
    assert "skipped" in bs.markdown(result)[2]


def test_a_baseline_commit_that_is_not_there_is_a_reason_not_a_crash() -> None:
    why = bs.load_fifo_baseline("0" * 40)
    assert isinstance(why, str) and "git show" in why and "engine/scheduling/__init__.py" in why


# -- the workload ---------------------------------------------------------------------------------------------
def test_workload_follows_the_philly_fit() -> None:
    w = bs.generate_workload(nodes=1000, gpus_per_node=8, gangs=20000, tenants=10, seed=1)
    n = len(w.gangs)
    share = {size: sum(1 for g in w.gangs if g.gpus == size) / n for size in (1, 2, 4, 8, 16)}
    for size, p in bs.GANG_GPUS:
        assert abs(share[size] - p) < 0.01, (size, share[size])
    assert all(g.nnodes == 2 and g.gpus_per_node == 8 for g in w.gangs if g.gpus == 16)
    assert all(g.nnodes == 1 for g in w.gangs if g.gpus <= 8)
    long = sum(1 for g in w.gangs if g.duration > 60 * 10**3) / n
    assert abs(long - 0.05) < 0.01
    assert all(600 <= g.duration <= 600_000 for g in w.gangs)
    assert abs(sum(1 for g in w.gangs if g.priority == "high") / n - 0.10) < 0.01
    assert all(g.cpus_per_node == 4 * g.gpus_per_node for g in w.gangs) and w.cpus_per_node == 64
    arrivals = [g.arrival for g in w.gangs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0
    mean_gap = arrivals[-1] / (n - 1)
    assert abs(mean_gap * w.arrival_rate - 1) < 0.05  # Poisson at the documented rate


def test_tenants_have_unequal_weights_and_quotas_summing_to_the_cluster() -> None:
    w = bs.generate_workload(nodes=7, gpus_per_node=8, gangs=50, tenants=10, seed=1)
    assert [t.weight for t in w.tenants] == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    assert sum(t.quota_gpus for t in w.tenants) == 56
    assert [t.cohort for t in w.tenants[:4]] == ["cohort-a", "cohort-b", "cohort-c", "cohort-a"]
    config = bs.queue_config(w, grace_s=120, min_runtime_s=60)
    assert config["cohorts"][0] == {"name": "cluster"}
    assert {c.get("parent") for c in config["cohorts"][1:]} == {"cluster"}


def test_the_same_seed_gives_the_same_workload_and_another_seed_another() -> None:
    def make(seed: int) -> bs.Workload:
        return bs.generate_workload(nodes=20, gpus_per_node=8, gangs=300, tenants=3, seed=seed)

    assert make(3) == make(3)
    assert make(3).gangs != make(4).gangs


def test_the_kueue_baseline_is_kueues_benchmark_workload() -> None:
    w = bs.kueue_baseline_workload()
    assert len(w.gangs) == 15000 and len(w.tenants) == 30 and w.total_gpus == 600 and w.gpus_per_node == 20
    assert round(w.bound()["bound_s"], 6) == 66  # Kueue's work-conserving bound: 39,600 unit-seconds / 600
    per_tenant = {(g.priority, g.gpus, g.duration) for g in w.gangs if g.tenant == "cq-4-5"}
    assert per_tenant == {("small", 1, 0.2), ("medium", 5, 0.5), ("large", 20, 1.0)}
    large = sorted(g.arrival for g in w.gangs if g.tenant == "cq-0-0" and g.priority == "large")
    assert len(large) == 50 and large[:2] == [0.0, 1.2]
    config = bs.queue_config(w, grace_s=120, min_runtime_s=0)
    assert [c["name"] for c in config["cohorts"]] == [f"cohort-{c}" for c in range(5)]
    assert config["tenants"][0]["borrowing_limit"] == {"gpu": 100} and config["tenants"][0]["quota"] == {"gpu": 20}
    assert {c["name"]: c["value"] for c in config["priority_classes"]} == {"small": 50, "medium": 100, "large": 200}
    assert config["policy"]["reclaim_within_cohort"] == "any" and config["policy"]["min_runtime"] == 0
    from engine.scheduling.config import load_queue_config

    assert len(load_queue_config(config).tenants) == 30


def test_the_kueue_baseline_defaults_to_no_save_time_and_no_minimum_runtime() -> None:
    args = bs.parse_args(["--workload", "kueue-baseline"])
    assert (args.save_s, args.min_runtime_s) == (0, 0)
    assert (bs.parse_args([]).save_s, bs.parse_args([]).min_runtime_s) == (30, 60)
    assert bs.parse_args(["--workload", "kueue-baseline", "--min-runtime-s", "1.5"]).min_runtime_s == 1.5


def test_usage_half_life_is_a_flag_and_absent_leaves_the_queue_file_as_it_was() -> None:
    w = bs.kueue_baseline_workload()
    assert "usage_half_life" not in bs.queue_config(w, grace_s=120, min_runtime_s=0)["policy"]
    assert bs.queue_config(w, grace_s=120, min_runtime_s=0, usage_half_life_s=60)["policy"]["usage_half_life"] == 60
    assert bs.parse_args([]).usage_half_life_s is None
    assert bs.parse_args(["--usage-half-life-s", "3600"]).usage_half_life_s == 3600
    with pytest.raises(SystemExit):
        bs.parse_args(["--usage-half-life-s", "0"])
    line = bs.command_line({"config": {"workload": "kueue-baseline", "usage_half_life_s": 60.0}})
    assert line.endswith("--usage-half-life-s 60")


def test_checkpoint_interval_tells_the_policy_and_runs_todays_victim_choice_beside_it() -> None:
    result = json_line(bench(*SMALL, "--fifo-budget-s", "0", "--checkpoint-interval", "600", "--json"))
    costed, today = result["policy"], result["policy_today"]
    for side in (costed, today):
        assert all(side["checks"].values()), side["violations"]
        assert side["checkpoint_reports"] > 0 and side["gpu_hours_lost_preemption"] >= 0
        assert side["gpu_hours_lost_preemption"] == round(side["gpu_seconds_lost"] / 3600, 2)
    assert result["config"]["checkpoint_interval_s"] == 600 and result["config"]["checkpoint_every_s"] is None
    assert bs.command_line(result).endswith("--checkpoint-interval 600")
    assert "gpu_hours_lost_preemption" in json_line(bench(*SMALL, "--fifo-budget-s", "0", "--json"))["policy"]
    with pytest.raises(SystemExit):
        bs.parse_args(["--checkpoint-interval", "0"])
    # each gang's own interval, from half to twice the flag's, the same for the same seed
    drawn = bs.Checkpoints.drawn(["a", "b", "c"], 600.0, 7, 30.0)
    assert all(300 <= drawn.interval(g) <= 1200 for g in "abc") and drawn.kept("a", drawn.interval("a") * 2.5) > 0
    assert drawn.intervals == bs.Checkpoints.drawn(["a", "b", "c"], 600.0, 7, 30.0).intervals


def test_checkpoint_wait_sets_the_policy_knob_for_the_costed_side() -> None:
    result = json_line(
        bench(*SMALL, "--fifo-budget-s", "0", "--checkpoint-interval", "600", "--checkpoint-wait", "120", "--json")
    )
    for side in (result["policy"], result["policy_today"]):
        assert all(side["checks"].values()), side["violations"]
    assert result["config"]["queue"]["policy"]["checkpoint_wait"] == 120 == result["config"]["checkpoint_wait_s"]
    assert bs.command_line(result).endswith("--checkpoint-interval 600 --checkpoint-wait 120")
    for bad in (["--checkpoint-wait", "120"], ["--checkpoint-interval", "600", "--checkpoint-wait", "0"]):
        with pytest.raises(SystemExit):
            bs.parse_args(bad)


def test_users_name_a_user_per_gang_and_the_policy_orders_by_them() -> None:
    plain = json_line(bench(*SMALL, "--fifo-budget-s", "0", "--json"))
    result = json_line(bench(*SMALL, "--fifo-budget-s", "0", "--users", "3", "--json"))
    assert all(result["policy"]["checks"].values()), result["policy"]["violations"]
    assert result["policy"]["gangs_finished"] == plain["policy"]["gangs_finished"] == 300
    assert result["config"]["users_per_tenant"] == 3 and "users_per_tenant" not in plain["config"]
    assert bs.command_line(result).endswith("--users 3")
    assert result["policy"]["decision_hash"] != plain["policy"]["decision_hash"]  # the order inside tenants moved
    with pytest.raises(SystemExit):
        bs.parse_args(["--users", "-1"])


def test_one_cohort_of_the_kueue_baseline_ends_with_min_runtime_zero() -> None:
    # issue 22: with min_runtime 0 the policy preempted gangs in a loop on this workload and never ended
    w = bs.kueue_baseline_workload()
    tenants = tuple(t for t in w.tenants if t.cohort == "cohort-0")
    gangs = tuple(g for g in w.gangs if g.tenant.startswith("cq-0-") and g.arrival < 3)
    w = replace(w, tenants=tenants, gangs=gangs, nodes=6, cohorts=w.cohorts[:1] if w.cohorts else None)
    result = bs.simulate(w, bs.PolicyAdapter(bs.queue_config(w, grace_s=120, min_runtime_s=0)), save_s=0)
    assert result["finished"] and all(result["checks"].values()), result["violations"]
    assert result["preemptions_per_gang"] <= 1
    assert set(result["queue_delay_by_priority_s"]) == {"small", "medium", "large"}
    row = dict(zip(("small", "medium", "large"), result["queue_delay_mean_by_priority_s"].values(), strict=True))
    assert all(v is not None and v >= 0 for v in row.values()), row
    assert "kueue-baseline" in bs.command_line({"config": {"workload": "kueue-baseline", "save_s": 0.0}})


def test_gangs_never_ask_for_more_nodes_than_the_cluster_has() -> None:
    assert bs.gang_shape(16, 8, 1000) == (2, 8)
    assert bs.gang_shape(16, 4, 2) == (2, 4)
    assert bs.gang_shape(16, 8, 1) == (1, 8)
    assert bs.gang_shape(3, 8, 1) == (1, 3)


# -- the metrics ----------------------------------------------------------------------------------------------
def test_water_filling_caps_each_tenant_at_its_demand_and_splits_the_rest_by_weight() -> None:
    assert bs.water_fill(12, [100, 100, 100], [1, 2, 3]) == [2, 4, 6]
    assert bs.water_fill(12, [1, 100, 100], [1, 2, 3]) == [1, 4.4, pytest.approx(6.6)]
    assert bs.water_fill(12, [1, 2, 3], [1, 1, 1]) == [1, 2, 3]
    assert bs.water_fill(12, [0, 100, 0], [1, 1, 1]) == [0, 12, 0]


def test_jain_index_and_percentiles() -> None:
    assert bs.jain_index([1, 1, 1, 1]) == 1
    assert bs.jain_index([1, 0, 0, 0]) == 0.25
    assert bs.percentile([3, 1, 2], 50) == 2
    assert bs.percentile([0, 10], 99) == pytest.approx(9.9)
    assert bs.percentile([], 50) is None


# -- the checks catch a bad scheduler --------------------------------------------------------------------
Answer = Callable[[str, str, float], Sequence[Any]]


class Scripted(bs.Adapter):
    """A scheduler written for one scenario: ``answer(call, gang_id, now)`` returns its decisions."""

    name = "scripted"

    def __init__(self, answer: Answer) -> None:
        super().__init__()
        self.answer = answer

    def register(self, node_id: str, gpus: int, cpus: int, now: float) -> list[bs.Outcome]:
        return self._timed(lambda: [], now)

    def submit(self, gang: bs.SimGang, now: float) -> list[bs.Outcome]:
        return self._timed(lambda: self.answer("submit", gang.gang_id, now), now)

    def release(self, gang_id: str, now: float) -> list[bs.Outcome]:
        return self._timed(lambda: self.answer("release", gang_id, now), now)

    def tick(self, now: float) -> list[bs.Outcome]:
        return self._timed(lambda: [], now)

    def next_deadline(self) -> float | None:
        return None


def one_node(*gangs: tuple[str, float, float, int]) -> bs.Workload:
    """One node of 2 GPUs, one tenant; gangs as (id, arrival, duration, GPUs)."""
    return bs.Workload(
        nodes=1,
        gpus_per_node=2,
        cpus_per_node=16,
        tenants=(bs.SimTenant(name="team-a", weight=1, quota_gpus=2, cohort=None),),
        gangs=tuple(
            bs.SimGang(g, "team-a", "low", arrival, duration, 1, gpus, 4.0 * gpus)
            for g, arrival, duration, gpus in gangs
        ),
        arrival_rate=1.0,
    )


def admitted(gang_id: str, *gpu_ids: int) -> Admitted:
    node = NodeAssignment(node_id="node-0", address="node-0:0", node_rank=0, gpu_ids=gpu_ids)
    return Admitted(placement=Placement(gang_id=gang_id, nodes=(node,)))


def preempted(gang_id: str, by: str) -> Preempted:
    return Preempted(gang_id=gang_id, by=by, by_tenant="team-a", cause="priority", reason="test", grace_s=120)


def test_a_gpu_given_twice_is_caught() -> None:
    workload = one_node(("a", 0, 100, 1), ("b", 10, 100, 1))
    result = bs.simulate(workload, Scripted(lambda call, g, now: [admitted(g, 0)] if call == "submit" else []), 30)
    assert result["checks"]["no_double_allocation"] is False
    assert any("b got GPUs [0] on node-0, which another gang holds" in v for v in result["violations"])


def test_an_admission_of_a_running_gang_is_caught() -> None:
    workload = one_node(("a", 0, 100, 1), ("b", 10, 100, 1))
    result = bs.simulate(workload, Scripted(lambda call, g, now: [admitted("a", 0)] if call == "submit" else []), 30)
    assert result["checks"]["consistent_decisions"] is False
    assert any("a admitted while running" in v for v in result["violations"])


def test_a_preempted_gang_saves_releases_and_resumes_from_its_last_checkpoint() -> None:
    # a (2 GPUs, 5,000 s) runs from 0; b arrives at 1,000 and preempts it; a saves for 30 s, releases, is
    # resubmitted with 5,000 - 600 s left (its checkpoint at 600 s), and runs again when b is done
    workload = one_node(("a", 0, 5000, 2), ("b", 1000, 100, 2))

    def answer(call: str, gang_id: str, now: float) -> list[Any]:
        if call == "submit" and gang_id == "a" and now == 0:
            return [admitted("a", 0, 1)]
        if call == "submit" and gang_id == "b":
            return [preempted("a", by="b")]
        if call == "release" and gang_id == "a" and now == 1030:
            return [admitted("b", 0, 1)]
        if call == "release" and gang_id == "b":
            return [admitted("a", 0, 1)]
        return []

    result = bs.simulate(workload, Scripted(answer), save_s=30)
    assert all(result["checks"].values()), result["violations"]
    assert result["gpu_seconds_lost"] == 2 * (400 + 30)
    assert result["preemptions"] == 1 and result["preemptions_per_gang"] == 0.5
    assert result["preemptions_by_cause"] == {"priority": 1}
    assert result["makespan_s"] == 1000 + 30 + 100 + 4400
    assert result["queue_delay_s"]["team-a"]["p99"] == pytest.approx(30, abs=0.5)  # b waited for a's save
    assert result["gpu_allocated_under_backlog"] == 1.0


def test_a_preemption_cycle_is_caught() -> None:
    workload = one_node(("a", 0, 5000, 2), ("b", 1000, 5000, 2))

    def answer(call: str, gang_id: str, now: float) -> list[Any]:
        if call == "submit" and gang_id == "a" and now == 0:
            return [admitted("a", 0, 1)]
        if call == "submit" and gang_id == "b" and now == 1000:
            return [preempted("a", by="b")]
        if call == "release" and gang_id == "a" and now == 1030:
            return [admitted("b", 0, 1)]
        if call == "submit" and gang_id == "a" and now == 1030:  # a comes back and takes its GPUs from b: a cycle
            return [preempted("b", by="a")]
        if call == "release" and gang_id == "b":
            return [admitted("a", 0, 1)]
        if call == "release" and gang_id == "a":
            return [admitted("b", 0, 1)]
        return []

    result = bs.simulate(workload, Scripted(answer), save_s=30)
    assert result["checks"]["no_preemption_cycle"] is False
    assert result["checks"]["all_finished"] is True


def test_a_scheduler_that_preempts_forever_is_stopped() -> None:
    workload = one_node(("a", 0, 5000, 2), ("b", 1000, 5000, 2))

    def answer(call: str, gang_id: str, now: float) -> list[Any]:
        other = "b" if gang_id == "a" else "a"
        if call == "submit" and (gang_id == "a" and now == 0):
            return [admitted("a", 0, 1)]
        if call == "submit":  # whoever asks takes the node from the other: ping-pong
            return [preempted(other, by=gang_id)]
        return [admitted(other, 0, 1)]  # a release: the other one gets the node

    result = bs.simulate(workload, Scripted(answer), save_s=30)
    assert result["finished"] is False
    assert result["checks"]["no_preemption_cycle"] is False and result["checks"]["all_finished"] is False
    assert any("stopped after" in v for v in result["violations"])


def test_a_deadline_that_a_tick_does_not_move_is_caught_and_the_trace_goes_on() -> None:
    class Stuck(Scripted):
        def next_deadline(self) -> float | None:
            return 5.0

    workload = one_node(("a", 0, 100, 1), ("b", 10, 100, 1))
    adapter = Stuck(lambda call, g, now: [admitted(g, 0 if g == "a" else 1)] if call == "submit" else [])
    result = bs.simulate(workload, adapter, 30)
    assert result["checks"]["deadlines_advance"] is False
    assert result["checks"]["all_finished"] is True


# -- bad input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--nodes", "0"), "--nodes must be at least 1, got 0"),
        (("--gangs", "-3"), "--gangs must be at least 1, got -3"),
        (("--gpus-per-node", "0"), "--gpus-per-node must be at least 1, got 0"),
        (("--load", "0"), "--load must be a finite number > 0, got 0.0"),
        (("--save-s", "nan"), "--save-s must be a finite number >= 0, got nan"),
        (("--fifo-budget-s", "-1"), "--fifo-budget-s must be a finite number >= 0, got -1.0"),
        (("--save-s", "200"), "--save-s (200) must not exceed --grace-s (120)"),
        (("--json", "--markdown"), "not allowed with argument"),
        (("--gang", "5"), "unrecognized arguments: --gang"),
    ],
)
def test_bad_flags_are_refused_before_anything_runs(args: tuple[str, ...], message: str) -> None:
    done = bench(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr and not done.stdout


def test_render_of_a_missing_file_says_so(tmp_path: Path) -> None:
    done = bench("--render", str(tmp_path / "nope.json"))
    assert done.returncode == 1
    assert "cannot read" in done.stderr and "Traceback" not in done.stderr


# -- GPU flavors (bench_fleet.py) ---------------------------------------------------------------------------
def test_a_flavored_run_counts_flavor_violations_and_the_policy_has_none() -> None:
    result = json_line(bench("--flavors", "h100:8,a100:12", *SMALL[2:], "--fifo-budget-s", "20", "--json", timeout=300))
    policy = result["policy"]
    assert policy["flavor_violations"] == 0, result["config"]["flavor_violation_examples"]
    assert all(policy["checks"].values()), policy["violations"]
    assert "flavor_violations" in result["fifo"]  # flavor-blind placement, counted the same way
    assert result["config"]["flavors"] == {"h100": 8, "a100": 12} and result["config"]["nodes"] == 20
    flavors = result["config"]["queue"]["flavors"]
    assert [f["name"] for f in flavors] == ["h100", "a100"]
    quota = result["config"]["queue"]["tenants"][0]["quota"]
    assert set(quota) == {"h100", "a100"}


@pytest.mark.parametrize("flag", ["h100", "h100:0", "h100:4,h100:2", ":3"])
def test_a_bad_flavors_flag_is_refused(flag: str) -> None:
    done = bench("--flavors", flag, "--json")
    assert done.returncode == 2 and "--flavors" in done.stderr, done.stderr


def test_without_flavors_the_queue_file_and_requests_are_as_before() -> None:
    assert bs.parse_args([]).flavors is None
    w = bs.generate_workload(20, 8, 50, 3, 0, 1.5)
    assert "flavors" not in bs.queue_config(w, grace_s=120, min_runtime_s=0)
