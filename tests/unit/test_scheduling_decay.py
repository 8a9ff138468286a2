"""Fair share with memory (``policy.usage_half_life``): the decay itself, the order it gives, the views,
continue-as-new and configuration changes, and the configuration's errors.

Plain Python: ``Policy.step`` driven directly, with times as simulated seconds passed as ``now``.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling_builders import FOREVER, admitted, config, gang, node

from engine.cli import render, render_queues
from engine.scheduling import ConfigApplied, GangReleased, Policy, QueueConfigError, load_queue_config
from engine.scheduling.usage_decay import UsageDecay

HOUR = 3600.0
TAU = HOUR / math.log(2)  # the mean age of a decayed second, half-life 1 h


def two_tenants(half_life: str | None, quotas: str = "") -> Policy:
    policy = "" if half_life is None else f"policy: {{usage_half_life: {half_life}}}"
    text = f"tenants: [{{name: team-a{quotas}}}, {{name: team-b{quotas}}}]\n{policy}\n"
    return Policy(config(text), node_ttl_s=FOREVER)


def busy_hour(policy: Policy) -> list[str]:
    """team-a holds the whole node (8 GPUs) for an hour; meanwhile team-a, then team-b, queue a gang for all
    of it. Returns who starts when team-a's gang ends."""
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    assert admitted(policy.step(gang("a1", "team-a", gpus=8), 0.0)) == ["a1"]
    policy.step(gang("a2", "team-a", gpus=8), 10.0)
    policy.step(gang("b1", "team-b", gpus=8), 20.0)
    return admitted(policy.step(GangReleased(gang_id="a1"), HOUR))


# ---------------------------------------------------------------- the order


def test_a_tenant_that_used_everything_for_an_hour_yields_to_one_that_did_not() -> None:
    # without the knob both shares are 0 once a1 ends (nothing runs): submission order, a2 first, as today
    assert busy_hour(two_tenants(None)) == ["a2"]
    remembering = two_tenants("1h")
    assert busy_hour(remembering) == ["b1"]
    # one half-life of 8 GPUs: half of the average a tenant holding them for ever would have
    tenants = remembering.queues()["tenants"]
    assert tenants["team-a"]["decayed_usage"]["gpu"] == pytest.approx(8 * TAU * 0.5)
    assert tenants["team-a"]["share"] == pytest.approx(0.5)
    assert tenants["team-b"]["decayed_usage"]["gpu"] == 0.0


def test_the_memory_fades_and_a_long_half_life_remembers_longer() -> None:
    policy = two_tenants("1h")
    busy_hour(policy)  # b1 runs from 1 h on; team-a's history halves every hour, team-b's grows
    policy.step(GangReleased(gang_id="b1"), 2 * HOUR)
    a = policy.queues()["tenants"]["team-a"]["decayed_usage"]["gpu"]
    b = policy.queues()["tenants"]["team-b"]["decayed_usage"]["gpu"]
    assert a == pytest.approx(8 * TAU * 0.25) and b == pytest.approx(8 * TAU * 0.5)


def test_a_tenant_within_its_quota_builds_no_history() -> None:
    # fair share counts usage above nominal only: a quota is an entitlement, not something to pay back
    text = """
    cohorts: [{name: c}]
    tenants:
      - {name: team-a, cohort: c, quota: {gpu: 4}}
      - {name: team-b, cohort: c, quota: {gpu: 4}}
    policy: {usage_half_life: 1h, min_runtime: 0}
    """
    policy = Policy(config(text), node_ttl_s=FOREVER)
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    policy.step(gang("a1", "team-a", gpus=4), 0.0)
    policy.step(gang("b1", "team-b", gpus=2), 0.0)
    policy.step(gang("b2", "team-b", gpus=2), 0.0)  # team-b borrows nothing either: 4 of 4
    policy.step(GangReleased(gang_id="a1"), HOUR)
    tenants = policy.queues()["tenants"]
    assert tenants["team-a"]["decayed_usage"]["gpu"] == 0.0 and tenants["team-a"]["share"] == 0.0
    policy.step(GangReleased(gang_id="b1"), HOUR)
    policy.step(gang("a2", "team-a", gpus=6), HOUR)  # borrows 2 of team-b's idle quota for an hour
    policy.step(GangReleased(gang_id="a2"), 2 * HOUR)
    assert policy.queues()["tenants"]["team-a"]["decayed_usage"]["gpu"] == pytest.approx(2 * TAU * 0.5)


