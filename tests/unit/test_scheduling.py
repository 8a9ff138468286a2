"""Scheduling policy with one tenant: all-or-nothing admission, backfill, best-fit placement, nodes, reasons.

Plain Python: the policy is pure, so these drive ``Policy.step`` directly, without Temporal. With no queue
configuration there is one tenant ("default") without quota; tenants, quotas and preemption across
tenants are in ``test_scheduling_tenants.py``, random event streams in ``test_scheduling_properties.py``.
"""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from scheduling_builders import admitted, gang, gpus_of, node, node_view, only, order, run_last

import engine.scheduling
from engine.scheduling import (
    Admitted,
    ConfigApplied,
    Decision,
    Event,
    GangRejected,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    Pending,
    Policy,
    Preempted,
    Tick,
    load_queue_config,
)

# the nodes of these tests have 4 GPUs and 8 CPUs unless they say otherwise; their gangs ask for what they say
TWO_NODES = [node("a", gpus=2, cpus=8), node("b", gpus=2, cpus=8)]

# ---------------------------------------------------------------- admission


def test_admission_is_all_or_nothing() -> None:
    policy, _ = run_last([*TWO_NODES, gang("one", gpus=1)])
    decisions = policy.step(gang("pair", nnodes=2, gpus=2))
    # one node has room for its share, the other does not: nothing is taken at all
    assert admitted(decisions) == []
    assert "pair" not in policy.running
    assert order(policy) == ["pair"]
    assert node_view(policy, "b")["free_gpu_ids"] == [0, 1]
    only(decisions, Pending, "pair")


def test_gangs_that_each_need_the_whole_cluster_never_overlap() -> None:
    policy, first = run_last([*TWO_NODES, gang("x", nnodes=2, gpus=2)])
    assert admitted(first) == ["x"]
    second = policy.step(gang("y", nnodes=2, gpus=2))
    assert admitted(second) == []
    assert order(policy) == ["y"]
    after = policy.step(GangReleased(gang_id="x"))
    assert admitted(after) == ["y"]
    assert list(policy.running) == ["y"]
    assert gpus_of(policy, "y") == {"a": (0, 1), "b": (0, 1)}
    assert order(policy) == []


def test_a_small_gang_backfills_preemptibly_while_a_big_gang_waits() -> None:
    policy, _ = run_last([*TWO_NODES, gang("one", gpus=1), gang("big", nnodes=2, gpus=2)])
    assert "smaller gangs may use the idle GPUs meanwhile, preemptibly" in policy.pending["big"].reason
    decisions = policy.step(gang("tiny", gpus=1))
    # idle GPUs are used: tiny starts behind big, but only as backfill
    assert admitted(decisions) == ["tiny"]
    assert order(policy) == ["big"]
    view = next(r for r in policy.describe()["running"] if r["gang_id"] == "tiny")
    assert view["backfill"] is True and view["preemptible"] is True
    assert next(r for r in policy.describe()["running"] if r["gang_id"] == "one")["backfill"] is False
    # big could start but for tiny: tiny is preempted for it, and nothing new starts meanwhile
    decisions = policy.step(GangReleased(gang_id="one"))
    preempted = [d for d in decisions if isinstance(d, Preempted)]
    assert [(d.gang_id, d.by, d.by_tenant, d.cause) for d in preempted] == [("tiny", "big", "default", "backfill")]
    assert preempted[0].grace_s == 120.0
    assert "to make room for gang 'big' of default" in preempted[0].reason
    assert only(decisions, Pending, "big") == (
        "pending: preempting 1 gang (backfill) to make room: waiting for tiny to release; "
        "needs 4 GPUs on 2 nodes (2 GPUs, 1 CPU per node)"
    )
    # the GPUs freed for big are not backfilled again meanwhile
    decisions = policy.step(gang("late", gpus=1))
    assert admitted(decisions) == [] and order(policy) == ["big", "late"]
    # once tiny has left, big gets the whole cluster
    decisions = policy.step(GangReleased(gang_id="tiny"))
    assert admitted(decisions) == ["big"]
    assert gpus_of(policy, "big") == {"a": (0, 1), "b": (0, 1)}
    assert "late" in policy.pending


def test_without_backfill_a_small_gang_waits_behind_a_big_one() -> None:
    config = load_queue_config({"tenants": [{"name": "default"}], "policy": {"backfill": False}})
    policy, _ = run_last([*TWO_NODES, gang("one", gpus=1), gang("big", nnodes=2, gpus=2)], Policy(config))
    assert "smaller gangs may use" not in policy.pending["big"].reason
    decisions = policy.step(gang("tiny", gpus=1))
    assert admitted(decisions) == []
    assert order(policy) == ["big", "tiny"]
    assert only(decisions, Pending, "tiny") == (
        "pending: behind gang 'big' of default, which goes first (within its quota before borrowing, then "
        "priority, then fair share, then submission order) and waits for capacity; needs 1 GPU on 1 node "
        "(1 GPU, 1 CPU per node)"
    )
    assert admitted(policy.step(GangReleased(gang_id="one"))) == ["big"]


