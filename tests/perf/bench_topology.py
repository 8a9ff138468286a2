"""Topology-aware placement in the scheduler benchmark (``bench_scheduler.py --racks N``).

The cluster's nodes are spread over ``N`` racks in order (node i in rack ``i * N // nodes``, label
``rack=rNN``) and the queue file declares ``topology: [rack]``. Two sides run the same trace on the same
labelled nodes, in the same process:

* **policy** (topology-aware): each multi-node gang asks for its rack, ``required`` when it fits one rack
  when idle and its id's CRC-32 is even, ``preferred`` otherwise (a gang bigger than a rack can only prefer;
  with ``--preferred-wait S`` it waits up to S seconds for one rack once it could start over several);
* **blind**: the same gangs asking nothing, placed as today (topology-blind best fit).

Each side's JSON gets ``gangs_in_one_domain``: of the admissions of multi-node gangs that fit one rack when
idle, the fraction placed in one rack (``one_domain`` has the counts, and the required/preferred split).
"""

from __future__ import annotations

import argparse
import zlib
from typing import Any

from bench_scheduler import Outcome, PolicyAdapter, SimGang

__all__ = ["RackedAdapter", "add_arguments", "rack_of", "racked_queue"]

LEVEL = "rack"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--racks",
        type=int,
        default=0,
        help="spread the nodes over this many racks (node label rack, queue file topology: [rack]); multi-node "
        "gangs ask for one rack (required or preferred), and a topology-blind side runs the same trace "
        "(default 0: no racks)",
    )
    parser.add_argument(
        "--preferred-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --racks: the gangs preferring a rack wait up to this long for one once they could start over "
        "several (Topology(wait=...)); default: they never wait",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, nodes: int) -> None:
    if args.racks < 0 or args.racks > nodes:
        parser.error(f"--racks must be between 0 and the number of nodes ({nodes}), got {args.racks}")
    if args.preferred_wait is not None and (not args.racks or not args.preferred_wait > 0):
        parser.error(f"--preferred-wait needs --racks and a positive number of seconds, got {args.preferred_wait}")


def rack_of(index: int, nodes: int, racks: int) -> str:
    """The rack of node ``index`` of ``nodes``: racks of (nearly) equal size, in node order."""
    return f"r{index * racks // nodes:03d}"


def racked_queue(queue: dict[str, Any]) -> dict[str, Any]:
    """The queue file with ``topology: [rack]``."""
    return {**queue, "topology": [LEVEL]}


