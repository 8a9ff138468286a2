"""Lent capacity is always reclaimable: only preemptible gangs borrow, a lender waiting goes first, the
priority classes a tenant may name, the cap on a tenant's pending gangs, and the bound on a lender's wait
(a property test in simulated time).

Plain Python: ``Policy.step`` driven directly (``engine.scheduling.policy``'s docstring has the rules). The
attacks themselves, as a tenant would try them, are in tests/security/test_quotas.py.
"""

from __future__ import annotations

import base64
import heapq
import json
import textwrap
import zlib
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling_builders import (
    FOREVER,
    TWO_TEAMS,
    admitted,
    comes_back,
    config,
    drain,
    gang,
    node,
    only,
    preempted,
    run,
)

from engine.scheduling import (
    Admitted,
    ConfigApplied,
    Event,
    GangRejected,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeRegistered,
    NodeSpec,
    Pending,
    Policy,
    Preempted,
    Tick,
    load_queue_config,
)

CLUSTER = [node("a"), node("b")]  # 4 GPUs, team-a's and team-b's quotas together
CLASSES = """
priority_classes:
  - {name: low, value: 10}
  - {name: high, value: 100, preemptible: false}
  - {name: top, value: 1000}
"""


# ---------------------------------------------------------------- only preemptible gangs borrow


def test_a_protected_gang_is_admitted_within_nominal_even_when_preemptible_gangs_of_its_tenant_borrow() -> None:
    policy = Policy(config(TWO_TEAMS + CLASSES + "policy: {within_tenant: never}\n"))
    # team-a's protected gangs hold none of its quota: a protected gang may start although team-a borrows,
    # because what team-a holds above its quota is then held by its preemptible gangs
    assert admitted(run([*CLUSTER, gang("p1", "team-a"), gang("p2", "team-a"), gang("p3", "team-a")], policy)) == [
        "p1",
        "p2",
        "p3",
    ]
    assert admitted(policy.step(gang("h1", "team-a", priority="high"))) == ["h1"]
    decisions = policy.step(gang("h2", "team-a", priority="high"))  # 2 protected GPUs: its quota
    assert admitted(decisions) == []  # no GPU idle
    # node a holds p1 and p2, node b p3 and h1: team-b's 2-GPU gang takes node a back; h1 is never a victim
    decisions = policy.step(gang("b1", "team-b", gpus=2))
    assert sorted(v for v, *_ in preempted(decisions)) == ["p1", "p2"]


def test_a_protected_gang_bigger_than_the_nominal_quota_is_rejected_at_once() -> None:
    policy = Policy(config(TWO_TEAMS + CLASSES))
    decisions = run([*CLUSTER, gang("big", "team-a", gpus=2, nnodes=2, preemptible=False)], policy)
    assert only(decisions, GangRejected, "big") == (
        "rejected: needs 4 GPUs on 2 nodes (2 GPUs, 1 CPU per node), more than the nominal quota of tenant team-a "
        "(2 GPUs), and the gang is not preemptible: only preemptible gangs may borrow beyond the nominal quota "
        "(make it preemptible, or ask for a bigger quota)"
    )
    assert only(policy.step(gang("cls", "team-a", gpus=3, priority="high")), GangRejected, "cls").startswith(
        "rejected: needs 3 GPUs"
    )


