"""Property test of the shape Kueue's scheduler benchmark has (issue 22): several preemptible priority
classes inside each tenant, reclaim across the tenants of a cohort, gangs far shorter than the spacing of
their arrivals, ``min_runtime: 0``, and a preempted gang that releases and comes back in the same instant
(no save time). The random streams of test_scheduling_properties.py missed the loop this shape found: a
gang waiting for its victims lost what they freed to a gang of lower priority, preempted that one, and so
on forever without the clock moving.

The test drives a closed loop (each admitted gang releases after its duration; each preempted one releases
and is submitted again at once) and asserts that it ends: every gang finishes, within a bounded number of
policy steps, with few preemptions per gang. A unit test keeps the smallest example of the loop, and
checks that the policy as Schedulers recorded before the fix decided (``hold_for_victims = False``) still
loops on it, so the flag really selects the old decisions.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling_builders import config, gang, node, run

from engine.scheduling import Admitted, GangReleased, GangSubmitted, Policy, Preempted, Tick

CLASSES = """
priority_classes:
  - {name: small, value: 50}
  - {name: medium, value: 100}
  - {name: large, value: 200}
"""
SIZES = {"small": 1, "medium": 2, "large": 4}  # GPUs per class (a large gang takes a whole node)


def queue_file(cohorts: int, tenants: int, quota: int, borrowing: int) -> str:
    lines = ["cohorts: [" + ", ".join(f"{{name: c{c}}}" for c in range(cohorts)) + "]", "tenants:"]
    lines += [
        f"  - {{name: t{c}-{t}, cohort: c{c}, quota: {{gpu: {quota}}}, borrowing_limit: {{gpu: {borrowing}}}}}"
        for c in range(cohorts)
        for t in range(tenants)
    ]
    policy = "policy: {reclaim_within_cohort: any, within_tenant: lower_priority, min_runtime: 0, max_pending: 1000}"
    return "\n".join([*lines, policy]) + CLASSES


@dataclass
class Outcome:
    steps: int
    finished: int
    gangs: int
    preemptions: dict[str, int]


def closed_loop(policy: Policy, arrivals: list[tuple[float, str, str, str]], durations: dict[str, float]) -> Outcome:
    """Every arrival through ``policy``, each admitted gang releasing after its duration and each preempted
    one releasing and coming back in the same instant; stops after 50 steps per gang (a loop)."""
    heap: list[tuple[float, int, int, str, str]] = []  # (time, releases first, seq, kind, gang)
    requests = {}
    for seq, (at, gang_id, tenant, cls) in enumerate(arrivals):
        requests[gang_id] = gang(gang_id, tenant, gpus=SIZES[cls], priority=cls).request
        heapq.heappush(heap, (at, 1, seq, "arrive", gang_id))
    seq = len(arrivals)
    attempt: dict[str, int] = {}
    preemptions = dict.fromkeys(requests, 0)
    finished, steps, limit = 0, 0, 50 * len(arrivals)

    def step(event: GangSubmitted | GangReleased | Tick, now: float) -> None:
        nonlocal seq, steps
        steps += 1
        for d in policy.step(event, now):
            seq += 1
            if isinstance(d, Admitted):
                attempt[d.gang_id] = attempt.get(d.gang_id, 0) + 1
                heapq.heappush(heap, (now + durations[d.gang_id], 0, seq, f"finish:{attempt[d.gang_id]}", d.gang_id))
            elif isinstance(d, Preempted):
                preemptions[d.gang_id] += 1
                heapq.heappush(heap, (now, 0, seq, f"saved:{attempt[d.gang_id]}", d.gang_id))

    while heap and steps < limit:
        deadline = policy.next_deadline()
        if deadline is not None and deadline <= heap[0][0]:
            step(Tick(), deadline)
            continue
        at, _, _, kind, gang_id = heapq.heappop(heap)
        if kind == "arrive":
            step(GangSubmitted(request=requests[gang_id]), at)
            continue
        what, n = kind.split(":")
        if int(n) != attempt[gang_id]:
            continue  # an earlier attempt's finish: it was preempted
        attempt[gang_id] += 1  # neither its finish nor its save can come twice
        step(GangReleased(gang_id=gang_id), at)
        if what == "finish":
            finished += 1
        else:  # saved: its task asks again for the same gang, at once
            step(GangSubmitted(request=requests[gang_id]), at)
    return Outcome(steps, finished, len(arrivals), preemptions)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[str, int, list[tuple[float, str, str, str]], dict[str, float]]:
    """Cohorts of tenants whose quotas add up to the nodes, each submitting gangs of the three classes on a
    grid of 100 ms, each gang running a few ms to a few hundred ms (mostly far below the grid)."""
    cohorts = draw(st.integers(1, 2), label="cohorts")
    tenants = draw(st.integers(2, 4), label="tenants per cohort")
    quota = 4
    text = queue_file(cohorts, tenants, quota, draw(st.sampled_from([4, 8, 100]), label="borrowing limit"))
    nodes = cohorts * tenants * quota // 4  # nodes of 4 GPUs
    arrivals, durations = [], {}
    for c in range(cohorts):
        for t in range(tenants):
            for i in range(draw(st.integers(1, 12), label="gangs")):
                cls = draw(st.sampled_from(["small", "small", "small", "medium", "large"]))
                at = draw(st.integers(0, 30)) / 10
                gang_id = f"t{c}-{t}-{cls}-{i}"
                arrivals.append((at, gang_id, f"t{c}-{t}", cls))
                durations[gang_id] = draw(st.sampled_from([0.001, 0.01, 0.05, 0.2, 0.5]))
    arrivals.sort(key=lambda a: a[0])  # stable: at one instant, in the order drawn
    return text, nodes, arrivals, durations


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(workloads())
def test_reclaim_across_tenants_and_priorities_within_them_end_with_min_runtime_zero(
    workload: tuple[str, int, list[tuple[float, str, str, str]], dict[str, float]],
) -> None:
    text, nodes, arrivals, durations = workload
    policy = Policy(config(text))
    for i in range(nodes):
        policy.step(node(f"n{i}", gpus=4, cpus=64), 0.0)
    outcome = closed_loop(policy, arrivals, durations)
    assert outcome.finished == outcome.gangs, (
        f"{outcome.gangs - outcome.finished} gangs never finished after {outcome.steps} steps "
        f"(preempted {max(outcome.preemptions.values())} times at most): a preemption loop"
    )
    worst = max(outcome.preemptions, key=lambda g: outcome.preemptions[g])
    assert outcome.preemptions[worst] <= 3, f"{worst} preempted {outcome.preemptions[worst]} times"


def loop_example(hold: bool) -> Outcome:
    """The smallest example of the loop: teams t0-0 and t0-1 are at their quotas, which make up their
    cohort; t0-0's medium gang (2 GPUs) preempts two of its small ones, which come back at once. Before the
    fix the first of them to come back took the GPU the medium gang waited for (the other had not released
    yet), was preempted for it, and so on, without the clock moving."""
    policy = Policy(config(queue_file(1, 2, 4, 100)))
    policy.hold_for_victims = hold
    for i in range(2):
        policy.step(node(f"n{i}", gpus=4, cpus=64), 0.0)
    arrivals = [(0.0, f"t0-1-small-{i}", "t0-1", "small") for i in range(4)]
    arrivals += [(0.0, f"t0-0-small-{i}", "t0-0", "small") for i in range(4)]
    arrivals += [(0.1, "t0-0-medium-0", "t0-0", "medium")]
    durations = {a[1]: 1.0 for a in arrivals}
    return closed_loop(policy, arrivals, durations)


def test_a_gang_waiting_for_its_victims_keeps_what_they_free() -> None:
    outcome = loop_example(hold=True)
    assert outcome.finished == outcome.gangs
    assert sum(outcome.preemptions.values()) == 2, outcome.preemptions  # two small gangs make room, once


def test_the_decisions_recorded_before_the_fix_still_loop_on_it() -> None:
    # what a Scheduler whose history predates the fix replays (workflows/scheduler.py patches it in)
    outcome = loop_example(hold=False)
    assert outcome.finished < outcome.gangs and max(outcome.preemptions.values()) > 10, outcome


def test_the_hold_is_undone_when_the_cycle_ends() -> None:
    # the quota a waiting gang holds is the cycle's view only: the ledger shows what actually runs
    policy = Policy(config(queue_file(1, 2, 4, 100)))
    events = [node("n0", gpus=4, cpus=64), node("n1", gpus=4, cpus=64)]
    events += [gang(f"o{i}", "t0-1", priority="small") for i in range(4)]
    events += [gang(f"s{i}", "t0-0", priority="small") for i in range(4)]
    run([*events, gang("m", "t0-0", gpus=2, priority="medium")], policy, 0.0)
    assert len(policy.pending["m"].victims) == 2
    run([GangReleased(gang_id=sorted(policy.pending["m"].victims)[0])], policy, 0.0)
    assert len(policy.pending["m"].victims) == 1  # held for the rest of that cycle, and given back after it
    assert policy.tenancy.used("t0-0") == (3, 3000, 0) and policy.tenancy.used("t0-1") == (4, 4000, 0)
