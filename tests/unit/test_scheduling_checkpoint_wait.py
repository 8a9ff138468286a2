"""``policy.checkpoint_wait``: a victim whose next checkpoint is near is preempted just after it.

A gang's interval is learned from its attempt's last two checkpoint reports (``Checkpoint.every_s``); with
``checkpoint_wait: 2m`` a victim whose next checkpoint is expected within 2 minutes, and sooner than the work
it would lose now is old, is not preempted before it (as a gang younger than ``min_runtime`` is not): the
waiting gang searches again once it is told (at most ``CHECKPOINT_LATE_S`` after it was expected), and the
victim then loses next to nothing. A checkpoint that does not come by then is not waited for again.
"""

from __future__ import annotations

import pytest
from scheduling_builders import FOREVER, config, gang, node, preempted, run
from test_scheduling_lost_work import checkpointed

from engine.scheduling import Policy, Preempted, Tick
from engine.scheduling.config_errors import QueueConfigError
from engine.scheduling.lost_work import next_checkpoint
from engine.scheduling.preemption import CHECKPOINT_LATE_S

WAITING = """
tenants: [{name: default}]
priority_classes:
  - {name: low, value: 10}
  - {name: high, value: 100}
policy: {within_tenant: lower_priority, min_runtime: 0, checkpoint_wait: 2m}
"""


def one_low_gang(text: str = WAITING) -> Policy:
    """``low`` fills an 8-GPU node from 0 s and checkpoints every 600 s: at 600 and 1200 (next: 1800)."""
    policy = Policy(config(text), node_ttl_s=FOREVER)
    run([node("n", gpus=8), gang("low", gpus=8, priority="low")], policy, now=0.0)
    run([checkpointed("low", 600.0, save_s=10.0)], policy, now=600.0)
    run([checkpointed("low", 1200.0, save_s=10.0)], policy, now=1200.0)
    return policy


def cost(decisions: list[object]) -> float | None:
    return next(d.cost_gpu_s for d in decisions if isinstance(d, Preempted))


def test_the_interval_comes_from_the_last_two_checkpoints_of_the_attempt() -> None:
    policy = one_low_gang()
    assert policy.running["low"].checkpoint.every_s == 600.0
    assert next_checkpoint(policy.running["low"]) == 1800.0
    restored = Policy.restore(policy.snapshot())  # it survives continue-as-new
    assert next_checkpoint(restored.running["low"]) == 1800.0


def test_a_victim_whose_checkpoint_is_near_goes_just_after_it() -> None:
    policy = one_low_gang()
    assert preempted(run([gang("boss", gpus=8, priority="high")], policy, now=1750.0)) == []
    assert policy.next_deadline() == 1800.0 + CHECKPOINT_LATE_S  # a Tick comes back for it
    # its reason says what it waits for (not only what stops it), and so does a restored Scheduler's
    note = "; it waits for gang 'low' of default to save its next checkpoint before preempting it"
    assert note in policy.pending["boss"].reason
    restored = Policy.restore(policy.snapshot())
    assert restored.pending["boss"].reason == policy.pending["boss"].reason
    assert run([Tick()], restored, now=1760.0) == []  # a look after the restore says nothing new
    run([checkpointed("low", 1800.0, save_s=10.0)], policy, now=1800.0)
    decisions = run([Tick()], policy, now=policy.next_deadline())
    assert preempted(decisions) == [("low", "boss", "default", "priority")]
    # 8 GPUs × (5 s since its checkpoint + 10 s save + 10 s restore): not the 50 minutes since 1200 - 600
    assert cost(decisions) == 8 * (CHECKPOINT_LATE_S + 10.0 + 10.0)
    assert "checkpoint" not in policy.pending["boss"].reason  # it waits for "low" to release now


