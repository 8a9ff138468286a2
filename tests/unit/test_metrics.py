"""The Prometheus families gangflow serves (engine.runtime.metrics): what the Scheduler's views become, read
back through ``prometheus_client``'s own exposition and parser, as a Prometheus server would read them; and
``--metrics-port`` refused before anything starts. The live scrape is tests/test_cli_stack.py's."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from conftest import gangflow_cli, gangflow_main
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
from scheduling_builders import TWO_TEAMS, config, gang, node, run

from engine.runtime.metrics import MetricsEndpoint, scheduler_families
from engine.scheduling import Policy


class _Static(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families

    def describe(self) -> Iterable[Metric]:
        return []


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exposed(policy: Policy) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static(scheduler_families(policy.queues(), policy.describe())))
    return samples(generate_latest(registry).decode())


def test_tenant_quota_usage_borrowing_and_pending_gangs_as_kueue_names_them() -> None:
    policy = Policy(config(TWO_TEAMS))
    run([node("n1"), node("n2")], policy)
    run([gang("a1", "team-a", gpus=2), gang("a2", "team-a", gpus=2), gang("a3", "team-a", gpus=1)], policy)
    got = exposed(policy)

    def tenant(metric: str, name: str, resource: str = "gpu") -> float:
        labels = (("cohort", "research"), ("flavor", ""), ("resource", resource), ("tenant", name))
        return got[(f"gangflow_tenant_{metric}", labels)]

    # team-a holds its 2 GPUs and borrowed team-b's idle 2; its third gang waits (the cohort has none left)
    assert tenant("nominal_quota", "team-a") == 2 and tenant("resource_usage", "team-a") == 4
    assert tenant("borrowed_resources", "team-a") == 2 and tenant("lent_resources", "team-b") == 2
    assert tenant("resource_usage", "team-a", "cpu") == 2  # a gang asks 1 CPU by default
    assert got[("gangflow_pending_gangs", (("tenant", "team-a"),))] == 1
    assert got[("gangflow_pending_gangs", (("tenant", "team-b"),))] == 0
    assert got[("gangflow_admitted_active_gangs", (("tenant", "team-a"),))] == 2
    assert got[("gangflow_preempting_gangs", (("tenant", "team-a"),))] == 0
    assert got[("gangflow_tenant_fair_share", (("tenant", "team-a"),))] > 0
    # a quota the file leaves unlimited (memory) is absent, never a made-up 0
    labels = (("cohort", "research"), ("flavor", ""), ("resource", "mem"), ("tenant", "team-a"))
    mem = ("gangflow_tenant_nominal_quota", labels)
    assert mem not in got


def test_a_tenant_whose_quota_names_flavors_has_a_sample_per_flavor() -> None:
    """As Kueue labels its quota families: per flavor where the queue file names them (examples/fleet.yaml: team-a
    has 4 h100 and 2 a100), adding up to the tenant's whole."""
    from conftest import ROOT

    policy = Policy(config((ROOT / "examples" / "fleet.yaml").read_text()))
    got = exposed(policy)
    nominal = {
        dict(labels)["flavor"]: value
        for (name, labels), value in got.items()
        if name == "gangflow_tenant_nominal_quota" and ("tenant", "team-a") in labels and ("resource", "gpu") in labels
    }
    assert nominal == {"h100": 4, "a100": 2}


def test_nodes_gpus_allocation_liveness_and_drain() -> None:
    policy = Policy(config(TWO_TEAMS))
    run([node("n1", gpus=4), node("n2", gpus=2), gang("a1", "team-a", gpus=3)], policy)
    got = exposed(policy)
    gpus = {n: got[("gangflow_node_gpus", (("node", n),))] for n in ("n1", "n2")}
    used = {n: got[("gangflow_node_allocated_gpus", (("node", n),))] for n in ("n1", "n2")}
    assert gpus == {"n1": 4, "n2": 2} and used == {"n1": 3, "n2": 0}
    assert got[("gangflow_node_alive", (("node", "n1"),))] == 1
    assert got[("gangflow_node_drained", (("node", "n2"),))] == 0


