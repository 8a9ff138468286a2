"""A node's lease, the agent's side (engine.runtime.leases) and the one-node view a starting agent asks for."""

from __future__ import annotations

import asyncio

from scheduling_builders import node, run_last
from temporalio.testing import ActivityEnvironment

from engine.runtime.leases import LeaseHolder


def test_an_old_lease_ending_beside_a_new_one_leaves_the_agent_holding_one() -> None:
    # a lease the agent replaced (not picked up in time) may arrive after all and end beside the new one:
    # the agent must not think it holds none (it would replace the good lease, again and again, under load)
    async def scenario() -> None:
        holder = LeaseHolder(every=0.05)
        old_env, new_env = ActivityEnvironment(), ActivityEnvironment()
        old = asyncio.create_task(old_env.run(holder.hold, "a"))
        new = asyncio.create_task(new_env.run(holder.hold, "a"))
        await asyncio.sleep(0.2)
        assert holder.held and holder.holding == 2
        old_env.cancel()  # the replaced lease is gone: its heartbeat learns so
        await asyncio.gather(old, return_exceptions=True)
        assert holder.held and not holder.lapsed()
        new_env.worker_shutdown()  # the agent stops: the lease is returned
        assert await new == "agent stopped"
        assert not holder.held and holder.lapsed()

    asyncio.run(scenario())


def test_one_node_s_view_is_its_row_of_describe() -> None:
    policy, _ = run_last([node("a", gpus=2, cpus=8), node("b", gpus=4, cpus=16)], now=0.0)
    rows = {row["node_id"]: row for row in policy.describe()["nodes"]}
    assert policy.describe_node("b") == rows["b"]
    assert policy.describe_node("nowhere") is None
