"""Topology-aware placement (engine.scheduling.topology): required and preferred levels, unconstrained gangs as
before, waits and their reasons, requests rejected at once, defragmentation for a required gang, the queue
file's ``topology`` key and the snapshot round trip (node labels and the request's levels)."""

from __future__ import annotations

import re

import pytest
from scheduling_builders import FOREVER, admitted, config, gang, nodes_of, only, preempted, run

from engine import DefinitionError, GangPlugin, Topology, task
from engine.core import definition_of
from engine.core.gang import GangShape
from engine.errors import QueueConfigError
from engine.scheduling import (
    GangRejected,
    GangReleased,
    NodeRegistered,
    NodeSpec,
    Pending,
    Policy,
    Tick,
    dump_queue_config,
    load_queue_config,
)
from engine.scheduling.topology import DomainIndex
from workflows.gang_spec import GangSpec, gang_request

RACKS = """\
tenants: [{name: default}]
topology: [block, rack]
"""


def labelled(node_id: str, rack: str | None, block: str | None = "b1", gpus: int = 2) -> NodeRegistered:
    labels = {k: v for k, v in (("rack", rack), ("block", block)) if v is not None}
    return NodeRegistered(spec=NodeSpec(node_id=node_id, address=f"{node_id}.local", gpus=gpus, cpus=16, labels=labels))


def racks(sizes: dict[str, int], block: str = "b1") -> list[NodeRegistered]:
    """Nodes ``<rack>-<i>`` in racks of the given sizes."""
    return [labelled(f"{rack}-{i}", rack, block) for rack, size in sizes.items() for i in range(size)]


def policy_of(text: str = RACKS) -> Policy:
    return Policy(config(text), node_ttl_s=FOREVER)


def rack_of(policy: Policy, gang_id: str) -> set[str]:
    return {policy.inventory.nodes[n].spec.labels.get("rack", "-") for n in nodes_of(policy, gang_id)}


# -- the queue file -------------------------------------------------------------------------------------
def test_queue_file_declares_levels_outermost_first_and_round_trips() -> None:
    cfg = load_queue_config(RACKS)
    assert cfg.topology == ("block", "rack")
    assert load_queue_config(dump_queue_config(cfg)) == cfg
    assert "topology" not in dump_queue_config(load_queue_config("tenants: [{name: a}]"))  # as before


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("[rack, rack]", "topology[1]: level 'rack' is listed twice (already topology[0])"),
        ("[host]", "topology[0]: 'host' is the node itself"),
        ('[""]', "topology[0]: must be a non-empty node label key"),
        ('["a b"]', "topology[0]: 'a b' is not a node label key"),
        ("rack", "topology: must be a list"),
        ("[1]", "topology[0]: must be a string"),
    ],
)
def test_bad_levels_are_refused_naming_the_field(written: str, message: str) -> None:
    with pytest.raises(QueueConfigError) as info:
        load_queue_config(f"tenants: [{{name: a}}]\ntopology: {written}\n")
    assert str(info.value).startswith(message), str(info.value)


# -- required ---------------------------------------------------------------------------------------------
def test_required_puts_every_node_in_one_rack_the_tightest_that_holds_it() -> None:
    policy = policy_of()
    # r1 has 3 nodes, r2 has 2: a blind best fit could mix them; required takes the tightest rack that holds it
    decisions = run([*racks({"r1": 3, "r2": 2}), gang("g", nnodes=2, gpus=2, topology_required="rack")], policy)
    assert admitted(decisions) == ["g"]
    assert rack_of(policy, "g") == {"r2"}


def test_required_waits_saying_the_largest_rack_has_too_few_free() -> None:
    policy = policy_of()
    two = {"nnodes": 2, "gpus": 2, "topology_required": "rack"}
    run([*racks({"r1": 3, "r2": 3}), gang("a", **two), gang("b", **two)], policy)
    assert (rack_of(policy, "a"), rack_of(policy, "b")) == ({"r1"}, {"r2"})  # ties: the first rack by name
    decisions = run([gang("g", nnodes=3, gpus=2, topology_required="rack")], policy)
    assert admitted(decisions) == []
    reason = only(decisions, Pending, "g")
    assert "needs 3 nodes in one rack (2 GPUs, 1 CPU per node); the largest rack (rack=r2) has 1 free" in reason, reason
    # 4 nodes are free, but in two racks: a release frees a whole rack and it starts there
    decisions = run([GangReleased(gang_id="a")], policy)
    assert admitted(decisions) == ["g"] and rack_of(policy, "g") == {"r1"}


