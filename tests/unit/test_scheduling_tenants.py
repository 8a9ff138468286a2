"""Scheduling policy with several tenants: quotas, cohorts, borrowing and lending, reclaim, priorities,
minimum runtime, backfill without starvation, fair share, configuration changes, reasons and views.

Plain Python: ``Policy.step`` driven directly with queue configurations written as users write them
(YAML through ``load_queue_config``). Times are simulated seconds passed as ``now``.
"""

from __future__ import annotations

import heapq
import json
import textwrap

import pytest
from scheduling_builders import TWO_TEAMS, admitted, config, gang, node, only, order, preempted, run, used_gpus

from engine.scheduling import (
    Admitted,
    ConfigApplied,
    Decision,
    Event,
    GangRejected,
    GangReleased,
    GangRequest,
    GangSubmitted,
    Pending,
    Policy,
    Preempted,
    Tick,
)

GI = 2**30

CLUSTER = [node("a"), node("b")]  # 4 GPUs


def team_a_borrows_everything(text: str = TWO_TEAMS) -> Policy:
    """team-a runs a1..a4 (1 GPU each: a1, a2 on node a, a3, a4 on node b); a3 and a4 borrow team-b's quota."""
    policy = Policy(config(text))
    decisions = run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy)
    assert admitted(decisions) == ["a1", "a2", "a3", "a4"]
    return policy


# ---------------------------------------------------------------- quotas, borrowing, lending


def test_a_tenant_without_a_cohort_stops_at_its_nominal_quota_even_with_idle_gpus() -> None:
    policy = Policy(config("tenants: [{name: solo, quota: {gpu: 2}}, {name: other}]"))
    decisions = run([*CLUSTER, gang("s1", "solo"), gang("s2", "solo"), gang("s3", "solo")], policy)
    assert admitted(decisions) == ["s1", "s2"]
    assert only(decisions, Pending, "s3") == (
        "pending: solo is at its quota of 2 GPUs and has no cohort to borrow from; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    # the idle GPUs go to whoever may use them
    assert admitted(policy.step(gang("o1", "other", gpus=2))) == ["o1"]
    tenants = policy.queues()["tenants"]
    assert tenants["solo"]["used"]["gpu"] == 2 and tenants["solo"]["borrowed"]["gpu"] == 0
    assert tenants["solo"]["pending"] == 1


def test_a_tenant_borrows_idle_cohort_capacity_and_the_lender_shows_it_lent() -> None:
    policy = team_a_borrows_everything()
    decisions = policy.step(gang("a5", "team-a"))
    assert only(decisions, Pending, "a5") == (
        "pending: team-a is at its quota of 2 GPUs and cannot borrow: cohort research has 0 GPUs idle; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    tenants = policy.queues()["tenants"]
    assert (tenants["team-a"]["used"]["gpu"], tenants["team-a"]["borrowed"]["gpu"]) == (4, 2)
    assert (tenants["team-b"]["used"]["gpu"], tenants["team-b"]["lent"]["gpu"]) == (0, 2)
    assert tenants["team-a"]["lent"]["gpu"] == 0


@pytest.mark.parametrize(("limit", "most"), [(0, 2), (1, 3)])
def test_borrowing_limit_caps_what_a_tenant_takes_above_its_quota(limit: int, most: int) -> None:
    policy = Policy(
        config(
            f"""
            cohorts: [{{name: research}}]
            tenants:
              - {{name: team-a, cohort: research, quota: {{gpu: 2}}, borrowing_limit: {{gpu: {limit}}}}}
              - {{name: team-b, cohort: research, quota: {{gpu: 2}}}}
            """
        )
    )
    decisions = run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy)
    assert admitted(decisions) == [f"a{i}" for i in range(1, most + 1)]
    assert used_gpus(policy, "team-a") == most
    assert only(decisions, Pending, f"a{most + 1}") == (
        f"pending: team-a is at its quota of 2 GPUs and its borrowing limit of {limit} GPU{'' if limit == 1 else 's'}; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    # team-b's quota is untouched by what team-a may not borrow
    assert admitted(run([gang("b1", "team-b"), gang("b2", "team-b")][: 4 - most], policy)) == ["b1", "b2"][: 4 - most]


def test_lending_limit_keeps_part_of_the_quota_for_the_lender() -> None:
    policy = Policy(
        config(
            """
            cohorts: [{name: research}]
            tenants:
              - {name: team-a, cohort: research, quota: {gpu: 2}}
              - {name: team-b, cohort: research, quota: {gpu: 2}, lending_limit: {gpu: 1}}
            """
        )
    )
    decisions = run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy)
    assert admitted(decisions) == ["a1", "a2", "a3"]  # team-b lends one of its two idle GPUs
    assert "cohort research has 0 GPUs idle" in only(decisions, Pending, "a4")
    assert policy.queues()["tenants"]["team-b"]["lent"]["gpu"] == 1
    # the GPU team-b kept is there for it at once, without preempting anyone
    decisions = policy.step(gang("b1", "team-b"))
    assert admitted(decisions) == ["b1"] and preempted(decisions) == []
    # the one it lent is taken back
    decisions = policy.step(gang("b2", "team-b"))
    assert preempted(decisions) == [("a3", "b2", "team-b", "reclaim")]


def test_nested_cohorts_share_the_root_cohorts_pool() -> None:
    policy = Policy(
        config(
            """
            cohorts: [{name: org}, {name: research, parent: org}, {name: prod, parent: org}]
            tenants:
              - {name: team-a, cohort: research, quota: {gpu: 2}}
              - {name: team-b, cohort: prod, quota: {gpu: 2}}
              - {name: loner, quota: {gpu: 0}}
            """
        )
    )
    decisions = run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy)
    assert admitted(decisions) == ["a1", "a2", "a3", "a4"]  # team-b's idle quota, across sibling cohorts
    tenants = policy.queues()["tenants"]
    assert tenants["team-a"]["cohort"] == "org" and tenants["team-b"]["lent"]["gpu"] == 2
    assert policy.queues()["cohorts"]["research"] == {"parent": "org", "tenants": ["team-a"]}
    # and it is reclaimed across them
    assert preempted(policy.step(gang("b1", "team-b"))) == [("a4", "b1", "team-b", "reclaim")]
    # a tenant outside the tree has a quota of 0 GPUs and nothing to borrow: it is refused at once
    assert "more than tenant loner may ever hold" in only(policy.step(gang("l1", "loner")), GangRejected, "l1")


