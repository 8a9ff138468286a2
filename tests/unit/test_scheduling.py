"""Scheduling policy: strict-FIFO all-or-nothing admission, best-fit placement, reasons, and invariants.

Plain Python: the policy is pure, so these drive ``step`` directly, without Temporal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from engine.scheduling import (
    Admitted,
    ClusterState,
    Decision,
    Event,
    GangReleased,
    GangRequest,
    GangSubmitted,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    Pending,
    Rejected,
    Tick,
    describe,
    next_deadline,
    pending_reasons,
    place,
    step,
    usage,
)
from engine.scheduling.reasons import never_fits_reason

# ---------------------------------------------------------------- helpers


def node(node_id: str, gpus: int = 4, cpus: float = 8, mem: int | None = None) -> NodeRegistered:
    return NodeRegistered(spec=NodeSpec(node_id=node_id, address=f"{node_id}.local", gpus=gpus, cpus=cpus, mem=mem))


def gang(gang_id: str, nnodes: int = 1, gpus: int = 0, cpus: float = 1.0, mem: int | None = None) -> GangSubmitted:
    return GangSubmitted(
        request=GangRequest(gang_id=gang_id, nnodes=nnodes, gpus_per_node=gpus, cpus_per_node=cpus, mem_per_node=mem)
    )


def run(
    events: Iterable[Event], state: ClusterState | None = None, now: float | None = None
) -> tuple[ClusterState, list[Decision]]:
    """Apply events in order; return the final state and the decisions of the *last* event."""
    state = state or ClusterState()
    decisions: list[Decision] = []
    for event in events:
        state, decisions = step(state, event, now)
    return state, decisions


def admitted(decisions: list[Decision]) -> list[str]:
    return [d.gang_id for d in decisions if isinstance(d, Admitted)]


def only(decisions: list[Decision], kind: type[Pending] | type[Rejected], gang_id: str) -> str:
    reasons = [d.reason for d in decisions if isinstance(d, kind) and d.gang_id == gang_id]
    assert len(reasons) == 1, decisions
    return reasons[0]


def gpus_of(state: ClusterState, gang_id: str) -> dict[str, tuple[int, ...]]:
    return {a.node_id: a.gpu_ids for a in state.running[gang_id].placement.nodes}


TWO_NODES = [node("a", gpus=2), node("b", gpus=2)]

# ---------------------------------------------------------------- admission


def test_admission_is_all_or_nothing() -> None:
    state, _ = run([*TWO_NODES, gang("one", gpus=1)])
    state, decisions = step(state, gang("pair", nnodes=2, gpus=2))
    # one node has room for its share, the other does not: nothing is taken at all
    assert admitted(decisions) == []
    assert "pair" not in state.running
    assert state.queued_ids() == ("pair",)
    assert usage(state)["b"].free_gpu_ids == (0, 1)
    only(decisions, Pending, "pair")


def test_fifo_gangs_that_each_need_the_whole_cluster_never_overlap() -> None:
    state, first = run([*TWO_NODES, gang("x", nnodes=2, gpus=2)])
    assert admitted(first) == ["x"]
    state, second = step(state, gang("y", nnodes=2, gpus=2))
    assert admitted(second) == []
    assert state.queued_ids() == ("y",)
    state, after = step(state, GangReleased(gang_id="x"))
    assert admitted(after) == ["y"]
    assert list(state.running) == ["y"]
    assert gpus_of(state, "y") == {"a": (0, 1), "b": (0, 1)}
    assert state.queue == ()


def test_no_backfill_a_small_gang_waits_behind_a_big_head() -> None:
    state, _ = run([*TWO_NODES, gang("one", gpus=1), gang("big", nnodes=2, gpus=2)])
    state, decisions = step(state, gang("tiny", gpus=1))
    assert admitted(decisions) == []
    assert state.queued_ids() == ("big", "tiny")
    reason = only(decisions, Pending, "tiny")
    assert "1 gang ahead in the queue, head 'big'" in reason
    assert "strict FIFO" in reason
    assert reason.endswith("it would fit now")


def test_admission_repeats_while_the_new_head_fits() -> None:
    state, _ = run([*TWO_NODES, gang("all", nnodes=2, gpus=2), gang("p", gpus=1), gang("q", gpus=2), gang("r", gpus=2)])
    assert state.queued_ids() == ("p", "q", "r")
    state, decisions = step(state, GangReleased(gang_id="all"))
    # p and q fit together (p on a, q on b); r does not fit any more and stays the head
    assert admitted(decisions) == ["p", "q"]
    assert state.queued_ids() == ("r",)
    assert next(d for d in decisions if isinstance(d, Pending)).gang_id == "r"


def test_released_pending_request_leaves_the_queue_and_unknown_release_is_a_noop() -> None:
    state, _ = run([*TWO_NODES, gang("x", nnodes=2, gpus=2), gang("y", gpus=1), gang("z", gpus=1)])
    assert state.queued_ids() == ("y", "z")
    state, decisions = step(state, GangReleased(gang_id="y"))
    assert state.queued_ids() == ("z",)
    assert "x" in state.running
    # z moved to the head: its reason changed, so it is told why it still waits
    assert only(decisions, Pending, "z").startswith("pending: needs 1 GPU on 1 node")
    again, nothing = step(state, GangReleased(gang_id="never-seen"))
    assert nothing == []
    assert again == state


def test_duplicate_gang_id_is_rejected_and_the_original_is_untouched() -> None:
    state, _ = run([*TWO_NODES, gang("x", nnodes=2, gpus=2), gang("y", gpus=1)])
    state2, decisions = step(state, gang("x", gpus=1))
    assert "already running" in only(decisions, Rejected, "x")
    state3, decisions = step(state2, gang("y"))
    assert "already queued" in only(decisions, Rejected, "y")
    assert state3 == state


def test_malformed_requests_are_rejected_with_what_is_wrong() -> None:
    state, decisions = run([*TWO_NODES, gang("bad", nnodes=0, gpus=-1, cpus=-0.5)])
    reason = only(decisions, Rejected, "bad")
    assert "nnodes must be at least 1, got 0" in reason
    assert "gpus_per_node must not be negative, got -1" in reason
    assert "cpus_per_node must not be negative, got -0.5" in reason
    state, decisions = step(state, gang("", gpus=1))
    assert "gang_id is empty" in only(decisions, Rejected, "")
    assert state.queue == () and state.running == {}


def test_a_gang_larger_than_the_cluster_is_rejected_at_once() -> None:
    state, decisions = run([*TWO_NODES, gang("wide", nnodes=3, gpus=1)])
    reason = only(decisions, Rejected, "wide")
    assert reason == (
        "rejected: needs 3 GPUs on 3 nodes (1 GPU, 1 CPU per node); "
        "only 2 of 2 alive nodes are that big even when idle (largest: 2 GPUs, 8 CPUs)"
    )
    state, decisions = step(state, gang("fat", nnodes=1, gpus=8))
    assert "only 0 of 2 alive nodes are that big" in only(decisions, Rejected, "fat")
    assert "largest: 2 GPUs" in only(decisions, Rejected, "fat")
    _, decisions = step(ClusterState(), gang("early", gpus=1))
    assert "no alive node is registered" in only(decisions, Rejected, "early")
    assert state.queue == ()


def test_a_gang_that_needs_lost_nodes_waits_for_them_without_blocking_the_queue() -> None:
    # a whole-cluster restart: the nodes are lost, not gone; a gang that needs them waits (bounded)
    state, decisions = run([*TWO_NODES, NodeLost(node_id="b"), gang("pair", nnodes=2, gpus=1)], now=100.0)
    assert not [d for d in decisions if isinstance(d, Rejected)]
    assert "waiting for lost node b to come back (up to 600 s" in only(decisions, Pending, "pair")
    assert state.queue[0].lost_wait_since == 100.0
    # it does not hold the queue: a gang behind it that fits starts at once
    state, decisions = step(state, gang("solo", gpus=1), now=101.0)
    assert admitted(decisions) == ["solo"] and state.queued_ids() == ("pair",)
    # b registers again: the pair starts on the capacity left
    state, decisions = step(state, node("b", gpus=2), now=102.0)
    assert admitted(decisions) == ["pair"]


def test_a_gang_waiting_for_lost_nodes_is_rejected_after_its_wait() -> None:
    request = GangRequest(gang_id="pair", nnodes=2, gpus_per_node=1, lost_node_wait_s=30)
    events = [*TWO_NODES, NodeLost(node_id="b"), GangSubmitted(request=request)]
    state, _ = run(events, ClusterState(node_ttl_s=1000), now=0.0)
    assert next_deadline(state) == 30.0  # the Scheduler wakes up then (b, lost, has no deadline)
    state, decisions = step(state, Tick(), now=29.0)
    assert decisions == [] and state.queued_ids() == ("pair",)
    state, decisions = step(state, Tick(), now=30.0)
    assert only(decisions, Rejected, "pair") == (
        "unschedulable: needs 2 GPUs on 2 nodes (1 GPU, 1 CPU per node); waited 30 s for lost node b to come "
        "back, and they did not"
    )
    assert state.queue == ()


def test_rejection_counts_lost_nodes_and_says_so() -> None:
    _, decisions = run([*TWO_NODES, NodeLost(node_id="b"), gang("triple", nnodes=3, gpus=1)])
    reason = only(decisions, Rejected, "triple")
    assert "only 2 of 2 registered nodes (1 of them lost) are that big even when idle" in reason


def test_a_node_that_stops_registering_expires_even_when_idle() -> None:
    state, _ = run([node("a", gpus=2)], now=0.0)
    state, _ = run([node("b", gpus=2)], state, now=10.0)
    assert next_deadline(state) == 20.0  # a's registration expires first (ttl 20 s)
    state, _ = step(state, Tick(), now=20.0)
    assert state.nodes["a"].alive  # exactly at the ttl: not yet
    state, _ = step(state, Tick(), now=20.5)
    assert not state.nodes["a"].alive and state.nodes["b"].alive
    state, _ = step(state, node("a", gpus=2), now=21.0)  # re-registration revives it
    assert state.nodes["a"].alive and state.nodes["a"].last_seen == 21.0


# ---------------------------------------------------------------- placement


def test_placement_packs_onto_the_fullest_node_and_takes_the_lowest_gpu_ids() -> None:
    state, _ = run([node("a", gpus=4), node("b", gpus=4), gang("first", gpus=2)])
    assert gpus_of(state, "first") == {"a": (0, 1)}  # a tie: the lowest node id
    state, _ = step(state, gang("second", gpus=1))
    assert gpus_of(state, "second") == {"a": (2,)}  # a has fewer GPUs free than b: pack it
    state, _ = step(state, GangReleased(gang_id="first"))
    state, _ = step(state, gang("third", gpus=2))
    assert gpus_of(state, "third") == {"a": (0, 1)}  # the lowest free ids, reusing the released ones
    state, _ = step(state, gang("fourth", gpus=2))
    assert gpus_of(state, "fourth") == {"b": (0, 1)}


def test_placement_ties_on_gpus_break_by_fewer_free_cpus() -> None:
    state, _ = run([node("a", gpus=2, cpus=16), node("b", gpus=2, cpus=4), gang("cpu", nnodes=1, cpus=2)])
    # a CPU-only gang: both nodes have 2 GPUs free, b has fewer CPUs free
    assert gpus_of(state, "cpu") == {"b": ()}


def test_node_ranks_follow_node_id_order_and_carry_addresses() -> None:
    _, decisions = run([node("c"), node("a"), node("b"), gang("g", nnodes=3, gpus=1)])
    placement = next(d for d in decisions if isinstance(d, Admitted)).placement
    assert [(a.node_id, a.node_rank, a.address) for a in placement.nodes] == [
        ("a", 0, "a.local"),
        ("b", 1, "b.local"),
        ("c", 2, "c.local"),
    ]


def test_cpus_are_accounted_exactly_in_millicores() -> None:
    # with float sums 0.1 + 0.2 > 0.3 and the second gang would never fit
    state, decisions = run([node("a", gpus=0, cpus=0.3), gang("p", cpus=0.1)])
    state, decisions = step(state, gang("q", cpus=0.2))
    assert admitted(decisions) == ["q"]
    state, decisions = step(state, gang("r", cpus=0.1))
    assert admitted(decisions) == []
    assert usage(state)["a"].free_cpus == 0.0


def test_memory_is_checked_where_nodes_report_it() -> None:
    gib = 2**30
    state, decisions = run([node("a", mem=8 * gib), gang("m", mem=6 * gib), gang("n", mem=4 * gib)])
    assert admitted(decisions) == []
    assert "pending: needs 1 node (1 CPU, 4 GiB per node)" in only(decisions, Pending, "n")
    assert "a short of memory (held by m)" in only(decisions, Pending, "n")
    # a node that does not report memory is not limited by it
    state, decisions = step(state, node("b", mem=None))
    assert admitted(decisions) == ["n"]


# ---------------------------------------------------------------- nodes coming and going


def test_lost_node_is_not_offered_keeps_its_allocations_and_comes_back_on_registration() -> None:
    state, _ = run([*TWO_NODES, gang("big", gpus=2), gang("small", gpus=1)])
    assert gpus_of(state, "big") == {"a": (0, 1)}
    assert gpus_of(state, "small") == {"b": (0,)}
    state, _ = step(state, NodeLost(node_id="b"))
    assert state.nodes["b"].alive is False
    # b still has GPU 1 free, but a lost node offers nothing
    state, decisions = step(state, gang("wants-1", gpus=1))
    assert admitted(decisions) == []
    assert usage(state)["b"].free_gpu_ids == ()
    assert "1 lost node not offered: b" in only(decisions, Pending, "wants-1")
    # allocations on a lost node stay until their gang releases them
    state, _ = step(state, NodeLost(node_id="a"))
    assert set(state.running) == {"big", "small"}
    state, decisions = step(state, node("b", gpus=2))
    assert state.nodes["b"].alive is True
    assert admitted(decisions) == ["wants-1"]
    assert gpus_of(state, "wants-1") == {"b": (1,)}  # GPU 0 is still small's
    state, decisions = step(state, node("a", gpus=2))
    assert decisions == []
    assert usage(state)["a"].used_gpu_ids == (0, 1)
    state, decisions = step(state, GangReleased(gang_id="big"))
    assert usage(state)["a"].free_gpu_ids == (0, 1)


def test_node_lost_for_an_unknown_node_is_a_noop() -> None:
    state, _ = run(TWO_NODES)
    assert step(state, NodeLost(node_id="zzz")) == (state, [])


def test_reregistration_updates_capacity_and_address() -> None:
    state, _ = run([node("a", gpus=1), gang("g", gpus=2, nnodes=1)])
    assert state.queue == () and "g" not in state.running  # rejected: a has only 1 GPU
    state, _ = run([node("a", gpus=4), NodeRegistered(spec=NodeSpec(node_id="a", address="new", gpus=8, cpus=1))])
    assert state.nodes["a"].spec.address == "new"
    assert state.nodes["a"].spec.gpus == 8


# ---------------------------------------------------------------- reasons, purity, serialization


def test_pending_reason_says_what_is_needed_what_is_free_and_who_holds_it() -> None:
    state, _ = run([*TWO_NODES, gang("one", gpus=1)])
    state, decisions = step(state, gang("pair", nnodes=2, gpus=2))
    reason = only(decisions, Pending, "pair")
    assert reason == (
        "pending: needs 4 GPUs on 2 nodes (2 GPUs, 1 CPU per node); 3 GPUs free on 2 of 2 alive nodes; "
        "only 1 node has 2 GPUs, 1 CPU free, 2 needed; busy: a short of GPUs (held by one)"
    )
    assert pending_reasons(state) == {"pair": reason}
    assert state.queue[0].reason == reason
    # Pending is sent when the reason changes, not again for an event that changes nothing for it
    state, decisions = step(state, NodeLost(node_id="nope"))
    assert decisions == []
    state, decisions = step(state, NodeLost(node_id="b"))
    changed = only(decisions, Pending, "pair")
    assert "only 1 alive node is big enough even when idle: waiting for lost node b to come back" in changed


def test_cpu_only_pending_reason() -> None:
    _, decisions = run([node("a", gpus=0, cpus=2), gang("x", cpus=1.5), gang("y", cpus=1)])
    assert only(decisions, Pending, "y") == (
        "pending: needs 1 node (1 CPU per node); 0.5 CPUs free on 1 of 1 alive node; "
        "no node has 1 CPU free, 1 needed; busy: a short of CPUs (held by x)"
    )


def test_step_never_mutates_its_input() -> None:
    state, _ = run([*TWO_NODES, gang("x", nnodes=2, gpus=1), gang("y", nnodes=2, gpus=2)])
    before = state.model_dump(mode="json")
    events: list[Event] = [GangReleased(gang_id="x"), NodeLost(node_id="a"), node("c"), gang("z", gpus=1)]
    for event in events:
        step(state, event)
    assert state.model_dump(mode="json") == before


def test_state_json_round_trip() -> None:
    state, _ = run(
        [
            *TWO_NODES,
            node("m", gpus=0, cpus=0.75, mem=3 * 2**30),
            gang("x", nnodes=2, gpus=1, cpus=0.25),
            gang("y", nnodes=2, gpus=2),
            gang("z", cpus=0.5, mem=2**30),
            NodeLost(node_id="b"),
        ]
    )
    assert state.running and state.queue and not state.nodes["b"].alive
    wire = json.loads(json.dumps(state.model_dump(mode="json")))
    again = ClusterState.model_validate(wire)
    assert again == state
    # and it decides exactly as before
    event = GangReleased(gang_id="x")
    assert step(again, event) == step(state, event)


def test_events_and_decisions_round_trip_through_their_tagged_unions() -> None:
    events: list[Event] = [node("a"), NodeLost(node_id="a"), gang("g", nnodes=2, gpus=1), GangReleased(gang_id="g")]
    adapter = TypeAdapter(list[Event])
    assert adapter.validate_json(adapter.dump_json(events)) == events
    _, decisions = run([*TWO_NODES, gang("g", nnodes=2, gpus=1), gang("h", nnodes=2, gpus=2)])
    _, rejected = run([gang("r")])
    all_decisions = [*decisions, *rejected]
    assert {type(d) for d in all_decisions} == {Pending, Rejected}
    decision_adapter = TypeAdapter(list[Decision])
    assert decision_adapter.validate_python(decision_adapter.dump_python(all_decisions, mode="json")) == all_decisions


def test_inconsistent_state_is_refused_on_load() -> None:
    state, _ = run([*TWO_NODES, gang("x", gpus=1)])
    wire = state.model_dump(mode="json")
    wire["queue"] = [{"request": wire["running"]["x"]["request"], "reason": ""}]
    try:
        ClusterState.model_validate(wire)
    except ValueError as exc:
        assert "both queued and running" in str(exc)
    else:
        raise AssertionError("a gang both queued and running was accepted")


def test_describe_summarizes_nodes_running_and_pending() -> None:
    state, _ = run([*TWO_NODES, NodeLost(node_id="b"), gang("x", gpus=1), gang("y", gpus=2), gang("z", gpus=1)])
    summary = describe(state)
    json.dumps(summary)  # plain JSON
    assert summary["totals"] == {
        "nodes": 2,
        "alive_nodes": 1,
        "gpus_total": 2,
        "gpus_free": 1,
        "running": 1,
        "pending": 2,
    }
    a, b = summary["nodes"]
    assert (a["node_id"], a["alive"], a["gpus_total"], a["gpus_free"], a["gangs"]) == ("a", True, 2, 1, ["x"])
    assert (b["node_id"], b["alive"], b["gpus_free"], b["cpus_free"]) == ("b", False, 0, 0.0)
    assert summary["running"] == [
        {
            "gang_id": "x",
            "tenant": "default",
            "nnodes": 1,
            "gpus_per_node": 1,
            "cpus_per_node": 1.0,
            "mem_per_node": None,
            "nodes": [{"node_id": "a", "address": "a.local", "node_rank": 0, "gpu_ids": [0]}],
        }
    ]
    assert [(p["position"], p["gang_id"]) for p in summary["pending"]] == [(1, "y"), (2, "z")]
    assert [p["reason"] for p in summary["pending"]] == [q.reason for q in state.queue]
    assert summary["pending"][1]["reason"].endswith("it would fit now")


def test_place_is_a_what_if_that_ignores_the_queue() -> None:
    state, _ = run([*TWO_NODES, gang("x", gpus=1)])
    placement = place(state, GangRequest(gang_id="w", nnodes=2, gpus_per_node=1))
    assert placement is not None
    assert [(a.node_id, a.gpu_ids) for a in placement.nodes] == [("a", (1,)), ("b", (0,))]
    assert place(state, GangRequest(gang_id="w", nnodes=2, gpus_per_node=2)) is None
    assert place(state, GangRequest(gang_id="w", nnodes=0)) is None


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
def events_st(draw: st.DrawFn, state: ClusterState) -> Event:
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
            lost_node_wait_s=draw(st.sampled_from([5.0, 600.0])),
        )
        return GangSubmitted(request=request)
    # mostly a gang the scheduler knows (running ones more often: they free capacity), sometimes any id
    known = [*state.queued_ids(), *state.running, *state.running]
    return GangReleased(gang_id=draw(st.sampled_from(known or GANG_IDS)))


def _shrinks(old: NodeSpec, new: NodeSpec) -> bool:
    smaller_mem = old.mem is not None and (new.mem is None or new.mem < old.mem)
    return new.gpus < old.gpus or new.cpus < old.cpus or smaller_mem or (old.mem is None and new.mem is not None)


def check_invariants(state: ClusterState, shrunk: set[str]) -> None:
    queued = state.queued_ids()
    assert len(set(queued)) == len(queued)
    assert not set(queued) & state.running.keys(), "a gang is both queued and running"
    held: dict[str, set[int]] = {}
    cpus: dict[str, int] = {}
    mem: dict[str, int] = {}
    for gang_id, alloc in state.running.items():
        request, nodes = alloc.request, alloc.placement.nodes
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
        spec = state.nodes[node_id].spec
        if node_id not in shrunk:  # a node re-registered smaller may keep older, larger allocations
            assert ids <= set(range(spec.gpus))
            assert cpus[node_id] <= round(spec.cpus * 1000)
            assert spec.mem is None or mem[node_id] <= spec.mem
    holders = [q for q in state.queue if never_fits_reason(q.request, state.nodes) is None]
    if holders:
        assert place(state, holders[0].request) is None, "the head fits but was not admitted"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_event_sequences_keep_the_invariants(data: st.DataObject) -> None:
    state = ClusterState()
    shrunk: set[str] = set()
    now = 0.0  # the Scheduler's clock: node registrations expire and lost-node waits run out as it advances
    # start from a small cluster so that most submissions have somewhere to go
    initial: list[Event] = data.draw(st.lists(register_st(), min_size=1, max_size=4))
    for i in range(data.draw(st.integers(1, 60))):
        event = initial[i] if i < len(initial) else data.draw(events_st(state))
        before = state.model_dump(mode="json")
        old = state.nodes.get(event.spec.node_id) if isinstance(event, NodeRegistered) else None
        if isinstance(event, NodeRegistered) and old is not None and _shrinks(old.spec, event.spec):
            shrunk.add(event.spec.node_id)
        now += data.draw(st.sampled_from([0.0, 1.0, 7.0, 30.0]))
        new, decisions = step(state, event, now)
        assert state.model_dump(mode="json") == before, "step mutated its input"
        check_invariants(new, shrunk)

        # FIFO without backfill: the admitted gangs are exactly a prefix of the queue the event left,
        # leaving out the gangs that wait for lost nodes (they hold no place in the queue)
        # a submission is refused at once ("rejected: ..."); a queued gang is dropped only once its wait for
        # lost nodes ran out ("unschedulable: ...")
        refused = [d.gang_id for d in decisions if isinstance(d, Rejected) and d.reason.startswith("rejected:")]
        expired = [d.gang_id for d in decisions if isinstance(d, Rejected) and d.reason.startswith("unschedulable:")]
        assert not refused or (isinstance(event, GangSubmitted) and refused == [event.request.gang_id])
        for gang_id in expired:
            waited = next(q for q in state.queue if q.request.gang_id == gang_id)
            assert (
                waited.lost_wait_since is not None and now - waited.lost_wait_since >= waited.request.lost_node_wait_s
            )
        expected = [g for g in state.queued_ids() if g not in expired]
        if isinstance(event, GangReleased):
            expected = [g for g in expected if g != event.gang_id]
        if isinstance(event, GangSubmitted) and not refused:
            expected.append(event.request.gang_id)
        requests = {q.request.gang_id: q.request for q in (*state.queue, *new.queue)}
        if isinstance(event, GangSubmitted):
            requests[event.request.gang_id] = event.request
        holding = [g for g in expected if never_fits_reason(requests[g], new.nodes) is None]
        got = admitted(decisions)
        assert got == holding[: len(got)]
        assert list(new.queued_ids()) == [g for g in expected if g not in got]
        for d in decisions:
            if isinstance(d, Admitted):
                assert d.gang_id in new.running
                assert all(new.nodes[a.node_id].alive for a in d.placement.nodes), "placed on a lost node"
                assert all(set(a.gpu_ids) <= set(range(new.nodes[a.node_id].spec.gpus)) for a in d.placement.nodes)
            if isinstance(d, Pending):
                assert d.gang_id in new.queued_ids()
        # running gangs are only ever removed by their own release
        for gang_id, alloc in state.running.items():
            if not (isinstance(event, GangReleased) and event.gang_id == gang_id):
                assert new.running[gang_id] == alloc
        state = new
    assert ClusterState.model_validate(json.loads(json.dumps(state.model_dump(mode="json")))) == state
