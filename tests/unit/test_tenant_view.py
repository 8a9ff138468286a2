"""What one tenant is shown of the Scheduler's state (engine.scheduling.tenant_view): its own rows, capacity
totals, no nodes, no other tenant's rows, and no other tenant's gang ids in any text; and how `gangflow
cluster` and `queues show` print such a view (no "no nodes registered": the nodes are the platform's)."""

from __future__ import annotations

import io

import pytest

from engine.cli import render, render_queues
from engine.core.protocol import tenant_of_namespace
from engine.scheduling.tenant_view import own_cluster, own_gang, own_queues, redact
from workflows.platform import VIEW_CALLS_MAX, ViewRequest

ROW_A = {"nominal": {"gpu": 2}, "used": {"gpu": 4}, "borrowed": {"gpu": 2}, "lent": {"gpu": 0}, "pending": 1}
ROW_B = {"nominal": {"gpu": 2}, "used": {"gpu": 0}, "borrowed": {"gpu": 0}, "lent": {"gpu": 2}, "pending": 1}
DESCRIBED = {
    "nodes": [{"node_id": "node-0", "gangs": ["team-a:r1.train-1", "team-b:secret-run.train-1"]}],
    "drained": [],
    "tenants": {"team-a": ROW_A, "team-b": ROW_B},
    "running": [
        {"gang_id": "team-a:r1.train-1", "tenant": "team-a", "nodes": [{"node_id": "node-0", "gpu_ids": [0]}]},
        {"gang_id": "team-b:secret-run.train-1", "tenant": "team-b", "preempting": {"by": "team-a:r2.train-1"}},
    ],
    "pending": [
        {
            "gang_id": "team-a:r2.train-1",
            "tenant": "team-a",
            "position": 2,
            "reason": "pending: behind gang 'team-b:secret-run.eval-1' of team-b, which goes first ...",
        },
        {"gang_id": "team-b:secret-run.eval-1", "tenant": "team-b", "position": 1, "reason": "pending: ..."},
    ],
    "totals": {"nodes": 2, "alive_nodes": 2, "gpus_total": 4, "gpus_free": 0, "running": 2, "pending": 2},
}


def test_a_tenant_sees_its_own_rows_and_capacity_only() -> None:
    view = own_cluster(DESCRIBED, "team-a")
    assert view["tenant_view"] == "team-a" and view["nodes"] == [] and view["tenants"] == {"team-a": ROW_A}
    assert [g["gang_id"] for g in view["running"]] == ["team-a:r1.train-1"]
    assert [g["gang_id"] for g in view["pending"]] == ["team-a:r2.train-1"]
    assert view["pending"][0]["position"] == 2  # how many go first, not whose
    assert view["totals"] == {"nodes": 2, "alive_nodes": 2, "gpus_total": 4, "running": 1, "pending": 1}
    text = repr(view)
    assert "secret-run" not in text and "team-b:" not in text, text
    assert "behind a gang of team-b, which goes first" in view["pending"][0]["reason"]
    assert own_queues({"tenants": {"team-a": ROW_A, "team-b": ROW_B}}, "team-b") == {
        "tenant_view": "team-b",
        "tenants": {"team-b": ROW_B},
        "flavors": [],
        "topology": [],
        "own_flavors": None,
    }
    assert own_cluster({"tenants": {}}, "team-c")["tenants"] == {}  # a tenant the configuration lacks


def test_other_tenants_gang_ids_are_redacted_and_nothing_else() -> None:
    tenants = ["team-a", "team-b"]
    assert redact("waiting for team-b:x.train-1, team-a:y.train-2 to release", "team-a", tenants) == (
        "waiting for a gang of team-b, team-a:y.train-2 to release"
    )
    # times, addresses and names of tenants the configuration does not know stay as they are
    same = "since 16:41:06 on 127.0.0.1:7233; cohort research lent it to team-b"
    assert redact(same, "team-a", tenants) == same
    status = {
        "phase": "preempted by team-b:x.train-1 of team-b (reclaim)",
        "placement": None,
        "attempts": [{"attempt": 0, "reason": "preempted by 'team-b:x.train-1'"}],
    }
    gang = own_gang(status, "team-a", tenants)
    assert gang["state"] == "waiting" and "team-b:" not in repr(gang)
    assert own_gang({"placement": {"nodes": []}}, "team-a", tenants)["state"] == "running"


def test_a_look_is_checked_before_it_reaches_the_platform() -> None:
    assert ViewRequest.of({"run_id": "r", "calls": ["train-1"], "cluster": True}) == ViewRequest(
        "r", ["train-1"], True, False
    )
    for bad in ([], {"calls": "train-1"}, {"run_id": 3}, {"calls": ["x"] * (VIEW_CALLS_MAX + 1)}):
        with pytest.raises(ValueError):
            ViewRequest.of(bad)


def test_the_namespace_names_its_tenant() -> None:
    assert tenant_of_namespace("gf-team-a") == "team-a"
    assert [tenant_of_namespace(n) for n in ("gangflow-system", "default", "gf-", "gf-Team_A")] == [None] * 4


def _printed(monkeypatch: pytest.MonkeyPatch, show: object, data: dict[str, object]) -> str:
    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.Console(file=out, width=300))
    show(data)  # type: ignore[operator]
    return " ".join(out.getvalue().split())


def test_cluster_and_queues_print_a_tenants_view_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _printed(monkeypatch, render_queues.show_queue, own_cluster(DESCRIBED, "team-a"))
    assert "team-a's view, through its Nexus endpoint" in text and "2 alive node(s), 4 GPU(s)" in text
    assert "no nodes registered" not in text and "team-a:r2.train-1" in text and "behind a gang of team-b" in text
    empty = _printed(monkeypatch, render_queues.show_queue, own_cluster({"tenants": {}, "totals": {}}, "team-c"))
    assert "no gang of team-c is running or pending" in empty
    # the platform's own view of a stack no node agent joined yet says how one joins
    bare = _printed(monkeypatch, render_queues.show_queue, {"nodes": [], "tenants": {}, "totals": {}})
    assert "no nodes registered: distributed tasks wait for one (gangflow dev --nodes N" in bare
    queues = _printed(monkeypatch, render_queues.show_queues, own_queues({"tenants": {"team-a": ROW_A}}, "team-a"))
    assert "team-a's queue, through its Nexus endpoint" in queues and "team-b" not in queues
