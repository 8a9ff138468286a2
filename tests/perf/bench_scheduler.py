"""Scheduling policy at cluster scale: a discrete-event simulation of a shared GPU cluster, FIFO vs Policy.

    python tests/perf/bench_scheduler.py [--nodes 1000] [--gpus-per-node 8] [--gangs 15000] [--tenants 10]
                                         [--seed 0] [--load 1.5] [--save-s 30] [--grace-s 120]
                                         [--min-runtime-s 60] [--usage-half-life-s H] [--fifo-budget-s 60]
                                         [--flavors h100:400,a100:600]   # GPU flavors: bench_fleet.py
                                         [--racks 50]
                                         [--json | --markdown]
    python tests/perf/bench_scheduler.py --render RESULT.json     # the README rows of a saved JSON line

Two schedulers are driven directly, without Temporal, by the same seeded workload (see
:func:`generate_workload`), in simulated time (seconds; no wall clock enters the schedule):

* **fifo** — the strict-FIFO policy gangflow had before multi-tenant scheduling, loaded from git (the
  package ``engine/scheduling`` at commit ``8de69f7``, imported as ``fifo_baseline``). It ignores tenants
  and priorities and recomputes every queued gang's reason on every event, so it is capped by a
  wall-clock budget (``--fifo-budget-s``) and reports how far it got (``"finished": false``).
* **policy** — ``engine.scheduling.Policy`` with a queue configuration built from the workload (tenant
  quotas, cohorts, priority classes; :func:`queue_config`).

Each scheduler sits behind the same small adapter (:class:`Adapter`: register a node, submit, release,
tick, next deadline). The simulation sends every node's registration at time 0, each gang's submission at
its arrival, and a release when it finishes; a ``Tick`` whenever the scheduler's ``next_deadline()`` has
passed before the next event. A preempted gang (a ``Preempted`` decision) stops working at once, spends
``--save-s`` seconds saving while it still holds its GPUs, releases them, and is submitted again at once
under the same gang id with the work it has left since its last periodic checkpoint (one every 600 s of
run time; the work after it is lost). ``gpu_seconds_lost`` = GPUs x (lost work + save time).

Only the scheduler call itself is timed (``time.perf_counter`` around it, one sample per event), so the
simulation's own bookkeeping does not count against the scheduler.

Metrics, per scheduler:

* ``events_per_s``, ``p50_ms``, ``p99_ms`` — scheduler calls per second of scheduler time; latency per call.
  ``p50_cpu_ms``, ``p99_cpu_ms``: the same in process time (CPU) of the call, which other work on a shared
  machine does not inflate as it does the wall-clock latency.
* ``cpu_s`` — process time of the whole simulation loop, bookkeeping included (the Policy's snapshot
  size, sampled as the queue grows, is left out); ``step_cpu_s`` — process time inside the scheduler
  calls only, which other work on a shared machine does not inflate as it does wall-clock figures.
* ``makespan_over_bound`` — the last release over the work-conserving lower bound
  max(total GPU-seconds / cluster GPUs, max over gangs of arrival + duration). With the Philly fit the
  second term wins (a gang of up to 6.9 days), so this says mostly whether the longest gangs started
  early; ``config.bound`` has both terms.
* ``gpu_allocated_under_backlog`` — the time-weighted mean fraction of GPUs allocated while a gang waits.
* ``jain`` — Jain's index over tenants of (GPU-seconds received / entitlement), per 10-minute window with a
  backlog, averaged over those windows. A window's entitlement is the weighted max-min (water-filling)
  split of its GPU-seconds among the tenants, each capped at its demand in the window (the GPU-seconds it
  ran plus the GPU-seconds it had waiting).
* ``queue_delay_s`` — per tenant, p50 and p99 of (first admission - submission); also over all tenants
  and per priority class.
* ``preemptions_per_gang`` and ``gpu_seconds_lost``.
* ``checks`` — every placement checked against the simulation's own per-node GPU and CPU ledger
  (``no_double_allocation``), decisions that fit the gang's state (``consistent_decisions``: no admission
  of a gang that is not waiting, no preemption of one that is not running), no gang preempted for one
  that it later preempts (``no_preemption_cycle``), a ``Tick`` at ``next_deadline()`` moves it
  (``deadlines_advance``), every gang finished (``all_finished``); ``violations`` says what failed.
  A trace also stops after 100 scheduler calls per gang, lest a preemption loop never end.
* ``decision_hash`` — SHA-256 of every decision and its time: the same seed gives the same hash.
* ``--racks N``: topology-aware placement against topology-blind placement on the same racked nodes, a
  ``blind`` side beside ``policy``, each with ``gangs_in_one_domain`` (``bench_topology``).

Prints ONE JSON line ``{"benchmark": "scheduler", "fifo": {...}, "policy": {...}, "config": {...}, ...}`` on
stdout and a table on stderr (``--markdown``: the README's rows; ``--json``: no table). Not a test:
nothing here asserts on timings (``test_bench_scheduler.py`` runs a small size for its checks).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import math
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import ModuleType, SimpleNamespace
from typing import Any

from sim_checkpoints import CHECKPOINT, Checkpoints
from sim_ledger import SimLedger, TimedCounters

from engine.core.protocol import BADPUT

BASELINE_COMMIT = "8de69f7"
BASELINE_FILES = ("__init__", "model", "events", "capacity", "reasons", "describe", "policy")
#: the simulation does not model node heartbeats: a node registered at time 0 never expires
NODE_TTL_S = 1e12
CHECKPOINT_EVERY_S = 600.0
WINDOW_S = 600.0
#: arrivals keep ``--load`` x the cluster busy with what gangs run within this long of their start
RAMP_S = 3600.0
#: a trace stops after this many scheduler calls per gang (or node): a preemption loop would never end
MAX_CALLS_PER_GANG = 100
PROGRESS_EVERY_S = 30.0
#: gang sizes and durations: the Philly fit that the Gavel scheduler uses
GANG_GPUS = ((1, 0.83), (2, 0.03), (4, 0.03), (8, 0.10), (16, 0.01))
LONG_FRACTION = 0.05
SHORT_EXPONENTS = (1.0, 3.0)  # 60 * 10^U(1,3) s: 10 minutes to 16.7 hours
LONG_EXPONENTS = (3.0, 4.0)  # 60 * 10^U(3,4) s: 16.7 hours to 6.9 days
WEIGHTS = (1, 2, 3)  # tenants' weights, cycling
HIGH_FRACTION = 0.10
PRIORITY_CLASSES = (
    {"name": "low", "value": 10, "preemptible": True},
    {"name": "high", "value": 100, "preemptible": False},
)
COHORTS = ("cohort-a", "cohort-b", "cohort-c")
ROOT_COHORT = "cluster"
CPUS_PER_GPU_NODE = 8  # a node has 8 CPUs per GPU
CPUS_PER_GPU_GANG = 4  # a gang asks 4 CPUs per GPU on each of its nodes
SCHEDULERS = ("fifo", "policy")
#: issue 9's goals, shown next to the figures
GOALS = {
    "p99_ms": "≤ 5 ms",
    "step_cpu_s": "≤ 10 s",
    "makespan_over_bound": "≤ 1.2",
    "gpu_allocated_under_backlog": "≥ 90%",
    "jain": "≥ 0.95",
    "preemptions_per_gang": "≤ 3",
    "counters_us_per_event": "≤ 1 ms",
}


# ---------------------------------------------------------------------------------------------------------
# the workload
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimGang:
    """One gang of the trace: who submits it, when, its shape and how long it runs undisturbed."""

    gang_id: str
    tenant: str
    priority: str  # "low" (preemptible) or "high" (not)
    arrival: float
    duration: float
    nnodes: int
    gpus_per_node: int
    cpus_per_node: float

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node


@dataclass(frozen=True)
class SimTenant:
    name: str
    weight: int
    quota_gpus: int
    cohort: str | None
    borrowing_gpus: int | None = None  # the borrowing limit (None: unlimited)


@dataclass(frozen=True)
class Workload:
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    tenants: tuple[SimTenant, ...]
    gangs: tuple[SimGang, ...]
    arrival_rate: float  # gangs per second
    name: str = "philly"  # see ``WORKLOADS``
    priority_classes: tuple[dict[str, Any], ...] = PRIORITY_CLASSES
    #: the queue file's cohorts (None: ``cohort-a..c`` under one root ``cluster``, as the tenants name them)
    cohorts: tuple[dict[str, Any], ...] | None = None
    #: the queue file's policy keys this workload sets beyond ``queue_config``'s
    policy: tuple[tuple[str, Any], ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_ids(self) -> list[str]:
        width = len(str(self.nodes - 1))
        return [f"node-{i:0{width}d}" for i in range(self.nodes)]

    def bound(self) -> dict[str, float]:
        """The work-conserving lower bound on the makespan and its two terms."""
        work = sum(g.gpus * g.duration for g in self.gangs) / self.total_gpus
        longest = max(g.arrival + g.duration for g in self.gangs)
        return {"work_s": work, "longest_s": longest, "bound_s": max(work, longest)}


def _mean_capped(lo: float, hi: float, cap: float) -> float:
    """E[min(60 * 10^U(lo, hi), cap)]: a duration of the fit, counted up to ``cap`` seconds."""
    c = min(max(math.log10(cap / 60), lo), hi)
    below = 60 * (10**c - 10**lo) / ((hi - lo) * math.log(10))  # the durations shorter than the cap
    return below + cap * (hi - c) / (hi - lo)


def expected_gpu_seconds(gpus_per_node: int, nodes: int, horizon: float = math.inf) -> float:
    """The mean GPU-seconds one generated gang runs within ``horizon`` seconds of its start (sizes as
    :func:`gang_shape` rounds them; size and duration are drawn independently)."""
    gpus = sum(p * math.prod(gang_shape(g, gpus_per_node, nodes)) for g, p in GANG_GPUS)
    duration = (1 - LONG_FRACTION) * _mean_capped(*SHORT_EXPONENTS, horizon) + LONG_FRACTION * _mean_capped(
        *LONG_EXPONENTS, horizon
    )
    return gpus * duration


def gang_shape(gpus: int, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(nnodes, gpus per node) for a gang of ``gpus`` GPUs: one node when it fits one, else whole nodes
    (``ceil(gpus / gpus_per_node)`` of them, full), and never more nodes than the cluster has."""
    if gpus <= gpus_per_node:
        return 1, gpus
    return min(nodes, math.ceil(gpus / gpus_per_node)), gpus_per_node