def test_a_protected_gang_waits_for_its_tenants_protected_gangs_and_says_so() -> None:
    policy = Policy(config(TWO_TEAMS + CLASSES))
    run([*CLUSTER, gang("h1", "team-a", gpus=2, priority="high")], policy)
    decisions = policy.step(gang("h2", "team-a", priority="high"))
    assert only(decisions, Pending, "h2") == (
        "pending: team-a's gangs that are not preemptible hold 2 GPUs of its quota of 2 GPUs, and this one is not "
        "preemptible either: only preemptible gangs may borrow beyond the nominal quota, so it waits for them to "
        "finish; needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    # a bigger preemptible gang of team-a still borrows: the protected one's refusal does not stop it
    assert admitted(policy.step(gang("p", "team-a", gpus=2))) == ["p"]
    assert admitted(policy.step(GangReleased(gang_id="h1"))) == ["h2"]


# ---------------------------------------------------------------- a lender waiting goes first


def test_a_lender_waiting_gets_what_its_reclaim_frees_and_no_new_borrower_takes_it() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {min_runtime: 0, preemption_grace: 30s}\n"), node_ttl_s=FOREVER)
    run([*CLUSTER, *(gang(f"a{i}", "team-a", gpus=1) for i in range(1, 5))], policy, now=0.0)
    decisions = policy.step(gang("b1", "team-b", gpus=2), now=1.0)
    assert sorted(v for v, *_ in preempted(decisions)) == ["a3", "a4"]
    # team-a submits more while its gangs leave: the GPU a3 frees is team-b's, not a new loan
    run([gang("a5", "team-a"), gang("a6", "team-a")], policy, now=2.0)
    decisions = comes_back(policy, "a3", now=3.0)
    assert admitted(decisions) == []
    # b1 holds what its victims free for the rest of the cycle (preemption.hold): nothing of the cohort is idle
    assert policy.pending["a5"].reason == (
        "pending: team-a is at its quota of 2 GPUs and cannot borrow: cohort research has 0 GPUs idle; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    assert admitted(comes_back(policy, "a4", now=4.0)) == ["b1"]
    # the lender got its quota: team-a borrows again only what is idle (nothing now)
    assert admitted(policy.step(GangReleased(gang_id="a1"), now=5.0)) == ["a3"]


def test_a_gang_within_its_quota_goes_before_a_borrower_of_any_priority() -> None:
    # Kueue's order: within nominal quota first, then priority; a priority class does not buy lent capacity
    policy = Policy(config(TWO_TEAMS + CLASSES))
    run([*CLUSTER, gang("a1", "team-a"), gang("a2", "team-a"), gang("b1", "team-b"), gang("b-tmp", "team-b")], policy)
    run([gang("a3", "team-a", priority="top"), gang("b2", "team-b", priority="low")], policy)
    # b-tmp leaves: its GPU is team-b's own quota; a3 of a far higher class would borrow it
    assert admitted(policy.step(GangReleased(gang_id="b-tmp"))) == ["b2"]


def test_within_a_tenant_priority_still_comes_first() -> None:
    policy = Policy(config(TWO_TEAMS + CLASSES))
    run([*CLUSTER, gang("a1", "team-a"), gang("b1", "team-b", gpus=2), gang("b2", "team-b")], policy)
    # team-a: a big top gang that would borrow and a small low one within its quota; the top one ranks first
    run([gang("top", "team-a", gpus=2, priority="top"), gang("small", "team-a", priority="low")], policy)
    assert [p["gang_id"] for p in policy.describe()["pending"]] == ["top", "small"]


def test_a_lender_that_waits_for_drained_nodes_no_longer_holds_borrowers_back() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {min_runtime: 60s}\n"), node_ttl_s=FOREVER)
    run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy, now=0.0)
    policy.step(gang("b1", "team-b", gpus=2), now=10.0)  # its victims are too young: it waits for its quota
    assert policy.lenders.by_root == {"research": {"b1"}}
    run([drain("a"), drain("b")], policy, now=20.0)  # now it waits for an operator, not for what team-b lent
    assert policy.lenders.by_root == {}


# ---------------------------------------------------------------- priority classes per tenant


RESTRICTED = TWO_TEAMS.replace(
    "quota: {gpu: 2}}\n  - {name: team-b", "quota: {gpu: 2}, priority_classes: [low]}\n  - {name: team-b"
)


def test_a_class_the_tenant_may_not_use_is_rejected_naming_the_ones_it_may() -> None:
    policy = Policy(config(RESTRICTED + CLASSES))
    decisions = run([*CLUSTER, gang("h", "team-a", priority="high"), gang("t", "team-a", priority="top")], policy)
    assert only(decisions, GangRejected, "h") == (
        "rejected: tenant team-a may not use priority class 'high' (its priority classes: low)"
    )
    assert "'top'" in only(decisions, GangRejected, "t")
    assert admitted(run([gang("l", "team-a", priority="low"), gang("d", "team-a")], policy)) == ["l", "d"]
    assert admitted(policy.step(gang("bh", "team-b", priority="high"))) == ["bh"]  # team-b: every class


def test_a_config_change_rejects_pending_gangs_of_a_class_no_longer_allowed_and_keeps_running_ones() -> None:
    policy = Policy(config(TWO_TEAMS + CLASSES))
    run([node("a"), gang("r1", "team-a", priority="top"), gang("r2", "team-a", priority="top")], policy)
    run([gang("w", "team-a", priority="top")], policy)  # node a's 2 GPUs are taken: it waits
    decisions = policy.step(ConfigApplied(config=config(RESTRICTED + CLASSES)))
    assert sorted(d.gang_id for d in decisions if isinstance(d, GangRejected)) == ["w"]
    assert {"r1", "r2"} <= set(policy.running)
    empty = RESTRICTED.replace("priority_classes: [low]", "priority_classes: []")
    decisions = Policy(config(empty + CLASSES)).step(gang("l", "team-a", priority="low"))
    assert only(decisions, GangRejected, "l").endswith(
        "(its priority classes: none; a gang that names no class gets the default)"
    )


# ---------------------------------------------------------------- max_pending


def test_a_gang_beyond_the_tenants_max_pending_is_rejected_naming_the_cap() -> None:
    text = TWO_TEAMS.replace("{name: team-b,", "{name: team-b, max_pending: 1,") + "policy: {max_pending: 2}\n"
    policy = Policy(config(text))
    run([node("a"), gang("hog", "team-b", gpus=2)], policy)  # the only node is full: the next gangs wait
    decisions = run([gang(f"a{i}", "team-a") for i in range(1, 4)], policy)
    assert only(decisions, GangRejected, "a3") == (
        "rejected: tenant team-a already has 2 gangs waiting, its cap (policy.max_pending); submit it again once "
        "some have started, or raise the cap in the queue configuration"
    )
    decisions = run([gang("b1", "team-b"), gang("b2", "team-b")], policy)
    assert "its cap (the max_pending of tenant team-b)" in only(decisions, GangRejected, "b2")
    # a withdrawn gang frees its place
    assert not [
        d for d in run([GangReleased(gang_id="a1"), gang("a4", "team-a")], policy) if isinstance(d, GangRejected)
    ]


def test_a_preempted_gang_coming_back_is_never_refused_for_max_pending() -> None:
    text = TWO_TEAMS + "policy: {max_pending: 1}\n"
    policy = Policy(config(text))
    run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy)
    victims = [v for v, *_ in preempted(policy.step(gang("b1", "team-b", gpus=2)))]
    policy.step(gang("a5", "team-a"))  # team-a's one pending gang
    for victim in victims:
        assert not [d for d in comes_back(policy, victim) if isinstance(d, GangRejected)]
    assert {"a5", *victims} <= set(policy.pending)


