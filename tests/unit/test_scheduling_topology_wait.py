"""``Topology(preferred=..., wait=...)``: a gang preferring one domain waits up to ``wait`` for one once it could
start over several (Slurm's ``--switches=1@<max-time>``), then takes several; without a wait it never waits."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from scheduling_builders import FOREVER, admitted, config, gang, nodes_of, only, preempted, run
from test_scheduling_topology import DEFRAG, FLAVORED_RACKS, flavored, labelled, rack_of, racks

from engine import Topology
from engine.core.gang import GangShape
from engine.scheduling import GangRejected, GangReleased, Pending, Policy, Tick
from workflows.gang_spec import GangSpec, gang_request

RACKS = """\
tenants: [{name: default}]
topology: [rack]
"""


def two_half_taken_racks(text: str = RACKS) -> Policy:
    """Racks r1 (n0, n2) and r2 (n1, n3) of 2-GPU nodes, ``a`` on n0 and ``b`` on n1, neither preemptible (no
    gang moves to free a rack): two nodes free, in two racks."""
    policy = Policy(config(text), node_ttl_s=FOREVER)
    nodes = [labelled(f"n{i}", f"r{i % 2 + 1}") for i in range(4)]
    run([*nodes, gang("a", gpus=2, preemptible=False), gang("b", gpus=2, preemptible=False)], policy, now=0.0)
    assert (nodes_of(policy, "a"), nodes_of(policy, "b")) == ({"n0"}, {"n1"})
    return policy


def waiting(gang_id: str, wait: float | None = 60.0) -> object:
    return gang(gang_id, nnodes=2, gpus=2, topology_preferred="rack", topology_wait_s=wait)


def test_it_waits_for_one_rack_and_takes_it_when_one_frees() -> None:
    policy = two_half_taken_racks()
    decisions = run([waiting("g")], policy, now=100.0)
    assert admitted(decisions) == []
    assert only(decisions, Pending, "g").startswith("pending: waiting for one rack: needs 2 nodes")
    assert "waits for it up to 60 s" in only(decisions, Pending, "g")
    assert policy.next_deadline() == 160.0  # a Tick comes when the wait runs out
    decisions = run([GangReleased(gang_id="a")], policy, now=130.0)
    assert admitted(decisions) == ["g"] and rack_of(policy, "g") == {"r1"}


def test_after_its_wait_it_takes_several_racks() -> None:
    policy = two_half_taken_racks()
    run([waiting("g")], policy, now=100.0)
    assert admitted(run([Tick()], policy, now=159.0)) == []
    assert admitted(run([Tick()], policy, now=160.0)) == ["g"]
    assert rack_of(policy, "g") == {"r1", "r2"}


def test_without_a_wait_it_takes_several_racks_at_once() -> None:
    policy = two_half_taken_racks()
    assert admitted(run([waiting("g", wait=None)], policy, now=100.0)) == ["g"]
    assert rack_of(policy, "g") == {"r1", "r2"}


def test_the_wait_counts_from_when_it_could_first_start_over_several() -> None:
    policy = two_half_taken_racks()
    run([gang("c", gpus=2)], policy, now=0.0)
    run([waiting("g")], policy, now=10.0)  # one node free: it waits for capacity, not yet for a rack
    assert policy._topology_waits == {}
    run([GangReleased(gang_id="c")], policy, now=500.0)  # two free, in two racks: its wait starts now
    assert policy._topology_waits == {"g": 500.0} and policy.next_deadline() == 560.0
    assert admitted(run([Tick()], policy, now=560.0)) == ["g"]


def test_a_gang_preferring_host_with_a_wait_never_waits() -> None:
    # every node is a host of its own: two nodes are always two hosts, so a wait for one could only run out
    policy = two_half_taken_racks()
    decisions = run([gang("g", nnodes=2, gpus=2, topology_preferred="host", topology_wait_s=60.0)], policy, now=100.0)
    assert admitted(decisions) == ["g"] and policy._topology_waits == {}


def test_a_gang_behind_it_backfills_only_as_behind_a_required_gang() -> None:
    policy = two_half_taken_racks(RACKS + "priority_classes: [{name: vip, value: 0, preemptible: false}]\n")
    decisions = run([waiting("g"), gang("v", gpus=2, priority="vip")], policy, now=100.0)
    assert admitted(decisions) == []  # not preemptible: it does not backfill, it waits behind g
    assert "which goes first" in only(decisions, Pending, "v") and "waits for one rack" in only(decisions, Pending, "v")
    decisions = run([gang("s", gpus=2)], policy, now=101.0)
    assert admitted(decisions) == ["s"]  # preemptible: it backfills on one of the two free nodes


def test_while_it_waits_it_moves_gangs_out_of_one_rack_only() -> None:
    """With a wait it could start over two racks without moving anyone: it moves gangs only to free one rack
    (as a required gang), never to start over several."""
    policy = Policy(config(DEFRAG), node_ttl_s=FOREVER)
    nodes = [labelled(node_id, rack) for node_id, rack in (("n0", "r2"), ("n1", "r1"), ("n2", "r2"), ("n3", "r1"))]
    run([*nodes, gang("c", gpus=2, priority="vip"), gang("a", priority="low"), gang("f")], policy, now=0.0)
    run([gang("b", priority="low"), GangReleased(gang_id="f"), GangReleased(gang_id="c")], policy, now=50.0)
    # n0 (r2) and n3 (r1) free, a on n1 (r1), b on n2 (r2): freeing one rack means moving a or b
    decisions = run([waiting("g")], policy, now=100.0)
    assert [(v, cause) for v, _, _, cause in preempted(decisions)] == [("b", "defrag")]  # r2: b is younger
    decisions = run([GangReleased(gang_id="b"), gang("b", priority="low")], policy, now=101.0)
    assert sorted(admitted(decisions)) == ["b", "g"] and rack_of(policy, "g") == {"r2"}


def test_a_restored_policy_keeps_the_wait() -> None:
    policy = two_half_taken_racks()
    run([waiting("g")], policy, now=100.0)
    restored = Policy.restore(policy.snapshot())
    assert restored._topology_waits == {"g": 100.0} and restored.pending["g"].request.topology_wait_s == 60.0
    events = [Tick()]
    assert run(events, restored, now=160.0) == run(events, policy, now=160.0)


@pytest.mark.parametrize("wait", [60.0, None])
def test_a_gang_of_two_flavors_takes_the_one_with_a_whole_rack_rather_than_wait(wait: float | None) -> None:
    """h100 has two free nodes in two racks, a100 a free rack: a gang asking h100 first, then a100, starts at once
    on the a100 rack when it would wait for one; without a wait it takes its first flavor over two racks."""
    policy = Policy(config(FLAVORED_RACKS), node_ttl_s=FOREVER)
    fleet = [flavored("h0", "r1", "h100"), flavored("h1", "r2", "h100"), flavored("a0", "r3", "a100")]
    fleet.append(flavored("a1", "r3", "a100"))
    asks = {"nnodes": 2, "gpus": 2, "flavors": ("h100", "a100"), "topology_preferred": "rack"}
    decisions = run([*fleet, gang("g", **asks, topology_wait_s=wait)], policy, now=0.0)
    assert admitted(decisions) == ["g"]
    assert nodes_of(policy, "g") == ({"a0", "a1"} if wait else {"h0", "h1"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topology_required": "rack", "topology_wait_s": 60.0}, "topology_wait_s 60.0 needs topology_preferred"),
        ({"topology_preferred": "rack", "topology_wait_s": 0.0}, "a positive number of seconds"),
    ],
)
def test_a_wait_without_preferred_or_not_positive_is_rejected(fields: dict[str, object], message: str) -> None:
    policy = Policy(config(RACKS), node_ttl_s=FOREVER)
    decisions = run([*racks({"r1": 2}), gang("g", nnodes=2, **fields)], policy)
    assert message in only(decisions, GangRejected, "g")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"required": "rack", "wait": 60}, "Topology.wait applies to preferred= only"),
        ({"preferred": "rack", "wait": 0}, "Topology.wait must be positive, got 0"),
        ({"preferred": "rack", "wait": "10m"}, "Topology.wait must be seconds or a timedelta, got '10m'"),
        ({"preferred": "rack", "wait": True}, "Topology.wait must be seconds or a timedelta, got True"),
    ],
)
def test_a_bad_wait_is_refused_when_written(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Topology(**kwargs)  # type: ignore[arg-type]


def test_the_wait_travels_from_the_task_to_the_gang_request() -> None:
    placement = Topology(preferred="rack", wait=timedelta(minutes=10))
    assert placement.wait == timedelta(minutes=10) and placement.wait_s == 600.0
    assert Topology(preferred="rack", wait=90).wait_s == 90.0 and Topology(preferred="rack").wait_s is None
    shape = GangShape(nnodes=2, nproc_per_node=1, gpus_per_node=1, cpus_per_node=1.0, mem_per_node=None)
    spec = GangSpec(task="t", call="t-1", shape=shape, timeout_s=60, heartbeat_timeout_s=10, tenant="default")
    assert "topology_wait_s" not in gang_request(spec, "g")  # unset: the payload of before
    spec = GangSpec(**{**spec.__dict__, "topology_preferred": "rack", "topology_wait_s": 600.0})
    assert gang_request(spec, "g")["topology_wait_s"] == 600.0