def generate_workload(
    nodes: int, gpus_per_node: int, gangs: int, tenants: int, seed: int, load: float = 1.5
) -> Workload:
    """A seeded trace calibrated to the Philly fit (Gavel), on ``nodes`` x ``gpus_per_node`` GPUs.

    - **Gang size**: 1 GPU with p=.83, 2 with .03, 4 with .03, 8 with .10, 16 with .01. A gang bigger than a
      node takes whole nodes (16 GPUs on 8-GPU nodes: 2 nodes of 8); see :func:`gang_shape`.
    - **Duration**: 95 % are 60 * 10^U(1,3) s, 5 % are 60 * 10^U(3,4) s.
    - **CPUs**: nodes have 8 CPUs per GPU, a gang asks 4 per GPU on each node, so GPUs are what binds.
    - **Arrivals**: Poisson, at ``load * GPUs * 3600 / E[GPU-seconds a gang runs in its first hour]``
      (from the distributions above): by Little's law the gangs submitted in the last hour alone would
      keep ``load`` times the cluster busy. Not the long-run rate (``GPUs / E[GPU-seconds]``): half of the
      work is in the 5 % of gangs that run for days, which would spread a trace of 15,000 gangs over
      hours of arrivals with the cluster rarely full. With the default 1.5 the cluster is full within about
      an hour and a backlog of thousands of gangs lasts for most of the trace (as in Kueue's scheduler
      benchmark, which submits everything at once): the regime where order, fairness and preemption matter.
    - **Tenants**: ``team-0..`` with weights cycling 1, 2, 3 and GPU quotas proportional to the weights
      summing to the cluster's GPUs (largest remainder), in up to 3 cohorts (``cohort-a..c``, tenant i in
      cohort i mod 3) under one root cohort ``cluster``, so idle quota can be borrowed across the whole
      cluster. Each gang's tenant is drawn uniformly: demand is equal, entitlements are not.
    - **Priority**: 10 % of gangs are ``high`` (not preemptible), the rest ``low`` (preemptible).
    """
    rng = random.Random(seed)
    weights = [WEIGHTS[i % len(WEIGHTS)] for i in range(tenants)]
    total = nodes * gpus_per_node
    exact = [total * w / sum(weights) for w in weights]
    quotas = [math.floor(x) for x in exact]
    # largest remainder, ties to the lower index: deterministic and summing to the cluster exactly
    for i in sorted(range(tenants), key=lambda i: (quotas[i] - exact[i], i))[: total - sum(quotas)]:
        quotas[i] += 1
    ncohorts = min(len(COHORTS), tenants)
    sim_tenants = tuple(
        SimTenant(name=f"team-{i}", weight=weights[i], quota_gpus=quotas[i], cohort=COHORTS[i % ncohorts])
        for i in range(tenants)
    )
    rate = load * total / expected_gpu_seconds(gpus_per_node, nodes, RAMP_S)
    sizes = [g for g, _p in GANG_GPUS]
    cumulative = [p for _g, p in GANG_GPUS]
    width = len(str(gangs - 1))
    now = 0.0
    out = []
    for i in range(gangs):
        if i:
            now += rng.expovariate(rate)
        gpus = rng.choices(sizes, weights=cumulative)[0]
        exponents = LONG_EXPONENTS if rng.random() < LONG_FRACTION else SHORT_EXPONENTS
        duration = 60 * 10 ** rng.uniform(*exponents)
        tenant = sim_tenants[rng.randrange(tenants)].name
        priority = "high" if rng.random() < HIGH_FRACTION else "low"
        nnodes, per_node = gang_shape(gpus, gpus_per_node, nodes)
        out.append(
            SimGang(
                gang_id=f"g{i:0{width}d}",
                tenant=tenant,
                priority=priority,
                arrival=round(now, 3),
                duration=round(duration, 3),
                nnodes=nnodes,
                gpus_per_node=per_node,
                cpus_per_node=float(CPUS_PER_GPU_GANG * per_node),
            )
        )
    return Workload(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_node=CPUS_PER_GPU_NODE * gpus_per_node,
        tenants=sim_tenants,
        gangs=tuple(out),
        arrival_rate=rate,
    )


def kueue_baseline_workload() -> Workload:
    """Kueue's scheduler benchmark workload (kubernetes-sigs/kueue ``test/performance/scheduler/configs/
    baseline``), in gangflow's terms: 5 cohorts x 6 tenants (Kueue's ClusterQueues), each with a nominal
    quota of 20 GPUs and a borrowing limit of 100, ``reclaim_within_cohort: any`` and ``within_tenant:
    lower_priority``. Each tenant submits 350 small gangs (1 GPU, 200 ms, priority 50, one every 100 ms),
    100 medium (5 GPUs, 500 ms, priority 100, every 500 ms) and 50 large (20 GPUs, 1 s, priority 200, every
    1.2 s), the first of each at time 0: 15,000 gangs, all preemptible. Kueue's units are CPUs; here they
    are GPUs, on 30 nodes of 20 (6 per cohort's quota, one large gang per node). Work-conserving bound:
    39,600 GPU-seconds / 600 GPUs = 66 s."""
    classes = (("small", 350, 0.1, 1, 0.2, 50), ("medium", 100, 0.5, 5, 0.5, 100), ("large", 50, 1.2, 20, 1.0, 200))
    cohorts, per_cohort, gpus_per_node = 5, 6, 20
    tenants = tuple(
        SimTenant(name=f"cq-{c}-{q}", weight=1, quota_gpus=20, cohort=f"cohort-{c}", borrowing_gpus=100)
        for c in range(cohorts)
        for q in range(per_cohort)
    )
    gangs = [
        SimGang(
            gang_id=f"{t.name}-{name}-{i:03d}",
            tenant=t.name,
            priority=name,
            arrival=round(i * every, 3),
            duration=duration,
            nnodes=1,
            gpus_per_node=gpus,
            cpus_per_node=float(CPUS_PER_GPU_GANG * gpus),
        )
        for t in tenants
        for name, count, every, gpus, duration, _value in classes
        for i in range(count)
    ]
    gangs.sort(key=lambda g: g.arrival)  # stable: at one instant, tenants in order, small before large
    return Workload(
        nodes=cohorts * per_cohort * 20 // gpus_per_node,
        gpus_per_node=gpus_per_node,
        cpus_per_node=CPUS_PER_GPU_NODE * gpus_per_node,
        tenants=tenants,
        gangs=tuple(gangs),
        arrival_rate=len(gangs) / gangs[-1].arrival,
        name="kueue-baseline",
        priority_classes=tuple(
            {"name": name, "value": value, "preemptible": True} for name, _n, _e, _g, _d, value in classes
        ),
        cohorts=tuple({"name": f"cohort-{c}"} for c in range(cohorts)),
        policy=(("reclaim_within_cohort", "any"), ("within_tenant", "lower_priority")),
    )


#: ``--workload``: the generated Philly-fit trace, or Kueue's benchmark workload (fixed: no size flags)
WORKLOADS = ("philly", "kueue-baseline")