def test_a_node_without_the_label_is_in_no_rack() -> None:
    policy = policy_of()
    nodes = [labelled("r1-0", "r1"), labelled("bare-0", None), labelled("bare-1", None)]
    decisions = run([*nodes, gang("g", nnodes=2, gpus=2, topology_required="rack")], policy)
    assert admitted(decisions) == []
    reason = only(decisions, Pending, "g")
    assert "in one rack" in reason and "nodes without a 'rack' label are in no rack" in reason, reason
    # preferred uses them, after the racks
    decisions = run([gang("p", nnodes=3, gpus=2, topology_preferred="rack")], policy)
    assert admitted(decisions) == ["p"] and nodes_of(policy, "p") == {"r1-0", "bare-0", "bare-1"}


def test_a_required_gang_no_rack_could_ever_hold_waits_for_nodes_and_is_rejected_in_time() -> None:
    policy = policy_of()
    run(racks({"r1": 2, "r2": 2}), policy, now=0.0)
    decisions = run([gang("g", nnodes=3, gpus=2, topology_required="rack", lost_node_wait_s=60)], policy, now=1.0)
    reason = only(decisions, Pending, "g")
    assert "no rack has that many that big even when idle (the most in one rack: 2" in reason, reason
    decisions = run([Tick()], policy, now=62.0)
    assert "no node that can hold it registered within 60 s" in only(decisions, GangRejected, "g")
    # a third node in r1 would have done
    policy = policy_of()
    run(racks({"r1": 2, "r2": 2}), policy, now=0.0)
    run([gang("g", nnodes=3, gpus=2, topology_required="rack")], policy, now=1.0)
    decisions = run([labelled("r1-2", "r1")], policy, now=2.0)
    assert admitted(decisions) == ["g"] and rack_of(policy, "g") == {"r1"}


def test_the_outer_level_works_the_same() -> None:
    policy = policy_of()
    nodes = [*racks({"r1": 2}, "b1"), *racks({"r2": 1, "r3": 2}, "b2")]
    decisions = run([*nodes, gang("g", nnodes=3, gpus=2, topology_required="block")], policy)
    assert admitted(decisions) == ["g"] and nodes_of(policy, "g") == {"r2-0", "r3-0", "r3-1"}


# -- preferred --------------------------------------------------------------------------------------------
def test_preferred_takes_one_rack_when_one_holds_it_else_the_fewest() -> None:
    policy = policy_of()
    run(racks({"r1": 4, "r2": 2, "r3": 1}), policy)
    run([gang("one", nnodes=2, gpus=2, topology_preferred="rack")], policy)
    assert rack_of(policy, "one") == {"r2"}  # the tightest rack that holds it
    decisions = run([gang("two", nnodes=5, gpus=2, topology_preferred="rack")], policy)
    assert admitted(decisions) == ["two"]
    assert rack_of(policy, "two") == {"r1", "r3"}  # the largest rack, then the tightest that holds the rest


def test_preferred_never_waits_where_an_unconstrained_gang_would_start() -> None:
    policy = policy_of()
    run(racks({"r1": 1, "r2": 1, "r3": 1}), policy)
    decisions = run([gang("g", nnodes=3, gpus=2, topology_preferred="rack")], policy)
    assert admitted(decisions) == ["g"] and rack_of(policy, "g") == {"r1", "r2", "r3"}


# -- unconstrained ----------------------------------------------------------------------------------------
def test_unconstrained_gangs_are_placed_exactly_as_without_topology() -> None:
    events = [*racks({"r1": 3, "r2": 2, "r3": 4})] + [gang(f"g{i}", nnodes=1 + i % 3, gpus=1 + i % 2) for i in range(8)]
    with_levels, without = policy_of(), Policy(config("tenants: [{name: default}]"))
    assert run(events, with_levels) == run(events, without)