def test_a_gang_that_is_not_preemptible_does_not_backfill() -> None:
    policy, _ = run_last([*TWO_NODES, gang("one", gpus=1), gang("big", nnodes=2, gpus=2)])
    decisions = policy.step(gang("precious", gpus=1, preemptible=False))
    assert admitted(decisions) == []
    assert "(this gang is not preemptible, so it does not backfill)" in only(decisions, Pending, "precious")
    # a CPU-only gang of another shape still backfills
    assert admitted(policy.step(gang("cpu-only", gpus=0, cpus=1))) == ["cpu-only"]


def test_admission_repeats_while_the_next_gang_fits() -> None:
    policy, _ = run_last(
        [*TWO_NODES, gang("all", nnodes=2, gpus=2), gang("p", gpus=1), gang("q", gpus=2), gang("r", gpus=2)]
    )
    assert order(policy) == ["p", "q", "r"]
    decisions = policy.step(GangReleased(gang_id="all"))
    # p and q fit together (p on a, q on b); r does not fit any more and is told why
    assert admitted(decisions) == ["p", "q"]
    assert order(policy) == ["r"]
    assert only(decisions, Pending, "r").startswith("pending: waiting for capacity: needs 2 GPUs on 1 node")


def test_released_pending_request_leaves_the_queue_and_unknown_release_is_a_noop() -> None:
    policy, _ = run_last([*TWO_NODES, gang("x", nnodes=2, gpus=2), gang("y", gpus=1), gang("z", gpus=1)])
    assert order(policy) == ["y", "z"]
    assert policy.pending["z"].reason == (
        "pending: queued behind earlier gangs of default (first in, first out); needs 1 GPU on 1 node "
        "(1 GPU, 1 CPU per node)"
    )
    decisions = policy.step(GangReleased(gang_id="y"))
    assert order(policy) == ["z"]
    assert "x" in policy.running
    # z is now first of its kind: its reason changed, so it is told why it still waits
    assert only(decisions, Pending, "z").startswith("pending: waiting for capacity: needs 1 GPU on 1 node")
    before = policy.snapshot()
    assert policy.step(GangReleased(gang_id="never-seen")) == []
    assert policy.snapshot() == before


def test_duplicate_gang_id_is_rejected_and_the_original_is_untouched() -> None:
    policy, _ = run_last([*TWO_NODES, gang("x", nnodes=2, gpus=2), gang("y", gpus=1)])
    before = policy.snapshot()
    decisions = policy.step(gang("x", gpus=1))
    assert only(decisions, GangRejected, "x") == (
        "rejected: gang id 'x' is already running; release it before submitting it again"
    )
    decisions = policy.step(gang("y", gpus=0))
    assert only(decisions, GangRejected, "y") == "rejected: gang id 'y' is already queued"
    assert policy.snapshot() == before


def test_malformed_requests_are_rejected_with_what_is_wrong() -> None:
    policy, decisions = run_last([*TWO_NODES, gang("bad", nnodes=0, gpus=-1, cpus=-0.5, mem=-1)])
    reason = only(decisions, GangRejected, "bad")
    assert reason.startswith("rejected: malformed request: ")
    assert "nnodes must be at least 1, got 0" in reason
    assert "gpus_per_node must not be negative, got -1" in reason
    assert "cpus_per_node must not be negative, got -0.5" in reason
    assert "mem_per_node must not be negative, got -1" in reason
    decisions = policy.step(gang("", gpus=1))
    assert "gang_id is empty" in only(decisions, GangRejected, "")
    assert policy.pending == {} and policy.running == {}


def test_a_gang_larger_than_every_registered_node_waits_for_one_to_register() -> None:
    """Kueue keeps a workload no flavor fits pending; so does gangflow: the cluster may be coming up (the first
    seconds of ``gangflow dev --nodes 2``), or a node pool scaling out. Bounded by its ``lost_node_wait_s``."""
    policy, decisions = run_last([*TWO_NODES, gang("wide", nnodes=3, gpus=1)], now=0.0)
    assert only(decisions, Pending, "wide") == (
        "pending: needs 3 GPUs on 3 nodes (1 GPU, 1 CPU per node); only 2 of 2 alive nodes are that big even when "
        "idle (largest: 2 GPUs, 8 CPUs): waiting up to 600 s for a node that can hold it to register (gangs "
        "behind it may start meanwhile)"
    )
    # it holds up nobody: a gang behind it that fits starts at once
    assert admitted(policy.step(gang("solo", gpus=1), now=1.0)) == ["solo"] and order(policy) == ["wide"]
    # a third node registers: the wide gang starts
    assert admitted(policy.step(node("c", gpus=2, cpus=8), now=2.0)) == ["wide"]


def test_a_gang_submitted_before_any_node_registers_starts_when_one_does() -> None:
    policy, decisions = run_last([gang("early", gpus=1)], now=0.0)
    assert only(decisions, Pending, "early").startswith(
        "pending: needs 1 GPU on 1 node (1 GPU, 1 CPU per node); no alive node is registered: waiting up to 600 s"
    )
    assert admitted(policy.step(node("a", gpus=2, cpus=8), now=15.0)) == ["early"]