@pytest.mark.parametrize(("weight_b", "first"), [(1, "a2"), (4, "b2")])
def test_the_weight_divides_the_remembered_share_too(weight_b: int, first: str) -> None:
    """team-a holds the node for the first hour, team-b for the second: at 2 h team-a's history is half of
    team-b's (older, so more decayed), so team-a goes first, unless team-b's weight is 4 times team-a's."""
    text = f"tenants: [{{name: team-a}}, {{name: team-b, weight: {weight_b}}}]\npolicy: {{usage_half_life: 1h}}"
    policy = Policy(config(text), node_ttl_s=FOREVER)
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    policy.step(gang("a1", "team-a", gpus=8), 0.0)
    policy.step(gang("b1", "team-b", gpus=8), 10.0)
    assert admitted(policy.step(GangReleased(gang_id="a1"), HOUR)) == ["b1"]
    policy.step(gang("a2", "team-a", gpus=8), HOUR + 10)
    policy.step(gang("b2", "team-b", gpus=8), HOUR + 20)
    assert admitted(policy.step(GangReleased(gang_id="b1"), 2 * HOUR)) == [first]


@pytest.mark.parametrize("half_life", [None, "1h"])
def test_the_order_moves_with_the_clock_alone(half_life: str | None) -> None:
    """team-b used the node for an hour, team-a now runs a1: with memory team-b's new gang goes after
    team-a's at first; as team-b's history fades and team-a's grows it goes first, and starts at the next
    event, even one that changes nothing else (a node re-registering unchanged). Without memory team-b,
    running nothing, goes first at once."""
    policy = two_tenants(half_life)
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    policy.step(gang("b0", "team-b", gpus=8), 0.0)
    policy.step(gang("a1", "team-a", gpus=2), 1.0)
    assert admitted(policy.step(GangReleased(gang_id="b0"), HOUR)) == ["a1"]
    policy.step(gang("a2", "team-a", gpus=8), HOUR)  # waits for a1's GPUs
    # not preemptible, so it does not backfill behind a2 while a2 goes first
    first = admitted(policy.step(gang("b1", "team-b", gpus=4, preemptible=False), HOUR))
    if half_life is None:
        assert first == ["b1"]
        return
    assert first == []
    # team-a: 2 GPUs now, and its average grows to 2; team-b's average of 4 halves every hour: they cross
    # at 2^(-t/h) = 2/3, about 35 minutes on
    assert admitted(policy.step(node("n0", gpus=8, cpus=64), HOUR + 1800)) == []
    assert admitted(policy.step(node("n0", gpus=8, cpus=64), HOUR + 2500)) == ["b1"]


# ---------------------------------------------------------------- the decay


def test_decay_closed_form() -> None:
    decay = UsageDecay(HOUR)
    decay.change("t", (8, 1000, 0), 0.0)
    assert decay.value_at("t", 0.0) == (0.0, 0.0, 0.0)
    assert decay.value_at("t", HOUR)[0] == pytest.approx(8 * TAU * 0.5)
    assert decay.average("t", 50 * HOUR)[0] == pytest.approx(8.0)  # held for ever: the average is the usage
    decay.change("t", (0, 0, 0), HOUR)
    assert decay.value_at("t", 3 * HOUR)[0] == pytest.approx(8 * TAU * 0.5 / 4)
    assert decay.value_at("never-seen", HOUR) == (0.0, 0.0, 0.0)
    assert list(decay.moving()) == ["t"]
    with pytest.raises(ValueError, match="half-life"):
        UsageDecay(0.0)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 5 * HOUR), st.integers(0, 16), st.lists(st.floats(0, 1), max_size=3)),
        min_size=1,
        max_size=12,
    )
)
def test_decay_is_lazy_exact_and_bounded(steps: list[tuple[float, int, list[float]]]) -> None:
    """Settled only at changes, or also at any times between them, the value is the same (the closed form is
    exact, not an approximation per event); with usage ``r`` it stays within [0, max(start, r * tau)] and
    without usage it never grows."""
    lazy, eager = UsageDecay(HOUR), UsageDecay(HOUR)
    now, rate = 0.0, 0
    for dt, new_rate, looks in steps:
        start = lazy.value_at("t", now)[0]
        for fraction in sorted(looks):
            eager.change("t", (rate, 0, 0), now + fraction * dt)  # the same usage, settled in between
        now += dt
        value = lazy.value_at("t", now)[0]
        assert 0.0 <= value <= max(start, rate * lazy.tau) * (1 + 1e-9) + 1e-9
        if rate == 0:
            assert value <= start * (1 + 1e-12) + 1e-12
        assert eager.value_at("t", now)[0] == pytest.approx(value, rel=1e-9, abs=1e-6)
        lazy.change("t", (new_rate, 0, 0), now)
        eager.change("t", (new_rate, 0, 0), now)
        rate = new_rate