# -- rejected at once -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topology_required": "row"}, "topology level 'row' is not declared in the queue file (topology: block, rack"),
        ({"topology_preferred": "row"}, "topology level 'row' is not declared"),
        ({"topology_required": "rack", "topology_preferred": "block"}, "a gang names at most one topology level"),
        ({"topology_required": "host"}, "needs 2 nodes in one host, and a host is one node"),
        ({"topology_required": "a b"}, "'a b' is not a node label key"),
    ],
)
def test_a_level_that_cannot_be_met_is_rejected_at_once(fields: dict[str, str], message: str) -> None:
    policy = policy_of()
    decisions = run([*racks({"r1": 2}), gang("g", nnodes=2, **fields)], policy)
    assert message in only(decisions, GangRejected, "g")


def test_without_declared_levels_every_level_but_host_is_rejected() -> None:
    policy = Policy(config("tenants: [{name: default}]"))
    decisions = run([*racks({"r1": 2}), gang("g", nnodes=2, topology_required="rack")], policy)
    assert "(topology: none are declared; and 'host', the node itself)" in only(decisions, GangRejected, "g")
    decisions = run([gang("h", topology_required="host"), gang("p", nnodes=2, topology_preferred="host")], policy)
    assert admitted(decisions) == ["h", "p"]


def test_a_new_configuration_without_the_level_rejects_the_waiting_gangs_that_name_it() -> None:
    from engine.scheduling import ConfigApplied

    policy = policy_of()
    run([*racks({"r1": 1, "r2": 1}), gang("g", nnodes=2, gpus=2, topology_required="rack")], policy)
    decisions = run([ConfigApplied(config=config("tenants: [{name: default}]\ntopology: [block]"))], policy)
    assert "topology level 'rack' is not declared" in only(decisions, GangRejected, "g")
    assert policy.inventory.domains is not None and policy.inventory.domains.levels == ("block",)
    decisions = run([gang("b", nnodes=2, gpus=2, topology_required="block")], policy)
    assert admitted(decisions) == ["b"]


# -- defragmentation --------------------------------------------------------------------------------------
DEFRAG = """\
tenants: [{name: default}]
topology: [rack]
priority_classes: [{name: low, value: 0}, {name: vip, value: 0, preemptible: false}]
policy: {min_runtime: 10s}
"""


def two_half_full_racks(young: str = "low") -> Policy:
    """Racks r1 and r2 of two 2-GPU nodes; ``old`` (admitted at 0) on r1-0 and ``young`` (at 50) on r2-0, the
    other node of each rack free: a gang needing both nodes of one rack fits only if one of them moves."""
    policy = policy_of(DEFRAG)
    run(racks({"r1": 2}), policy, now=0.0)
    run([gang("old", gpus=2, priority="low"), gang("pin", gpus=2, priority="vip")], policy, now=0.0)
    run([*racks({"r2": 2}), gang("young", gpus=2, priority=young), GangReleased(gang_id="pin")], policy, now=50.0)
    assert (nodes_of(policy, "old"), nodes_of(policy, "young")) == ({"r1-0"}, {"r2-0"})
    return policy


def test_a_required_gang_moves_the_gangs_of_the_rack_that_loses_the_least_work() -> None:
    policy = two_half_full_racks()
    decisions = run([gang("g", nnodes=2, gpus=2, topology_required="rack")], policy, now=100.0)
    # young has run 50 s on 2 GPUs, old 100 s: r2 is the cheaper rack to free
    assert [(v, by, cause) for v, by, _, cause in preempted(decisions)] == [("young", "g", "defrag")]
    decisions = run([GangReleased(gang_id="young"), gang("young", gpus=2, priority="low")], policy, now=101.0)
    assert sorted(admitted(decisions)) == ["g", "young"]
    assert rack_of(policy, "g") == {"r2"} and nodes_of(policy, "young") == {"r1-1"}


def test_defrag_never_moves_a_gang_that_is_not_preemptible() -> None:
    policy = two_half_full_racks(young="vip")
    decisions = run([gang("g", nnodes=2, gpus=2, topology_required="rack")], policy, now=100.0)
    assert [(v, cause) for v, _, _, cause in preempted(decisions)] == [("old", "defrag")]


