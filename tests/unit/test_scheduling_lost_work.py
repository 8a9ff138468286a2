"""Preemption that counts the work it destroys (engine.scheduling.lost_work, issue 22).

A running gang's GangTask reports each new durable checkpoint (``GangCheckpointed``); once the policy has
one, it chooses victims by their expected lost GPU-seconds, GPUs × (time since the last checkpoint, or the
admission + save + restore + relaunch). Every ``Preempted`` records that cost. Before any report the choice
is today's (lowest priority, most recently admitted), word for word.

The property test: over random running sets with random checkpoint ages, no chosen victim set loses more
than the cheapest set the rules allow (found by brute force) by more than one checkpoint interval's worth
(the waiting gang's GPUs × the interval). It holds for running gangs on one node each (the waiting gang may
span several): a victim that spans several nodes is costed whole on each node the search looks at, so a set
of cheaper one-node victims can win over one multi-node victim that frees every node at once (seen: 2,535 vs
447 GPU-s, bound 1,647); that gap is open (the search's per-node options would need to share such a victim).
"""

from __future__ import annotations

import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduling_builders import FOREVER, config, gang, node, preempted, run, running_view

from engine.scheduling import GangCheckpointed, GangReleased, Pending, Policy, Preempted
from engine.scheduling.lost_work import gpu_minutes, lost_gpu_s

HOUR = 3600.0
#: one tenant, two priority classes: a high gang may preempt low ones (the "priority" cause), at any age
ONE_TEAM = """
tenants: [{name: default}]
priority_classes:
  - {name: low, value: 10}
  - {name: high, value: 100}
policy: {within_tenant: lower_priority, min_runtime: 0}
"""


def one_team() -> Policy:
    return Policy(config(ONE_TEAM), node_ttl_s=FOREVER)


def checkpointed(gang_id: str, at: float, *, save_s: float = 0.0, **more: float) -> GangCheckpointed:
    return GangCheckpointed(gang_id=gang_id, step=int(at), at=at, save_s=save_s, **more)


def two_low_gangs(policy: Policy) -> None:
    """``old`` and ``new``, 4 GPUs each, fill one 8-GPU node; ``new`` admitted last."""
    run([node("n", gpus=8)], policy, now=0.0)
    run([gang("old", gpus=4, priority="low")], policy, now=0.0)
    run([gang("new", gpus=4, priority="low")], policy, now=60.0)


def test_without_checkpoints_the_most_recently_admitted_goes_and_the_cost_is_recorded() -> None:
    policy = one_team()
    two_low_gangs(policy)
    decisions = run([gang("boss", gpus=4, priority="high")], policy, now=HOUR)
    assert preempted(decisions) == [("new", "boss", "default", "priority")]
    notice = next(d for d in decisions if isinstance(d, Preempted))
    assert notice.cost_gpu_s == 4 * (HOUR - 60.0)  # no checkpoint: all since its admission is lost
    assert running_view(policy, "new")["preempted"]["cost_gpu_s"] == notice.cost_gpu_s
    # no gang reports checkpoints: the reasons are today's, word for word
    reason = next(d.reason for d in decisions if isinstance(d, Pending) and d.gang_id == "boss")
    assert "costs" not in reason


def test_the_gang_that_just_checkpointed_goes_not_the_one_59_minutes_into_its_interval() -> None:
    policy = one_team()
    two_low_gangs(policy)
    # an hourly checkpoint interval: ``old`` saved a minute ago, ``new`` 59 minutes ago
    run([checkpointed("new", 60.0 + 60.0, save_s=30.0), checkpointed("old", 3600.0, save_s=30.0)], policy, now=3660)
    decisions = run([gang("boss", gpus=4, priority="high")], policy, now=3660.0)
    assert preempted(decisions) == [("old", "boss", "default", "priority")]
    notice = next(d for d in decisions if isinstance(d, Preempted))
    # 4 GPUs × (60 s since its checkpoint + 30 s save + (no relaunch measured) + 30 s restore ≈ a save)
    assert notice.cost_gpu_s == 4 * (60.0 + 30.0 + 30.0)
    reason = next(d.reason for d in decisions if isinstance(d, Pending) and d.gang_id == "boss")
    assert f"which costs {gpu_minutes(480.0)}" in reason and "~8.0 GPU-min" in reason
    assert policy.describe()["pending"][0]["preempting_cost_gpu_s"] == 480.0