def test_admissions_and_preemptions_by_cause_count_up_across_a_continue_as_new() -> None:
    policy = Policy(config(TWO_TEAMS))
    # team-a borrows team-b's idle GPUs; team-b then reclaims them: one of team-a's gangs is preempted
    run([node("n1"), node("n2"), gang("a1", "team-a", gpus=2), gang("a2", "team-a", gpus=2)], policy)
    run([gang("b1", "team-b", gpus=2)], policy)
    restored = Policy.restore(policy.snapshot())  # what the next run of the Scheduler starts from
    for each in (policy, restored):
        got = exposed(each)
        assert got[("gangflow_admitted_gangs_total", (("tenant", "team-a"),))] == 2
        assert got[("gangflow_preempted_gangs_total", (("cause", "reclaim"), ("tenant", "team-a")))] == 1
        # what it was expected to lose (no clock here: nothing ran long enough to lose anything)
        assert got[("gangflow_preemption_cost_gpu_seconds_total", (("cause", "reclaim"), ("tenant", "team-a")))] == 0
    assert restored.counters.rows() == policy.counters.rows()


def test_attempt_ledgers_add_up_per_tenant_flavor_and_cause_and_give_the_goodput_ratio() -> None:
    """What GangTasks tell the Scheduler of their ended attempts (LEDGER_SIGNAL) is exposed as GPU-seconds by
    cause and a goodput ratio per tenant, across a continue-as-new; a malformed ledger counts nothing."""
    policy = Policy(config(TWO_TEAMS))

    def told(tenant: str, flavor: str | None, productive: float, **badput: float) -> dict[str, Any]:
        return {"tenant": tenant, "flavor": flavor, "productive_gpu_s": productive, "badput": badput}

    assert policy.counters.ledger(told("team-a", "h100", 80.0, launch=10.0, lost_preemption=10.0))
    assert policy.counters.ledger(told("team-a", None, 30.0, restore=10.0))
    assert policy.counters.ledger(told("team-b", None, 0.0, idle=5.0))
    for bad in (
        None,
        "ledger",
        told("", None, 1.0),  # no tenant
        told("team-a", None, -1.0),  # a negative figure
        told("team-a", None, float("inf")),
        told("team-a", None, 1.0, coffee=3.0),  # a cause the ledger does not have
        told("team-a", None, True),  # type: ignore[arg-type]
        {"tenant": "team-a", "flavor": 3, "productive_gpu_s": 1.0, "badput": {}},
    ):
        assert not policy.counters.ledger(bad), bad
    restored = Policy.restore(policy.snapshot())
    for each in (policy, restored):
        got = exposed(each)
        spent = {k[1]: v for k, v in got.items() if k[0] == "gangflow_gpu_seconds_total"}
        assert spent[(("cause", "productive"), ("flavor", "h100"), ("tenant", "team-a"))] == 80
        assert spent[(("cause", "lost_preemption"), ("flavor", "h100"), ("tenant", "team-a"))] == 10
        assert spent[(("cause", "restore"), ("flavor", ""), ("tenant", "team-a"))] == 10
        assert sum(v for k, v in spent.items() if ("tenant", "team-a") in k) == 140
        assert got[("gangflow_goodput_ratio", (("tenant", "team-a"),))] == pytest.approx(110 / 140)
        assert got[("gangflow_goodput_ratio", (("tenant", "team-b"),))] == 0
    assert restored.counters.rows() == policy.counters.rows()
    assert "gpu_seconds" not in Policy().counters.rows()  # a snapshot without ledgers is what it was before


def test_an_empty_scheduler_exposes_valid_text() -> None:
    got = exposed(Policy())
    assert got[("gangflow_pending_gangs", (("tenant", "default"),))] == 0
    assert not [k for k in got if k[0].startswith("gangflow_node_")]