def queue_config(
    workload: Workload,
    grace_s: float,
    min_runtime_s: float,
    usage_half_life_s: float | None = None,
    checkpoint_wait_s: float | None = None,
) -> dict[str, Any]:
    """The queue configuration (the YAML file's shape) the Policy runs with: the workload's tenants and
    cohorts, its priority classes, no cap on pending gangs, and the default policy otherwise (fair share
    with memory only when ``usage_half_life_s`` is given, a victim's checkpoint waited for only with
    ``checkpoint_wait_s``: without them the queue file is as before)."""
    if workload.cohorts is None:
        used = sorted({t.cohort for t in workload.tenants if t.cohort is not None})
        cohorts = [{"name": ROOT_COHORT}, *({"name": c, "parent": ROOT_COHORT} for c in used)]
    else:
        cohorts = [dict(c) for c in workload.cohorts]
    tenants = []
    for t in workload.tenants:
        entry: dict[str, Any] = {"name": t.name, "cohort": t.cohort, "weight": t.weight, "quota": {"gpu": t.quota_gpus}}
        if t.borrowing_gpus is not None:
            entry["borrowing_limit"] = {"gpu": t.borrowing_gpus}
        tenants.append(entry)
    return {
        "cohorts": cohorts,
        "tenants": tenants,
        "priority_classes": [dict(c) for c in workload.priority_classes],
        # the trace keeps a backlog of thousands of gangs per tenant: no cap on pending gangs refuses any of it
        "policy": {
            "min_runtime": min_runtime_s,
            "preemption_grace": grace_s,
            "default_priority": workload.priority_classes[0]["name"],
            "max_pending": len(workload.gangs),
            **dict(workload.policy),
            **({} if usage_half_life_s is None else {"usage_half_life": usage_half_life_s}),
            **({} if checkpoint_wait_s is None else {"checkpoint_wait": checkpoint_wait_s}),
        },
    }


# ---------------------------------------------------------------------------------------------------------
# the schedulers, behind one adapter
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """A decision, reduced to what the simulation acts on."""

    kind: str  # admitted | preempted | rejected | pending
    gang_id: str
    nodes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # admitted: (node id, GPU ids), by node rank
    by: str = ""  # preempted: the preemptor
    cause: str = ""  # preempted: reclaim | priority | backfill | drain
    reason: str = ""


class Adapter:
    """What the simulation needs from a scheduler. Subclasses build the scheduler's own event objects
    (outside the timed call) and make one ``_timed`` call per event, which times the scheduler, hashes its
    decisions (``decision_hash``: same trace, same decisions) and reduces them to :class:`Outcome`."""

    name = ""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.cpu_latencies: list[float] = []  # process time per call
        self.cpu_s = 0.0
        self.counts: dict[str, int] = {}
        self._digest = hashlib.sha256()
        self.fleet: Any = None  # ``--flavors``: bench_fleet.Fleet (node labels, gangs' flavors, violations)

    def register(self, node_id: str, gpus: int, cpus: int, now: float) -> list[Outcome]:
        raise NotImplementedError

    def submit(self, gang: SimGang, now: float) -> list[Outcome]:
        raise NotImplementedError

    def release(self, gang_id: str, now: float) -> list[Outcome]:
        raise NotImplementedError

    def tick(self, now: float) -> list[Outcome]:
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        raise NotImplementedError

    @property
    def decision_hash(self) -> str:
        return self._digest.hexdigest()

    def _timed(self, call: Callable[[], Sequence[Any]], now: float) -> list[Outcome]:
        cpu, start = time.process_time(), time.perf_counter()
        decisions = call()
        self.latencies.append(time.perf_counter() - start)
        cpu = time.process_time() - cpu  # what a shared machine's other work does not inflate
        self.cpu_latencies.append(cpu)
        self.cpu_s += cpu
        out = []
        for decision in decisions:
            self._digest.update(f"{now!r} ".encode())
            self._digest.update(decision.model_dump_json().encode())
            self._digest.update(b"\n")
            kind = str(decision.kind)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind == "admitted":
                nodes = tuple((a.node_id, tuple(a.gpu_ids)) for a in decision.placement.nodes)
                out.append(Outcome(kind, decision.placement.gang_id, nodes=nodes))
                if self.fleet is not None:
                    ids = [n for n, _ in nodes]
                    self.fleet.check(self.name, decision.placement.gang_id, ids, getattr(decision, "flavor", None))
            elif kind == "preempted":
                out.append(
                    Outcome(kind, decision.gang_id, by=decision.by, cause=decision.cause, reason=decision.reason)
                )
            elif kind == "rejected":
                out.append(Outcome(kind, decision.gang_id, reason=decision.reason))
        return out


class PolicyAdapter(Adapter):
    """``engine.scheduling.Policy``: one object, mutated by ``step``."""

    name = "policy"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        from engine.scheduling import GangReleased, GangRequest, GangSubmitted, NodeRegistered, NodeSpec, Policy, Tick
        from engine.scheduling.config import load_queue_config

        self.s = SimpleNamespace(
            GangReleased=GangReleased,
            GangRequest=GangRequest,
            GangSubmitted=GangSubmitted,
            NodeRegistered=NodeRegistered,
            NodeSpec=NodeSpec,
            Tick=Tick,
        )
        self.policy = Policy(load_queue_config(config), node_ttl_s=NODE_TTL_S)
        self.policy.counters = TimedCounters()  # the same counting, timed apart (counters_us_per_event)
        self.users = 0  # ``--users``: each gang names one of this many users of its tenant

    def user_of(self, gang_id: str) -> dict[str, str]:
        """The request's ``user`` field under ``--users`` (drawn by the gang's id, so every side agrees)."""
        return {"user": f"user{zlib.crc32(gang_id.encode()) % self.users}"} if self.users else {}

    def _step(self, event: Any, now: float) -> list[Outcome]:
        return self._timed(lambda: self.policy.step(event, now), now)

    def register(self, node_id: str, gpus: int, cpus: int, now: float) -> list[Outcome]:
        labels = self.fleet.labels(node_id) if self.fleet is not None else {}
        spec = self.s.NodeSpec(node_id=node_id, address=f"{node_id}:0", gpus=gpus, cpus=cpus, labels=labels)
        return self._step(self.s.NodeRegistered(spec=spec), now)

    def submit(self, gang: SimGang, now: float) -> list[Outcome]:
        request = self.s.GangRequest(
            gang_id=gang.gang_id,
            nnodes=gang.nnodes,
            gpus_per_node=gang.gpus_per_node,
            cpus_per_node=gang.cpus_per_node,
            tenant=gang.tenant,
            priority=gang.priority,
            flavors=self.fleet.gang_flavors[gang.gang_id] if self.fleet is not None else (),
            **self.user_of(gang.gang_id),
        )
        return self._step(self.s.GangSubmitted(request=request), now)

    def release(self, gang_id: str, now: float) -> list[Outcome]:
        return self._step(self.s.GangReleased(gang_id=gang_id), now)

    def tick(self, now: float) -> list[Outcome]:
        return self._step(self.s.Tick(), now)

    def next_deadline(self) -> float | None:
        deadline: float | None = self.policy.next_deadline()
        return deadline

    def snapshot_bytes(self) -> int:
        """The size of the state a continue-as-new would carry, as compact JSON."""
        import json

        return len(json.dumps(self.policy.snapshot(), separators=(",", ":")))


class FifoAdapter(Adapter):
    """The pre-tenancy FIFO policy: ``state, decisions = step(state, event, now)``; no tenants, no priorities."""

    name = "fifo"

    def __init__(self, module: ModuleType) -> None:
        super().__init__()
        self.m = module
        self.state = module.ClusterState(node_ttl_s=NODE_TTL_S)

    def _step(self, event: Any, now: float) -> list[Outcome]:
        def call() -> Sequence[Any]:
            self.state, decisions = self.m.step(self.state, event, now)
            return decisions  # type: ignore[no-any-return]

        return self._timed(call, now)

    def register(self, node_id: str, gpus: int, cpus: int, now: float) -> list[Outcome]:
        spec = self.m.NodeSpec(node_id=node_id, address=f"{node_id}:0", gpus=gpus, cpus=cpus)
        return self._step(self.m.NodeRegistered(spec=spec), now)

    def submit(self, gang: SimGang, now: float) -> list[Outcome]:
        request = self.m.GangRequest(
            gang_id=gang.gang_id,
            nnodes=gang.nnodes,
            gpus_per_node=gang.gpus_per_node,
            cpus_per_node=gang.cpus_per_node,
            tenant=gang.tenant,
        )
        return self._step(self.m.GangSubmitted(request=request), now)

    def release(self, gang_id: str, now: float) -> list[Outcome]:
        return self._step(self.m.GangReleased(gang_id=gang_id), now)

    def tick(self, now: float) -> list[Outcome]:
        return self._step(self.m.Tick(), now)

    def next_deadline(self) -> float | None:
        deadline: float | None = self.m.next_deadline(self.state)
        return deadline