def test_a_gang_bigger_than_its_tenant_may_ever_hold_is_rejected_at_submit() -> None:
    policy = Policy(
        config(
            """
            cohorts: [{name: research}]
            tenants:
              - {name: solo, quota: {gpu: 2}}
              - {name: team-a, cohort: research, quota: {gpu: 2}, borrowing_limit: {gpu: 1}}
              - {name: team-b, cohort: research, quota: {gpu: 2, cpu: 4}}
            """
        )
    )
    run([node("a", gpus=4), node("b", gpus=4)], policy)
    assert only(policy.step(gang("s", "solo", gpus=3)), GangRejected, "s") == (
        "rejected: needs 3 GPUs on 1 node (3 GPUs, 1 CPU per node), more than tenant solo may ever hold "
        "(2 GPUs: its quota of 2 GPUs plus what it may borrow)"
    )
    assert "more than tenant team-a may ever hold (3 GPUs: its quota of 2 GPUs" in only(
        policy.step(gang("a", "team-a", gpus=2, nnodes=2)), GangRejected, "a"
    )
    # team-a lends all of its 2 GPUs but has no CPU quota to lend: team-b may hold 4 GPUs but only 4 CPUs
    assert "more than tenant team-b may ever hold (4 CPUs: its quota of 4 CPUs" in only(
        policy.step(gang("b", "team-b", gpus=2, nnodes=2, cpus=3)), GangRejected, "b"
    )
    assert admitted(policy.step(gang("b-ok", "team-b", gpus=2, nnodes=2, cpus=2))) == ["b-ok"]
    assert policy.pending == {}


def test_unknown_tenant_and_unknown_priority_class_are_rejected_with_the_names_known() -> None:
    policy = Policy(
        config(
            """
            tenants: [{name: team-a}, {name: team-b}]
            priority_classes: [{name: low, value: 10}, {name: high, value: 100}]
            """
        )
    )
    run(CLUSTER, policy)
    assert only(policy.step(gang("x", "team-z")), GangRejected, "x") == (
        "rejected: unknown tenant 'team-z' (tenants: team-a, team-b)"
    )
    assert only(policy.step(gang("y", "team-a", priority="urgent")), GangRejected, "y") == (
        "rejected: unknown priority class 'urgent' (priority classes: high, low)"
    )
    assert only(Policy().step(gang("z", "default", priority="high")), GangRejected, "z") == (
        "rejected: unknown priority class 'high' (priority classes: none are defined)"
    )
    assert policy.pending == {} and policy.running == {}


# ---------------------------------------------------------------- reclaim