def test_defrag_never_moves_a_gang_before_its_min_runtime() -> None:
    policy = two_half_full_racks()
    decisions = run([gang("g", nnodes=2, gpus=2, topology_required="rack")], policy, now=55.0)
    assert [(v, cause) for v, _, _, cause in preempted(decisions)] == [("old", "defrag")]  # young is 5 s old
    policy = two_half_full_racks()
    run([GangReleased(gang_id="old")], policy, now=55.0)
    run([gang("old", gpus=2, priority="low")], policy, now=55.0)  # now both are too young
    decisions = run([gang("g", nnodes=2, gpus=2, topology_required="rack")], policy, now=56.0)
    assert preempted(decisions) == []
    assert [v for v, *_ in preempted(run([Tick()], policy, now=60.0))] == ["young"]  # of age first


@pytest.mark.parametrize("in_one", [True, False])
def test_a_preferring_gang_that_must_move_gangs_moves_them_out_of_one_rack(in_one: bool) -> None:
    """n0 (rack r2) full, n1 (r1) and n2 (r2) half taken by ``a`` (admitted at 0) and ``b`` (at 50), n3 (r1)
    free: a gang preferring one rack needs both nodes of r1 or r2 freed. Moving ``a`` gives it r1; moving ``b``,
    the younger, is what a topology-blind search takes (and Schedulers recorded before did: ``in_one`` False),
    and spans two racks."""
    policy = policy_of(DEFRAG)
    policy.defrag_preferred = in_one
    nodes = [labelled(node_id, rack) for node_id, rack in (("n0", "r2"), ("n1", "r1"), ("n2", "r2"), ("n3", "r1"))]
    run([*nodes, gang("c", gpus=2, priority="vip"), gang("a", priority="low"), gang("f")], policy, now=0.0)
    run([gang("b", priority="low"), GangReleased(gang_id="f")], policy, now=50.0)
    assert [nodes_of(policy, g) for g in "cab"] == [{"n0"}, {"n1"}, {"n2"}]
    decisions = run([gang("g", nnodes=2, gpus=2, topology_preferred="rack")], policy, now=100.0)
    victim = "a" if in_one else "b"
    assert [(v, cause) for v, _, _, cause in preempted(decisions)] == [(victim, "defrag")]
    decisions = run([GangReleased(gang_id=victim), gang(victim, priority="low")], policy, now=101.0)
    assert sorted(admitted(decisions)) == sorted(["g", victim])
    assert rack_of(policy, "g") == ({"r1"} if in_one else {"r1", "r2"})


# -- index, snapshot --------------------------------------------------------------------------------------
def test_the_domain_index_follows_takes_and_releases() -> None:
    policy = policy_of()
    run([*racks({"r1": 2, "r2": 1}), gang("a", gpus=1), gang("b", nnodes=2, gpus=2, topology_required="rack")], policy)
    index = policy.inventory.domains
    assert isinstance(index, DomainIndex)
    fresh = DomainIndex(index.levels, policy.inventory.offered_nodes())
    assert fresh.buckets == index.buckets
    run([GangReleased(gang_id="a"), GangReleased(gang_id="b")], policy)
    fresh = DomainIndex(index.levels, policy.inventory.offered_nodes())
    assert (
        fresh.buckets
        == index.buckets
        == {
            "block": {"b1": {2: [(16000, "r1-0"), (16000, "r1-1"), (16000, "r2-0")]}},
            "rack": {"r1": {2: [(16000, "r1-0"), (16000, "r1-1")]}, "r2": {2: [(16000, "r2-0")]}},
        }
    )