def test_a_gang_no_node_ever_holds_is_rejected_after_its_wait() -> None:
    request = GangRequest(gang_id="fat", nnodes=1, gpus_per_node=8, lost_node_wait_s=30)
    policy, _ = run_last([*TWO_NODES, GangSubmitted(request=request)], Policy(node_ttl_s=1000), now=0.0)
    assert policy.next_deadline() == 30.0
    assert policy.step(Tick(), now=29.0) == []
    assert only(policy.step(Tick(), now=30.0), GangRejected, "fat") == (
        "unschedulable: needs 8 GPUs on 1 node (8 GPUs, 1 CPU per node); only 0 of 2 alive nodes are that big even "
        "when idle (largest: 2 GPUs, 8 CPUs); no node that can hold it registered within 30 s"
    )
    assert policy.pending == {}


def test_schedulers_recorded_before_node_waits_reject_at_once() -> None:
    """``wait_for_nodes=False``: what a Scheduler whose history predates the wait decides (workflows/scheduler.py
    sets it from ``workflow.patched``), so its replay makes the same decisions."""
    policy = Policy()
    policy.wait_for_nodes = False
    _, decisions = run_last([*TWO_NODES, gang("wide", nnodes=3, gpus=1)], policy)
    assert only(decisions, GangRejected, "wide") == (
        "rejected: needs 3 GPUs on 3 nodes (1 GPU, 1 CPU per node); "
        "only 2 of 2 alive nodes are that big even when idle (largest: 2 GPUs, 8 CPUs)"
    )
    old = Policy()
    old.wait_for_nodes = False
    _, decisions = run_last([gang("early", gpus=1)], old)
    assert only(decisions, GangRejected, "early") == (
        "rejected: needs 1 GPU on 1 node (1 GPU, 1 CPU per node); no alive node is registered"
    )


def test_a_gang_that_needs_lost_nodes_waits_for_them_without_blocking_the_queue() -> None:
    # a whole-cluster restart: the nodes are lost, not gone; a gang that needs them waits (bounded)
    policy, decisions = run_last([*TWO_NODES, NodeLost(node_id="b"), gang("pair", nnodes=2, gpus=1)], now=100.0)
    assert not [d for d in decisions if isinstance(d, GangRejected)]
    assert "waiting for lost node b to come back (up to 600 s" in only(decisions, Pending, "pair")
    assert policy.pending["pair"].lost_wait_since == 100.0
    # it does not hold the queue: a gang behind it that fits starts at once
    decisions = policy.step(gang("solo", gpus=1), now=101.0)
    assert admitted(decisions) == ["solo"] and order(policy) == ["pair"]
    # b registers again: the pair starts on the capacity left
    decisions = policy.step(node("b", gpus=2, cpus=8), now=102.0)
    assert admitted(decisions) == ["pair"]


def test_a_gang_waiting_for_lost_nodes_is_rejected_after_its_wait() -> None:
    request = GangRequest(gang_id="pair", nnodes=2, gpus_per_node=1, lost_node_wait_s=30)
    events: list[Event] = [*TWO_NODES, NodeLost(node_id="b"), GangSubmitted(request=request)]
    policy, _ = run_last(events, Policy(node_ttl_s=1000), now=0.0)
    assert policy.next_deadline() == 30.0  # the Scheduler wakes up then (a expires at 1000; b, lost, never)
    decisions = policy.step(Tick(), now=29.0)
    assert decisions == [] and order(policy) == ["pair"]
    decisions = policy.step(Tick(), now=30.0)
    assert only(decisions, GangRejected, "pair") == (
        "unschedulable: needs 2 GPUs on 2 nodes (1 GPU, 1 CPU per node); waited 30 s for lost node b to come "
        "back, and they did not"
    )
    assert policy.pending == {}
    assert policy.next_deadline() == 1000.0


def test_the_wait_for_a_node_counts_lost_nodes_and_says_so() -> None:
    _, decisions = run_last([*TWO_NODES, NodeLost(node_id="b"), gang("triple", nnodes=3, gpus=1)])
    reason = only(decisions, Pending, "triple")
    assert "only 2 of 2 registered nodes (1 of them lost) are that big even when idle" in reason


def test_a_node_that_stops_registering_expires_even_when_idle() -> None:
    policy, _ = run_last([node("a", gpus=2, cpus=8)], now=0.0)
    run_last([node("b", gpus=2, cpus=8)], policy, now=10.0)
    assert policy.next_deadline() == 20.0  # a's registration expires first (ttl 20 s)
    policy.step(Tick(), now=20.0)
    assert node_view(policy, "a")["alive"]  # exactly at the ttl: not yet
    policy.step(Tick(), now=20.5)
    assert not node_view(policy, "a")["alive"] and node_view(policy, "b")["alive"]
    assert policy.next_deadline() == 30.0
    policy.step(node("a", gpus=2, cpus=8), now=21.0)  # re-registration revives it
    assert node_view(policy, "a")["alive"] and policy.inventory.nodes["a"].last_seen == 21.0


def leased(node_id: str, *, sandboxed: bool = False) -> NodeRegistered:
    spec = NodeSpec(node_id=node_id, address=f"{node_id}.local", gpus=2, cpus=8, sandboxed=sandboxed, leased=True)
    return NodeRegistered(spec=spec)