def test_a_lowered_cap_keeps_the_gangs_already_waiting() -> None:
    policy = Policy(config(TWO_TEAMS))
    run([node("a"), gang("hog", "team-b", gpus=2), *(gang(f"a{i}", "team-a") for i in range(1, 4))], policy)
    decisions = policy.step(ConfigApplied(config=config(TWO_TEAMS + "policy: {max_pending: 1}\n")))
    assert not [d for d in decisions if isinstance(d, GangRejected)] and len(policy.pending) == 3
    assert isinstance(policy.step(gang("a4", "team-a"))[0], GangRejected)


# ---------------------------------------------------------------- snapshots across continue-as-new


def _rewrite(snapshot: dict[str, Any], change: Any) -> dict[str, Any]:
    data = json.loads(zlib.decompress(base64.b64decode(snapshot["zlib"])))
    change(data)
    blob = zlib.compress(json.dumps(data).encode())
    return {"v": snapshot["v"], "zlib": base64.b64encode(blob).decode("ascii")}


def test_a_snapshot_carries_the_lenders_waiting_and_an_older_one_without_them_still_restores() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {min_runtime: 60s}\n"), node_ttl_s=FOREVER)
    run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy, now=0.0)
    policy.step(gang("b1", "team-b", gpus=2), now=10.0)  # a lender waiting for its victims to come of age
    restored = Policy.restore(json.loads(json.dumps(policy.snapshot())))
    assert restored.lenders.by_root == policy.lenders.by_root == {"research": {"b1"}}
    for event, now in ((gang("a5", "team-a"), 20.0), (GangReleased(gang_id="a1"), 30.0), (Tick(), 60.0)):
        assert restored.step(event, now) == policy.step(event, now)

    def older(data: dict[str, Any]) -> None:  # a snapshot of before this change: no lenders, no new keys
        del data["lenders"]
        data["config"]["policy"].pop("max_pending")

    old = Policy.restore(_rewrite(Policy(config(TWO_TEAMS)).snapshot(), older))
    assert old.lenders.by_root == {} and old.config.policy.max_pending == 1000
    assert old.config.tenant("team-a") is not None and old.config.allows("team-a", None)