def test_can_place_answers_as_place_and_forgets_when_what_is_free_changes() -> None:
    """``Inventory.can_place`` (what a flavor choice asks of every waiting head) says whether ``place`` would
    find nodes: a preferred gang wherever an unconstrained one fits, a required one only within one rack; its
    remembered answers go when a take or release changes what is free."""
    policy = policy_of()
    run([*racks({"r1": 2, "r2": 1}), gang("a", gpus=2)], policy)  # a takes one of r1's nodes whole
    inventory = policy.inventory
    asks = {
        "preferred": gang("p", nnodes=2, gpus=2, topology_preferred="rack").request,
        "required": gang("q", nnodes=2, gpus=2, topology_required="rack").request,
        "plain": gang("u", nnodes=2, gpus=2).request,
    }
    for name, request in asks.items():
        assert inventory.can_place(request, name) == (inventory.place(request) is not None), name
    assert [inventory.can_place(r, n) for n, r in asks.items()] == [True, False, True]
    run([gang("b", gpus=2)], policy)  # the last free node goes: remembered answers are not kept
    assert [inventory.can_place(r, n) for n, r in asks.items()] == [False, False, False]
    run([GangReleased(gang_id="a"), GangReleased(gang_id="b")], policy)
    assert [inventory.can_place(r, n) for n, r in asks.items()] == [True, True, True]
    excluded = frozenset({"r1-0", "r2-0"})  # what it remembers is by key: the caller's key names the exclude set
    assert not inventory.can_place(asks["plain"], ("plain", excluded), excluded)
    assert inventory.can_place(asks["plain"], "plain")


def test_snapshot_keeps_node_labels_and_the_levels_asked() -> None:
    policy = policy_of()
    run([*racks({"r1": 2, "r2": 3}), gang("a", gpus=2, nnodes=2, topology_required="rack")], policy)
    run([gang("w", gpus=2, nnodes=4, topology_required="rack"), gang("p", gpus=1, topology_preferred="block")], policy)
    restored = Policy.restore(policy.snapshot())
    assert {n: x.spec.labels for n, x in restored.inventory.nodes.items()} == {
        n: x.spec.labels for n, x in policy.inventory.nodes.items()
    }
    assert restored.pending["w"].request.topology_required == "rack"
    assert restored.running["a"].request.topology_required == "rack"
    assert restored.running["p"].request.topology_preferred == "block"
    assert (
        restored.inventory.domains is not None
        and restored.inventory.domains.buckets == policy.inventory.domains.buckets
    )
    events = [GangReleased(gang_id="a"), labelled("r2-3", "r2"), gang("z", nnodes=2, gpus=2, topology_required="rack")]
    assert run(events, restored) == run(events, policy)