def test_a_leased_node_never_expires_only_its_lease_reports_it_lost() -> None:
    # its agent heartbeats a lease instead of re-registering (workflows.node_lease): no deadline to miss
    policy, _ = run_last([leased("a"), node("b", gpus=2, cpus=8)], now=0.0)
    assert policy.next_deadline() == 20.0  # b's, the unleased one's
    policy.step(Tick(), now=3600.0)
    assert node_view(policy, "a")["alive"] and not node_view(policy, "b")["alive"]
    assert policy.next_deadline() is None
    policy.step(NodeLost(node_id="a"), now=3601.0)  # the lease ended
    assert not node_view(policy, "a")["alive"]
    policy.step(leased("a"), now=3700.0)  # a new lease registers it again
    assert node_view(policy, "a")["alive"] and policy.next_deadline() is None


def test_a_snapshot_keeps_whether_a_node_is_leased_and_sandboxed() -> None:
    # a leased node never registers again after a continue-as-new: what it said must survive the snapshot
    policy, _ = run_last([leased("a", sandboxed=True), node("b")], now=0.0)
    restored = Policy.restore(json.loads(json.dumps(policy.snapshot())))
    assert restored.inventory.nodes["a"].spec == policy.inventory.nodes["a"].spec
    assert restored.inventory.nodes["a"].spec.leased and restored.inventory.nodes["a"].spec.sandboxed
    assert not restored.inventory.nodes["b"].spec.leased
    restored.step(Tick(), now=3600.0)
    assert node_view(restored, "a")["alive"]


def test_a_snapshot_from_before_leases_restores_its_nodes_unleased() -> None:
    policy, _ = run_last([node("a")], now=0.0)
    snapshot = policy.snapshot()
    data = json.loads(zlib.decompress(base64.b64decode(snapshot["zlib"])))
    data["nodes"] = [row[:9] for row in data["nodes"]]  # the rows ended at the drain reason then
    blob = base64.b64encode(zlib.compress(json.dumps(data).encode())).decode()
    restored = Policy.restore({**snapshot, "zlib": blob})
    assert restored.inventory.nodes["a"].spec == policy.inventory.nodes["a"].spec


def test_without_a_clock_nothing_expires() -> None:
    # unit tests of the pure rules pass no ``now``: no deadline fires
    policy, _ = run_last([node("a", gpus=2, cpus=8)], now=0.0)
    policy.step(Tick())
    policy.step(Tick())
    assert node_view(policy, "a")["alive"]


# ---------------------------------------------------------------- placement


def test_placement_packs_onto_the_fullest_node_and_takes_the_lowest_gpu_ids() -> None:
    policy, _ = run_last([node("a", gpus=4, cpus=8), node("b", gpus=4, cpus=8), gang("first", gpus=2)])
    assert gpus_of(policy, "first") == {"a": (0, 1)}  # a tie: the lowest node id
    policy.step(gang("second", gpus=1))
    assert gpus_of(policy, "second") == {"a": (2,)}  # a has fewer GPUs free than b: pack it
    policy.step(GangReleased(gang_id="first"))
    policy.step(gang("third", gpus=2))
    assert gpus_of(policy, "third") == {"a": (0, 1)}  # the lowest free ids, reusing the released ones
    policy.step(gang("fourth", gpus=2))
    assert gpus_of(policy, "fourth") == {"b": (0, 1)}


def test_placement_ties_on_gpus_break_by_fewer_free_cpus() -> None:
    policy, _ = run_last([node("a", gpus=2, cpus=16), node("b", gpus=2, cpus=4), gang("cpu", gpus=0, nnodes=1, cpus=2)])
    # a CPU-only gang: both nodes have 2 GPUs free, b has fewer CPUs free
    assert gpus_of(policy, "cpu") == {"b": ()}


def test_node_ranks_follow_node_id_order_and_carry_addresses() -> None:
    _, decisions = run_last(
        [node("c", gpus=4, cpus=8), node("a", gpus=4, cpus=8), node("b", gpus=4, cpus=8), gang("g", nnodes=3, gpus=1)]
    )
    placement = next(d for d in decisions if isinstance(d, Admitted)).placement
    assert [(a.node_id, a.node_rank, a.address) for a in placement.nodes] == [
        ("a", 0, "a.local"),
        ("b", 1, "b.local"),
        ("c", 2, "c.local"),
    ]


def test_cpus_are_accounted_exactly_in_millicores() -> None:
    # with float sums 0.1 + 0.2 > 0.3 and the second gang would never fit
    policy, decisions = run_last([node("a", gpus=0, cpus=0.3), gang("p", gpus=0, cpus=0.1)])
    decisions = policy.step(gang("q", gpus=0, cpus=0.2))
    assert admitted(decisions) == ["q"]
    decisions = policy.step(gang("r", gpus=0, cpus=0.1))
    assert admitted(decisions) == []
    assert node_view(policy, "a")["cpus_free"] == 0


def test_memory_is_checked_where_nodes_report_it() -> None:
    gib = 2**30
    policy, decisions = run_last(
        [node("a", gpus=4, cpus=8, mem=8 * gib), gang("m", gpus=0, mem=6 * gib), gang("n", gpus=0, mem=4 * gib)]
    )
    assert admitted(decisions) == []
    assert only(decisions, Pending, "n").startswith(
        "pending: waiting for capacity: needs 1 node (1 CPU, 4 GiB per node); no node has 1 CPU, 4 GiB free"
    )
    assert node_view(policy, "a")["mem_free"] == 2 * gib
    # a node that does not report memory is not limited by it
    decisions = policy.step(node("b", gpus=4, cpus=8, mem=None))
    assert admitted(decisions) == ["n"]