# ---------------------------------------------------------------- the bound, in simulated time


@dataclass
class _Sim:
    """A cluster in simulated time: gangs run their duration, preempted gangs release within the grace and
    come back at once (their GangRun asks again), and the Scheduler ticks at ``next_deadline()``."""

    policy: Policy
    grace: float
    durations: dict[str, float] = field(default_factory=dict)
    exits: dict[str, float] = field(default_factory=dict)  # gang -> the fraction of the grace it takes to leave
    queue: list[tuple[float, int, str, Any]] = field(default_factory=list)  # (when, seq, what, payload)
    ticks: set[float] = field(default_factory=set)
    seq: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    admitted_at: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def at(self, when: float, what: str, payload: Any) -> None:
        self.seq += 1  # ties in time go in the order they were planned
        heapq.heappush(self.queue, (when, self.seq, what, payload))

    def step(self, now: float, event: Event) -> None:
        for decision in self.policy.step(event, now):
            if isinstance(decision, Admitted):
                gang_id = decision.gang_id
                self.admitted_at.setdefault(gang_id, now)
                self.attempts[gang_id] = self.attempts.get(gang_id, 0) + 1
                self.at(now + self.durations.get(gang_id, 1e9), "finish", (gang_id, self.attempts[gang_id]))
            elif isinstance(decision, Preempted):
                request = self.policy.running[decision.gang_id].request
                self.attempts[decision.gang_id] += 1  # its planned finish is void
                self.at(now + self.exits.get(decision.gang_id, 1.0) * self.grace, "back", request)
            elif isinstance(decision, GangRejected):
                self.rejected[decision.gang_id] = decision.reason
        deadline = self.policy.next_deadline()
        if deadline is not None and deadline < FOREVER and max(deadline, now) not in self.ticks:
            self.ticks.add(max(deadline, now))
            self.at(max(deadline, now), "tick", None)

    def until(self, end: float) -> None:
        while self.queue and self.queue[0][0] <= end:
            now, _, what, payload = heapq.heappop(self.queue)
            if what == "event":
                self.step(now, payload)
            elif what == "tick":
                self.step(now, Tick())
            elif what == "back":  # the ranks left: release, and the GangRun asks again for the same gang
                self.step(now, GangReleased(gang_id=payload.gang_id))
                self.step(now, GangSubmitted(request=payload))
            elif self.attempts.get(payload[0]) == payload[1]:  # "finish", of the attempt that still runs
                self.step(now, GangReleased(gang_id=payload[0]))


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    whole = draw(st.booleans(), label="whole-node gangs")  # else 1-GPU gangs: either way nothing fragments
    nodes = draw(st.integers(2, 5), label="nodes")
    per_node = draw(st.sampled_from([1, 2]), label="GPUs per node") if whole else 2
    total = nodes * per_node
    unit = per_node if whole else 1
    b_quota = draw(st.integers(1, total // unit - 1), label="team-b's quota") * unit
    rest = total - b_quota
    d_quota = draw(st.integers(0, rest // unit), label="team-d's quota") * unit
    return {
        "whole": whole,
        "nodes": nodes,
        "per_node": per_node,
        "quotas": {"team-a": rest - d_quota, "team-b": b_quota, "team-d": d_quota},
        "min_runtime": draw(st.sampled_from([0.0, 30.0, 60.0]), label="min_runtime"),
        "grace": draw(st.sampled_from([5.0, 30.0, 120.0]), label="grace"),
        "within_tenant": draw(st.sampled_from(["never", "lower_priority"])),
        "backfill": draw(st.booleans(), label="backfill"),
    }


BORROWER_CLASSES = [None, "low", "high", "top"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(scenarios(), st.data())
def test_a_gang_within_its_nominal_quota_starts_within_min_runtime_plus_grace(
    scenario: dict[str, Any], data: st.DataObject
) -> None:
    """Borrowers (team-a and team-d) of every priority class and preemptible flag take all they can and keep
    submitting; team-b's gangs, each keeping team-b within its nominal quota, start within ``min_runtime`` +
    ``preemption_grace`` of their arrival. The quotas add up to the nodes and no gang shape fragments them
    (whole nodes, or 1 GPU), so placement never stops a gang the quota allows: the property is about quotas."""
    quotas, per_node = scenario["quotas"], scenario["per_node"]
    text = f"""
        cohorts: [{{name: research}}]
        tenants:
          - {{name: team-a, cohort: research, quota: {{gpu: {quotas["team-a"]}}}}}
          - {{name: team-b, cohort: research, quota: {{gpu: {quotas["team-b"]}}}}}
          - {{name: team-d, cohort: research, quota: {{gpu: {quotas["team-d"]}}}}}
        policy:
          reclaim_within_cohort: any
          within_tenant: {scenario["within_tenant"]}
          min_runtime: {scenario["min_runtime"]}
          preemption_grace: {scenario["grace"]}
          backfill: {str(scenario["backfill"]).lower()}
        """
    policy = Policy(load_queue_config(textwrap.dedent(text) + CLASSES), node_ttl_s=FOREVER)
    sim = _Sim(policy, scenario["grace"])
    for index in range(scenario["nodes"]):
        sim.step(0.0, NodeRegistered(spec=NodeSpec(node_id=f"n{index}", address="-", gpus=per_node, cpus=64)))

    def shape() -> dict[str, int]:
        if scenario["whole"]:
            return {"nnodes": data.draw(st.integers(1, 3)), "gpus_per_node": per_node}
        return {"nnodes": 1, "gpus_per_node": 1}

    # the borrowers: a burst at the start, then more now and then, of every class and flag, mostly long
    now = 0.0
    for count in range(data.draw(st.integers(6, 16), label="borrower gangs")):
        now += data.draw(st.sampled_from([0.0, 0.0, 1.0, 7.0, 45.0]))
        gang_id = f"x{count}"
        request = GangRequest(
            gang_id=gang_id,
            tenant=data.draw(st.sampled_from(["team-a", "team-a", "team-d"])),
            priority=data.draw(st.sampled_from(BORROWER_CLASSES)),
            preemptible=data.draw(st.sampled_from([True, True, False])),
            **shape(),
        )
        sim.durations[gang_id] = data.draw(st.sampled_from([20.0, 300.0, 1e6, 1e6]))
        sim.exits[gang_id] = data.draw(st.sampled_from([0.0, 1.0]))  # at once, or at the end of the grace
        sim.at(now, "event", GangSubmitted(request=request))
    # team-b: one gang at a time, each within its nominal quota when it arrives
    bound = scenario["min_runtime"] + scenario["grace"]
    when = data.draw(st.sampled_from([0.5, 10.0, 61.0, 130.0]), label="team-b's first arrival")
    for index in range(data.draw(st.integers(1, 3), label="team-b gangs")):
        sim.until(when)
        used = sum(
            r.request.nnodes * r.request.gpus_per_node for r in policy.running.values() if r.request.tenant == "team-b"
        )
        room = quotas["team-b"] - used
        if room < (per_node if scenario["whole"] else 1):
            when += 100.0
            continue
        gang_id = f"b{index}"
        if scenario["whole"]:
            fields = {"nnodes": data.draw(st.integers(1, room // per_node)), "gpus_per_node": per_node}
        else:
            fields = {"nnodes": 1, "gpus_per_node": 1}
        request = GangRequest(
            gang_id=gang_id,
            tenant="team-b",
            priority=data.draw(st.sampled_from(BORROWER_CLASSES)),
            preemptible=data.draw(st.booleans()),
            **fields,
        )
        sim.durations[gang_id] = data.draw(st.sampled_from([50.0, 1e6]))
        sim.step(when, GangSubmitted(request=request))
        sim.until(when + bound)
        assert gang_id not in sim.rejected, sim.rejected[gang_id]
        assert gang_id in sim.admitted_at, (
            f"{gang_id} of team-b (within its quota of {quotas['team-b']} GPUs) not admitted within "
            f"{bound} s: {policy.pending[gang_id].reason}"
        )
        assert sim.admitted_at[gang_id] - when <= bound
        when += bound + data.draw(st.sampled_from([0.5, 30.0]))  # the simulation has run until when + bound
    # nothing is lent for good: no borrower runs a protected gang above its tenant's quota
    for tenant in ("team-a", "team-d"):
        protected = sum(
            r.request.nnodes * r.request.gpus_per_node
            for r in policy.running.values()
            if r.request.tenant == tenant and not r.preemptible
        )
        assert protected <= quotas[tenant]
