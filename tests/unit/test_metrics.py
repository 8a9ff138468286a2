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
from conftest import gangflow_cli
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
        return got[(f"gangflow_tenant_{metric}", (("cohort", "research"), ("resource", resource), ("tenant", name)))]

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
    mem = ("gangflow_tenant_nominal_quota", (("cohort", "research"), ("resource", "mem"), ("tenant", "team-a")))
    assert mem not in got


def test_nodes_gpus_allocation_liveness_and_drain() -> None:
    policy = Policy(config(TWO_TEAMS))
    run([node("n1", gpus=4), node("n2", gpus=2), gang("a1", "team-a", gpus=3)], policy)
    got = exposed(policy)
    gpus = {n: got[("gangflow_node_gpus", (("node", n),))] for n in ("n1", "n2")}
    used = {n: got[("gangflow_node_allocated_gpus", (("node", n),))] for n in ("n1", "n2")}
    assert gpus == {"n1": 4, "n2": 2} and used == {"n1": 3, "n2": 0}
    assert got[("gangflow_node_alive", (("node", "n1"),))] == 1
    assert got[("gangflow_node_drained", (("node", "n2"),))] == 0


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
    bad = gangflow_cli(command, *extra, *address, "--metrics-port", "70000", timeout=60)
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
    used = {name for expr in exprs for name in re.findall(r"\bgangflow_[a-z_]+\b", expr)}
    exported = _exported_names()
    assert used and used <= exported, f"the dashboard graphs what nothing exports: {sorted(used - exported)}"
    # each panel says where its numbers come from, and every exported family is on the dashboard somewhere
    assert not exported - used, f"exported but on no panel: {sorted(exported - used)}"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