def test_reclaim_preempts_the_most_recently_admitted_borrower_and_names_everyone() -> None:
    policy = team_a_borrows_everything()
    decisions = policy.step(gang("b1", "team-b"))
    assert preempted(decisions) == [("a4", "b1", "team-b", "reclaim")]
    notice = next(d for d in decisions if isinstance(d, Preempted))
    assert notice.reason == (
        "preempted (reclaim) to make room for gang 'b1' of team-b, which needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    assert notice.grace_s == 120.0
    assert only(decisions, Pending, "b1") == (
        "pending: preempting 1 gang (reclaim) to make room: waiting for a4 to release; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    view = next(r for r in policy.describe()["running"] if r["gang_id"] == "a4")
    assert view["preempting"] is True and view["preempted_for"] == "b1"
    # a gang of the same shape waits behind b1 (first in, first out within a tenant)
    decisions = policy.step(gang("b2", "team-b"))
    assert preempted(decisions) == [] and "queued behind earlier gangs of team-b" in only(decisions, Pending, "b2")
    # one of another shape is looked at now, and a4, already being preempted, is not preempted again for it
    assert preempted(policy.step(gang("b3", "team-b", cpus=2))) == [("a3", "b3", "team-b", "reclaim")]
    decisions = policy.step(GangReleased(gang_id="a4"))
    assert admitted(decisions) == ["b1"]
    assert policy.running["b1"].placement.nodes[0].gpu_ids == (1,)
    # the GPU reclaimed for team-b goes to team-b's earliest gang that fits (first in, first out)
    decisions = policy.step(GangReleased(gang_id="a3"))
    assert admitted(decisions) == ["b2"]
    assert "team-b is at its quota of 2 GPUs and cannot borrow" in only(decisions, Pending, "b3")
    assert (used_gpus(policy, "team-a"), used_gpus(policy, "team-b")) == (2, 2)


def test_reclaim_takes_the_fewest_whole_gangs() -> None:
    policy = Policy(config(TWO_TEAMS))
    run([*CLUSTER, gang("pair", "team-a", gpus=2), gang("a3", "team-a"), gang("a4", "team-a")], policy)
    assert {a.node_id for a in policy.running["pair"].placement.nodes} == {"a"}
    # two GPUs on one node: node a frees them with one victim, node b would need two (the newer ones)
    decisions = policy.step(gang("b-pair", "team-b", gpus=2))
    assert preempted(decisions) == [("pair", "b-pair", "team-b", "reclaim")]


def test_a_multi_node_victim_is_preempted_whole() -> None:
    policy = Policy(config(TWO_TEAMS))
    decisions = run([*CLUSTER, gang("wide", "team-a", nnodes=2), gang("a2", "team-a"), gang("a3", "team-a")], policy)
    assert admitted(decisions) == ["wide", "a2", "a3"]
    decisions = policy.step(gang("b-pair", "team-b", gpus=2))
    victims = {v for v, *_ in preempted(decisions)}
    assert "wide" in victims and len(victims) == 2
    # wide's GPU on the other node is freed too: it is one gang, released as one
    decisions = run([GangReleased(gang_id=v) for v in sorted(victims)], policy)
    assert admitted(decisions) == ["b-pair"]
    assert used_gpus(policy, "team-a") == 1 and used_gpus(policy, "team-b") == 2


def test_reclaim_of_a_whole_quota_takes_the_most_recent_borrowers() -> None:
    policy = team_a_borrows_everything()
    # two GPUs on one node: nodes a (a1, a2) and b (a3, a4) need two victims each; b's are the newer
    decisions = policy.step(gang("b-pair", "team-b", gpus=2))
    assert preempted(decisions) == [("a4", "b-pair", "team-b", "reclaim"), ("a3", "b-pair", "team-b", "reclaim")]


def test_reclaim_within_cohort_never_waits_for_the_borrowers_to_finish() -> None:
    policy = team_a_borrows_everything(TWO_TEAMS + "policy: {reclaim_within_cohort: never}\n")
    decisions = policy.step(gang("b1", "team-b"))
    assert preempted(decisions) == []
    assert only(decisions, Pending, "b1") == (
        "pending: team-b is within its quota of 2 GPUs, but cohort research lent it out: waiting for it to be "
        "returned (no gang holding it may be preempted for this one); needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    decisions = policy.step(GangReleased(gang_id="a1"))
    assert admitted(decisions) == ["b1"]


def test_reclaim_within_cohort_lower_priority_takes_back_only_from_lower_priorities() -> None:
    text = TWO_TEAMS + textwrap.dedent(
        """
        priority_classes: [{name: low, value: 10}, {name: high, value: 100}]
        policy: {reclaim_within_cohort: lower_priority, default_priority: low}
        """
    )
    policy = team_a_borrows_everything(text)
    decisions = policy.step(gang("b-low", "team-b"))
    assert preempted(decisions) == []
    assert "within its quota of 2 GPUs, but cohort research lent it out" in only(decisions, Pending, "b-low")
    decisions = policy.step(gang("b-high", "team-b", priority="high", cpus=2))
    assert preempted(decisions) == [("a4", "b-high", "team-b", "reclaim")]


def test_a_borrower_of_higher_priority_is_not_reclaimed_for_a_lower_one_under_lower_priority() -> None:
    text = TWO_TEAMS + textwrap.dedent(
        """
        priority_classes: [{name: low, value: 10}, {name: high, value: 100}]
        policy: {reclaim_within_cohort: lower_priority}
        """
    )
    policy = Policy(config(text))
    run([*CLUSTER, *(gang(f"a{i}", "team-a", priority="high") for i in range(1, 5))], policy)
    assert preempted(policy.step(gang("b1", "team-b", priority="low"))) == []
    assert preempted(policy.step(gang("b2", "team-b", priority="high"))) == []  # equal is not lower


# ---------------------------------------------------------------- priorities


PRIORITIES = """\
tenants: [{name: team-a, quota: {gpu: 4}}, {name: team-b, quota: {gpu: 4}}]
priority_classes:
  - {name: low, value: 10}
  - {name: medium, value: 50}
  - {name: high, value: 100}
  - {name: vip, value: 1000, preemptible: false}
"""


def test_a_higher_priority_gang_preempts_the_lowest_priority_newest_gangs_of_its_own_tenant() -> None:
    policy = Policy(config(PRIORITIES))
    events: list[Event] = [
        *CLUSTER,
        gang("m1", "team-a", priority="medium"),
        gang("l2", "team-a", priority="low"),
        gang("l3", "team-a", priority="low"),
        gang("l4", "team-a", priority="low"),
    ]
    assert admitted(run(events, policy)) == ["m1", "l2", "l3", "l4"]
    decisions = policy.step(gang("h1", "team-a", priority="high"))
    assert preempted(decisions) == [("l4", "h1", "team-a", "priority")]
    # two GPUs on one node: node b's low gangs go, not the medium one on node a
    policy = Policy(config(PRIORITIES))
    run(events, policy)
    decisions = policy.step(gang("h2", "team-a", priority="high", gpus=2))
    assert preempted(decisions) == [("l4", "h2", "team-a", "priority"), ("l3", "h2", "team-a", "priority")]
    assert "m1" not in {v for v, *_ in preempted(decisions)}


def test_within_tenant_never_makes_a_high_priority_gang_wait() -> None:
    policy = Policy(config(PRIORITIES + "policy: {within_tenant: never}\n"))
    run([*CLUSTER, *(gang(f"l{i}", "team-a", priority="low") for i in range(4))], policy)
    decisions = policy.step(gang("h", "team-a", priority="high"))
    assert preempted(decisions) == []
    assert only(decisions, Pending, "h") == (
        "pending: team-a is at its quota of 4 GPUs and has no cohort to borrow from; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    # priority still orders the queue: h goes before an earlier low gang
    run([gang("l-late", "team-a", priority="low")], policy)
    assert order(policy) == ["h", "l-late"]
    assert admitted(policy.step(GangReleased(gang_id="l0"))) == ["h"]


def test_priority_never_preempts_another_tenant() -> None:
    policy = Policy(config(PRIORITIES))
    run([*CLUSTER, *(gang(f"l{i}", "team-a", priority="low") for i in range(4))], policy)
    # team-b is within its quota, but team-a is within its own: nothing to reclaim, no cohort
    decisions = policy.step(gang("h", "team-b", priority="high"))
    assert preempted(decisions) == []
    assert only(decisions, Pending, "h").startswith("pending: waiting for capacity")


def test_gangs_of_a_non_preemptible_class_or_marked_not_preemptible_are_never_victims() -> None:
    policy = Policy(config(PRIORITIES))
    events: list[Event] = [
        *CLUSTER,
        gang("vip", "team-a", priority="vip"),
        gang("kept", "team-a", priority="low", preemptible=False),
        gang("l3", "team-a", priority="low"),
        gang("l4", "team-a", priority="low"),
    ]
    run(events, policy)
    views = {r["gang_id"]: r for r in policy.describe()["running"]}
    assert (views["vip"]["preemptible"], views["kept"]["preemptible"], views["l3"]["preemptible"]) == (
        False,
        False,
        True,
    )
    # two GPUs on one node: node a holds vip and kept, so only node b's two low gangs can go
    decisions = policy.step(gang("h2", "team-a", priority="high", gpus=2))
    assert sorted(v for v, *_ in preempted(decisions)) == ["l3", "l4"]
    run([GangReleased(gang_id="l3"), GangReleased(gang_id="l4")], policy)
    assert "h2" in policy.running
    # now only protected gangs and h2 hold team-a's GPUs: another high gang waits
    decisions = policy.step(gang("h3", "team-a", priority="high"))
    assert preempted(decisions) == []
    assert "h3" in policy.pending


def test_a_preemptible_false_request_is_protected_so_it_never_borrows() -> None:
    policy = Policy(config(TWO_TEAMS))
    decisions = run([*CLUSTER, *(gang(f"a{i}", "team-a", preemptible=False) for i in range(1, 5))], policy)
    assert admitted(decisions) == ["a1", "a2"]  # team-a's nominal quota; team-b's idle GPUs are not lent to them
    assert "only preemptible gangs may borrow beyond the nominal quota" in policy.pending["a3"].reason
    decisions = run([gang("b1", "team-b"), gang("b2", "team-b")], policy)
    assert admitted(decisions) == ["b1", "b2"] and preempted(decisions) == []
    decisions = policy.step(gang("b3", "team-b", priority=None))
    assert preempted(decisions) == []  # a1 and a2 are team-a's own quota, and protected


# ---------------------------------------------------------------- minimum runtime


def test_min_runtime_protects_young_gangs_and_the_deadline_says_when_they_come_of_age() -> None:
    text = TWO_TEAMS + "policy: {min_runtime: 60s, preemption_grace: 30s}\n"
    policy = Policy(config(text), node_ttl_s=10_000)
    run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy, now=0.0)
    decisions = policy.step(gang("b1", "team-b"), now=10.0)
    assert preempted(decisions) == []
    assert only(decisions, Pending, "b1") == (
        "pending: team-b is within its quota of 2 GPUs, but cohort research lent it out: reclaiming it; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node); it may preempt gang 'a1' of team-a once that gang has "
        "run policy.min_runtime"
    )
    assert policy.next_deadline() == 60.0  # when team-a's gangs have run for min_runtime
    assert policy.step(Tick(), now=59.0) == []
    decisions = policy.step(Tick(), now=60.0)
    assert preempted(decisions) == [("a4", "b1", "team-b", "reclaim")]
    assert next(d for d in decisions if isinstance(d, Preempted)).grace_s == 30.0
    assert policy.next_deadline() == 10_000.0  # only the nodes' registrations are left


def test_schedulers_recorded_before_name_no_victim_too_young_to_go() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {min_runtime: 60s}\n"), node_ttl_s=10_000)
    policy.name_young_victims = False  # what a Scheduler recorded before the patch decides on replay
    run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy, now=0.0)
    reason = only(policy.step(gang("b1", "team-b"), now=10.0), Pending, "b1")
    assert reason.endswith("reclaiming it; needs 1 GPU on 1 node (1 GPU, 1 CPU per node)")


def test_min_runtime_passes_over_young_gangs_for_older_ones() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {min_runtime: 60s}\n"), node_ttl_s=10_000)
    run([*CLUSTER, gang("a1", "team-a"), gang("a2", "team-a")], policy, now=0.0)
    run([gang("a3", "team-a"), gang("a4", "team-a")], policy, now=50.0)
    # at 70 a3 and a4, the most recently admitted, are too young: a2 is preempted instead
    decisions = policy.step(gang("b1", "team-b"), now=70.0)
    assert preempted(decisions) == [("a2", "b1", "team-b", "reclaim")]
    assert policy.next_deadline() == 10_000.0


def test_without_now_every_gang_is_old_enough() -> None:
    policy = team_a_borrows_everything(TWO_TEAMS + "policy: {min_runtime: 1h}\n")
    assert preempted(policy.step(gang("b1", "team-b"))) == [("a4", "b1", "team-b", "reclaim")]


# ---------------------------------------------------------------- backfill and its bound


class Sim:
    """A discrete-event driver: an admitted gang runs for its duration then releases; a preempted gang
    releases after the whole grace (the worst case), then comes back with its remaining work."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.now = 0.0
        self._events: list[tuple[float, int, str, str, int]] = []  # (time, order, kind, gang, generation)
        self._n = 0
        self.requests: dict[str, GangRequest] = {}
        self.remaining: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.generation: dict[str, int] = {}
        self.admissions: dict[str, list[float]] = {}
        self.preemptions: list[tuple[float, Preempted]] = []

    def _push(self, at: float, kind: str, gang_id: str) -> None:
        self._n += 1
        heapq.heappush(self._events, (at, self._n, kind, gang_id, self.generation.get(gang_id, 0)))

    def submit(self, at: float, request: GangRequest, duration: float) -> None:
        self.requests[request.gang_id] = request
        self.remaining[request.gang_id] = duration
        self._push(at, "submit", request.gang_id)

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Admitted):
                self.started[d.gang_id] = self.now
                self.admissions.setdefault(d.gang_id, []).append(self.now)
                self._push(self.now + self.remaining[d.gang_id], "done", d.gang_id)
            elif isinstance(d, Preempted):
                self.preemptions.append((self.now, d))
                self.remaining[d.gang_id] -= self.now - self.started[d.gang_id]
                self.generation[d.gang_id] = self.generation.get(d.gang_id, 0) + 1  # its "done" is void
                self._push(self.now + d.grace_s, "preempted", d.gang_id)
            elif isinstance(d, GangRejected):
                raise AssertionError(f"unexpected rejection: {d}")

    def run_until(self, end: float) -> None:
        ticked_at = None
        while True:
            deadline = self.policy.next_deadline()
            at = self._events[0][0] if self._events else float("inf")
            if deadline is not None and deadline < at and deadline <= end:
                # the Scheduler ticks when a deadline has passed: one that a Tick leaves in the past would
                # make it tick forever
                assert ticked_at is None or deadline > ticked_at, f"next_deadline() stays at {deadline} after a Tick"
                self.now = ticked_at = max(self.now, deadline)
                self._apply(self.policy.step(Tick(), self.now))
                continue
            ticked_at = None
            if at > end:
                return
            at, _, kind, gang_id, generation = heapq.heappop(self._events)
            self.now = at
            if generation != self.generation.get(gang_id, 0):
                continue
            if kind == "submit":
                self._apply(self.policy.step(GangSubmitted(request=self.requests[gang_id]), at))
            elif kind == "done":
                self._apply(self.policy.step(GangReleased(gang_id=gang_id), at))
            else:  # preempted: released after the grace, then submitted again (it keeps its place)
                self._apply(self.policy.step(GangReleased(gang_id=gang_id), at))
                self._apply(self.policy.step(GangSubmitted(request=self.requests[gang_id]), at))


@pytest.mark.parametrize(
    "small_s",
    [
        pytest.param(1000.0, id="long-small-gangs"),
        pytest.param(30.0, id="small-gangs-shorter-than-min-runtime"),
    ],
)
def test_a_stream_of_small_gangs_never_starves_a_big_gang_past_the_documented_bound(small_s: float) -> None:
    # The bound (engine.scheduling.policy): the big gang waits at most for the gangs admitted before it
    # started waiting, plus the minimum runtime and the grace of the backfilled gangs in its way.
    min_runtime, grace = 60.0, 120.0
    policy = Policy(
        config(f"tenants: [{{name: team-a}}]\npolicy: {{min_runtime: {min_runtime}, preemption_grace: {grace}}}"),
        node_ttl_s=1e9,
    )
    sim = Sim(policy)
    for node_event in [node("a", gpus=4), node("b", gpus=4)]:
        policy.step(node_event, 0.0)
    # one GPU frees 20 s before the last gang admitted before the big one leaves: a small gang backfills it
    # just in time to be too young to preempt when the big gang could start (the worst case)
    durations = {"early-1": 480.0, "early-2": 500.0}
    for gang_id, duration in durations.items():
        sim.submit(0.0, GangRequest(gang_id=gang_id, nnodes=1, gpus_per_node=1, tenant="team-a"), duration)
    big_at = 10.0
    sim.submit(big_at, GangRequest(gang_id="big", nnodes=2, gpus_per_node=4, tenant="team-a"), 100.0)
    # small gangs arrive every 5 s for as long as the test runs, each wanting 1 GPU
    for i in range(400):
        request = GangRequest(gang_id=f"small-{i}", nnodes=1, gpus_per_node=1, tenant="team-a")
        sim.submit(big_at + 1.0 + 5.0 * i, request, small_s)
    sim.run_until(2000.0)

    started = sim.admissions.get("big", [])
    assert len(started) == 1, f"the big gang never started (small gangs admitted: {len(sim.admissions) - 3})"
    bound = max(durations.values()) + min_runtime + grace
    assert started[0] <= bound, f"the big gang started at {started[0]} s, after the bound of {bound} s"
    # meanwhile the idle GPUs were used: small gangs ran before the big gang started
    assert any(times[0] < started[0] for g, times in sim.admissions.items() if g.startswith("small-"))
    # only backfilled gangs were preempted, only for the big gang, each at most once
    victims = [d.gang_id for _, d in sim.preemptions]
    assert all(v.startswith("small-") for v in victims)
    assert {(d.by, d.cause) for _, d in sim.preemptions} <= {("big", "backfill")}
    assert len(victims) == len(set(victims))


def test_next_deadline_is_always_ahead_of_the_clock() -> None:
    # the Scheduler sends a Tick when next_deadline has passed: one that a step leaves in the past would
    # make it tick in a loop
    policy = Policy(node_ttl_s=1e6)
    steps: list[tuple[float, Event]] = [
        (0.0, node("a")),
        (0.0, node("b")),
        (0.0, gang("early", "default")),
        (10.0, gang("big", "default", nnodes=2, gpus=2)),
        (20.0, gang("small-1", "default")),  # backfills next to early
        (30.0, gang("small-2", "default")),  # backfills node b
        (40.0, gang("small-3", "default", cpus=2)),
    ]
    for now, event in steps:
        policy.step(event, now)
        deadline = policy.next_deadline()
        assert deadline is None or deadline > now, f"next_deadline() {deadline} after a step at {now}"
    now = 40.0
    while (deadline := policy.next_deadline()) is not None and deadline < 1e6:
        assert deadline > now, f"next_deadline() stays at {deadline} after a Tick at {now}"
        now = deadline
        policy.step(Tick(), now)
    # early never leaves, so big never starts and nothing is preempted for it
    assert "big" in policy.pending and all(r.preempted_for is None for r in policy.running.values())


def test_restore_keeps_the_deadline_of_a_gang_waiting_for_victims_to_come_of_age() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {min_runtime: 60s}\n"), node_ttl_s=10_000)
    run([*CLUSTER, *(gang(f"a{i}", "team-a") for i in range(1, 5))], policy, now=0.0)
    policy.step(gang("b1", "team-b"), now=10.0)
    assert policy.next_deadline() == 60.0
    restored = Policy.restore(json.loads(json.dumps(policy.snapshot())))
    # after a continue-as-new the Scheduler must still wake up at 60 to reclaim
    assert restored.next_deadline() == 60.0


def test_a_fragmented_cluster_moves_a_smaller_gang_to_idle_gpus_elsewhere() -> None:
    policy = Policy(config("tenants: [{name: team-a}, {name: team-b}]"))
    run([*CLUSTER, gang("s1", "team-a"), gang("x", "team-a"), gang("s2", "team-b"), GangReleased(gang_id="x")], policy)
    # one GPU idle on each node: the 2-GPU gang fits nowhere, but s2 can start again at once next to s1
    decisions = policy.step(gang("big", "team-b", gpus=2))
    assert preempted(decisions) == [("s2", "big", "team-b", "defrag")]
    assert admitted(policy.step(GangReleased(gang_id="s2"))) == ["big"]
    assert admitted(policy.step(gang("s2", "team-b"))) == ["s2"]
    assert {g: sorted(a.node_id for a in r.placement.nodes) for g, r in policy.running.items()} == {
        "s1": ["a"],
        "big": ["b"],
        "s2": ["a"],
    }


def test_a_gang_is_not_moved_when_it_could_not_start_again_at_once() -> None:
    policy = Policy(config("tenants: [{name: team-a}, {name: team-b}]"))
    # node a has one CPU: once s1 holds it, s2 could not move there
    run([node("a", cpus=1), node("b"), gang("s1", "team-a"), gang("s2", "team-b")], policy)
    decisions = policy.step(gang("big", "team-b", gpus=2))
    assert preempted(decisions) == []
    assert "big" in policy.pending


def test_a_preempted_gang_that_comes_back_keeps_its_place() -> None:
    policy = team_a_borrows_everything()
    run([gang("a5", "team-a"), gang("a6", "team-a")], policy)
    assert preempted(policy.step(gang("b1", "team-b"))) == [("a4", "b1", "team-b", "reclaim")]
    run([GangReleased(gang_id="a4"), gang("a4", "team-a")], policy)  # its GangTask releases and asks again
    assert order(policy) == ["a4", "a5", "a6"]  # ahead of the gangs submitted after it first was
    decisions = policy.step(GangReleased(gang_id="b1"))
    assert admitted(decisions) == ["a4"]


# ---------------------------------------------------------------- fair share


FAIR = """
    cohorts: [{name: research}]
    tenants:
      - {name: team-a, cohort: research, weight: 1, quota: {gpu: 1, cpu: 8}}
      - {name: team-b, cohort: research, weight: 2, quota: {gpu: 1, cpu: 8}}
      - {name: team-c, cohort: research, quota: {gpu: 6, cpu: 48}}
"""


def fair_share_cluster() -> Policy:
    """team-c fills its 6 GPUs, team-a and team-b one each, and both queue five more gangs."""
    policy = Policy(config(FAIR))
    run([node(f"n{i}") for i in range(4)], policy)
    run([*(gang(f"c{i}", "team-c") for i in range(6)), gang("a0", "team-a"), gang("b0", "team-b")], policy)
    run([gang(f"{t}{i}", f"team-{t}") for i in range(1, 6) for t in "ab"], policy)
    assert len(policy.running) == 8 and len(policy.pending) == 10
    return policy


def test_fair_share_gives_borrowed_capacity_in_proportion_to_weight() -> None:
    policy = fair_share_cluster()
    got = []
    for i in range(6):  # team-c's GPUs come free one by one: each goes to the lower weighted share
        got += admitted(policy.step(GangReleased(gang_id=f"c{i}")))
    assert got == ["a1", "b1", "b2", "a2", "b3", "b4"]
    tenants = policy.queues()["tenants"]
    assert (tenants["team-a"]["borrowed"]["gpu"], tenants["team-b"]["borrowed"]["gpu"]) == (2, 4)
    # weighted shares: team-a 2/8 / 1, team-b 4/8 / 2
    assert (tenants["team-a"]["share"], tenants["team-b"]["share"]) == (0.25, 0.25)


def test_the_lower_weighted_share_goes_first_whatever_the_submission_order() -> None:
    policy = fair_share_cluster()
    run([GangReleased(gang_id=f"c{i}") for i in range(4)], policy)  # a1, b1, b2, a2 borrowed
    assert policy.queues()["tenants"]["team-a"]["share"] == 0.25  # 2 GPUs above quota of 8, weight 1
    assert policy.queues()["tenants"]["team-b"]["share"] == 0.125  # 2 above, weight 2
    # a3 was submitted before b3, but team-b's share is lower
    assert order(policy).index("b3") < order(policy).index("a3")
    assert admitted(policy.step(GangReleased(gang_id="c4"))) == ["b3"]


def test_weight_zero_gets_only_what_nobody_else_wants() -> None:
    policy = Policy(
        config(
            """
            cohorts: [{name: research}]
            tenants:
              - {name: team-a, cohort: research, weight: 0, quota: {gpu: 1, cpu: 8}}
              - {name: team-b, cohort: research, weight: 1, quota: {gpu: 1, cpu: 8}}
              - {name: team-c, cohort: research, quota: {gpu: 2, cpu: 16}}
            """
        )
    )
    run([*CLUSTER, gang("c0", "team-c"), gang("c1", "team-c"), gang("a0", "team-a"), gang("b0", "team-b")], policy)
    run([gang("a1", "team-a"), gang("a2", "team-a"), gang("b1", "team-b"), gang("b2", "team-b")], policy)
    assert admitted(policy.step(GangReleased(gang_id="c0"))) == ["a1"]  # both at share 0: submission order
    # team-a now borrows with weight 0: an infinite share, so team-b goes first from now on
    assert admitted(policy.step(GangReleased(gang_id="c1"))) == ["b1"]
    assert order(policy) == ["b2", "a2"]


def test_queues_view_is_strict_json_even_with_an_infinite_share() -> None:
    policy = Policy(config("tenants: [{name: team-a, weight: 0}]"))
    run([*CLUSTER, gang("a1", "team-a")], policy)
    # JSON has no Infinity: the CLI's --json output and the Scheduler's query result must stay parseable
    json.dumps(policy.queues(), allow_nan=False)
    json.dumps(policy.describe(), allow_nan=False)


# ---------------------------------------------------------------- configuration changes


CHANGING = """
    tenants: [{name: team-a, quota: {gpu: 4}}, {name: team-b, quota: {gpu: 4}}]
    priority_classes: [{name: low, value: 10}, {name: high, value: 100}, {name: old, value: 1}]
    policy: {within_tenant: never}
"""


def test_a_config_change_reranks_rejects_pending_gangs_of_removed_tenants_and_keeps_running_ones() -> None:
    policy = Policy(config(CHANGING))
    events: list[Event] = [
        node("n0", gpus=4),
        gang("a0", "team-a", gpus=2),
        gang("b0", "team-b", gpus=2),
        gang("ah", "team-a", priority="high"),
        gang("al", "team-a", priority="low"),
        gang("ao", "team-a", priority="old"),
        gang("b1", "team-b"),
    ]
    run(events, policy)
    assert order(policy) == ["ah", "al", "ao", "b1"]  # no class: value 0
    new = config(
        """
        tenants: [{name: team-a, quota: {gpu: 4}}]
        priority_classes: [{name: low, value: 1000}, {name: high, value: 100}]
        policy: {within_tenant: never}
        """
    )
    decisions = policy.step(ConfigApplied(config=new))
    assert only(decisions, GangRejected, "b1") == "rejected: unknown tenant 'team-b' (tenants: team-a)"
    assert only(decisions, GangRejected, "ao") == "rejected: unknown priority class 'old' (priority classes: high, low)"
    assert [d for d in decisions if not isinstance(d, GangRejected)] == []
    assert order(policy) == ["al", "ah"]  # low is now the higher class
    # team-b's running gang keeps running, and keeps being shown while it holds GPUs
    assert "b0" in policy.running
    assert policy.queues()["tenants"]["team-b"]["used"]["gpu"] == 2
    assert admitted(policy.step(GangReleased(gang_id="b0"))) == ["al", "ah"]
    assert "team-b" not in policy.queues()["tenants"]


def test_a_config_change_applies_new_quotas_to_pending_gangs() -> None:
    policy = Policy(config("tenants: [{name: team-a, quota: {gpu: 1}}]"))
    decisions = run([*CLUSTER, gang("a1", "team-a"), gang("a2", "team-a")], policy)
    assert admitted(decisions) == ["a1"] and "at its quota of 1 GPU" in only(decisions, Pending, "a2")
    decisions = policy.step(ConfigApplied(config=config("tenants: [{name: team-a, quota: {gpu: 2}}]")))
    assert admitted(decisions) == ["a2"]
    # a quota shrunk below what runs does not stop running gangs
    decisions = policy.step(ConfigApplied(config=config("tenants: [{name: team-a, quota: {gpu: 1}}]")))
    assert decisions == [] and set(policy.running) == {"a1", "a2"}
    decisions = policy.step(gang("a3", "team-a"))
    assert "at its quota of 1 GPU" in only(decisions, Pending, "a3")
    # a gang that no longer fits the tenant's quota at all is rejected
    assert "more than tenant team-a may ever hold" in only(
        policy.step(ConfigApplied(config=config("tenants: [{name: team-a, quota: {gpu: 0}}]"))), GangRejected, "a3"
    )


def test_a_gang_is_never_preempted_for_a_gang_it_was_preempted_for() -> None:
    text = "tenants: [{name: team-a}]\npriority_classes: [{name: low, value: 10}, {name: high, value: 100}]"
    policy = Policy(config(text))
    run([node("n0"), gang("y", "team-a", gpus=2, priority="low")], policy)
    assert preempted(policy.step(gang("x", "team-a", gpus=2, priority="high"))) == [("y", "x", "team-a", "priority")]
    decisions = run([GangReleased(gang_id="y"), gang("y", "team-a", gpus=2, priority="low")], policy)
    assert admitted(decisions) == ["x"]
    # the classes swap: y now outranks x, but preempting x for y would be a cycle
    swapped = "tenants: [{name: team-a}]\npriority_classes: [{name: low, value: 1000}, {name: high, value: 100}]"
    decisions = policy.step(ConfigApplied(config=config(swapped)))
    assert preempted(decisions) == []
    assert "x" in policy.running and order(policy) == ["y"]


# ---------------------------------------------------------------- reasons


def test_pending_reasons_are_in_tenant_terms_and_sent_only_when_they_change() -> None:
    text = """
        cohorts: [{name: research}]
        tenants:
          - {name: team-a, cohort: research, quota: {gpu: 2}, borrowing_limit: {gpu: 1}}
          - {name: team-b, cohort: research, quota: {gpu: 2}}
        policy: {reclaim_within_cohort: never}
    """
    policy = Policy(config(text))
    run([node("a"), node("b"), node("c")], policy)  # 6 GPUs, 4 of them in quotas
    decisions = run([gang(f"a{i}", "team-a") for i in range(1, 5)], policy)
    assert admitted(decisions) == ["a1", "a2", "a3"]
    assert only(decisions, Pending, "a4") == (
        "pending: team-a is at its quota of 2 GPUs and its borrowing limit of 1 GPU; "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    decisions = policy.step(gang("b1", "team-b", gpus=2))
    assert only(decisions, Pending, "b1") == (
        "pending: team-b is within its quota of 2 GPUs, but cohort research lent it out: waiting for it to be "
        "returned (no gang holding it may be preempted for this one); needs 2 GPUs on 1 node (2 GPUs, 1 CPU per node)"
    )
    # events after which the same things block the same gangs send nothing
    assert policy.step(node("a")) == []
    assert policy.step(Tick()) == []
    assert policy.step(gang("a-cpu", "team-a", gpus=0)) == [Admitted(placement=policy.running["a-cpu"].placement)]
    assert policy.step(GangReleased(gang_id="a4")) == []  # withdrawn: b1 is still stopped by the same thing
    # a3 leaves: team-b gets its quota back
    decisions = policy.step(GangReleased(gang_id="a3"))
    assert admitted(decisions) == ["b1"]
    assert [d for d in decisions if isinstance(d, Pending)] == []


def test_every_pending_reason_names_the_tenant_and_what_the_gang_needs() -> None:
    policy = team_a_borrows_everything()
    run([gang("a5", "team-a"), gang("a6", "team-a"), gang("b1", "team-b")], policy)
    reasons = {p["gang_id"]: p["reason"] for p in policy.describe()["pending"]}
    assert reasons["a5"].startswith("pending: team-a is at its quota of 2 GPUs and cannot borrow")
    assert reasons["a6"] == (
        "pending: queued behind earlier gangs of team-a (first in, first out); "
        "needs 1 GPU on 1 node (1 GPU, 1 CPU per node)"
    )
    assert reasons["b1"].startswith("pending: preempting 1 gang (reclaim) to make room: waiting for a4")
    assert all(reason.endswith("needs 1 GPU on 1 node (1 GPU, 1 CPU per node)") for reason in reasons.values())


# ---------------------------------------------------------------- views


def test_queues_view_has_the_documented_shape_and_units() -> None:
    policy = Policy(
        config(
            """
            cohorts: [{name: research}]
            tenants:
              - {name: team-a, cohort: research, weight: 2, quota: {gpu: 1, cpu: 4, mem: 16Gi}}
              - {name: team-b, cohort: research, quota: {gpu: 2, cpu: "500m", mem: 8Gi}}
              - {name: free}
            """
        )
    )
    run([node("a", mem=64 * GI), node("b", mem=64 * GI)], policy)
    request = GangRequest(
        gang_id="a1", nnodes=1, gpus_per_node=2, cpus_per_node=1.5, mem_per_node=4 * GI, tenant="team-a"
    )
    run([GangSubmitted(request=request), gang("a2", "team-a", gpus=2), gang("f1", "free", cpus=0.25)], policy)
    view = policy.queues()
    assert json.loads(json.dumps(view)) == view
    assert set(view) >= {"tenants"}
    for entry in view["tenants"].values():
        assert set(entry) >= {"nominal", "used", "borrowed", "lent", "pending", "share"}
        for key in ("nominal", "used", "borrowed", "lent"):
            assert set(entry[key]) == {"gpu", "cpu", "mem"}
    a, b, free = (view["tenants"][name] for name in ("team-a", "team-b", "free"))
    assert a["nominal"] == {"gpu": 1, "cpu": 4, "mem": 16 * GI}  # cpu in CPUs, mem in bytes
    assert a["used"] == {"gpu": 2, "cpu": 1.5, "mem": 4 * GI}
    assert a["borrowed"] == {"gpu": 1, "cpu": 0, "mem": 0}
    assert a["pending"] == 1
    assert a["share"] == pytest.approx(1 / 4 / 2)  # 1 GPU above quota of 4, weight 2
    assert b["nominal"] == {"gpu": 2, "cpu": 0.5, "mem": 8 * GI}
    assert b["lent"]["gpu"] == 1 and b["used"]["gpu"] == 0
    assert free["nominal"] == {"gpu": None, "cpu": None, "mem": None}  # not limited
    assert free["used"]["cpu"] == 0.25 and free["pending"] == 0


def test_describe_shows_tenants_priorities_and_who_is_being_preempted() -> None:
    text = TWO_TEAMS + "priority_classes: [{name: low, value: 10}]\n"
    policy = team_a_borrows_everything(text)
    run([gang("b1", "team-b", priority="low")], policy)
    summary = policy.describe()
    assert json.loads(json.dumps(summary)) == summary
    assert set(summary) >= {"totals", "nodes", "running", "pending", "tenants"}
    a4 = next(r for r in summary["running"] if r["gang_id"] == "a4")
    assert (a4["tenant"], a4["priority"], a4["preempting"], a4["preempted_for"]) == ("team-a", "default", True, "b1")
    (b1,) = summary["pending"]
    assert (b1["gang_id"], b1["tenant"], b1["priority"], b1["position"], b1["preempting"]) == (
        "b1",
        "team-b",
        "low",
        1,
        ["a4"],
    )
    assert summary["tenants"] == policy.queues()["tenants"]


# ---------------------------------------------------------------- bugs these tests found


def test_a_gang_within_its_quota_goes_before_a_borrower_so_nothing_is_admitted_only_to_be_reclaimed() -> None:
    policy = Policy(config(TWO_TEAMS))
    # team-a at its quota, team-b at its quota too (b1 uses CPUs, which team-b's quota does not limit: they
    # must not count in its share)
    run([*CLUSTER, gang("a1", "team-a"), gang("a2", "team-a"), gang("b1", "team-b", cpus=15)], policy)
    run([gang("b-tmp", "team-b"), gang("a3", "team-a"), gang("b2", "team-b")], policy)
    # b-tmp leaves: its GPU is team-b's own quota; a3 would borrow it, b2 is within team-b's quota
    decisions = policy.step(GangReleased(gang_id="b-tmp"))
    assert preempted(decisions) == []
    assert admitted(decisions) == ["b2"]


def test_a_config_change_that_protects_a_class_protects_its_running_gangs() -> None:
    text = "tenants: [{name: team-a}]\npriority_classes: [{name: low, value: 10}, {name: high, value: 100}]"
    policy = Policy(config(text))
    run([node("n0"), gang("l", "team-a", gpus=2, priority="low")], policy)
    protected = text.replace("value: 10}", "value: 10, preemptible: false}")
    policy.step(ConfigApplied(config=config(protected)))
    decisions = policy.step(gang("h", "team-a", gpus=2, priority="high"))
    assert preempted(decisions) == []
    assert next(r for r in policy.describe()["running"] if r["gang_id"] == "l")["preemptible"] is False


def test_a_reason_says_reclaiming_only_when_something_can_be_reclaimed() -> None:
    text = TWO_TEAMS + "priority_classes: [{name: low, value: 10}]\npolicy: {reclaim_within_cohort: lower_priority}\n"
    policy = team_a_borrows_everything(text)
    # team-a's borrowers have the same priority as b1: under lower_priority none of them may be reclaimed
    decisions = policy.step(gang("b1", "team-b"))
    assert preempted(decisions) == []
    assert "waiting for it to be returned" in only(decisions, Pending, "b1")


def test_a_gang_within_its_quota_goes_before_a_borrower_of_its_priority() -> None:
    policy = Policy(config(TWO_TEAMS + "policy: {reclaim_within_cohort: never}\n"))
    run([*CLUSTER, gang("a1", "team-a"), gang("a2", "team-a"), gang("b1", "team-b"), gang("b-tmp", "team-b")], policy)
    run([gang("a3", "team-a"), gang("b2", "team-b")], policy)  # a3 would borrow, b2 would not once b-tmp leaves
    # one of team-b's GPUs comes free: it is team-b's own quota, not idle capacity for team-a to borrow
    assert admitted(policy.step(GangReleased(gang_id="b-tmp"))) == ["b2"]


def test_a_gang_that_never_fits_its_quota_is_rejected_even_when_another_resource_stops_it_first() -> None:
    policy = Policy(
        config(
            """
            cohorts: [{name: research}]
            tenants:
              - {name: team-a, cohort: research, quota: {gpu: 2, cpu: 4}}
              - {name: team-b, cohort: research, quota: {gpu: 2}}
            """
        )
    )
    run([node("a"), node("b"), node("c"), gang("a1", "team-a", gpus=2), gang("a2", "team-a", gpus=2)], policy)
    # 6 CPUs: more than the 4 team-a may ever hold; its GPUs, all borrowed now, stop it first
    decisions = policy.step(gang("wide", "team-a", nnodes=3, cpus=2))
    assert "more than tenant team-a may ever hold (4 CPUs" in only(decisions, GangRejected, "wide")
    for decision in run([GangReleased(gang_id="a1"), GangReleased(gang_id="a2")], policy):
        assert not isinstance(decision, Pending) or decision.reason.startswith("pending: "), decision


def scheduler_ticks(policy: Policy, now: float, until: float) -> list[Decision]:
    """What the Scheduler workflow does between events: a Tick whenever next_deadline has passed."""
    decisions: list[Decision] = []
    for _ in range(50):
        deadline = policy.next_deadline()
        if deadline is None or deadline > until:
            return decisions
        now = max(now, deadline)
        decisions += policy.step(Tick(), now)
    raise AssertionError(f"still ticking at {now}: next_deadline() does not move")


def test_a_gang_whose_search_was_put_off_is_woken_up_when_its_victim_comes_of_age() -> None:
    config_text = """
        tenants: [{name: team-q, quota: {gpu: 1}}, {name: team-a}]
        priority_classes: [{name: high, value: 100}]
        policy: {min_runtime: 60}
    """
    policy = Policy(config(config_text), node_ttl_s=1e6)
    run(
        [node("n0", gpus=2), node("n1", gpus=1), gang("q1", "team-q", preemptible=False), gang("e1", "team-a")],
        policy,
        0,
    )
    run([gang("q2", "team-q", priority="high")], policy, now=5.0)  # stopped by team-q's quota; first in order
    run([gang("big", "team-a", gpus=2)], policy, now=10.0)  # waits for e1
    run([gang("small", "team-a")], policy, now=20.0)  # backfills next to e1
    # e1 leaves: big could start once small, backfilled at 20, has run for min_runtime
    run([GangReleased(gang_id="e1")], policy, now=30.0)
    decisions = scheduler_ticks(policy, 30.0, until=100.0)
    assert preempted(decisions) == [("small", "big", "team-a", "backfill")]