# -- the task side: @task(placement=Topology(...)) -> GangSpec -> the gang request ----------------------------
class _Ranks(GangPlugin):
    nnodes, nproc_per_node = 2, 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "Topology needs exactly one of required= or preferred="),
        ({"required": "rack", "preferred": "block"}, "Topology needs exactly one of required= or preferred="),
        ({"required": ""}, "Topology.required: must be a non-empty node label key"),
        ({"preferred": "a b"}, "Topology.preferred: 'a b' is not a node label key"),
    ],
)
def test_topology_is_checked_when_written(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Topology(**kwargs)


def test_a_distributed_task_carries_its_placement_into_the_gang_request() -> None:
    @task(plugin=_Ranks(), placement=Topology(required="rack"))
    def train() -> None: ...

    defn = definition_of(train)
    assert defn.placement == Topology(required="rack") and defn.placement.level == "rack"
    shape = GangShape(nnodes=2, nproc_per_node=1, gpus_per_node=1, cpus_per_node=1.0, mem_per_node=None)
    spec = GangSpec(task="t", call="t-1", shape=shape, timeout_s=60, heartbeat_timeout_s=10, tenant="default")
    assert "topology_required" not in gang_request(spec, "g")  # unset: the payload of before
    spec = GangSpec(**{**spec.__dict__, "topology_required": "rack"})
    assert gang_request(spec, "g")["topology_required"] == "rack"
    spec = GangSpec(**{**spec.__dict__, "topology_required": None, "topology_preferred": "block"})
    request = gang_request(spec, "g")
    assert request["topology_preferred"] == "block" and "topology_required" not in request


def test_a_plain_task_with_a_placement_is_refused_at_decoration() -> None:
    with pytest.raises(DefinitionError, match=r"placement= applies to distributed tasks \(plugin=\.\.\.\) only"):

        @task(placement=Topology(required="rack"))
        def plain() -> None: ...

    with pytest.raises(DefinitionError, match=r"placement must be a Topology"):

        @task(plugin=_Ranks(), placement="rack")  # type: ignore[typeddict-item]
        def wrong() -> None: ...


def test_a_restored_policy_words_the_waits_of_gangs_of_one_shape_alike() -> None:
    # the second gang of a shape (another tenant's) is not placed again in a cycle: its reason reads the first's
    policy = policy_of("tenants: [{name: default}, {name: other}]\ntopology: [block, rack]\n")
    three = {"nnodes": 3, "gpus": 2, "topology_required": "rack"}
    two = {"nnodes": 2, "gpus": 2, "topology_required": "rack"}
    run(
        [
            *racks({"r1": 3, "r2": 3}),
            gang("x", **two),
            gang("y", **two),
            gang("a", **three),
            gang("b", "other", **three),
        ],
        policy,
    )
    assert "the largest rack (rack=r2) has 1 free" in policy.pending["b"].reason
    restored = Policy.restore(policy.snapshot())
    events = [gang("c", gpus=2), gang("d", **three), GangReleased(gang_id="y"), GangReleased(gang_id="x")]
    assert run(events, restored) == run(events, policy)


# -- with flavors ---------------------------------------------------------------------------------------------
FLAVORED_RACKS = """\
flavors: [{name: h100, node_labels: {gpu: h100}}, {name: a100, node_labels: {gpu: a100}}]
tenants: [{name: default, quota: {h100: {gpu: 8}, a100: {gpu: 8}}}]
topology: [rack]
"""


def flavored(node_id: str, rack: str, gpu: str) -> NodeRegistered:
    labels = {"rack": rack, "gpu": gpu}
    return NodeRegistered(spec=NodeSpec(node_id=node_id, address=f"{node_id}.local", gpus=2, cpus=16, labels=labels))


def test_a_flavored_gang_requiring_a_rack_takes_its_flavors_nodes_of_one_rack_only() -> None:
    """Rack r1 holds two a100 and one h100 node, r2 two h100: an h100 gang of two nodes in one rack has only r2
    (r1 has room for two nodes, but one is an a100); defragmentation looks at its flavor's nodes too."""
    policy = policy_of(FLAVORED_RACKS)
    fleet = [flavored("r1-a", "r1", "a100"), flavored("r1-b", "r1", "a100"), flavored("r1-h", "r1", "h100")]
    fleet += [flavored("r2-h", "r2", "h100"), flavored("r2-i", "r2", "h100")]
    decisions = run([*fleet, gang("g", nnodes=2, gpus=2, flavors=("h100",), topology_required="rack")], policy)
    assert admitted(decisions) == ["g"] and nodes_of(policy, "g") == {"r2-h", "r2-i"}
    decisions = run([gang("w", nnodes=2, gpus=2, flavors=("h100",), topology_required="rack")], policy)
    assert admitted(decisions) == []  # r1 has two free nodes, but one h100: it waits, never takes an a100
    assert "in one rack" in only(decisions, Pending, "w")
    decisions = run([gang("a", nnodes=2, gpus=2, flavors=("a100",), topology_required="rack")], policy)
    assert admitted(decisions) == ["a"] and nodes_of(policy, "a") == {"r1-a", "r1-b"}


def test_the_fleet_example_places_as_the_readme_says() -> None:
    """examples/fleet.yaml on the README's four dev nodes: an h100 gang on h100 nodes only, a gang requiring a
    rack in one rack, and team-b (a100 only) never on an h100."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml").read_text()
    policy = policy_of(text)
    nodes = [
        flavored(f"node-{i}", rack, gpu) for i, (gpu, rack) in enumerate([("h100", "r1")] * 2 + [("a100", "r2")] * 2)
    ]
    decisions = run([*nodes, gang("h", "team-a", gpus=2, flavors=("h100",))], policy)
    assert admitted(decisions) == ["h"] and nodes_of(policy, "h") <= {"node-0", "node-1"}
    decisions = run([gang("b", "team-b", nnodes=2, gpus=1, topology_required="rack")], policy)
    assert admitted(decisions) == ["b"] and nodes_of(policy, "b") == {"node-2", "node-3"}  # a100: its only flavor
    decisions = run([gang("r", "team-a", nnodes=2, gpus=1, topology_required="rack")], policy)
    assert admitted(decisions) == ["r"] and rack_of(policy, "r") == {"r2"}  # an h100 node is taken: r2 holds it