def load_fifo_baseline(commit: str = BASELINE_COMMIT) -> ModuleType | str:
    """The FIFO policy package as it was at ``commit``, imported as ``fifo_baseline``; or why it cannot be."""
    import importlib
    import re
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    scratch = Path(tempfile.mkdtemp(prefix="gangflow-fifo-baseline-"))
    try:
        package = scratch / "fifo_baseline"
        package.mkdir()
        for name in BASELINE_FILES:
            path = f"engine/scheduling/{name}.py"
            try:
                done = subprocess.run(
                    ["git", "-C", str(root), "show", f"{commit}:{path}"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"git show {commit}:{path} did not run: {exc}"
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
                return f"git show {commit}:{path} failed: {why}"
            (package / f"{name}.py").write_text(re.sub(r"\bengine\.scheduling\b", "fifo_baseline", done.stdout))
        sys.path.insert(0, str(scratch))
        try:
            # the package's __init__ imports every module, so the files are not needed after this
            return importlib.import_module("fifo_baseline")
        except Exception as exc:
            return f"the baseline at {commit} does not import: {type(exc).__name__}: {exc}"
        finally:
            sys.path.remove(str(scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# the simulation
# ---------------------------------------------------------------------------------------------------------
ARRIVE, FINISH, SAVED = "arrive", "finish", "saved"
#: at one instant, releases (and checkpoints, sim_checkpoints) go before arrivals so that what they change
#: is there for them
ORDER = {FINISH: 0, SAVED: 0, CHECKPOINT: 0, ARRIVE: 1}
Nodes = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class GangTask:
    """The simulation's view of one gang across its attempts."""

    gang: SimGang
    tenant: int  # index into the workload's tenants
    done_work: float = 0.0  # checkpointed progress carried from earlier attempts
    attempt: int = 0  # admissions so far: a FINISH or SAVED event of an earlier attempt is stale
    state: str = "new"  # new | pending | running | saving | finished | rejected
    started: float = 0.0
    stopped: float = 0.0  # when a preemption notice stopped its work
    first_admitted: float | None = None
    placement: Nodes = ()
    preemptions: int = 0
    cause: str = ""  # the cause of its latest preemption

    @property
    def remaining(self) -> float:
        return self.gang.duration - self.done_work


class Simulation:
    """One scheduler through the whole trace: the event heap, each gang's state, the simulation's own ledger
    of the cluster (every placement is checked against it) and the time integrals the metrics need."""

    def __init__(
        self, workload: Workload, adapter: Adapter, save_s: float, checkpoints: Checkpoints | None = None
    ) -> None:
        self.workload, self.adapter, self.save_s = workload, adapter, save_s
        self.checkpoints = checkpoints or Checkpoints(CHECKPOINT_EVERY_S)
        self.node_ids = workload.node_ids()
        index = {t.name: i for i, t in enumerate(workload.tenants)}
        self.runs = {g.gang_id: GangTask(g, index[g.tenant]) for g in workload.gangs}
        self.free_gpus = {n: set(range(workload.gpus_per_node)) for n in self.node_ids}
        self.free_cpus = dict.fromkeys(self.node_ids, float(workload.cpus_per_node))
        self.heap: list[tuple[float, int, int, str, str, int]] = []
        self.seq = 0
        self.clock = 0.0
        # piecewise-constant state, integrated by `advance`
        self.held_gpus = 0  # allocated, including gangs still saving after a preemption notice
        self.pending = 0
        self.pending_gpus = [0] * len(workload.tenants)
        self.running_gpus = [0] * len(workload.tenants)
        self.backlog_s = 0.0
        self.held_under_backlog = 0.0  # GPU-seconds
        self.windows: dict[int, tuple[list[float], list[float]]] = {}  # GPU-seconds ran, waited per tenant
        # what happened
        self.finished = 0
        self.makespan = 0.0
        self.rejections = 0
        self.lost_gpu_s = 0.0
        self.causes: dict[str, int] = {}
        self.preempted_by: set[tuple[str, str]] = set()  # (victim, preemptor)
        self.peak_pending = 0
        self.snapshot_at = 0
        self.snapshot_bytes: int | None = None
        self.measuring_s = 0.0
        # what went wrong
        self.violations: list[str] = []
        self.ledger = SimLedger([t.name for t in workload.tenants])  # where the GPU-seconds went (sim_ledger)
        self.double_allocations = 0
        self.inconsistent = 0
        self.cycles = 0
        self.deadlines_advance = True

    # -- the run ----------------------------------------------------------------------------------------
    def run(self, budget_s: float | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Every event of the trace, or as many as ``budget_s`` seconds of wall clock allow; ``progress``
        gets a line every ``PROGRESS_EVERY_S`` seconds of wall clock."""
        for gang in self.workload.gangs:
            self.push(gang.arrival, ARRIVE, gang.gang_id)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for node_id in self.node_ids:
            self.handle(self.adapter.register(node_id, self.workload.gpus_per_node, self.workload.cpus_per_node, 0.0))
        stopped = False
        last_ticked: float | None = None
        limit = MAX_CALLS_PER_GANG * (len(self.runs) + len(self.node_ids))
        report = wall0 + PROGRESS_EVERY_S
        while self.heap:
            last_ticked = self.tick_until(self.heap[0][0], last_ticked)
            at, _order, _seq, kind, gang_id, attempt = heapq.heappop(self.heap)
            self.advance(at)
            run = self.runs[gang_id]
            if kind == ARRIVE:
                self.submit(run)
            elif kind == FINISH and run.attempt == attempt and run.state in ("running", "saving"):
                self.finish(run)
            elif kind == SAVED and run.attempt == attempt and run.state == "saving":
                self.saved(run)
            elif kind == CHECKPOINT:
                self.checkpoints.fire(self, run, attempt)
            self.sample_snapshot()
            if progress is not None and time.perf_counter() > report:
                report += PROGRESS_EVERY_S
                progress(
                    f"  {self.adapter.name}: {len(self.adapter.latencies):,} calls, {self.clock / 3600:,.1f} h "
                    f"simulated, {self.pending:,} waiting, {self.finished:,} finished"
                )
            if budget_s is not None and time.perf_counter() - wall0 > budget_s:
                stopped = bool(self.heap)
                break
            if len(self.adapter.latencies) > limit:
                # a scheduler that preempts in a loop would never let the trace end
                self.violations.append(f"stopped after {limit:,} scheduler calls: gangs preempted in a loop?")
                stopped = bool(self.heap)
                break
        cpu_s = time.process_time() - cpu0 - self.measuring_s
        return self.result(finished=not stopped, cpu_s=cpu_s, wall_s=time.perf_counter() - wall0)

    def tick_until(self, upcoming: float, last_ticked: float | None) -> float | None:
        """Send a Tick for every scheduler deadline that passes before ``upcoming``; the last one ticked."""
        deadline = self.adapter.next_deadline()
        while deadline is not None and deadline <= upcoming and deadline != last_ticked:
            now = max(deadline, self.clock)
            self.advance(now)
            self.handle(self.adapter.tick(now))
            last_ticked, deadline = deadline, self.adapter.next_deadline()
            if deadline is not None and deadline <= last_ticked:
                # a Tick that does not move the deadline would be sent forever: note it, go on with the trace
                self.deadlines_advance = False
                self.violation(f"next_deadline() is still {deadline} after a Tick at {now}")
                break
        return last_ticked

    def submit(self, run: GangTask) -> None:
        run.state = "pending"
        self.set_pending(run, True)
        self.handle(self.adapter.submit(replace(run.gang, duration=run.remaining), self.clock))

    def finish(self, run: GangTask) -> None:
        self.ledger.completed(run.gang.tenant, run.gang.gpus, run.started, self.clock)
        self.free(run)
        run.state, run.done_work = "finished", run.gang.duration
        self.finished += 1
        self.makespan = self.clock
        self.handle(self.adapter.release(run.gang.gang_id, self.clock))

    def saved(self, run: GangTask) -> None:
        """A preempted gang has saved: it releases its GPUs and asks again for the work it has left."""
        progress = run.done_work + (run.stopped - run.started)
        kept = self.checkpoints.kept(run.gang.gang_id, progress)
        self.lost_gpu_s += run.gang.gpus * (progress - kept + self.save_s)
        gang, drain = run.gang, run.cause == "drain"
        self.ledger.preempted(
            gang.tenant, gang.gpus, kept - run.done_work, progress - kept, self.clock - run.stopped, drain
        )
        run.done_work = kept
        self.free(run)
        self.handle(self.adapter.release(run.gang.gang_id, self.clock))
        self.submit(run)

    def sample_snapshot(self) -> None:
        """The Policy's continue-as-new state, measured each time the queue has grown by a quarter."""
        if isinstance(self.adapter, PolicyAdapter) and self.pending > max(self.peak_pending, 1.25 * self.snapshot_at):
            cpu = time.process_time()
            self.snapshot_at = self.pending
            self.snapshot_bytes = self.adapter.snapshot_bytes()
            self.measuring_s += time.process_time() - cpu  # not the simulation's cost: left out of cpu_s
        self.peak_pending = max(self.peak_pending, self.pending)

    # -- decisions --------------------------------------------------------------------------------------
    def handle(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            run = self.runs.get(outcome.gang_id)
            if run is None:
                self.inconsistency(f"a decision for unknown gang {outcome.gang_id}")
            elif outcome.kind == "admitted":
                self.admit(run, outcome.nodes)
            elif outcome.kind == "preempted":
                self.preempt(run, outcome)
            elif outcome.kind == "rejected":
                self.rejections += 1
                self.violation(f"{run.gang.gang_id} rejected: {outcome.reason}")
                if run.state == "pending":
                    self.set_pending(run, False)
                    run.state = "rejected"

    def admit(self, run: GangTask, nodes: Nodes) -> None:
        gang = run.gang
        if run.state != "pending":
            self.inconsistency(f"{gang.gang_id} admitted while {run.state}")
            return
        if len(nodes) != gang.nnodes or len({n for n, _ in nodes}) != len(nodes):
            self.inconsistency(f"{gang.gang_id} asked for {gang.nnodes} distinct nodes, got {[n for n, _ in nodes]}")
        for node_id, gpu_ids in nodes:
            free = self.free_gpus.get(node_id)
            if free is None:
                self.inconsistency(f"{gang.gang_id} placed on unknown node {node_id}")
                continue
            if len(gpu_ids) != gang.gpus_per_node or len(set(gpu_ids)) != len(gpu_ids):
                self.inconsistency(f"{gang.gang_id} got GPUs {gpu_ids} on {node_id}, asked for {gang.gpus_per_node}")
            taken = sorted(g for g in gpu_ids if g not in free)
            if taken:
                self.double_allocations += 1
                self.violation(f"{gang.gang_id} got GPUs {taken} on {node_id}, which another gang holds")
            free.difference_update(gpu_ids)
            self.free_cpus[node_id] -= gang.cpus_per_node
            if self.free_cpus[node_id] < -1e-9:
                self.double_allocations += 1
                self.violation(f"{gang.gang_id} overcommits the CPUs of {node_id}")
        self.set_pending(run, False)
        run.state, run.started, run.placement = "running", self.clock, nodes
        self.hold(run, True)
        if run.first_admitted is None:
            run.first_admitted = self.clock
        run.attempt += 1
        self.push(self.clock + run.remaining, FINISH, gang.gang_id, run.attempt)
        self.checkpoints.admitted(self, run)

    def preempt(self, run: GangTask, outcome: Outcome) -> None:
        """The notice: the gang stops working now and saves for ``save_s`` while it still holds its GPUs."""
        victim = run.gang.gang_id
        if run.state == "saving":
            return  # told again while it saves: nothing new to do
        if run.state != "running":
            self.inconsistency(f"{victim} preempted while {run.state}")
            return
        if (outcome.by, victim) in self.preempted_by:
            self.cycles += 1
            self.violation(f"preemption cycle: {victim} preempted for {outcome.by}, which was preempted for it")
        self.preempted_by.add((victim, outcome.by))
        self.causes[outcome.cause] = self.causes.get(outcome.cause, 0) + 1
        run.preemptions += 1
        run.state, run.stopped, run.cause = "saving", self.clock, outcome.cause
        if self.clock + self.save_s < run.started + run.remaining:
            self.push(self.clock + self.save_s, SAVED, victim, run.attempt)
        # else it finishes before its save would: nothing is lost, its own release follows

    # -- bookkeeping ------------------------------------------------------------------------------------
    def push(self, at: float, kind: str, gang_id: str, attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, ORDER[kind], self.seq, kind, gang_id, attempt))

    def set_pending(self, run: GangTask, on: bool) -> None:
        sign = 1 if on else -1
        self.pending += sign
        self.pending_gpus[run.tenant] += sign * run.gang.gpus

    def hold(self, run: GangTask, on: bool) -> None:
        sign = 1 if on else -1
        self.running_gpus[run.tenant] += sign * run.gang.gpus
        self.held_gpus += sign * run.gang.gpus

    def free(self, run: GangTask) -> None:
        for node_id, gpu_ids in run.placement:
            self.free_gpus[node_id].update(gpu_ids)
            self.free_cpus[node_id] += run.gang.cpus_per_node
        run.placement = ()
        self.hold(run, False)

    def advance(self, to: float) -> None:
        """Integrate the piecewise-constant state over [clock, to), window by window."""
        if to <= self.clock:
            return
        start, self.clock = self.clock, to
        if self.pending:
            self.backlog_s += to - start
            self.held_under_backlog += (to - start) * self.held_gpus
        elif not self.held_gpus:
            return
        t = start
        while t < to:
            index = int(t // WINDOW_S)
            end = min(to, (index + 1) * WINDOW_S)
            window = self.windows.get(index)
            if window is None:
                n = len(self.workload.tenants)
                window = self.windows[index] = ([0.0] * n, [0.0] * n)
            ran, waited = window
            for i, gpus in enumerate(self.running_gpus):
                if gpus:
                    ran[i] += gpus * (end - t)
            for i, gpus in enumerate(self.pending_gpus):
                if gpus:
                    waited[i] += gpus * (end - t)
            t = end

    def violation(self, text: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(f"t={self.clock:.1f}: {text}")

    def inconsistency(self, text: str) -> None:
        self.inconsistent += 1
        self.violation(text)

    # -- the figures ------------------------------------------------------------------------------------
    def result(self, finished: bool, cpu_s: float, wall_s: float) -> dict[str, Any]:
        lat = self.adapter.latencies
        busy = sum(lat)
        delays: dict[str, list[float]] = {t.name: [] for t in self.workload.tenants}
        by_priority: dict[str, list[float]] = {c["name"]: [] for c in self.workload.priority_classes}
        for run in self.runs.values():
            if run.first_admitted is not None:
                delays[run.gang.tenant].append(run.first_admitted - run.gang.arrival)
                by_priority[run.gang.priority].append(run.first_admitted - run.gang.arrival)
        bound = self.workload.bound()["bound_s"]
        jain = windowed_jain(self.windows, self.workload, self.clock)
        preemptions = sum(r.preemptions for r in self.runs.values())
        return {
            "finished": finished,
            "events": len(lat),
            "sim_time_s": round(self.clock, 1),
            "events_per_s": round(len(lat) / busy, 1) if busy else None,
            "p50_ms": _round(percentile(lat, 50), 3, 1000),
            "p99_ms": _round(percentile(lat, 99), 3, 1000),
            "p50_cpu_ms": _round(percentile(self.adapter.cpu_latencies, 50), 3, 1000),
            "p99_cpu_ms": _round(percentile(self.adapter.cpu_latencies, 99), 3, 1000),
            "max_ms": _round(max(lat, default=None), 3, 1000),
            "step_s": round(busy, 3),
            "step_cpu_s": round(self.adapter.cpu_s, 3),
            "cpu_s": round(cpu_s, 3),
            "wall_s": round(wall_s, 3),
            "makespan_s": round(self.makespan, 1) if finished else None,
            "makespan_over_bound": round(self.makespan / bound, 4) if finished else None,
            "gpu_allocated_under_backlog": (
                round(self.held_under_backlog / (self.backlog_s * self.workload.total_gpus), 4)
                if self.backlog_s
                else None
            ),
            "backlog_s": round(self.backlog_s, 1),
            "jain": _round(jain, 4),
            "preemptions_per_gang": round(preemptions / len(self.runs), 4),
            "preemptions": preemptions,
            "preemptions_by_cause": dict(sorted(self.causes.items())),
            "gpu_seconds_lost": round(self.lost_gpu_s, 1),
            "gpu_hours_lost_preemption": round(self.lost_gpu_s / 3600, 2),  # the same: work lost + saves
            **self.checkpoints.result(),
            "queue_delay_s": {name: p50_p99(v) for name, v in delays.items()},
            "queue_delay_all_s": p50_p99([d for v in delays.values() for d in v]),
            "queue_delay_by_priority_s": {name: p50_p99(v) for name, v in by_priority.items()},
            "queue_delay_mean_by_priority_s": {
                name: round(sum(v) / len(v), 2) if v else None for name, v in by_priority.items()
            },
            "gangs_finished": self.finished,
            "rejections": self.rejections,
            "peak_pending": self.peak_pending,
            "snapshot_bytes_at_peak": self.snapshot_bytes,
            "decisions": dict(sorted(self.adapter.counts.items())),
            "decision_hash": self.adapter.decision_hash,
            "ledger": self.ledger.result(),
            **self.counter_costs(),
            "checks": {
                "no_double_allocation": self.double_allocations == 0,
                "consistent_decisions": self.inconsistent == 0,
                "no_preemption_cycle": self.cycles == 0,
                "deadlines_advance": self.deadlines_advance,
                "all_finished": self.finished == len(self.runs),
            },
            "violations": self.violations,
        }

    def counter_costs(self) -> dict[str, Any]:
        """What the Policy's counters (engine.scheduling.counters: admission waits, restarts, admissions,
        preemptions) took per scheduler call, timed apart (sim_ledger.TimedCounters); FIFO has none."""
        counters = getattr(getattr(self.adapter, "policy", None), "counters", None)
        if not isinstance(counters, TimedCounters) or not self.adapter.latencies:
            return {}
        calls, busy = len(self.adapter.latencies), sum(self.adapter.latencies)
        return {
            "counters_us_per_event": round(counters.seconds / calls * 1e6, 2),
            "counters_max_ms": round(counters.slowest * 1000, 3),
            "counters_share_of_step": round(counters.seconds / busy, 4) if busy else None,
        }


def simulate(
    workload: Workload,
    adapter: Adapter,
    save_s: float,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    checkpoints: Checkpoints | None = None,
) -> dict[str, Any]:
    """Run the trace through ``adapter`` (at most ``budget_s`` of wall clock); its figures and checks."""
    return Simulation(workload, adapter, save_s, checkpoints).run(budget_s, progress)


# ---------------------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------------------
def _round(value: float | None, digits: int, scale: float = 1.0) -> float | None:
    return None if value is None else round(value * scale, digits)


def p50_p99(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": _round(percentile(values, 50), 1), "p99": _round(percentile(values, 99), 1)}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between the closest ranks; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def water_fill(capacity: float, demands: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted max-min split of ``capacity``: each share proportional to its weight, capped at its demand,
    what a capped share leaves going to the others."""
    alloc = [0.0] * len(demands)
    active = sorted(
        (i for i, d in enumerate(demands) if d > 0 and weights[i] > 0), key=lambda i: demands[i] / weights[i]
    )
    remaining, weight = capacity, sum(weights[i] for i in active)
    for k, i in enumerate(active):
        if demands[i] * weight <= remaining * weights[i]:
            alloc[i] = demands[i]
            remaining -= demands[i]
            weight -= weights[i]
        else:
            for j in active[k:]:
                alloc[j] = remaining * weights[j] / weight
            break
    return alloc


def jain_index(xs: Sequence[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything."""
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares else 1.0


def windowed_jain(windows: dict[int, tuple[list[float], list[float]]], workload: Workload, end: float) -> float | None:
    """Jain's index of received / entitled GPU-seconds per window with a backlog, averaged by window length
    (``windows``: per window index, the GPU-seconds each tenant ran and had waiting)."""
    weights = [float(t.weight) for t in workload.tenants]
    total, span = 0.0, 0.0
    for index, (ran, waited) in sorted(windows.items()):
        length = min(WINDOW_S, end - index * WINDOW_S)
        if not any(waited) or length <= 0:
            continue
        demand = [r + w for r, w in zip(ran, waited, strict=True)]
        entitled = water_fill(workload.total_gpus * length, demand, weights)
        ratios = [r / e for r, e in zip(ran, entitled, strict=True) if e > 0]
        if ratios:
            total += jain_index(ratios) * length
            span += length
    return total / span if span else None


# ---------------------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------------------
ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, key, format)
    ("scheduler calls per second", "events_per_s", "{:,.0f}"),
    ("p50 per call", "p50_ms", "{:.3f} ms"),
    ("p99 per call", "p99_ms", "{:.3f} ms"),
    ("p99 per call, CPU time", "p99_cpu_ms", "{:.3f} ms"),
    ("CPU for the whole trace, simulation included", "cpu_s", "{:.1f} s"),
    ("of which in the scheduler", "step_cpu_s", "{:.1f} s"),
    ("makespan / work-conserving bound", "makespan_over_bound", "{:.3f}"),
    ("GPUs allocated while gangs wait", "gpu_allocated_under_backlog", "{:.1%}"),
    ("Jain's index, received / entitled GPU time", "jain", "{:.3f}"),
    ("preemptions per gang", "preemptions_per_gang", "{:.3f}"),
    ("GPU-hours lost to preemption", "gpu_seconds_lost", "{:,.0f}"),
    ("queue delay p50, all tenants", "queue_delay_p50", "{:,.0f} s"),
    ("queue delay p99, all tenants", "queue_delay_p99", "{:,.0f} s"),
    ("queue delay p99, priority class high", "queue_delay_high_p99", "{:,.0f} s"),
    ("goodput (ledger in simulated time)", "goodput", "{:.2%}"),
    ("badput: work lost to preemption", "badput_lost_preemption", "{:,.0f} GPU-h"),
    ("badput: saving on notice (checkpoint)", "badput_checkpoint", "{:,.0f} GPU-h"),
    ("counters (waits, restarts) per scheduler call", "counters_us_per_event", "{:.1f} µs"),
)


#: figures about the schedule as a whole: a run stopped at its budget shows none (its JSON keeps them)
SCHEDULE_KEYS = frozenset(
    {
        "makespan_over_bound",
        "gpu_allocated_under_backlog",
        "jain",
        "queue_delay_p50",
        "queue_delay_p99",
        "queue_delay_high_p99",
    }
)


def cell(entry: dict[str, Any], key: str, fmt: str) -> str:
    if "skipped" in entry:
        return "skipped"
    if key in SCHEDULE_KEYS and not entry["finished"]:
        return "–"
    if key == "gpu_seconds_lost":
        value = entry.get(key)
        value = None if value is None else value / 3600
    elif key.startswith("queue_delay_p"):
        value = entry["queue_delay_all_s"][key.removeprefix("queue_delay_")]
    elif key.startswith("queue_delay_high_p"):
        value = entry["queue_delay_by_priority_s"].get("high", {}).get(key.removeprefix("queue_delay_high_"))
    elif key == "goodput":  # over what it ran: a scheduler stopped at its budget has a ledger so far
        value = (entry.get("ledger") or {}).get("goodput")
    elif key.startswith("badput_"):
        value = (entry.get("ledger") or {}).get("badput_gpu_s", {}).get(key.removeprefix("badput_"))
        value = None if value is None else value / 3600
    else:
        value = entry.get(key)
    if value is None:
        return "–"
    text = fmt.format(value)
    if key in ("cpu_s", "step_cpu_s") and not entry.get("finished", True):
        text = f"> {text} (stopped)"
    return text


#: the flags the caption names only when a run changed them
OPTIONAL_FLAGS = {"load": 1.5, "save_s": 30.0, "grace_s": 120.0, "min_runtime_s": 60.0, "fifo_budget_s": 60.0}
#: per workload, the defaults that differ from ``OPTIONAL_FLAGS`` (Kueue's run has no save time and no
#: minimum runtime)
WORKLOAD_DEFAULTS: dict[str, dict[str, float]] = {"kueue-baseline": {"save_s": 0.0, "min_runtime_s": 0.0}}


def defaults(workload: str) -> dict[str, float]:
    return {**OPTIONAL_FLAGS, **WORKLOAD_DEFAULTS.get(workload, {})}


def command_line(result: dict[str, Any]) -> str:
    """The command that reproduces ``result``."""
    c = result["config"]
    name = c.get("workload", "philly")
    if name == "philly":
        line = (
            f"python tests/perf/bench_scheduler.py --nodes {c['nodes']} --gpus-per-node {c['gpus_per_node']} "
            f"--gangs {c['gangs']} --tenants {c['tenants']} --seed {c['seed']}"
        )
    else:
        line = f"python tests/perf/bench_scheduler.py --workload {name}"
    for key, default in defaults(name).items():
        if key == "load" and name != "philly":
            continue
        if c.get(key, default) != default:
            line += f" --{key.replace('_', '-')} {c[key]:g}"
    if c.get("usage_half_life_s") is not None:
        line += f" --usage-half-life-s {c['usage_half_life_s']:g}"
    if c.get("checkpoint_interval_s") is not None:
        line += f" --checkpoint-interval {c['checkpoint_interval_s']:g}"
    if c.get("checkpoint_wait_s") is not None:
        line += f" --checkpoint-wait {c['checkpoint_wait_s']:g}"
    if c.get("users_per_tenant"):
        line += f" --users {c['users_per_tenant']}"
    if c.get("flavors"):  # the fleet trace's flags (bench_fleet, bench_topology)
        line += " --flavors " + ",".join(f"{name}:{nodes}" for name, nodes in c["flavors"].items())
    if c.get("racks"):
        line += f" --racks {c['racks']}"
    if c.get("preferred_wait_s") is not None:
        line += f" --preferred-wait {c['preferred_wait_s']:g}"
    return line


def compiled_note(config: dict[str, Any]) -> str:
    return " The policy ran compiled (`make native`)." if config.get("policy_compiled") else ""


def fifo_note(fifo: dict[str, Any]) -> str:
    if "skipped" in fifo:
        return f"FIFO skipped: {fifo['skipped']}."
    if fifo["finished"]:
        return "FIFO ran the whole trace."
    return (
        f"FIFO stopped at its wall-clock budget after {fifo['events']:,} scheduler calls and "
        f"{fifo['gangs_finished']:,} finished gangs ({fifo['sim_time_s'] / 3600:,.1f} simulated hours): it has no "
        f"figures for the schedule as a whole."
    )


def markdown(result: dict[str, Any]) -> list[str]:
    """The README's table and caption for one JSON line of this benchmark."""
    from benchenv import caption, markdown_table

    fifo, policy = result["fifo"], result["policy"]
    rows = [[label, cell(fifo, key, fmt), cell(policy, key, fmt), GOALS.get(key, "")] for label, key, fmt in ROWS]
    c = result["config"]
    if c.get("workload", "philly") != "philly":
        note = (
            f"{c['gangs']:,} gangs from {c['tenants']} tenants in {len(c['queue']['cohorts'])} cohorts on "
            f"{c['nodes']:,} nodes x {c['gpus_per_node']} GPUs, arriving over {c['last_arrival_s']:,.1f} s; bound "
            f"{c['bound']['bound_s']:,.1f} s (work {c['bound']['work_s']:,.1f} s). {fifo_note(fifo)}{compiled_note(c)}"
        )
        table_rows = markdown_table(["", "FIFO (before)", "Policy", "goal"], "lrrr", rows)
        return [*table_rows, "", note, "", caption(command_line(result), result)]
    note = (
        f"{c['gangs']:,} gangs from {c['tenants']} tenants on {c['nodes']:,} nodes x {c['gpus_per_node']} GPUs, "
        f"arriving over {c['last_arrival_s'] / 3600:,.1f} h (see `--load`); "
        f"bound {c['bound']['bound_s'] / 3600:,.1f} h "
        f"(work {c['bound']['work_s'] / 3600:,.1f} h, longest gang from its arrival "
        f"{c['bound']['longest_s'] / 3600:,.1f} h). {fifo_note(fifo)}{compiled_note(c)}"
    )
    table_rows = markdown_table(["", "FIFO (before)", "Policy", "goal"], "lrrr", rows)
    return [*table_rows, *goodput_rows(result), "", note, "", caption(command_line(result), result)]


def goodput_rows(result: dict[str, Any]) -> list[str]:
    """Goodput per tenant, FIFO and the policy side by side (a blank line first; none for results from
    before the ledger)."""
    from benchenv import markdown_table

    fifo, policy = (result[k].get("ledger", {}).get("goodput_by_tenant", {}) for k in ("fifo", "policy"))
    if not policy:
        return []

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{value:.1%}"

    tenants = result["config"]["queue"]["tenants"]
    rows = [
        [f"{t['name']} (weight {t['weight']})", pct(fifo.get(t["name"])), pct(policy.get(t["name"]))] for t in tenants
    ]
    return ["", *markdown_table(["goodput per tenant", "FIFO (before)", "Policy"], "lrr", rows)]


def table(result: dict[str, Any]) -> list[str]:
    """The plain-text table printed to stderr."""
    fifo, policy = result["fifo"], result["policy"]
    lines = [f"{'':<48}{'fifo':>22}{'policy':>22}{'goal':>10}"]
    for label, key, fmt in ROWS:
        lines.append(f"{label:<48}{cell(fifo, key, fmt):>22}{cell(policy, key, fmt):>22}{GOALS.get(key, ''):>10}")
    lines.append("\nqueue delay mean / p50 / p99 per priority class (s)")
    for cls in result["config"]["queue"]["priority_classes"]:
        parts = []
        for entry in (fifo, policy):
            d = entry.get("queue_delay_by_priority_s", {}).get(cls["name"]) if entry.get("finished") else None
            mean = entry.get("queue_delay_mean_by_priority_s", {}).get(cls["name"])
            parts.append("–" if not d or d["p50"] is None else f"{mean:,.2f} / {d['p50']:,.1f} / {d['p99']:,.1f}")
        lines.append(f"  {cls['name']:<14}{parts[0]:>30}{parts[1]:>30}")
    lines.append("\nqueue delay p50 / p99 per tenant (s)")
    for tenant in result["config"]["queue"]["tenants"]:
        name = tenant["name"]
        parts = []
        for entry in (fifo, policy):
            d = entry.get("queue_delay_s", {}).get(name) if entry.get("finished") else None
            parts.append("–" if not d or d["p50"] is None else f"{d['p50']:,.0f} / {d['p99']:,.0f}")
        lines.append(f"  {name:<10} w={tenant['weight']:<3}{parts[0]:>30}{parts[1]:>30}")
    lines.append("\ngoodput per tenant (ledger in simulated time); badput by cause (GPU-hours)")
    for tenant in result["config"]["queue"]["tenants"]:
        name = tenant["name"]
        parts = [str((e.get("ledger") or {}).get("goodput_by_tenant", {}).get(name, "–")) for e in (fifo, policy)]
        lines.append(f"  {name:<16}{parts[0]:>30}{parts[1]:>30}")
    for cause in BADPUT:
        parts = []
        for entry in (fifo, policy):
            value = (entry.get("ledger") or {}).get("badput_gpu_s", {}).get(cause)
            parts.append("–" if value is None else f"{value / 3600:,.1f}")
        lines.append(f"  {cause:<16}{parts[0]:>30}{parts[1]:>30}")
    for name, entry in (("fifo", fifo), ("policy", policy)):
        if "checks" in entry:
            failed = [k for k, ok in entry["checks"].items() if not ok]
            lines.append(f"{name}: checks {'all pass' if not failed else 'FAILED: ' + ', '.join(failed)}")
            lines.extend(f"  {v}" for v in entry["violations"][:5])
    lines.append(fifo_note(fifo))
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import bench_topology  # imports this module: not at the top (an import cycle)
    from benchenv import arguments, at_least_one, output_options

    parser = arguments(__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="GPU nodes (default %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default %(default)s)")
    parser.add_argument("--gangs", type=int, default=15000, help="gangs in the trace (default %(default)s)")
    parser.add_argument(
        "--tenants", type=int, default=10, help="tenants, weights 1, 2, 3 cycling (default %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload (default %(default)s)")
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="philly",
        help="philly: the generated trace the size flags shape; kueue-baseline: Kueue's scheduler benchmark "
        "workload, fixed (save time and minimum runtime 0 unless given) (default %(default)s)",
    )
    parser.add_argument(
        "--load",
        type=float,
        default=OPTIONAL_FLAGS["load"],
        help="GPUs the last hour's arrivals want, over the cluster's GPUs (default %(default)s)",
    )
    parser.add_argument(
        "--save-s",
        type=float,
        default=None,
        help=f"checkpoint save time of a preempted gang (default {OPTIONAL_FLAGS['save_s']:g}; kueue-baseline 0)",
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        default=OPTIONAL_FLAGS["grace_s"],
        help="the policy's preemption grace (default %(default)s)",
    )
    parser.add_argument(
        "--min-runtime-s",
        type=float,
        default=None,
        help=f"the policy's minimum runtime (default {OPTIONAL_FLAGS['min_runtime_s']:g}; kueue-baseline 0)",
    )
    parser.add_argument(
        "--usage-half-life-s",
        type=float,
        default=None,
        help="the policy's usage_half_life: fair share with memory (default: none, the share of now only)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=None,
        help="each gang checkpoints every S x 2^U(-1,1) s of work and tells the policy (sim_checkpoints); the "
        "policy then runs twice, victims by lost work and by the rule before it (default: every "
        f"{CHECKPOINT_EVERY_S:g} s, untold)",
    )
    parser.add_argument(
        "--checkpoint-wait",
        type=float,
        default=None,
        help="the policy's checkpoint_wait (needs --checkpoint-interval): a victim whose next checkpoint is due "
        "within S s is preempted just after it (default: none)",
    )
    parser.add_argument(
        "--fifo-budget-s",
        type=float,
        default=OPTIONAL_FLAGS["fifo_budget_s"],
        help="wall-clock cap for the FIFO baseline, 0 to skip it (default %(default)s)",
    )
    parser.add_argument(
        "--users",
        type=int,
        default=0,
        help="each gang names one of this many users of its tenant (drawn by its id): per-user fair share inside "
        "each tenant (default 0: no users)",
    )
    parser.add_argument(
        "--flavors",
        default=None,
        help="GPU flavors, NAME:NODES,... (e.g. h100:400,a100:600; replaces --nodes): bench_fleet.py",
    )
    bench_topology.add_arguments(parser)
    output_options(parser, json_flag=True)
    args = parser.parse_args(argv)
    if args.flavors is not None:
        from bench_fleet import parse_flavors

        try:
            args.flavors = parse_flavors(args.flavors)
        except ValueError as error:
            parser.error(str(error))
        args.nodes = sum(n for _, n in args.flavors)
    bench_topology.check_arguments(parser, args, args.nodes)
    for flag in ("save_s", "min_runtime_s"):
        if getattr(args, flag) is None:
            setattr(args, flag, defaults(args.workload)[flag])
    at_least_one(parser, args, "nodes", "gpus_per_node", "gangs", "tenants")
    if args.users < 0:
        parser.error(f"--users must be 0 or more, got {args.users}")
    for flag in ("save_s", "grace_s", "min_runtime_s", "fifo_budget_s"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value < 0:
            parser.error(f"--{flag.replace('_', '-')} must be a finite number >= 0, got {value}")
    half_life = args.usage_half_life_s
    if half_life is not None and (not math.isfinite(half_life) or half_life <= 0):
        parser.error(f"--usage-half-life-s must be a finite number > 0, got {half_life}")
    interval = args.checkpoint_interval
    if interval is not None and (not math.isfinite(interval) or interval <= 0):
        parser.error(f"--checkpoint-interval must be a finite number > 0, got {interval}")
    wait = args.checkpoint_wait
    if wait is not None and (interval is None or not math.isfinite(wait) or wait <= 0):
        parser.error(f"--checkpoint-wait needs --checkpoint-interval and a finite number > 0, got {wait}")
    if not math.isfinite(args.load) or args.load <= 0:
        parser.error(f"--load must be a finite number > 0, got {args.load}")
    if args.save_s > args.grace_s:
        parser.error(
            f"--save-s ({args.save_s:g}) must not exceed --grace-s ({args.grace_s:g}): "
            "a gang still saving when its grace ends is killed"
        )
    return args


def source_digest() -> str:
    """A short hash of ``engine/scheduling/*.py``: which policy code a saved result was measured with."""
    from pathlib import Path

    digest = hashlib.sha256()
    for path in sorted((Path(__file__).resolve().parents[2] / "engine" / "scheduling").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def policy_compiled() -> bool:
    """Whether the policy ran compiled (``engine.scheduling.native``, ``make native``): the same decisions, less CPU."""
    try:
        from engine.scheduling import native  # the package's import loads a fresh build before the policy
    except ImportError:
        return False
    return native.loaded()


def told(args: argparse.Namespace, workload: Workload) -> Checkpoints | None:
    """``--checkpoint-interval``: each gang's own interval, its checkpoints told to the policy."""
    if args.checkpoint_interval is None:
        return None
    return Checkpoints.drawn([g.gang_id for g in workload.gangs], args.checkpoint_interval, args.seed, args.save_s)


def main(args: argparse.Namespace) -> None:
    import bench_topology
    from benchenv import LoadSampler, emit, environment, log, render

    if args.render:
        render(args.render, "scheduler", markdown)
        return

    if args.workload == "kueue-baseline":
        workload = kueue_baseline_workload()
    else:
        workload = generate_workload(args.nodes, args.gpus_per_node, args.gangs, args.tenants, args.seed, args.load)
    queue = queue_config(workload, args.grace_s, args.min_runtime_s, args.usage_half_life_s, args.checkpoint_wait)
    fleet = None
    if args.flavors:  # bench_fleet.py: labelled nodes, per-flavor quotas, gangs asking for flavors
        from bench_fleet import Fleet

        fleet = Fleet(args.flavors)
        fleet.label(workload.node_ids(), [g.gang_id for g in workload.gangs], args.seed)
        queue = fleet.queue(queue)
    bound = workload.bound()
    config: dict[str, Any] = {
        "workload": workload.name,
        "nodes": workload.nodes,
        "gpus_per_node": workload.gpus_per_node,
        "cpus_per_node": workload.cpus_per_node,
        "gangs": len(workload.gangs),
        "tenants": len(workload.tenants),
        "seed": args.seed,
        "load": args.load,
        "arrival_rate_per_s": round(workload.arrival_rate, 6),
        "last_arrival_s": workload.gangs[-1].arrival,
        "save_s": args.save_s,
        "grace_s": args.grace_s,
        "min_runtime_s": args.min_runtime_s,
        "usage_half_life_s": args.usage_half_life_s,
        "checkpoint_every_s": CHECKPOINT_EVERY_S if args.checkpoint_interval is None else None,
        "checkpoint_interval_s": args.checkpoint_interval,
        **({"checkpoint_wait_s": args.checkpoint_wait} if args.checkpoint_wait is not None else {}),
        "window_s": WINDOW_S,
        "fifo_budget_s": args.fifo_budget_s,
        "fifo_commit": BASELINE_COMMIT,
        "bound": {k: round(v, 1) for k, v in bound.items()},
        "gpus_by_size": {
            str(size): sum(1 for g in workload.gangs if g.gpus == size)
            for size in sorted({g.gpus for g in workload.gangs})
        },
        "gangs_by_priority": {
            c["name"]: sum(1 for g in workload.gangs if g.priority == c["name"]) for c in workload.priority_classes
        },
        "high_priority": sum(1 for g in workload.gangs if g.priority == "high"),
        "queue": queue,
        "policy_source": source_digest(),
        "policy_compiled": policy_compiled(),
        **({"racks": args.racks} if args.racks else {}),
        **({"preferred_wait_s": args.preferred_wait} if args.preferred_wait is not None else {}),
        **({"users_per_tenant": args.users} if args.users else {}),
    }
    log(
        f"{workload.name}: {len(workload.gangs):,} gangs, {len(workload.tenants)} tenants, "
        f"{workload.nodes:,} nodes x {workload.gpus_per_node} GPUs; "
        f"last arrival at {workload.gangs[-1].arrival:,.0f} s, bound {bound['bound_s']:,.0f} s"
    )
    result: dict[str, Any] = {"benchmark": "scheduler"}
    with LoadSampler() as load:
        try:
            adapter = PolicyAdapter(queue)
            adapter.fleet, adapter.users = fleet, args.users
        except ImportError as exc:
            result["policy"] = {"skipped": f"engine.scheduling.Policy is not available: {exc}"}
        else:
            if args.racks:  # topology-aware ("policy") and blind ("blind") on racked nodes (bench_topology)
                sides = bench_topology.run_sides(
                    simulate,
                    workload,
                    queue,
                    args.racks,
                    args.save_s,
                    log,
                    lambda: told(args, workload),
                    fleet,
                    args.preferred_wait,
                    args.users,
                )
                result.update(sides)
            else:
                log("policy ...")
                checkpoints = told(args, workload)
                result["policy"] = simulate(workload, adapter, args.save_s, progress=log, checkpoints=checkpoints)
                log(f"  {result['policy']['events']:,} calls in {result['policy']['wall_s']:.1f} s")
            if args.checkpoint_interval is not None:  # the same trace and reports, victims by the rule before
                log("policy, victims by the rule before lost work ...")
                today = (
                    bench_topology.RackedAdapter(
                        queue, workload.node_ids(), args.racks, aware=True, wait=args.preferred_wait
                    )
                    if args.racks
                    else PolicyAdapter(queue)
                )
                today.name, today.fleet, today.users = "policy_today", fleet, args.users
                today.policy.lost_work.counting = False
                result["policy_today"] = simulate(
                    workload, today, args.save_s, progress=log, checkpoints=told(args, workload)
                )
        if args.fifo_budget_s == 0:
            result["fifo"] = {"skipped": "--fifo-budget-s 0"}
        else:
            baseline = load_fifo_baseline()
            if isinstance(baseline, str):
                result["fifo"] = {"skipped": baseline}
            else:
                log(f"fifo (from {BASELINE_COMMIT}, at most {args.fifo_budget_s:g} s) ...")
                fifo = FifoAdapter(baseline)
                fifo.fleet = fleet
                result["fifo"] = simulate(workload, fifo, args.save_s, budget_s=args.fifo_budget_s, progress=log)
                log(f"  {result['fifo']['events']:,} calls in {result['fifo']['wall_s']:.1f} s")
    for side in ("fifo", "policy", "blind", "policy_today") if fleet is not None else ():
        if side in result and "skipped" not in result[side]:
            result[side]["flavor_violations"] = fleet.violations.get(side, 0)
    if fleet is not None:
        config["flavors"] = dict(fleet.flavors)
        config["flavor_violation_examples"] = fleet.examples
    result = {
        "benchmark": "scheduler",
        "fifo": result["fifo"],
        "policy": result["policy"],
        **({"policy_today": result["policy_today"]} if "policy_today" in result else {}),
        **({"blind": result["blind"]} if "blind" in result else {}),
        "config": config,
        "environment": environment(),
        "load": load.summary(),
    }
    emit(result, [] if args.json else markdown(result) if args.markdown else table(result))


if __name__ == "__main__":
    main(parse_args())