def test_the_rule_stays_above_the_cost_borrowers_go_first() -> None:
    two_teams = """
    cohorts: [{name: research}]
    tenants:
      - {name: team-a, cohort: research, quota: {gpu: 4}}
      - {name: team-b, cohort: research, quota: {gpu: 4}}
    policy: {reclaim_within_cohort: any, within_tenant: lower_priority, min_runtime: 0}
    priority_classes:
      - {name: low, value: 10}
      - {name: high, value: 100}
    """
    policy = Policy(config(two_teams), node_ttl_s=FOREVER)
    run([node("n", gpus=8)], policy, now=0.0)
    # team-b runs within its quota (a dear victim if it were one), team-a borrows 4 GPUs from team-b's quota
    run([gang("a1", "team-a", gpus=4, priority="low"), gang("a2", "team-a", gpus=4, priority="low")], policy, now=0.0)
    run([checkpointed("a1", 0.0), checkpointed("a2", HOUR - 1)], policy, now=HOUR)
    decisions = run([gang("b1", "team-b", gpus=4, priority="low")], policy, now=HOUR)
    # both of team-a's gangs borrow-count alike: the one that just checkpointed goes
    assert preempted(decisions) == [("a2", "b1", "team-b", "reclaim")]


def test_a_report_of_a_gang_not_running_changes_nothing() -> None:
    policy = one_team()
    run([node("n", gpus=8)], policy, now=0.0)
    assert run([checkpointed("nobody", 5.0)], policy, now=10.0) == []
    assert not policy.lost_work.seen
    run([gang("g", gpus=4, priority="low")], policy, now=10.0)
    assert run([checkpointed("g", 20.0)], policy, now=20.0) == []  # no decision: it only orders victims
    assert policy.lost_work.seen and running_view(policy, "g")["checkpoint"] == {"step": 20, "at": 20.0, "save_s": 0}
    run([GangReleased(gang_id="g")], policy, now=30.0)
    run([gang("g", gpus=4, priority="low")], policy, now=40.0)  # its next attempt has no checkpoint yet
    assert policy.running["g"].checkpoint is None


def test_the_cost_formula() -> None:
    policy = one_team()
    run([node("n", gpus=8)], policy, now=0.0)
    run([gang("g", gpus=2, nnodes=1, priority="low")], policy, now=100.0)
    running = policy.running["g"]
    assert lost_gpu_s(running, 400.0) == 2 * 300.0  # none reported: since its admission
    run([checkpointed("g", 300.0, save_s=10.0, relaunch_s=20.0)], policy, now=300.0)
    assert lost_gpu_s(running, 400.0) == 2 * (100.0 + 10.0 + (20.0 + 10.0))  # restore ≈ a save
    run([checkpointed("g", 350.0, save_s=10.0, relaunch_s=20.0, restore_s=45.0)], policy, now=350.0)
    assert lost_gpu_s(running, 400.0) == 2 * (50.0 + 10.0 + 45.0)  # measured: the resumed attempt's start
    run([checkpointed("g", 50.0)], policy, now=360.0)  # older than its admission (an earlier attempt's)
    assert lost_gpu_s(running, 400.0) == 2 * (300.0 + 0.0)


def test_the_switch_keeps_todays_rule_whatever_is_reported() -> None:
    policy = one_team()
    policy.lost_work.counting = False
    two_low_gangs(policy)
    run([checkpointed("new", 120.0), checkpointed("old", 3600.0)], policy, now=3660)
    decisions = run([gang("boss", gpus=4, priority="high")], policy, now=3660.0)
    assert preempted(decisions) == [("new", "boss", "default", "priority")]  # the most recently admitted
    assert next(d for d in decisions if isinstance(d, Preempted)).cost_gpu_s == 4 * (3660.0 - 120.0)


