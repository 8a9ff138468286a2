"""A run at a glance without a server: the one line per gang state that ``gangflow status`` and the run's current
details share, the run's and the gang's markdown, the progress reports' payload and spacing, and the workflow
side's bookkeeping of signalled states (stale and malformed ones dropped)."""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from engine.core.glance import (
    GANGS_SHOWN,
    gang_details,
    gang_line,
    gang_status,
    progress_interval,
    progress_payload,
    progress_text,
    run_details,
)
from workflows.glance import RunGlance, call_attributes, progress_of

AT = 1_764_765_667.0  # 12:41:07 UTC
RUNNING: dict[str, Any] = {
    "call": "train-1",
    "phase": "attempt 2: 4 ranks running on n1, n2",
    "placed": True,
    "attempt": 2,
    "restarts": 1,
    "max_restarts": 3,
    "progress": {"attempt": 2, "step": 340, "metrics": {"lr": 0.001, "loss": 0.41}, "at": AT},
}
WAITING = {"call": "train-2", "phase": "pending: team-a is at its quota of 8 GPUs and cannot borrow", "placed": False}


def test_the_line_names_the_attempt_the_nodes_the_step_and_the_restarts() -> None:
    assert gang_line(RUNNING) == (
        "attempt 2: 4 ranks running on n1, n2: step 340, loss 0.41, lr 0.001 (12:41:07 UTC) · restarts 1 of 3"
    )
    assert gang_status(RUNNING) == "running" and gang_status(WAITING) == "waiting"
    assert gang_status(RUNNING, "completed") == "completed"
    # a waiting gang's line is the Scheduler's reason, word for word (what `gangflow status` printed before)
    assert gang_line(WAITING) == WAITING["phase"]


def test_an_earlier_attempts_progress_is_not_shown_as_this_ones() -> None:
    stale = {**RUNNING, "attempt": 3, "phase": "attempt 3: starting on n3"}
    assert gang_line(stale) == "attempt 3: starting on n3 · restarts 1 of 3"
    assert gang_line({"phase": "submitted"}) == "submitted" and gang_line({}) == "starting"


def test_the_status_query_answer_reads_the_same() -> None:
    """`gangflow status` passes the GangTask's status answer (a placement, not ``placed``)."""
    answer = {**RUNNING, "placement": {"nodes": []}, "pending": None}
    del answer["placed"]
    assert gang_line(answer) == gang_line(RUNNING) and gang_status(answer) == "running"


def test_progress_text_without_time_or_metrics() -> None:
    assert progress_text({"step": 5}) == "step 5"
    assert progress_text({"step": 5, "metrics": {"loss": 0.123456}}) == "step 5, loss 0.1235"


def test_the_gang_says_it_waits_though_the_list_shows_it_running() -> None:
    details = gang_details(WAITING)
    assert details.startswith("**waiting** for a placement — pending: team-a is at its quota of 8 GPUs"), details
    assert gang_details(RUNNING, "\n\n| node |").startswith("**running** — attempt 2: ")
    assert gang_details(RUNNING, "\n\n| node |").endswith("\n\n| node |")
    assert gang_details({**RUNNING, "ended": "completed"}).startswith("**completed** — ")
    # markdown in a reason is shown literally; an id's underscores need no escape
    assert gang_details({"phase": "pending: gang *a* of x_y <b>", "placed": False}).endswith(
        "pending: gang \\*a\\* of x_y \\<b\\>"
    )


def test_the_run_details_list_each_gang_call_under_the_task_counts() -> None:
    head = "**running:** train · **done:** 1 · **failed:** 0"
    done = {"call": "prep-1", "phase": "completed attempt 0 on n1", "ended": "completed"}
    text = run_details(head, [done, RUNNING, WAITING])
    lines = text.splitlines()
    assert lines[0] == head and lines[1] == ""
    assert lines[2] == f"- **train-1** · *running* · {gang_line(RUNNING)}"
    assert lines[3] == f"- **train-2** · *waiting* · {WAITING['phase']}"
    assert lines[4] == "- **prep-1** · *completed* · completed attempt 0 on n1"
    assert run_details(head, []) == head