def test_placement_what_if_ignores_the_queue() -> None:
    policy, _ = run_last([*TWO_NODES, gang("x", gpus=1)])
    placement = policy.inventory.place(GangRequest(gang_id="w", nnodes=2, gpus_per_node=1))
    assert placement is not None
    assert [(a.node_id, a.gpu_ids) for a in placement.nodes] == [("a", (1,)), ("b", (0,))]
    assert policy.inventory.place(GangRequest(gang_id="w", nnodes=2, gpus_per_node=2)) is None
    assert "w" not in policy.running


# ---------------------------------------------------------------- nodes coming and going


def test_lost_node_is_not_offered_keeps_its_allocations_and_comes_back_on_registration() -> None:
    policy, _ = run_last([*TWO_NODES, gang("big", gpus=2), gang("small", gpus=1)])
    assert gpus_of(policy, "big") == {"a": (0, 1)}
    assert gpus_of(policy, "small") == {"b": (0,)}
    policy.step(NodeLost(node_id="b"))
    assert node_view(policy, "b")["alive"] is False
    # b still has GPU 1 free, but a lost node offers nothing
    decisions = policy.step(gang("wants-1", gpus=1))
    assert admitted(decisions) == []
    assert node_view(policy, "b")["free_gpu_ids"] == []
    assert only(decisions, Pending, "wants-1").startswith("pending: waiting for capacity: needs 1 GPU on 1 node")
    # allocations on a lost node stay until their gang releases them
    decisions = policy.step(NodeLost(node_id="a"))
    assert set(policy.running) == {"big", "small"}
    # no alive node could hold it now: it waits for the lost ones instead
    assert "waiting for lost nodes a, b to come back" in only(decisions, Pending, "wants-1")
    decisions = policy.step(node("b", gpus=2, cpus=8))
    assert node_view(policy, "b")["alive"] is True
    assert admitted(decisions) == ["wants-1"]
    assert gpus_of(policy, "wants-1") == {"b": (1,)}  # GPU 0 is still small's
    decisions = policy.step(node("a", gpus=2, cpus=8))
    assert decisions == []
    assert node_view(policy, "a")["used_gpu_ids"] == [0, 1]
    policy.step(GangReleased(gang_id="big"))
    assert node_view(policy, "a")["free_gpu_ids"] == [0, 1]


def test_node_lost_for_an_unknown_node_is_a_noop() -> None:
    policy, _ = run_last(TWO_NODES)
    before = policy.snapshot()
    assert policy.step(NodeLost(node_id="zzz")) == []
    assert policy.snapshot() == before


def test_reregistration_updates_capacity_and_address() -> None:
    policy, decisions = run_last([node("a", gpus=1, cpus=8), gang("g", gpus=2, nnodes=1)])
    assert "only 0 of 1 alive node" in only(decisions, Pending, "g")  # a has only 1 GPU
    policy, _ = run_last(
        [node("a", gpus=4, cpus=8), NodeRegistered(spec=NodeSpec(node_id="a", address="new", gpus=8, cpus=1))]
    )
    view = node_view(policy, "a")
    assert (view["address"], view["gpus_total"], view["cpus_total"]) == ("new", 8, 1.0)


def test_a_node_that_shrinks_keeps_the_allocations_it_had() -> None:
    policy, _ = run_last([node("a", gpus=4, cpus=8), gang("g", gpus=3)])
    assert gpus_of(policy, "g") == {"a": (0, 1, 2)}
    policy.step(node("a", gpus=2, cpus=8))
    assert "g" in policy.running and node_view(policy, "a")["free_gpu_ids"] == []
    decisions = policy.step(gang("h", gpus=1))
    assert admitted(decisions) == []
    policy.step(GangReleased(gang_id="g"))
    assert gpus_of(policy, "h") == {"a": (0,)}


# ---------------------------------------------------------------- reasons, snapshot, serialization


def test_pending_reason_says_what_is_needed_and_is_sent_only_when_it_changes() -> None:
    policy, _ = run_last([*TWO_NODES, gang("one", gpus=1)])
    decisions = policy.step(gang("pair", nnodes=2, gpus=2))
    reason = only(decisions, Pending, "pair")
    assert reason == (
        "pending: waiting for capacity: needs 4 GPUs on 2 nodes (2 GPUs, 1 CPU per node); fewer than 2 nodes have "
        "2 GPUs, 1 CPU free (smaller gangs may use the idle GPUs meanwhile, preemptibly, until this gang fits)"
    )
    assert policy.describe()["pending"][0]["reason"] == reason
    # Pending is sent when the reason changes, not again for an event that changes nothing for it
    assert policy.step(NodeLost(node_id="nope")) == []
    assert admitted(policy.step(gang("other", gpus=1))) == ["other"]
    assert policy.step(node("c", gpus=1, cpus=8)) == []
    decisions = policy.step(NodeLost(node_id="b"))
    changed = only(decisions, Pending, "pair")
    assert "only 2 alive nodes are big enough" not in changed
    assert "waiting for lost node b to come back" in changed


