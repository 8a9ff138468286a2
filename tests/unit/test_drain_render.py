"""What ``gangflow cluster`` and ``gangflow node drain|undrain`` print for drained nodes and for gangs being
preempted, rendered from a real policy's ``describe()`` (no server: the view is plain JSON)."""

from __future__ import annotations

import pytest

from engine.cli.render_queues import show_drain, show_queue
from engine.scheduling import (
    GangRequest,
    GangSubmitted,
    NodeDrained,
    NodeRegistered,
    NodeSpec,
    Policy,
    load_queue_config,
)

TWO_TEAMS = """
cohorts: [{name: research}]
tenants:
  - {name: team-a, cohort: research, quota: {gpu: 2}}
  - {name: team-b, cohort: research, quota: {gpu: 2}}
"""


def submit(policy: Policy, gang_id: str, tenant: str, now: float, gpus: int = 1, nnodes: int = 1) -> None:
    request = GangRequest(gang_id=gang_id, nnodes=nnodes, gpus_per_node=gpus, tenant=tenant)
    policy.step(GangSubmitted(request=request), now)


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # one line per row: the assertions read whole cells


def test_queue_shows_drained_nodes_and_who_is_being_preempted_for_what(
    wide: None, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = Policy(load_queue_config(TWO_TEAMS), node_ttl_s=1e12)
    for node_id in ("a", "b"):
        policy.step(NodeRegistered(spec=NodeSpec(node_id=node_id, address=node_id, gpus=2, cpus=4)), 1000.0)
    for i in range(1, 5):
        submit(policy, f"a{i}", "team-a", 1000.0)  # a3 and a4 (node b) borrow team-b's quota
    submit(policy, "b1", "team-b", 2000.0)  # reclaims a4
    policy.step(NodeDrained(node_id="a", drained=True, reason="maintenance"), 2001.0)  # a1, a2
    submit(policy, "w", "team-b", 2002.0, gpus=2, nnodes=2)
    show_queue(policy.describe(), now=2013.0)
    out = capsys.readouterr().out
    assert "drained: maintenance" in out
    # node a holds a1 and a2 while they leave: none of its GPUs idle; b is up and full
    assert "drained: 0/2 idle" in out and "0/2 " in out
    assert out.count("preempting: drain of node a, 12 s of 120 s grace") == 2
    assert "preempting: reclaim by b1 of team-b, 13 s of 120 s grace" in out
    assert "a is drained (maintenance): waiting for an operator to undrain it" in out


def test_a_queue_from_an_older_scheduler_still_renders(wide: None, capsys: pytest.CaptureFixture[str]) -> None:
    node = {"node_id": "a", "address": "a", "alive": True, "gpus_free": 0, "gpus_total": 1, "free_gpu_ids": []}
    node |= {"cpus_free": 1.0, "cpus_total": 2.0, "gangs": ["g"]}
    gang = {"gang_id": "g", "tenant": "t", "priority": "p", "preempting": True, "nodes": []}
    show_queue({"nodes": [node], "running": [gang]})
    out = capsys.readouterr().out
    assert " up " in out and "preempting" in out


def test_drain_says_what_happens_to_each_gang(wide: None, capsys: pytest.CaptureFixture[str]) -> None:
    answer = {"node_id": "n1", "drained": True, "reason": "psu", "preempted": ["g1", "g2"], "remaining": ["k"]}
    show_drain({**answer, "leaving": ["g3"]})
    out = capsys.readouterr().out
    assert "node n1 drained (psu): it takes no new gangs" in out
    assert "preempted 2 gang(s): each gets its notice, saves a checkpoint and is placed elsewhere: g1, g2" in out
    assert "already leaving (preempted earlier): g3" in out
    assert "still running there, not preemptible (they run to their end): k" in out
    show_drain({"node_id": "n1", "drained": False, "reason": "", "preempted": [], "remaining": [], "leaving": []})
    assert "node n1 undrained: it takes new gangs again" in capsys.readouterr().out
