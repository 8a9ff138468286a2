"""The gang's payloads keep the shape of the dicts they replaced: a Scheduler, GangTask or node agent of the
version before reads them, and so do the recorded histories."""

from __future__ import annotations

from engine.core.gang import GangShape, notice_of, notice_payload
from engine.scheduling import Preempted
from workflows.gang_spec import GangSpec, gang_request

NOTICE = {"by": "b-1.train-1", "by_tenant": "team-b", "cause": "reclaim", "grace_s": 120.0, "reason": "room"}


def test_the_notice_travels_as_the_scheduler_signalled_it() -> None:
    notice = notice_of(NOTICE, "a-2.train-1")
    assert notice == Preempted(gang_id="a-2.train-1", **NOTICE)
    assert notice_payload(notice) == NOTICE
    to_agents = notice_payload(notice, grace_s=30.0, noticed_at=1.5)
    assert to_agents == {**NOTICE, "grace_s": 30.0, "noticed_at": 1.5}
    assert notice_of(to_agents, "a-2.train-1") == notice.model_copy(update={"grace_s": 30.0})


def test_a_malformed_notice_is_none_not_an_error() -> None:
    assert notice_of("preempt", "g") is None
    assert notice_of({**NOTICE, "cause": "whim"}, "g") is None
    assert notice_of({"by": "x"}, "g") is None


def test_the_submit_is_the_gang_request_dict_of_before() -> None:
    shape = GangShape(nnodes=2, nproc_per_node=2, gpus_per_node=2, cpus_per_node=1.0, mem_per_node=None)
    spec = GangSpec(task="t", call="t-1", shape=shape, timeout_s=60, heartbeat_timeout_s=10, tenant="default")
    before = {
        "gang_id": "g",
        "nnodes": 2,
        "gpus_per_node": 2,
        "cpus_per_node": 1.0,
        "mem_per_node": None,
        "tenant": "default",
        "lost_node_wait_s": 600.0,
    }
    assert gang_request(spec, "g") == before
    spec = GangSpec(**{**spec.__dict__, "priority": "high", "preemptible": False})
    assert gang_request(spec, "g") == {**before, "priority": "high", "preemptible": False}
    # the run's user only when it has one: a request without is byte for byte what older Schedulers accept
    spec = GangSpec(**{**spec.__dict__, "user": "alice"})
    assert gang_request(spec, "g") == {**before, "priority": "high", "preemptible": False, "user": "alice"}