# ---------------------------------------------------------------- continue-as-new and new configurations


def unpacked(snapshot: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(snapshot["zlib"])))
    return data


def packed(data: dict[str, Any]) -> dict[str, Any]:
    blob = zlib.compress(json.dumps(data, separators=(",", ":")).encode())
    return {"v": 1, "zlib": base64.b64encode(blob).decode("ascii")}


def test_the_decayed_usage_survives_a_snapshot_and_an_older_snapshot_restores_with_none() -> None:
    policy = two_tenants("1h")
    busy_hour(policy)
    snapshot = policy.snapshot()
    restored = Policy.restore(json.loads(json.dumps(snapshot)))
    assert restored.tenancy.decay is not None and policy.tenancy.decay is not None
    assert restored.tenancy.decay.rows() == policy.tenancy.decay.rows()
    assert restored.snapshot() == snapshot
    later = [GangReleased(gang_id="b1"), gang("a3", "team-a", gpus=8), gang("b3", "team-b", gpus=8)]
    for event in later:  # and it decides exactly alike from then on
        assert restored.step(event, 2 * HOUR) == policy.step(event, 2 * HOUR)
    assert restored.queues() == policy.queues()
    # a snapshot taken before usage_half_life existed has no "usage": it restores with no history at all
    old = unpacked(snapshot)
    del old["usage"]
    forgetful = Policy.restore(packed(old))
    assert forgetful.queues()["tenants"]["team-a"]["decayed_usage"]["gpu"] == 0.0
    # and without the knob the snapshot has no such key: it is what it was before, byte for byte
    assert "usage" not in unpacked(two_tenants(None).snapshot())


def test_a_new_configuration_keeps_the_history_and_dropping_the_key_drops_it() -> None:
    policy = two_tenants("1h")
    busy_hour(policy)
    before = policy.queues()["tenants"]["team-a"]["decayed_usage"]
    longer = config("tenants: [{name: team-a}, {name: team-b}]\npolicy: {usage_half_life: 2h}")
    policy.step(ConfigApplied(config=longer), HOUR)
    assert policy.queues()["tenants"]["team-a"]["decayed_usage"] == before
    policy.step(ConfigApplied(config=config("tenants: [{name: team-a}, {name: team-b}]")), HOUR)
    assert "decayed_usage" not in policy.queues()["tenants"]["team-a"]
    assert policy.tenancy.share("team-a", policy.inventory.capacity) == 0.0  # nothing of team-a runs


# ---------------------------------------------------------------- views and configuration


def test_queues_show_has_a_decayed_usage_column_only_with_the_knob() -> None:
    policy = two_tenants("1h")
    busy_hour(policy)
    data = {**policy.queues(), "config": {"policy": {"usage_half_life": 3600.0}}}
    with render.console.capture() as captured:
        render_queues.show_queues(data)
    text = captured.get()
    assert "decayed usage (half-life 1h)" in text and "gpu 5.77 GPU·h" in text, text  # 8 * tau / 2 s
    plain = two_tenants(None)
    busy_hour(plain)
    assert all("decayed_usage" not in entry for entry in plain.queues()["tenants"].values())
    with render.console.capture() as captured:
        render_queues.show_queues(plain.queues())
    assert "decayed" not in captured.get()


@pytest.mark.parametrize(("written", "seconds"), [("7d", 604800.0), ("12h", 43200.0), (90, 90.0), ("1m30s", 90.0)])
def test_usage_half_life_reads_durations(written: Any, seconds: float) -> None:
    policy = load_queue_config({"tenants": [{"name": "a"}], "policy": {"usage_half_life": written}}).policy
    assert policy.usage_half_life == seconds
    assert load_queue_config({"tenants": [{"name": "a"}]}).policy.usage_half_life is None


@pytest.mark.parametrize("written", [0, "0s", -1, "-1h", "soon", True, [7], float("inf"), "1e400d"])
def test_bad_usage_half_lives_are_refused_naming_the_field(written: Any) -> None:
    with pytest.raises(QueueConfigError) as caught:
        load_queue_config({"tenants": [{"name": "a"}], "policy": {"usage_half_life": written}})
    assert str(caught.value).startswith("policy.usage_half_life: "), str(caught.value)