def test_cpu_only_pending_reason() -> None:
    _, decisions = run_last([node("a", gpus=0, cpus=2), gang("x", gpus=0, cpus=1.5), gang("y", gpus=0, cpus=1)])
    assert only(decisions, Pending, "y").startswith(
        "pending: waiting for capacity: needs 1 node (1 CPU per node); no node has 1 CPU free"
    )


def test_reasons_never_carry_a_queue_position() -> None:
    policy, _ = run_last([*TWO_NODES, gang("x", nnodes=2, gpus=2)])
    reasons = []
    for i in range(6):
        reasons += [d.reason for d in policy.step(gang(f"g{i}", gpus=1 + i % 2)) if isinstance(d, Pending)]
    for text in reasons:
        assert "position" not in text and "ahead" not in text, text
    assert [p["position"] for p in policy.describe()["pending"]] == [1, 2, 3, 4, 5, 6]


def events_for_snapshot() -> tuple[list[Event], list[Event]]:
    before: list[Event] = [
        *TWO_NODES,
        node("m", gpus=0, cpus=0.75, mem=3 * 2**30),
        node("c", gpus=2, cpus=8),
        gang("x", nnodes=2, gpus=1, cpus=0.25),
        gang("y", nnodes=3, gpus=2),
        gang("z", gpus=0, cpus=0.5, mem=2**30),
        gang("w", gpus=1),
        NodeLost(node_id="c"),
        gang("v", nnodes=3, gpus=1, lost_node_wait_s=50),
    ]
    after: list[Event] = [
        GangReleased(gang_id="x"),
        gang("u", gpus=1),
        Tick(),
        node("c", gpus=2, cpus=8),
        GangReleased(gang_id="w"),
        gang("t", gpus=2),
        GangReleased(gang_id="u"),
        GangReleased(gang_id="y"),
        Tick(),
    ]
    return before, after


def test_restore_of_a_snapshot_decides_exactly_like_the_original() -> None:
    before, after = events_for_snapshot()
    original, _ = run_last(before, Policy(node_ttl_s=1000), now=10.0)
    assert original.running and original.pending and not node_view(original, "c")["alive"]
    wire = json.loads(json.dumps(original.snapshot()))  # it travels as JSON through continue-as-new
    restored = Policy.restore(wire)
    assert restored.describe() == original.describe()
    assert restored.queues() == original.queues()
    assert restored.next_deadline() == original.next_deadline()
    now = 10.0
    for event in after:
        now += 7.0
        assert restored.step(event, now) == original.step(event, now)
        assert restored.describe() == original.describe()
    assert restored.snapshot() == original.snapshot()


def test_restore_refuses_an_unknown_snapshot_version() -> None:
    snapshot = Policy().snapshot()
    with pytest.raises(ValueError, match="unknown scheduler snapshot version 99"):
        Policy.restore({**snapshot, "v": 99})


def test_events_and_decisions_round_trip_through_their_tagged_unions() -> None:
    config = load_queue_config({"tenants": [{"name": "team-a", "quota": {"gpu": 2, "cpu": 4, "mem": "8Gi"}}]})
    events: list[Event] = [
        node("a", gpus=4, cpus=8),
        NodeLost(node_id="a"),
        gang("g", nnodes=2, gpus=1, tenant="team-a", priority="high", preemptible=False),
        GangReleased(gang_id="g"),
        Tick(),
        ConfigApplied(config=config),
    ]
    adapter = TypeAdapter(list[Event])
    again = adapter.validate_json(adapter.dump_json(events))
    assert again == events
    assert again[-1].config.tenants[0].quota.cpu == 4000  # type: ignore[union-attr]
    policy, decisions = run_last([*TWO_NODES, gang("one", gpus=1), gang("h", nnodes=2, gpus=2), gang("s", gpus=1)])
    decisions += policy.step(GangReleased(gang_id="one"))
    _, rejected = run_last([gang("r", gpus=0, nnodes=0)])  # malformed: rejected at once
    all_decisions = [*decisions, *rejected]
    assert {type(d) for d in all_decisions} == {Admitted, Pending, Preempted, GangRejected}
    # the class was renamed from Rejected: its tag on the wire (outboxes, histories) is the same, the old name works
    assert rejected[0].model_dump(mode="json") == {"kind": "rejected", "gang_id": "r", "reason": rejected[0].reason}
    assert engine.scheduling.Rejected is GangRejected
    decision_adapter = TypeAdapter(list[Decision])
    assert decision_adapter.validate_python(decision_adapter.dump_python(all_decisions, mode="json")) == all_decisions