def test_the_endpoint_serves_its_sources_and_says_when_the_scheduler_does_not_answer() -> None:
    async def scrape() -> str:
        async def failing() -> list[Metric]:
            from engine.runtime.metrics import scheduler_source

            class Down:
                def get_workflow_handle(self, _id: str) -> Any:
                    raise RuntimeError("no Temporal here")

            return await scheduler_source(Down())()  # type: ignore[arg-type]

        endpoint = MetricsEndpoint(0, "127.0.0.1")
        endpoint.sources.append(failing)
        try:
            url = f"http://127.0.0.1:{endpoint.port}/metrics"
            return (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())).decode()
        finally:
            endpoint.stop()

    got = samples(asyncio.run(scrape()))
    assert got == {("gangflow_scheduler_up", ()): 0.0}


@pytest.mark.parametrize("command", ["worker", "node"])
def test_a_bad_or_taken_metrics_port_is_refused_before_anything_starts(command: str) -> None:
    extra = ["--node-id", "n1"] if command == "node" else []
    # nothing listens at this address: a command that got past the check would say it cannot reach Temporal
    address = ["--address", "127.0.0.1:1"]
    bad = gangflow_main(command, *extra, *address, "--metrics-port", "70000")  # in this process: parsing only
    assert bad.returncode == 2 and "--metrics-port must be a port between 1 and 65535, got 70000" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = gangflow_cli(command, *extra, *address, "--metrics-port", str(port), timeout=60)
    assert busy.returncode == 2 and f"--metrics-port {port}: cannot listen on 0.0.0.0" in busy.stderr, busy.stderr


def _exported_names() -> set[str]:
    """Every family name gangflow's own sources can export (a cluster with a node and a running gang, so that
    none is left out for being empty), as Prometheus stores them."""
    from types import SimpleNamespace

    from engine.runtime.metrics import node_source

    policy = Policy(config(TWO_TEAMS))
    run([node("n1"), gang("a1", "team-a")], policy)
    families = scheduler_families(policy.queues(), policy.describe())
    agent = SimpleNamespace(
        config=SimpleNamespace(node_id="n1", gpus=2), running=set(), lease=SimpleNamespace(held=True), cgroups=None
    )
    families += asyncio.run(node_source(agent)())  # type: ignore[arg-type]
    return {f.name for f in families} | {"gangflow_scheduler_up"}


def test_the_grafana_dashboard_graphs_only_metrics_gangflow_exports() -> None:
    import json
    import re

    from conftest import ROOT

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "gangflow-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    # a counter's samples are its family's name with _total, a histogram's with _bucket, _sum and _count
    found = {n for expr in exprs for n in re.findall(r"\bgangflow_[a-z_]+\b", expr)}
    used = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in found}
    exported = _exported_names()
    assert used and used <= exported, f"the dashboard graphs what nothing exports: {sorted(used - exported)}"
    # each panel says where its numbers come from, and every exported family is on the dashboard somewhere
    assert not exported - used, f"exported but on no panel: {sorted(exported - used)}"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def _snapshot_from_before_waits_and_restarts(policy: Policy) -> dict[str, Any]:
    """``policy``'s snapshot as a Scheduler from before the admission waits and restarts wrote it: no wait at
    the end of the pending rows, only admissions and preemptions among the counters."""
    import base64
    import json
    import zlib

    data = json.loads(zlib.decompress(base64.b64decode(policy.snapshot()["zlib"])))
    data["pending"] = [row[:9] for row in data["pending"]]
    data["counters"] = {k: data["counters"][k] for k in ("admitted", "preempted")}
    blob = zlib.compress(json.dumps(data).encode())
    return {"v": 1, "zlib": base64.b64encode(blob).decode("ascii")}


