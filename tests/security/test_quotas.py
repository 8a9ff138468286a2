"""Attack 6 of issue 20, quotas held hostage: what team-a tries, through the real scheduling policy, and
what stops it.

team-a borrows team-b's idle GPUs so that team-b, back for its own nominal quota, waits indefinitely: with
``preemptible=False`` gangs, with a priority class that is not preemptible (``high`` in
examples/queues.yaml) or of a higher value, by resubmitting borrowers as fast as the reclaim frees GPUs,
or by flooding the queue. Each attempt must fail: team-b's gang starts within ``min_runtime`` +
``preemption_grace``. The policy is pure (``engine.scheduling``), so it is driven directly in simulated
time, with the cluster's own queue file; the CLI's refusal of a class a tenant may not use, on a real
stack, is in tests/test_tenancy_e2e.py.
"""

from __future__ import annotations

from typing import Any

from conftest import ROOT

from engine.scheduling import (
    Admitted,
    Decision,
    GangRejected,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeRegistered,
    NodeSpec,
    Pending,
    Policy,
    Preempted,
    QueueConfig,
    Tick,
    dump_queue_config,
    load_queue_config,
)

#: the queue file the dev stack of the issue ran: team-a and team-b, 2 GPUs of quota each, one cohort
QUEUES = load_queue_config(ROOT / "examples" / "queues.yaml")
MIN_RUNTIME, GRACE = QUEUES.policy.min_runtime, QUEUES.policy.preemption_grace
BOUND = MIN_RUNTIME + GRACE


def cluster(config: QueueConfig = QUEUES) -> Policy:
    """`gangflow dev --nodes 2 --gpus-per-node 2` under ``config``."""
    policy = Policy(config, node_ttl_s=1e12)
    for node_id in ("node-0", "node-1"):
        policy.step(NodeRegistered(spec=NodeSpec(node_id=node_id, address="-", gpus=2, cpus=16)), 0.0)
    return policy


def submit(policy: Policy, gang_id: str, tenant: str, now: float, **fields: Any) -> list[Decision]:
    fields.setdefault("nnodes", 1)
    fields.setdefault("gpus_per_node", 1)
    return policy.step(GangSubmitted(request=GangRequest(gang_id=gang_id, tenant=tenant, **fields)), now)


def admitted(decisions: list[Decision]) -> list[str]:
    return [d.gang_id for d in decisions if isinstance(d, Admitted)]


def reason(decisions: list[Decision], kind: type[Pending] | type[GangRejected], gang_id: str) -> str:
    (text,) = [d.reason for d in decisions if isinstance(d, kind) and d.gang_id == gang_id]
    return text


def reclaim(policy: Policy, gang_id: str, now: float, *, churn: bool = False) -> float:
    """team-b asks for its 2 GPUs at ``now``; team-a's gangs leave only at the end of their grace, come back at
    once, and (``churn``) team-a submits a new borrower with every GPU that comes free. Returns when team-b's
    gang started."""
    decisions = submit(policy, gang_id, "team-b", now, gpus_per_node=2)
    leaving: dict[str, tuple[float, GangRequest]] = {}
    extra = 0
    while gang_id not in policy.running:
        for d in decisions:
            if isinstance(d, Preempted):
                leaving[d.gang_id] = (now + d.grace_s, policy.running[d.gang_id].request)
        deadline = policy.next_deadline()
        times = [t for t, _ in leaving.values()] + ([deadline] if deadline is not None and deadline < 1e12 else [])
        assert times, f"{gang_id} waits for nothing that will ever happen: {policy.pending[gang_id].reason}"
        now = max(now, min(times))
        assert now <= BOUND + 1e9, "runaway"
        decisions = policy.step(Tick(), now)
        for victim, (at, request) in sorted(leaving.items()):
            if at <= now:
                del leaving[victim]
                decisions += policy.step(GangReleased(gang_id=victim), now)
                decisions += policy.step(GangSubmitted(request=request), now)  # its GangRun asks again
                if churn:
                    extra += 1
                    decisions += submit(policy, f"churn-{extra}", "team-a", now)
    return now


# ---------------------------------------------------------------- borrowing with gangs that cannot be preempted


