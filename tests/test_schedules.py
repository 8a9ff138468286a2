"""Schedules on the session's real server and worker: a schedule of examples/scheduled_report.py is created
with its inputs, shows in the list with its next run, starts a run when triggered that completes with those
inputs and shows in ``gangflow status`` / ``list`` / ``logs`` like any run, pauses and resumes, and is deleted;
bad input exits 2 and creates nothing."""

from __future__ import annotations

import json
import os

import pytest
from conftest import ROOT, gangflow_cli, make_client, run, until

from engine.cli.app import build_parser
from engine.cli.common import CliError
from engine.cli.schedules import cmd_schedule
from engine.client._schedules import Schedules

EXAMPLE = str(ROOT / "examples" / "scheduled_report.py") + ":report"


def schedule_cli(address: str, *args: str) -> int:
    """``gangflow schedule ARGS`` in this process (what ``main`` runs), returning its exit status."""
    parsed = build_parser().parse_args(["schedule", *args, "--address", address])
    try:
        return run(cmd_schedule(parsed))
    except CliError as exc:
        print(f"error: {exc}")
        return exc.code


def test_a_schedule_starts_what_gangflow_run_starts(server, worker, artifacts, capsys):
    name = f"nightly-{os.urandom(3).hex()}"
    created = gangflow_cli(
        "schedule", "create", name, EXAMPLE, "--cron", "0 3 * * *", "--region", "eu", "--top", "2",
        "--artifacts", artifacts, "--note", "the morning report",
        GANGFLOW_ADDRESS=server.address,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert f"created schedule {name}" in " ".join(created.stdout.split())

    async def scenario() -> str:
        client = await make_client(server, artifacts)
        schedules = Schedules(client)
        listed = {s.name: s for s in await schedules.list()}
        assert listed[name].cron == ["0 3 * * *"] and listed[name].workflow == "report"
        assert listed[name].next_runs and listed[name].next_runs[0].hour == 3 and not listed[name].paused
        described = await schedules.describe(name)
        assert described.inputs == {"region": "eu", "top": 2} and described.overlap == "skip"
        assert described.note == "the morning report"

        run_id = await schedules.trigger(name)
        assert run_id is not None and run_id.startswith(f"{name}-")
        await client.wait(run_id)
        info = await client.status(run_id)
        assert (info.status, info.pipeline, info.tenant) == ("COMPLETED", "report", "default")
        # its logs are filed under its own run id, not the schedule's name shared by all its runs
        logs = await client.logs(run_id)
        assert any("top 2 products of eu" in text for _, text in logs), logs
        listed_runs = await until("the run in gangflow list", lambda: _listed(client, run_id), timeout=10)
        assert listed_runs.tenant == "default"
        return run_id

    run_id = run(scenario())
    status = gangflow_cli("status", run_id, "--json", GANGFLOW_ADDRESS=server.address)
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["status"] == "COMPLETED" and shown["result"]["region"] == "eu" and len(shown["result"]["top"]) == 2
    assert shown["schedule"] == name  # the run says which schedule started it
    text = gangflow_cli("status", run_id, GANGFLOW_ADDRESS=server.address)
    assert f"scheduled by {name}" in text.stdout, text.stdout

    capsys.readouterr()
    assert schedule_cli(server.address, "pause", name, "--note", "holidays") == 0
    assert f"paused schedule {name}" in capsys.readouterr().out
    assert schedule_cli(server.address, "list", "--json") == 0
    paused = {s["name"]: s for s in json.loads(capsys.readouterr().out)}[name]
    assert paused["paused"] and paused["note"] == "holidays"
    assert schedule_cli(server.address, "resume", name) == 0
    assert f"resumed schedule {name}" in capsys.readouterr().out
    # the list reads each schedule's state from the schedule, not from the (eventually consistent) visibility
    # store: right after resume it says so, as describe does
    assert schedule_cli(server.address, "list", "--json") == 0
    assert {s["name"]: s for s in json.loads(capsys.readouterr().out)}[name]["paused"] is False
    assert schedule_cli(server.address, "describe", name, "--json") == 0
    assert json.loads(capsys.readouterr().out)["paused"] is False

    # a name in use: exit 2, the schedule unchanged
    again = [name, EXAMPLE, "--cron", "0 4 * * *", "--region", "us", "--artifacts", artifacts]
    assert schedule_cli(server.address, "create", *again) == 2
    assert "exists already" in capsys.readouterr().out
    # --replace: the same name, new inputs and policy (the README's form: --input-json)
    replaced = [name, EXAMPLE, "--cron", "0 4 * * *", "--input-json", '{"region": "us"}', "--overlap", "buffer-one"]
    assert schedule_cli(server.address, "create", *replaced, "--catchup-window", "1h", "--replace") == 0
    capsys.readouterr()
    assert schedule_cli(server.address, "describe", name, "--json") == 0
    now = json.loads(capsys.readouterr().out)
    assert (now["cron"], now["inputs"], now["overlap"]) == (["0 4 * * *"], {"region": "us", "top": 3}, "buffer-one")
    assert now["catchup_window_s"] == 3600
    assert schedule_cli(server.address, "delete", name) == 0
    assert schedule_cli(server.address, "delete", name) == 1
    assert "no schedule named" in capsys.readouterr().out
    assert name not in {s.name for s in run(Schedules(run(make_client(server, artifacts))).list())}


async def _listed(client, run_id):
    return next((r for r in await client.runs(pipeline="report", limit=50) if r.run_id == run_id), None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 3 * * *", "--region", "eu", "--colour", "red"], "unknown parameter --colour"),
        (["--cron", "0 3 * * *", "--region", "eu", "--top", "many"], "'top'"),
        (["--cron", "0 3 * * *"], "region"),
        (["--cron", "0 25 * * *", "--region", "eu"], "hour 25 is out of range"),
    ],
    ids=["unknown-param", "wrong-type", "missing-required", "bad-cron"],
)
def test_bad_input_exits_2_and_creates_nothing(server, artifacts, capsys, args, message):
    name = f"bad-{os.urandom(3).hex()}"
    assert schedule_cli(server.address, "create", name, EXAMPLE, "--artifacts", artifacts, *args) == 2
    assert message in capsys.readouterr().out
    names = {s.name for s in run(Schedules(run(make_client(server, artifacts))).list())}
    assert name not in names