def test_admission_wait_is_a_histogram_per_tenant_that_survives_a_continue_as_new() -> None:
    from scheduling_builders import FOREVER

    from engine.scheduling import GangReleased

    policy = Policy(node_ttl_s=FOREVER)
    run([node("n1", gpus=2), gang("g1", gpus=2)], policy, now=0.0)  # admitted at once: a wait of 0 s
    run([gang("g2", gpus=2)], policy, now=10.0)  # waits for g1's GPUs
    restored = Policy.restore(policy.snapshot())  # mid-wait: the next Scheduler run knows when g2 came
    older = Policy.restore(_snapshot_from_before_waits_and_restarts(policy))
    for each in (policy, restored, older):
        run([GangReleased(gang_id="g1")], each, now=100.0)
        assert "g2" in each.running
    buckets = "gangflow_admission_wait_seconds_bucket"
    for each in (policy, restored):
        got = exposed(each)
        assert got[(buckets, (("le", "1.0"), ("tenant", "default")))] == 1  # g1
        assert got[(buckets, (("le", "60.0"), ("tenant", "default")))] == 1
        assert got[(buckets, (("le", "120.0"), ("tenant", "default")))] == 2  # g2: 90 s
        assert got[(buckets, (("le", "+Inf"), ("tenant", "default")))] == 2
        assert got[("gangflow_admission_wait_seconds_count", (("tenant", "default"),))] == 2
        assert got[("gangflow_admission_wait_seconds_sum", (("tenant", "default"),))] == 90.0
    assert restored.counters.rows() == policy.counters.rows()
    # a snapshot from before the waits restores: its counters go on, the wait it did not record is not made up
    got = exposed(older)
    assert got[("gangflow_admitted_gangs_total", (("tenant", "default"),))] == 2
    assert ("gangflow_admission_wait_seconds_count", (("tenant", "default"),)) not in got


def test_gang_restarts_by_cause_count_the_attempts_that_came_back() -> None:
    from scheduling_builders import comes_back, drain, nodes_of

    from engine.scheduling import GangReleased, NodeLost

    policy = Policy()
    run([node("n1"), node("n2"), gang("g1", gpus=2), gang("g2", gpus=2)], policy)
    (x,), (y,) = nodes_of(policy, "g1"), nodes_of(policy, "g2")
    # g1's GangTask reports its node lost, releases and asks again: node_lost
    run([NodeLost(node_id=x)], policy)
    comes_back(policy, "g1")
    # a drain preempts g2, which comes back: drain
    run([drain(y)], policy)
    comes_back(policy, "g2")
    # the lost node registers again and takes g2 (back at its old place in the order, ahead of g1); a rank fails
    # (its nodes alive) and g2 asks again: rank_failure
    run([node(x)], policy)
    assert list(policy.running) == ["g2"]
    comes_back(policy, "g2")
    # the gang running then (g1, ahead of g2's new attempt) completes: released, never submitted again, no
    # restart (its cause waits, across a continue-as-new)
    (done,) = policy.running
    run([GangReleased(gang_id=done)], policy)
    # team-b reclaims what team-a borrowed: the preempted gang comes back: preemption
    teams = Policy(config(TWO_TEAMS))
    run([node("n1"), node("n2"), gang("a1", "team-a", gpus=2), gang("a2", "team-a", gpus=2)], teams)
    run([gang("b1", "team-b", gpus=2)], teams)
    victim = next(g for g, r in teams.running.items() if r.preemption is not None)
    comes_back(teams, victim)
    for each, expected in (
        (policy, {("default", "node_lost"): 1, ("default", "drain"): 1, ("default", "rank_failure"): 1}),
        (teams, {("team-a", "preemption"): 1}),
    ):
        restored = Policy.restore(each.snapshot())
        for one in (each, restored):
            got = exposed(one)
            restarts = {
                (dict(labels)["tenant"], dict(labels)["cause"]): value
                for (name, labels), value in got.items()
                if name == "gangflow_gang_restarts_total"
            }
            assert restarts == expected
    assert done in Policy.restore(policy.snapshot()).counters.ended