def test_the_run_details_stay_small_for_a_run_of_many_calls() -> None:
    ended = [{"call": f"t-{n}", "phase": "done", "ended": "completed"} for n in range(50)]
    text = run_details("head", [*ended, RUNNING])
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(lines) == GANGS_SHOWN + 1 and "train-1" in lines[0] and "t-49" in lines[-2]
    assert lines[-1] == f"- … and {51 - GANGS_SHOWN} more distributed task calls (`gangflow status`)"
    live = [{**WAITING, "call": f"w-{n}"} for n in range(GANGS_SHOWN + 3)]
    assert len([line for line in run_details("h", live).splitlines() if line.startswith("- **")]) == GANGS_SHOWN


def test_progress_reports_are_rank_0s_and_spaced_out() -> None:
    rows = [
        {"rank": 0, "step": None, "metrics": {}, "reported_at": None},
        {"rank": 1, "step": 7, "metrics": {"loss": 0.5, "note": "x", "bad": float("nan")}, "reported_at": AT},
    ]
    assert progress_payload(1, rows) == {"attempt": 1, "step": 7, "metrics": {"loss": 0.5}, "at": AT}
    assert progress_payload(0, [{"rank": 0, "step": None}]) is None
    assert progress_interval(0) == 15 and progress_interval(1000) == 100 and progress_interval(86_400) == 600
    # a 10-hour attempt: about a hundred reports
    age, sent = 0.0, 0
    while age < 36_000:
        age += progress_interval(age)
        sent += 1
    assert 80 <= sent <= 130, sent


def test_the_gang_keeps_only_well_formed_reports() -> None:
    assert progress_of({"attempt": 0, "step": 3, "metrics": {"loss": 1, "s": "x"}, "at": AT}) == {
        "attempt": 0,
        "step": 3,
        "metrics": {"loss": 1},
        "at": AT,
    }
    for bad in (None, [], {"attempt": "0", "step": 1}, {"attempt": 0, "step": True}, {"attempt": 0}):
        assert progress_of(bad) is None, bad


def test_the_run_drops_stale_and_malformed_states_and_keeps_a_failure() -> None:
    glance = RunGlance()
    glance.started("train-1")
    assert not glance.told({"call": "train-9", "seq": 1, "phase": "x"})  # not a call of this run
    assert not glance.told("nonsense") and not glance.told({"call": "train-1"})
    assert glance.told({**RUNNING, "seq": 2})
    assert not glance.told({**WAITING, "call": "train-1", "seq": 1})  # older than what it has
    assert "step 340" in glance.details("h")
    glance.finished("train-1", "failed", "RankFailed: rank 1 exited with code 1\ntraceback ...")
    assert not glance.told({**RUNNING, "seq": 3})  # signalled before the failure, arriving after it
    assert glance.details("h").splitlines()[-1] == "- **train-1** · *failed* · RankFailed: rank 1 exited with code 1"


def test_a_gang_behind_nexus_is_listed_as_started_until_it_ends() -> None:
    glance = RunGlance()
    glance.started("train-1", told=False)
    started = "- **train-1** · *started* · in the platform's namespace, which gangflow status asks"
    assert glance.details("h").splitlines()[-1] == started
    glance.finished("train-1", "completed", goodput="goodput 90 %: 10 % launch")
    ended = started.replace("*started*", "*completed*") + " · goodput 90 %: 10 % launch"
    assert glance.details("h").splitlines()[-1] == ended


def test_a_completed_gang_may_tell_its_last_step_after_the_run_saw_it_end() -> None:
    glance = RunGlance()
    glance.started("train-1")
    glance.finished("train-1", "completed")
    assert glance.told({**RUNNING, "phase": "completed attempt 2 on n1, n2", "ended": "completed", "seq": 5})
    assert glance.details("h").splitlines()[-1].startswith("- **train-1** · *completed* · completed attempt 2 on n1")


def test_calls_carry_their_kind_and_tenant_and_a_child_keeps_its_pipeline() -> None:
    pipeline = SearchAttributeKey.for_keyword("GangflowPipeline")
    kind = SearchAttributeKey.for_keyword("GangflowKind")
    tenant = SearchAttributeKey.for_keyword("GangflowTenant")
    run = TypedSearchAttributes(
        [SearchAttributePair(pipeline, "p"), SearchAttributePair(kind, "run"), SearchAttributePair(tenant, "a")]
    )
    child = call_attributes("call", "a", run)
    assert child.get(pipeline) == "p" and child.get(kind) == "call" and child.get(tenant) == "a"
    assert len(child.search_attributes) == 3
    gang = call_attributes("gang", "team-a")
    assert gang.get(kind) == "gang" and gang.get(tenant) == "team-a" and gang.get(pipeline) is None