def test_describe_summarizes_nodes_running_and_pending() -> None:
    policy, _ = run_last(
        [*TWO_NODES, NodeLost(node_id="b"), gang("x", gpus=1), gang("y", gpus=2), gang("z", gpus=1, priority=None)]
    )
    summary = policy.describe()
    assert json.loads(json.dumps(summary)) == summary  # plain JSON
    assert summary["totals"] == {
        "nodes": 2,
        "alive_nodes": 1,
        "gpus_total": 2,
        "gpus_free": 0,
        "running": 2,
        "pending": 1,
    }
    a, b = summary["nodes"]
    assert (a["node_id"], a["alive"], a["gpus_total"], a["gpus_free"], a["gangs"]) == ("a", True, 2, 0, ["x", "z"])
    assert (b["node_id"], b["alive"], b["gpus_free"], b["cpus_free"]) == ("b", False, 0, 0)
    x = summary["running"][0]
    assert x == {
        "gang_id": "x",
        "tenant": "default",
        "priority": "default",
        "preemptible": True,
        "backfill": False,
        "preempting": False,
        "preempted_for": None,
        "preempted": None,
        "checkpoint": None,
        "admitted_at": 0.0,
        "nnodes": 1,
        "gpus_per_node": 1,
        "cpus_per_node": 1.0,
        "mem_per_node": None,
        "nodes": [{"node_id": "a", "address": "a.local", "node_rank": 0, "gpu_ids": [0]}],
    }
    assert summary["running"][1]["backfill"] is True  # z started while y waited
    assert [(p["position"], p["gang_id"]) for p in summary["pending"]] == [(1, "y")]
    assert summary["pending"][0]["reason"] == policy.pending["y"].reason
    assert summary["pending"][0]["preempting"] == []
    assert set(summary["tenants"]) == {"default"}
    assert summary["drained"] == []


# ---------------------------------------------------------------- property test

NODE_IDS = ["n0", "n1", "n2", "n3"]
GANG_IDS = [f"g{i}" for i in range(10)]
# weighted by repetition: mostly shapes that fit a 1-4 node cluster, sometimes too big or malformed
NNODES = [1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 0]
GPUS_PER_NODE = [0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 4, 8, -1]
CPUS_PER_NODE = [0.0, 0.25, 0.5, 1.0, 1.0, 2.0, 4.0]
MEM_PER_NODE = [None, None, None, 2**30, 4 * 2**30, 16 * 2**30]


def register_st() -> st.SearchStrategy[NodeRegistered]:
    spec = st.builds(
        NodeSpec,
        node_id=st.sampled_from(NODE_IDS),
        address=st.just("host"),
        gpus=st.integers(0, 8),
        cpus=st.sampled_from([1.0, 4.0, 8.0]),
        mem=st.sampled_from([None, 8 * 2**30, 32 * 2**30]),
    )
    return st.builds(NodeRegistered, spec=spec)


@st.composite
def events_st(draw: st.DrawFn, policy: Policy) -> Event:
    kind = draw(
        st.sampled_from(["register", "lost", "submit", "submit", "submit", "submit", "release", "release", "tick"])
    )
    if kind == "tick":
        return Tick()
    if kind == "register":
        return draw(register_st())
    if kind == "lost":
        return NodeLost(node_id=draw(st.sampled_from(NODE_IDS)))
    if kind == "submit":
        request = GangRequest(
            gang_id=draw(st.sampled_from(GANG_IDS)),
            nnodes=draw(st.sampled_from(NNODES)),
            gpus_per_node=draw(st.sampled_from(GPUS_PER_NODE)),
            cpus_per_node=draw(st.sampled_from(CPUS_PER_NODE)),
            mem_per_node=draw(st.sampled_from(MEM_PER_NODE)),
            preemptible=draw(st.sampled_from([True, True, True, False])),
            lost_node_wait_s=draw(st.sampled_from([5.0, 600.0])),
        )
        return GangSubmitted(request=request)
    # mostly a gang the scheduler knows (running ones more often: they free capacity), sometimes any id
    known = [*policy.pending, *policy.running, *policy.running]
    return GangReleased(gang_id=draw(st.sampled_from(known or GANG_IDS)))


def _shrinks(old: NodeSpec, new: NodeSpec) -> bool:
    smaller_mem = old.mem is not None and (new.mem is None or new.mem < old.mem)
    return new.gpus < old.gpus or new.cpus < old.cpus or smaller_mem or (old.mem is None and new.mem is not None)


