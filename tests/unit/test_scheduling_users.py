"""Fair share inside a tenant (``engine.scheduling.users``): a tenant's gangs take turns by their runs' users'
shares, the tenants keep their order among themselves, a tenant whose gangs name no user keeps its FIFO order,
and the users' usage survives continue-as-new and a new configuration.

Plain Python: ``Policy.step`` driven directly, with times as simulated seconds passed as ``now``.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from scheduling_builders import FOREVER, admitted, config, gang, node, order, run

from engine.cli import render, render_queues
from engine.scheduling import ConfigApplied, GangReleased, Policy
from engine.scheduling.events import Event, GangRejected, GangSubmitted

HOUR = 3600.0
TAU = HOUR / math.log(2)


def team(half_life: str | None = None, tenants: str = "[{name: team-a}]") -> Policy:
    policy = "" if half_life is None else f"policy: {{usage_half_life: {half_life}}}"
    return Policy(config(f"tenants: {tenants}\n{policy}\n"), node_ttl_s=FOREVER)


def without_user(event: Event) -> Event:
    """The same event, its gang naming no user (what a request from before users is)."""
    if not isinstance(event, GangSubmitted):
        return event
    return event.model_copy(update={"request": event.request.model_copy(update={"user": ""})})


def queued_tenants(events: list[Event], tenants: str) -> tuple[list[str], Policy]:
    """The tenants of the pending gangs in order after ``events``, and the policy."""
    policy = team(tenants=tenants)
    for event in events:
        policy.step(event, 0.0)
    return [p["tenant"] for p in policy.describe()["pending"]], policy


def busy_alice(policy: Policy, users: bool = True) -> list[str]:
    """alice and dave each hold half of a 16-GPU node; alice, then bob, queue a gang of 8. Who starts when
    dave's ends."""
    alice, bob, dave = ("alice", "bob", "dave") if users else ("", "", "")
    policy.step(node("n0", gpus=16, cpus=64), 0.0)
    assert admitted(policy.step(gang("a1", "team-a", gpus=8, user=alice), 0.0)) == ["a1"]
    assert admitted(policy.step(gang("d1", "team-a", gpus=8, user=dave), 0.0)) == ["d1"]
    policy.step(gang("a2", "team-a", gpus=8, user=alice), 10.0)
    policy.step(gang("b1", "team-a", gpus=8, user=bob), 20.0)
    return admitted(policy.step(GangReleased(gang_id="d1"), 100.0))


def test_a_user_holding_gpus_waits_behind_a_colleague_holding_none() -> None:
    # without users: submission order inside the tenant, as before
    assert busy_alice(team(), users=False) == ["a2"]
    policy = team()
    assert busy_alice(policy) == ["b1"]
    users = policy.queues()["tenants"]["team-a"]["users"]
    assert users["alice"]["used"]["gpu"] == 8 and users["alice"]["pending"] == 1
    assert users["alice"]["share"] == pytest.approx(0.5) and users["bob"]["used"]["gpu"] == 8
    # no half-life: no memory; a user holding nothing and waiting for nothing has no row
    assert "dave" not in users and "decayed_usage" not in users["alice"]


def test_the_queue_view_shows_the_order_the_users_take_turns_in() -> None:
    policy = team()
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    policy.step(gang("a1", "team-a", gpus=8, user="alice"), 0.0)
    for i, user in enumerate(["alice", "alice", "bob", "carol"]):
        policy.step(gang(f"{user}-{i}", "team-a", gpus=8, user=user), 10.0 + i)
    # alice holds the node: bob's and carol's gangs first, in submission order, then alice's
    assert order(policy) == ["bob-2", "carol-3", "alice-0", "alice-1"]
    rows = {p["gang_id"]: p for p in policy.describe()["pending"]}
    assert rows["bob-2"]["user"] == "bob" and rows["bob-2"]["position"] == 1
    assert policy.describe()["running"][0]["user"] == "alice"


def test_with_a_half_life_a_user_who_used_the_cluster_yields_after_releasing() -> None:
    def after_an_hour(half_life: str | None) -> tuple[Policy, list[str]]:
        policy = team(half_life)
        policy.step(node("n0", gpus=8, cpus=64), 0.0)
        policy.step(gang("a1", "team-a", gpus=8, user="alice"), 0.0)
        policy.step(gang("a2", "team-a", gpus=8, user="alice"), 10.0)
        policy.step(gang("b1", "team-a", gpus=8, user="bob"), 20.0)
        return policy, admitted(policy.step(GangReleased(gang_id="a1"), HOUR))

    assert after_an_hour(None)[1] == ["a2"]  # the usage of now only: nobody holds anything, FIFO
    policy, started = after_an_hour("1h")
    assert started == ["b1"]
    alice = policy.queues()["tenants"]["team-a"]["users"]["alice"]
    assert alice["decayed_usage"]["gpu"] == pytest.approx(8 * TAU * 0.5)
    assert alice["share"] == pytest.approx(0.5)  # its average over the past, over the node's 8 GPUs