def test_team_a_cannot_borrow_team_bs_gpus_with_preemptible_false_gangs() -> None:
    policy = cluster()
    decisions: list[Decision] = []
    for i in range(4):
        decisions += submit(policy, f"a{i}", "team-a", 0.0, preemptible=False)
    assert admitted(decisions) == ["a0", "a1"]  # its own 2 GPUs; team-b's idle ones are not lent to them
    assert "only preemptible gangs may borrow beyond the nominal quota" in policy.pending["a2"].reason
    # team-b's GPUs stayed idle for team-b: its gang starts at once
    assert admitted(submit(policy, "b0", "team-b", 1.0, gpus_per_node=2)) == ["b0"]


def test_team_a_cannot_borrow_with_a_class_that_is_not_preemptible() -> None:
    assert not QUEUES.priority("high").preemptible
    policy = cluster()
    decisions: list[Decision] = []
    for i in range(4):
        decisions += submit(policy, f"h{i}", "team-a", 0.0, priority="high")
    assert admitted(decisions) == ["h0", "h1"]
    assert admitted(submit(policy, "b0", "team-b", 1.0, gpus_per_node=2)) == ["b0"]
    # nor by asking for more than its quota in one protected gang: refused at once, not parked
    decisions = submit(policy, "big", "team-a", 2.0, nnodes=2, gpus_per_node=2, priority="high")
    assert reason(decisions, GangRejected, "big").startswith("rejected: needs 4 GPUs on 2 nodes")
    assert "the gang is not preemptible: only preemptible gangs may borrow" in reason(decisions, GangRejected, "big")


def test_a_higher_preemptible_class_does_not_keep_lent_gpus_past_the_bound() -> None:
    # the operator gives team-a a preemptible class far above team-b's: a class buys order within team-a, and
    # no claim on what team-b lent (reclaim_within_cohort: any, the example's and the default)
    data = dump_queue_config(QUEUES)
    data["priority_classes"].append({"name": "top", "value": 1000, "preemptible": True})
    policy = cluster(load_queue_config(data))
    decisions: list[Decision] = []
    for i in range(4):
        decisions += submit(policy, f"t{i}", "team-a", 0.0, priority="top")
    assert len(admitted(decisions)) == 4  # team-a borrows team-b's 2 idle GPUs
    started = reclaim(policy, "b0", 1.0)
    assert started - 1.0 <= BOUND, started


def test_resubmitting_borrowers_as_the_reclaim_frees_gpus_does_not_keep_team_b_out() -> None:
    policy = cluster()
    decisions: list[Decision] = []
    for i in range(4):
        decisions += submit(policy, f"a{i}", "team-a", 0.0)  # preemptible: they may borrow
    assert len(admitted(decisions)) == 4
    started = reclaim(policy, "b0", 1.0, churn=True)
    assert started - 1.0 <= BOUND, started
    # what team-b reclaimed is team-b's: team-a's resubmitted gangs wait, saying why
    waiting = [q.reason for q in policy.pending.values() if q.request.tenant == "team-a"]
    assert waiting and all(r.startswith(("pending: team-a is at its quota", "pending: queued behind")) for r in waiting)


# ---------------------------------------------------------------- classes a tenant may not use, flooding


def test_a_priority_class_team_a_may_not_use_is_refused() -> None:
    data = dump_queue_config(QUEUES)
    data["tenants"][0]["priority_classes"] = ["low"]
    policy = cluster(load_queue_config(data))
    decisions = submit(policy, "h", "team-a", 0.0, priority="high")
    assert reason(decisions, GangRejected, "h") == (
        "rejected: tenant team-a may not use priority class 'high' (its priority classes: low)"
    )
    assert not policy.running and not policy.pending


def test_flooding_the_queue_is_refused_beyond_max_pending() -> None:
    policy = cluster()
    for i in range(4):
        submit(policy, f"fill{i}", "team-b", 0.0)  # the cluster is full: team-a's gangs below all wait
    cap = QUEUES.max_pending("team-a")
    assert cap == 1000  # the default
    rejected = []
    for i in range(cap + 1):
        rejected += [d for d in submit(policy, f"a{i}", "team-a", 1.0) if isinstance(d, GangRejected)]
    assert [d.gang_id for d in rejected] == [f"a{cap}"]
    assert rejected[0].reason.startswith("rejected: tenant team-a already has 1000 gangs waiting, its cap")
    # team-b, a tenant of its own, is not held up by team-a's flood
    assert not [d for d in submit(policy, "b-next", "team-b", 2.0) if isinstance(d, GangRejected)]