def check_invariants(policy: Policy, shrunk: set[str]) -> None:
    assert not policy.pending.keys() & policy.running.keys(), "a gang is both queued and running"
    held: dict[str, set[int]] = {}
    cpus: dict[str, int] = {}
    mem: dict[str, int] = {}
    for gang_id, entry in policy.running.items():
        request, nodes = entry.request, entry.placement.nodes
        assert len(nodes) == request.nnodes
        assert len({a.node_id for a in nodes}) == request.nnodes, "a gang's nodes must be distinct"
        assert [a.node_rank for a in nodes] == list(range(request.nnodes))
        for a in nodes:
            assert len(a.gpu_ids) == request.gpus_per_node
            assert len(set(a.gpu_ids)) == len(a.gpu_ids)
            assert not held.setdefault(a.node_id, set()) & set(a.gpu_ids), f"GPU given twice on {a.node_id} ({gang_id})"
            held[a.node_id] |= set(a.gpu_ids)
            cpus[a.node_id] = cpus.get(a.node_id, 0) + round(request.cpus_per_node * 1000)
            mem[a.node_id] = mem.get(a.node_id, 0) + (request.mem_per_node or 0)
    for node_id, ids in held.items():
        spec = policy.inventory.nodes[node_id].spec
        if node_id not in shrunk:  # a node re-registered smaller may keep older, larger allocations
            assert ids <= set(range(spec.gpus))
            assert cpus[node_id] <= round(spec.cpus * 1000)
            assert spec.mem is None or mem[node_id] <= spec.mem
    # work conserving: every preemptible pending gang that fits what is free now, off the nodes reserved for
    # gangs waiting for their victims to leave or come of age, was started (a gang that is not preemptible
    # may wait behind a bigger one)
    reserved = frozenset().union(*policy._reserved.values())
    for gang_id, waiting in policy.pending.items():
        if waiting.preemptible and gang_id not in policy._reserved:
            placement = policy.inventory.place(waiting.request, exclude=reserved)
            assert placement is None, f"{gang_id} fits on {placement} but was not admitted"


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_random_event_sequences_keep_the_invariants(data: st.DataObject) -> None:
    policy = Policy()
    shrunk: set[str] = set()
    now = 0.0  # the Scheduler's clock: node registrations expire and lost-node waits run out as it advances
    # start from a small cluster so that most submissions have somewhere to go
    initial: list[Event] = data.draw(st.lists(register_st(), min_size=1, max_size=4))
    for i in range(data.draw(st.integers(1, 60))):
        event = initial[i] if i < len(initial) else data.draw(events_st(policy))
        old = policy.inventory.nodes.get(event.spec.node_id) if isinstance(event, NodeRegistered) else None
        if isinstance(event, NodeRegistered) and old is not None and _shrinks(old.spec, event.spec):
            shrunk.add(event.spec.node_id)
        now += data.draw(st.sampled_from([0.0, 1.0, 7.0, 30.0, 90.0]))
        pending_before = dict(policy.pending)
        running_before = {g: r.placement for g, r in policy.running.items()}
        decisions = policy.step(event, now)
        check_invariants(policy, shrunk)

        # a submission is refused at once ("rejected: ..."); a queued gang is dropped only once its wait for
        # lost nodes ran out ("unschedulable: ...")
        refused = [d.gang_id for d in decisions if isinstance(d, GangRejected) and d.reason.startswith("rejected:")]
        expired = [
            d.gang_id for d in decisions if isinstance(d, GangRejected) and d.reason.startswith("unschedulable:")
        ]
        assert not refused or (isinstance(event, GangSubmitted) and refused == [event.request.gang_id])
        for gang_id in expired:
            waited = pending_before.get(gang_id) or policy.pending.get(gang_id)
            assert waited is None or (
                waited.lost_wait_since is not None and now - waited.lost_wait_since >= waited.request.lost_node_wait_s
            )
        for d in decisions:
            if isinstance(d, Admitted):
                assert d.gang_id in policy.running
                assert all(policy.inventory.nodes[a.node_id].alive for a in d.placement.nodes), "placed on a lost node"
                assert all(
                    set(a.gpu_ids) <= set(range(policy.inventory.nodes[a.node_id].spec.gpus)) for a in d.placement.nodes
                )
            if isinstance(d, Pending):
                assert d.gang_id in policy.pending
            if isinstance(d, Preempted):
                assert d.gang_id in policy.running and policy.running[d.gang_id].preemptible
                # one tenant, one priority: only backfill (or moving a smaller gang out of the way) preempts
                assert d.cause in ("backfill", "defrag")
        # running gangs are only ever removed by their own release, and never move
        for gang_id, placement in running_before.items():
            if not (isinstance(event, GangReleased) and event.gang_id == gang_id):
                assert policy.running[gang_id].placement == placement
    restored = Policy.restore(json.loads(json.dumps(policy.snapshot())))
    assert restored.describe() == policy.describe()


def test_a_preemptible_gang_never_waits_behind_a_protected_one_of_its_shape() -> None:
    """Found by the random streams: one FIFO queue per shape held both, and only its head is looked at, so a
    gang that may backfill waited behind one that may not, forever."""
    cpu_only = [node("n0", gpus=0, cpus=1), node("n1", gpus=0, cpus=1)]
    policy, _ = run_last([*cpu_only, gang("g0", gpus=0, cpus=1), gang("wide", nnodes=2, gpus=0, cpus=0.25)])
    run_last([gang("protected", gpus=0, cpus=0.5, preemptible=False), gang("filler", gpus=0, cpus=0.5)], policy)
    assert "filler" in policy.running and "protected" in policy.pending  # filler backfills; protected waits


def test_nodes_kept_free_for_a_gang_are_free_as_soon_as_it_starts() -> None:
    """Found by the random streams (this is their example): the nodes reserved for a waiting gang stayed
    excluded for the rest of the cycle in which it started, so a small gang behind it that fit was not admitted."""
    events: list[Event] = [node("n0", gpus=0, cpus=1), NodeLost(node_id="n0"), node("n2", gpus=1, cpus=1)]
    events += [gang("g0", gpus=0, cpus=0.25), *[node("n0", gpus=0, cpus=1)] * 5, node("n0", gpus=2, cpus=1)]
    events += [gang("pair", nnodes=2, gpus=1), gang("big", gpus=2, cpus=0), gang("small", gpus=0, cpus=0.25)]
    policy, _ = run_last(events, now=0.0)
    assert policy._reserved.get("pair") and "small" in policy.pending  # nodes kept free for the pair
    policy.step(node("n1", gpus=1, cpus=1), 0.0)
    assert {"pair", "small"} <= set(policy.running)