def test_users_reorder_inside_a_tenant_only() -> None:
    """The tenants' places in the order are what they were without users: only which of a tenant's gangs
    takes each of its places changes (random queues behind a full cluster, with and without users)."""
    rng = random.Random(7)
    tenants = "[{name: team-a}, {name: team-b}, {name: team-c}]"
    for _ in range(20):
        # each user holds some GPUs (so their shares differ), then 30 gangs queue behind the full nodes
        events: list[Event] = [node(f"n{i}", gpus=8, cpus=64) for i in range(2)]
        for i, gpus in enumerate([1, 2, 4, 1, 2, 4]):
            events.append(gang(f"r{i}", ["team-a", "team-b"][i % 2], gpus=gpus, user=f"u{i % 3}"))
        for i in range(30):
            tenant, user = rng.choice(["team-a", "team-b", "team-c"]), rng.choice(["u0", "u1", "u2", "u3"])
            events.append(gang(f"g{i}", tenant, gpus=rng.choice([8, 16]), nnodes=1, user=user))

        with_users, policy = queued_tenants(events, tenants)
        without, _ = queued_tenants([without_user(e) for e in events], tenants)
        assert with_users == without
        # inside a tenant, the users by their shares: the lowest first
        users = policy.tenancy.users
        for tenant in ("team-a", "team-b", "team-c"):
            shares = [
                users.share(tenant, p["user"], policy.inventory.capacity)
                for p in policy.describe()["pending"]
                if p["tenant"] == tenant
            ]
            assert shares == sorted(shares)


def test_one_user_per_tenant_decides_exactly_as_no_user() -> None:
    rng = random.Random(3)
    events: list[tuple[float, Event]] = [(0.0, node(f"n{i}", gpus=8, cpus=64)) for i in range(3)]
    t = 0.0
    for i in range(60):
        t += rng.uniform(0, 20)
        tenant = rng.choice(["team-a", "team-b", "team-c"])
        events.append((t, gang(f"g{i}", tenant, gpus=rng.choice([1, 2, 4, 8]), user=f"{tenant}-owner")))
        if i % 3 == 2:
            events.append((t + 1, GangReleased(gang_id=f"g{i - 2}")))
    events.sort(key=lambda e: e[0])
    tenants = "[{name: team-a}, {name: team-b}, {name: team-c}]"
    with_users, without = team(tenants=tenants), team(tenants=tenants)
    for now, event in events:
        assert with_users.step(event, now) == without.step(without_user(event), now)


def test_users_survive_a_snapshot_and_a_new_configuration() -> None:
    policy = team("1h")
    busy_alice(policy)
    policy.step(GangReleased(gang_id="a1"), 200.0)
    restored = Policy.restore(json.loads(json.dumps(policy.snapshot())))
    assert restored.queues() == policy.queues()
    assert restored.describe()["pending"] == policy.describe()["pending"]
    assert restored.snapshot() == policy.snapshot()
    for event in [gang("c1", "team-a", gpus=8, user="carol"), GangReleased(gang_id="b1")]:
        assert restored.step(event, 300.0) == policy.step(event, 300.0)
    # a new configuration (another weight) keeps what each user holds and has held
    before = policy.queues()["tenants"]["team-a"]["users"]
    run([ConfigApplied(config=config("tenants: [{name: team-a, weight: 2}]\npolicy: {usage_half_life: 1h}\n"))], policy)
    after = policy.queues()["tenants"]["team-a"]["users"]
    assert {u: r["used"] for u, r in after.items()} == {u: r["used"] for u, r in before.items()}
    assert after["alice"]["decayed_usage"]["gpu"] == pytest.approx(before["alice"]["decayed_usage"]["gpu"])


def test_a_snapshot_without_users_is_as_before() -> None:
    policy = team()
    busy_alice(policy, users=False)
    assert "user_usage" not in json.dumps(policy.snapshot())
    assert "users" not in policy.queues()["tenants"]["team-a"]


def test_a_user_name_too_long_is_rejected_naming_it() -> None:
    policy = team()
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    (rejected,) = policy.step(gang("x", "team-a", user="u" * 300), 0.0)
    assert isinstance(rejected, GangRejected)
    assert "user is 300 characters long, at most 256" in rejected.reason