class RackedAdapter(PolicyAdapter):
    """``PolicyAdapter`` on racked nodes; ``aware``: multi-node gangs ask for a rack. Counts, per admission of
    a multi-node gang that fits a rack, whether it landed in one."""

    def __init__(
        self, queue: dict[str, Any], node_ids: list[str], racks: int, *, aware: bool, wait: float | None = None
    ) -> None:
        super().__init__(racked_queue(queue))
        self.name = "policy" if aware else "blind"
        self.aware = aware
        self.wait = wait  # how long a gang preferring a rack waits for one (``--preferred-wait``); None: never
        self.rack = {node_id: rack_of(i, len(node_ids), racks) for i, node_id in enumerate(node_ids)}
        sizes: dict[str, int] = {}
        for rack in self.rack.values():
            sizes[rack] = sizes.get(rack, 0) + 1
        self.rack_size = min(sizes.values())  # a gang of at most this many nodes fits any rack when idle
        self.asks: dict[str, str] = {}  # gang id -> "required" | "preferred" (aware side, multi-node gangs)
        self.nnodes: dict[str, int] = {}
        #: admissions of multi-node gangs that fit one rack: (all, in one rack), in total and per ask
        self.domain_counts = {
            "fit": 0,
            "one": 0,
            "required_fit": 0,
            "required_one": 0,
            "preferred_fit": 0,
            "preferred_one": 0,
        }

    def register(self, node_id: str, gpus: int, cpus: int, now: float) -> list[Outcome]:
        labels = {**(self.fleet.labels(node_id) if self.fleet is not None else {}), LEVEL: self.rack[node_id]}
        spec = self.s.NodeSpec(node_id=node_id, address=f"{node_id}:0", gpus=gpus, cpus=cpus, labels=labels)
        return self._step(self.s.NodeRegistered(spec=spec), now)

    def submit(self, gang: SimGang, now: float) -> list[Outcome]:
        self.nnodes[gang.gang_id] = gang.nnodes
        fields: dict[str, Any] = {}
        if gang.nnodes > 1:
            fits = gang.nnodes <= self.rack_size
            ask = "required" if fits and zlib.crc32(gang.gang_id.encode()) % 2 == 0 else "preferred"
            self.asks[gang.gang_id] = ask
            if self.aware:
                fields[f"topology_{ask}"] = LEVEL
                if ask == "preferred" and self.wait is not None:
                    fields["topology_wait_s"] = self.wait
        request = self.s.GangRequest(
            gang_id=gang.gang_id,
            nnodes=gang.nnodes,
            gpus_per_node=gang.gpus_per_node,
            cpus_per_node=gang.cpus_per_node,
            tenant=gang.tenant,
            priority=gang.priority,
            flavors=self.fleet.gang_flavors[gang.gang_id] if self.fleet is not None else (),
            **fields,
            **self.user_of(gang.gang_id),
        )
        return self._step(self.s.GangSubmitted(request=request), now)

    def _step(self, event: Any, now: float) -> list[Outcome]:
        outcomes = super()._step(event, now)
        for outcome in outcomes:  # outside the timed call
            n = self.nnodes.get(outcome.gang_id, 1)
            if outcome.kind != "admitted" or n < 2 or n > self.rack_size:
                continue
            one = len({self.rack[node_id] for node_id, _ in outcome.nodes}) == 1
            ask = self.asks[outcome.gang_id]
            self.domain_counts["fit"] += 1
            self.domain_counts["one"] += one
            self.domain_counts[f"{ask}_fit"] += 1
            self.domain_counts[f"{ask}_one"] += one
        return outcomes

    def summary(self) -> dict[str, Any]:
        """The keys this side adds to its JSON."""
        c = self.domain_counts
        return {
            "gangs_in_one_domain": round(c["one"] / c["fit"], 4) if c["fit"] else None,
            "one_domain": {**c, "rack_size": self.rack_size, "racks": len(set(self.rack.values()))},
        }


def run_sides(
    simulate: Any,
    workload: Any,
    queue: dict[str, Any],
    racks: int,
    save_s: float,
    log: Any,
    told: Any = None,
    fleet: Any = None,
    wait: float | None = None,
    users: int = 0,
) -> dict[str, dict[str, Any]]:
    """Both sides on the same trace: the topology-aware policy, then the topology-blind one. ``told``: makes
    each side's checkpoint reports (``--checkpoint-interval``: bench_scheduler.told), or None; ``fleet``: the
    flavors' node labels and gangs' flavors (``--flavors``: bench_fleet.Fleet), or None; ``wait``: the
    preferring gangs' wait for one rack (``--preferred-wait``); ``users``: ``--users``."""
    sides: dict[str, dict[str, Any]] = {}
    for aware in (True, False):
        adapter = RackedAdapter(queue, workload.node_ids(), racks, aware=aware, wait=wait)
        adapter.fleet, adapter.users = fleet, users
        log(f"{adapter.name} ({racks} racks of >= {adapter.rack_size} nodes) ...")
        checkpoints = None if told is None else told()
        run = simulate(workload, adapter, save_s, progress=log, checkpoints=checkpoints)
        sides[adapter.name] = {**run, **adapter.summary()}
        side = sides[adapter.name]
        log(f"  {side['events']:,} calls in {side['wall_s']:.1f} s; gangs in one rack {side['gangs_in_one_domain']}")
    return sides