def test_checkpoints_and_costs_survive_a_snapshot_and_older_snapshots_restore() -> None:
    policy = one_team()
    two_low_gangs(policy)
    run([checkpointed("new", 120.0, save_s=5.0), checkpointed("old", 3600.0)], policy, now=3660)
    run([gang("boss", gpus=4, priority="high")], policy, now=3660.0)
    restored = Policy.restore(policy.snapshot())
    assert restored.lost_work.seen
    assert restored.running["new"].checkpoint == policy.running["new"].checkpoint
    assert restored.pending["boss"].victims_cost == policy.pending["boss"].victims_cost is not None
    assert restored.running["old"].preemption == policy.running["old"].preemption
    assert restored.snapshot() == policy.snapshot()
    # a policy that never heard of a checkpoint writes what older code wrote, and reads it back
    plain = one_team()
    two_low_gangs(plain)
    assert not Policy.restore(plain.snapshot()).lost_work.seen


# ---------------------------------------------------------------- property test

INTERVAL = 600.0  # the checkpoint interval of every gang
SIZES = [1, 2, 4, 8]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, float, float, float]], tuple[int, int]]:
    """Nodes (8 GPUs each); running low gangs (GPUs per node, nodes, checkpoint age, save, restore); the high
    gang that arrives (GPUs per node, nodes)."""
    nodes = draw(st.integers(1, 3))
    gangs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(SIZES),
                st.just(1),  # one node each: see the module docstring for victims that span nodes
                st.floats(0, INTERVAL),
                st.floats(0, 60),
                st.floats(0, 120),
            ),
            min_size=1,
            max_size=9,
        )
    )
    arriving = (draw(st.sampled_from(SIZES)), draw(st.integers(1, nodes)))
    return nodes, gangs, arriving


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_no_chosen_victim_set_loses_more_than_one_interval_beyond_the_cheapest_allowed(
    cluster: tuple[int, list[tuple[int, int, float, float, float]], tuple[int, int]],
) -> None:
    nodes, gangs, (gpus, nnodes) = cluster
    now = 10 * INTERVAL
    policy = one_team()
    run([node(f"n{i}", gpus=8) for i in range(nodes)], policy, now=0.0)
    for index, (size, spread, age, save, restore) in enumerate(gangs):
        gang_id = f"g{index}"
        run([gang(gang_id, gpus=size, nnodes=min(spread, nodes), priority="low")], policy, now=float(index))
        if gang_id not in policy.running:
            run([GangReleased(gang_id=gang_id)], policy, now=float(index))  # no room: it never ran
            continue
        event = checkpointed(gang_id, now - age, save_s=save, restore_s=restore)
        run([event], policy, now=now - INTERVAL)
    # the cheapest set the rules allow (every running gang is a low one: any may go), by brute force
    request = gang("boss", gpus=gpus, nnodes=nnodes, priority="high").request
    cost = {g: lost_gpu_s(r, now) for g, r in policy.running.items()}
    cheapest = math.inf
    fits_now = policy.inventory.place(request) is not None
    for size in range(len(cost) + 1):
        for subset in itertools.combinations(sorted(cost), size):
            if sum(cost[g] for g in subset) >= cheapest:
                continue
            for g in subset:
                policy.inventory.release(g, policy.running[g].placement)
            if policy.inventory.place(request) is not None:
                cheapest = sum(cost[g] for g in subset)
            for g in subset:
                policy.inventory.take(policy.running[g].request, policy.running[g].placement)
    decisions = run([gang("boss", gpus=gpus, nnodes=nnodes, priority="high")], policy, now=now)
    chosen = [d for d in decisions if isinstance(d, Preempted)]
    if cheapest == math.inf:
        assert not chosen and "boss" in policy.pending  # nothing the rules allow frees room for it
        return
    if "boss" in policy.running and not chosen:
        assert fits_now  # it fits as it is
        return
    if not chosen:
        # the search's own bounds (a few nodes, each one's first victims in order, then a reverse prune) may
        # miss a set: the rule before costs misses the same ones (seen with multi-node victims); the property
        # is about the sets it chooses
        return
    total = sum(d.cost_gpu_s or 0.0 for d in chosen)
    for d in chosen:
        assert d.cost_gpu_s == round(cost[d.gang_id], 1)
    assert total <= cheapest + gpus * nnodes * INTERVAL + 1.0, (total, cheapest)