def test_queues_show_has_a_row_per_user_under_its_tenant() -> None:
    policy = team("1h")
    busy_alice(policy)
    data = {**policy.queues(), "config": {"policy": {"usage_half_life": 3600.0}}}
    with render.console.capture() as captured:
        render_queues.show_queues(data)
    text = captured.get()
    lines = {line.split("│")[0].strip(): line for line in text.splitlines() if "user " in line}
    assert set(lines) == {"user alice", "user bob", "user dave"}, text
    assert "gpu 8" in lines["user alice"] and "1" in lines["user alice"].split("│")[-2], text  # one waiting


def test_gangflow_cluster_names_each_gangs_user_under_its_tenant() -> None:
    policy = team()
    busy_alice(policy)
    with render.console.capture() as captured:
        render_queues.show_queue(policy.describe(), now=200.0)
    text = captured.get()
    tables = text[text.index("running gangs") :]
    running, pending = tables.split(" # ┃")  # the pending table's header
    assert "user alice" in running and "user bob" in running, text
    assert "user alice" in pending and "user bob" not in pending, text


def test_users_add_no_looks_to_a_cycle_and_the_lowest_share_goes_next() -> None:
    """Its users' gangs of one shape stand for each other as one queue's gangs do: one head of them is looked
    at per cycle (an event's cost does not grow with the users), the one of the user with the lowest share."""
    policy = team()
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    policy.step(gang("held", "team-a", gpus=4, user="u0"), 0.0)
    policy.step(gang("held2", "team-a", gpus=4, user="u1"), 0.0)
    for i in range(12):  # u0..u3, three gangs each, all of 4 GPUs: one queue without users
        policy.step(gang(f"g{i}", "team-a", gpus=4, user=f"u{i % 4}"), 1.0 + i)
    assert len(policy._entries["team-a"]) == 1  # one head in the order, not four
    # u1's gang ends: u0 holds 4 GPUs, the others none; the oldest of theirs goes (FIFO would take u0's g0)
    assert admitted(policy.step(GangReleased(gang_id="held2"), 100.0)) == ["g1"]
    # u0's ends: now u1 holds 4; of the others' gangs the oldest, u0's g0
    assert admitted(policy.step(GangReleased(gang_id="held"), 101.0)) == ["g0"]
    assert len(policy._entries["team-a"]) == 1


def test_gangs_with_and_without_users_of_one_tenant_start_in_one_cycle() -> None:
    """A tenant whose gangs name users and gangs that name none, of two shapes, all queued before any node:
    one node's registration starts them all, in one cycle (each queue's head, then the next of its shape)."""
    policy = team()
    for i, (user, gpus) in enumerate([("", 1), ("alice", 1), ("", 2), ("bob", 2), ("alice", 2), ("", 1)]):
        policy.step(gang(f"g{i}", "team-a", gpus=gpus, user=user), float(i))
    started = admitted(policy.step(node("n0", gpus=16, cpus=64), 10.0))
    assert sorted(started) == [f"g{i}" for i in range(6)]
    assert not policy.pending and policy._user_gangs["team-a"] == 0


def test_a_queue_whose_head_started_is_not_looked_at_once_its_tenants_last_user_gang_started() -> None:
    """Found by a random search: within its quota (share 0) a tenant's users' heads and its gangs without a
    user interleave; when the queue of a started gang without a user is empty, and the tenant's last gang
    naming a user starts before that queue's turn comes back, the cycle must not look at the started gang
    (it failed with KeyError before the fix in 50fa32f)."""
    policy = Policy(config("tenants: [{name: team-a, quota: {gpu: 32}}]"), node_ttl_s=FOREVER)
    policy.step(node("n0", gpus=8, cpus=64), 0.0)
    policy.step(gang("h0", "team-a", gpus=1, user="b"), 0.0)
    waiting = [("g0", 1, "c"), ("g1", 1, "b"), ("g2", 4, ""), ("g3", 1, ""), ("g4", 1, "b"), ("g5", 1, "")]
    waiting += [("g6", 2, "b"), ("g7", 4, "a"), ("g8", 4, "")]
    for gang_id, gpus, user in waiting:
        policy.step(gang(gang_id, "team-a", gpus=gpus, user=user), 1.0)
    started = admitted(policy.step(node("n1", gpus=16, cpus=64), 2.0))
    assert sorted(started) == ["g4", "g5", "g6", "g7", "g8"] and not policy.pending