def test_a_wait_for_a_checkpoint_is_said_under_a_quota_too() -> None:
    # "boss" of team-a reclaims its nominal quota from "low" of team-b (a borrower): quota, not nodes, stops it
    text = """
cohorts: [{name: c}]
tenants:
  - {name: team-a, quota: {gpu: 8}, cohort: c}
  - {name: team-b, quota: {gpu: 0}, cohort: c}
policy: {min_runtime: 0, checkpoint_wait: 2m}
"""
    policy = Policy(config(text), node_ttl_s=FOREVER)
    run([node("n", gpus=8), gang("low", gpus=8, tenant="team-b")], policy, now=0.0)
    run([checkpointed("low", 600.0), checkpointed("low", 1200.0)], policy, now=1200.0)
    assert preempted(run([gang("boss", gpus=8, tenant="team-a")], policy, now=1750.0)) == []
    reason = policy.pending["boss"].reason
    assert reason.endswith(
        "; it waits for gang 'low' of team-b to save its next checkpoint before preempting it (policy.checkpoint_wait)"
    )
    run([checkpointed("low", 1800.0)], policy, now=1800.0)
    assert preempted(run([Tick()], policy, now=policy.next_deadline())) == [("low", "boss", "team-a", "reclaim")]


def test_a_checkpoint_further_off_than_the_wait_is_not_waited_for() -> None:
    policy = one_low_gang()
    decisions = run([gang("boss", gpus=8, priority="high")], policy, now=1600.0)  # next in 200 s > 2 minutes
    assert preempted(decisions) == [("low", "boss", "default", "priority")]
    assert cost(decisions) == 8 * (400.0 + 10.0 + 10.0)


def test_a_short_interval_is_waited_for_once() -> None:
    # every 60 s: its next checkpoint is always within the wait, but just after one it loses little (5 s of
    # work, less than the 55 s to the next): it goes then, not at the next one, nor the one after
    policy = Policy(config(WAITING), node_ttl_s=FOREVER)
    run([node("n", gpus=8), gang("low", gpus=8, priority="low")], policy, now=0.0)
    run([checkpointed("low", 60.0), checkpointed("low", 120.0)], policy, now=120.0)
    assert preempted(run([gang("boss", gpus=8, priority="high")], policy, now=170.0)) == []
    run([checkpointed("low", 180.0)], policy, now=180.0)
    assert preempted(run([Tick()], policy, now=policy.next_deadline())) == [("low", "boss", "default", "priority")]


def test_a_victim_that_lost_little_yet_is_not_waited_for() -> None:
    # checkpointed at 1200, next at 1800: at 1250, within a 10-minute wait, it has 50 s to lose and 550 to go
    policy = one_low_gang(WAITING.replace("2m", "10m"))
    assert preempted(run([gang("boss", gpus=8, priority="high")], policy, now=1250.0)) != []


def test_a_checkpoint_that_does_not_come_is_not_waited_for_again() -> None:
    policy = one_low_gang()
    run([gang("boss", gpus=8, priority="high")], policy, now=1750.0)
    decisions = run([Tick()], policy, now=1800.0 + CHECKPOINT_LATE_S)  # no report at 1800
    assert preempted(decisions) == [("low", "boss", "default", "priority")]


@pytest.mark.parametrize("wait", ["checkpoint_wait: 0", "backfill: true"])  # 0, or left out (the default)
def test_without_a_wait_it_goes_at_once(wait: str) -> None:
    policy = one_low_gang(WAITING.replace("checkpoint_wait: 2m", wait))
    decisions = run([gang("boss", gpus=8, priority="high")], policy, now=1750.0)
    assert preempted(decisions) == [("low", "boss", "default", "priority")]


def test_victims_chosen_by_the_rule_before_lost_work_wait_for_nothing() -> None:
    policy = one_low_gang()
    policy.lost_work.counting = False  # the benchmark's "victims as before" side
    assert preempted(run([gang("boss", gpus=8, priority="high")], policy, now=1750.0)) != []


def test_a_first_checkpoint_gives_no_interval() -> None:
    policy = Policy(config(WAITING), node_ttl_s=FOREVER)
    run([node("n", gpus=8), gang("low", gpus=8, priority="low")], policy, now=0.0)
    run([checkpointed("low", 600.0)], policy, now=600.0)
    assert next_checkpoint(policy.running["low"]) is None
    assert preempted(run([gang("boss", gpus=8, priority="high")], policy, now=1190.0)) != []


@pytest.mark.parametrize(("value", "message"), [("-1m", "must be >= 0"), ("soon", "must be a duration")])
def test_a_bad_wait_is_refused_naming_the_key(value: str, message: str) -> None:
    with pytest.raises(QueueConfigError, match=rf"checkpoint_wait.*{message}"):
        config(WAITING.replace("2m", value))
