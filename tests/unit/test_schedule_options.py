"""Schedules without a server: cron and duration checks, overlap names, option validation, the command line
(bad input exits 2 before anything is contacted), the scheduled action starting what ``gangflow run`` starts,
and the run id each scheduled run gets."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import ScheduleActionStartWorkflow, ScheduleOverlapPolicy

from engine.cli.app import build_parser
from engine.cli.common import CliError
from engine.cli.schedules import cmd_schedule, split_create_argv
from engine.client import load_workflow_file, start_options
from engine.client._schedule_spec import check_cron, parse_duration
from engine.client._schedules import (
    OVERLAP_POLICIES,
    ScheduleOptions,
    _schedule,
    check_schedule_name,
    overlap_name,
    overlap_policy,
    prepare_schedule,
)
from engine.core.wire import RunContext
from engine.errors import InputError
from engine.runtime.connection import PIPELINE, TENANT
from workflows.scheduled import own_run_context

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT}/examples/scheduled_report.py:report"


@pytest.mark.parametrize(
    "expr",
    ["0 3 * * *", "*/15 9-17 * * mon-fri", "0 0 1 jan,jul *", "0 3 * * 7", "30 0 3 * * * 2030", "0 3 * * * 2030",
     "@daily", "@every 90m", "CRON_TZ=Europe/Paris 0 3 * * *", "  0  3 * * *  "],
)  # fmt: skip
def test_cron_expressions_temporal_reads_are_accepted(expr):
    assert check_cron(expr) == " ".join(expr.split())


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 25 * * *", "hour 25 is out of range (0-23)"),
        ("61 * * * *", "minute 61 is out of range"),
        ("0 3 * * funday", "day of week 'funday' is not a number"),
        ("0 3 * 13 *", "month 13 is out of range"),
        ("0 3 * *", "has 4 fields"),
        ("0 3 5-1 * *", "ends before it starts"),
        ("*/0 * * * *", "step '0' is not a positive number"),
        ("@sometimes", "unknown shortcut"),
        ("@every soon", "not a duration"),
        ("", "is empty"),
        ("0 3 ? * *", "day of month '?' is not a number"),
        ("0 3 L * *", "day of month 'L' is not a number"),
    ],
)
def test_bad_cron_expressions_are_named(expr, message):
    with pytest.raises(InputError, match="cron") as err:
        check_cron(expr)
    assert message in str(err.value)


def test_durations():
    assert parse_duration("1h") == timedelta(hours=1)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2d") == timedelta(days=2)
    for bad in ("", "1", "1 hour", "h", "-1h", "1y"):
        with pytest.raises(InputError, match=r"--catchup-window .* is not a duration"):
            parse_duration(bad, "--catchup-window")


def test_every_overlap_policy_of_temporal_has_a_name():
    named = set(OVERLAP_POLICIES.values())
    assert named == set(ScheduleOverlapPolicy)
    for name, policy in OVERLAP_POLICIES.items():
        assert overlap_policy(name) == policy and overlap_name(policy) == name
    with pytest.raises(InputError, match="unknown overlap policy 'sometimes'; expected one of skip, buffer-one"):
        overlap_policy("sometimes")


def test_options_are_checked():
    ok = ScheduleOptions(cron=(" 0 3 * * * ",), catchup_window=timedelta(hours=1), time_zone="Europe/Paris")
    assert ok.checked().cron == ("0 3 * * *",)
    with pytest.raises(InputError, match="at least one --cron"):
        ScheduleOptions(cron=()).checked()
    with pytest.raises(InputError, match="--catchup-window must be at least 10s"):
        ScheduleOptions(cron=("@daily",), catchup_window=timedelta(seconds=5)).checked()
    with pytest.raises(InputError, match="unknown time zone 'Mars/Olympus'"):
        ScheduleOptions(cron=("@daily",), time_zone="Mars/Olympus").checked()
    for bad in ("", "has space", "-leading", "a/b", "x" * 201):
        with pytest.raises(InputError, match="schedule name"):
            check_schedule_name(bad)
    assert check_schedule_name("nightly-report.v2_eu") == "nightly-report.v2_eu"


def test_the_scheduled_action_starts_what_gangflow_run_starts(tmp_path):
    defn = load_workflow_file(EXAMPLE)
    prepared = prepare_schedule(
        "nightly", defn, {"region": "eu"}, ScheduleOptions(cron=("0 3 * * *",)), artifacts=str(tmp_path)
    )
    assert prepared.envelope.run.run_id == "nightly" and prepared.envelope.inputs == {"region": "eu", "top": 3}
    assert prepared.envelope.code.bundle_sha  # pinned to the code as it is now
    schedule = _schedule(prepared.defn, prepared.envelope, "gangflow", prepared.options)
    action, run = schedule.action, start_options(prepared.defn, prepared.envelope)
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert (action.workflow, action.task_queue, action.id) == ("report", "gangflow", "nightly")
    assert action.memo == run["memo"] and action.execution_timeout == run["execution_timeout"]
    assert action.typed_search_attributes == run["search_attributes"]
    assert action.typed_search_attributes.get(PIPELINE) == "report" and action.typed_search_attributes.get(TENANT)
    assert (action.static_summary, action.static_details) == (run["static_summary"], run["static_details"])
    assert schedule.spec.cron_expressions == ["0 3 * * *"] and schedule.policy.overlap == ScheduleOverlapPolicy.SKIP


def test_each_scheduled_run_gets_its_own_run_id():
    run = RunContext("nightly", "report", "default", "/store")
    mine = own_run_context(run, "nightly-2026-12-01T03:00:00Z", "nightly")
    assert mine.run_id == "nightly-2026-12-01T03:00:00Z" and mine.pipeline == "report"
    # not started by that schedule, or a run started by gangflow run / a parent: unchanged (replays as it ran)
    assert own_run_context(run, "nightly-2026-12-01T03:00:00Z", None) is run
    assert own_run_context(run, "nightly-2026-12-01T03:00:00Z", "other") is run
    assert own_run_context(run, "nightly", None) is run
    child = RunContext("nightly-2026-12-01T03:00:00Z", "report", "default", "/store")
    assert own_run_context(child, "nightly-2026-12-01T03:00:00Z.sub-1", "nightly") is child


def test_create_splits_its_options_from_the_workflow_parameters():
    options = {"--cron": True, "--note": True, "--paused": False, "--json": False}
    own, target, params, separated, given = split_create_argv(
        ["nightly", "f.py:wf", "--cron", "0 3 * * *", "--region", "eu", "--paused", "--top=2"], options
    )
    assert own == ["nightly", "--cron", "0 3 * * *", "--paused"] and target == "f.py:wf"
    assert params == ["--region", "eu", "--top=2"] and not separated and given == {"--cron", "--paused"}
    _, target, params, separated, _ = split_create_argv(
        ["n", "f.py:wf", "--cron", "@daily", "--", "--note", "x"], options
    )
    assert target == "f.py:wf" and params == ["--note", "x"] and separated


def _cli(*args: str) -> int:
    parsed = build_parser().parse_args(["schedule", *args, "--address", "127.0.0.1:9"])  # nothing listens there
    try:
        return asyncio.run(cmd_schedule(parsed))
    except CliError as exc:
        return exc.code


@pytest.mark.parametrize(
    "args",
    [
        ["create", "n", EXAMPLE, "--cron", "0 3 * * *", "--region", "eu", "--colour", "red"],
        ["create", "n", EXAMPLE, "--cron", "0 3 * * *", "--region", "eu", "--top", "many"],
        ["create", "n", EXAMPLE, "--cron", "0 3 * * *"],
        ["create", "n", EXAMPLE, "--cron", "0 3 * * 8", "--region", "eu"],
        ["create", "n", EXAMPLE, "--region", "eu"],
        ["create", "n", EXAMPLE, "--cron", "@daily", "--region", "eu", "--catchup-window", "soon"],
        ["create", "n", EXAMPLE, "--cron", "@daily", "--region", "eu", "--time-zone", "Nowhere/City"],
        ["create", "bad name", EXAMPLE, "--cron", "@daily", "--region", "eu"],
        ["create", "n", f"{ROOT}/examples/scheduled_report.py:nothing", "--cron", "@daily"],
        ["create", "n", "--cron", "@daily"],
        ["pause"],
        ["list", "n"],
        ["resume", "n", "--cron", "@daily"],
        ["delete", "n", "--note", "why"],
    ],
)
def test_bad_command_lines_exit_2_before_anything_is_contacted(args):
    # exit 1 would mean it tried the (unreachable) server: the check came too late
    assert _cli(*args) == 2


def test_options_before_the_action_count_too():
    parsed = build_parser().parse_args(["schedule", "--json", "list", "--address", "127.0.0.1:9"])
    assert parsed.rest == ["--address", "127.0.0.1:9"] and parsed.json
