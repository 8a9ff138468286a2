"""Tenants and priorities as users give them, checked without a server: ``Gang(priority=, preemptible=)``,
the run's tenant and priority in its envelope, the client's check against a queue configuration, the
CLI's options and its refusal of a bad queue file before anything is contacted, and the tables."""

from __future__ import annotations

import re
import textwrap
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import gangflow_cli, gangflow_main

from engine import DefinitionError, Gang, InputError, Resources, task, workflow
from engine.cli import render, render_queues
from engine.cli.app import build_parser, run_options
from engine.client import (
    NO_QUEUE_CONFIG,
    TenancyError,
    check_tenancy,
    default_tenant,
    prepare_run,
    task_priorities,
)
from engine.core import definition_of
from engine.core.gang import GangPlugin
from engine.core.wire import CodeRef, Envelope, RunContext
from engine.types.codec import pack, unpack

#: an address nothing listens on: a command that got as far as contacting Temporal would say so
NOWHERE = "127.0.0.1:9"


class Ranks(GangPlugin):
    def __init__(self, nnodes: int = 2, nproc_per_node: int = 1) -> None:
        self.nnodes, self.nproc_per_node = nnodes, nproc_per_node

    @classmethod
    def notice(cls, signal_name: str) -> Ranks:
        ranks = cls()
        ranks.notice_signal = signal_name
        return ranks


@task(plugin=Ranks(), resources=Resources(gpu=1), gang=Gang(priority="high", preemptible=False))
def train(n: int) -> int:
    return n


@task(plugin=Ranks())
def evaluate(n: int) -> int:
    return n


@task
def prep(n: int) -> int:
    return n


@workflow
async def pipeline(n: int = 1) -> int:
    return await evaluate(n=await train(n=await prep(n=n)))


@task(plugin=Ranks(), gang=Gang(priority="low"))
def elsewhere(n: int) -> int:
    """Called by no workflow here: its class is nobody's business before a run that calls it."""
    return n


@task(plugin=Ranks(), gang=Gang(priority="urgent"))
def rushed(n: int) -> int:
    return n


lib = types.ModuleType("lib")  # stands in for a module of the project: the workflow calls ``lib.hurry``
lib.hurry = rushed  # type: ignore[attr-defined]


async def stage(n: int) -> int:
    """A helper of this file that calls a task."""
    return await train(n=n)


@workflow
async def via_helper(n: int = 1) -> int:
    return await stage(n)


@workflow
async def via_child(n: int = 1) -> int:
    return await via_helper(n=n)


@workflow
async def via_module(n: int = 1) -> int:
    return int(await lib.hurry(n=n))


@workflow
async def quiet(n: int = 1) -> int:
    return await prep(n=n)


# -- Gang(priority=, preemptible=) -----------------------------------------------------------------
def test_a_distributed_task_carries_its_priority_and_preemptibility():
    trained, evaluated = definition_of(train), definition_of(evaluate)
    assert (trained.priority, trained.preemptible) == ("high", False)
    assert (evaluated.priority, evaluated.preemptible) == (None, True)  # the run's class; preemptible
    assert train(n=3) == 3  # still a plain function


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gang": Gang(priority="high")}, "gang= applies"),
        ({"gang": Gang()}, "gang= applies"),  # even the defaults: a plain task has no gangs
        ({"priority": "high"}, "priority= applies"),  # the deprecated keywords, the same one message
        ({"preemptible": True}, "preemptible= applies"),
        ({"preemptible": False, "preemption_grace": 30}, "preemptible=, preemption_grace= apply"),
    ],
)
def test_gang_options_are_for_distributed_tasks_only(options: dict[str, Any], message: str):
    expected = r"^task 'plain': " + re.escape(message) + r" to distributed tasks \(plugin=\.\.\.\) only$"
    with pytest.raises(DefinitionError, match=expected), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        @task(**options)
        def plain(n: int) -> int:
            return n


BAD_GANGS = [
    ({"priority": ""}, "priority must name a priority class (a non-empty str without surrounding spaces), got ''"),
    ({"priority": " high"}, "got ' high'"),
    ({"priority": 100}, "got 100"),
    ({"preemptible": 0}, "preemptible must be True or False, got 0"),
    ({"preemptible": "no"}, "preemptible must be True or False, got 'no'"),
    ({"preemption_grace": 0}, "preemption_grace must be positive, got 0"),
    ({"preemption_grace": -5}, "preemption_grace must be positive, got -5"),
    ({"preemption_grace": 2 * 86400}, "preemption_grace must be at most 1 day, 0:00:00, got 2 days"),
]


@pytest.mark.parametrize(("options", "message"), BAD_GANGS)
def test_a_bad_gang_fails_where_it_is_built(options: dict[str, Any], message: str):
    with pytest.raises(DefinitionError) as caught:
        Gang(**options)
    assert str(caught.value).startswith("Gang: ") and message in str(caught.value)


@pytest.mark.parametrize(("options", "message"), BAD_GANGS)
def test_bad_deprecated_keywords_fail_at_decoration_naming_the_task(options: dict[str, Any], message: str):
    with pytest.raises(DefinitionError) as caught, pytest.warns(DeprecationWarning):

        @task(**{"plugin": Ranks(), **options})
        def gang(n: int) -> int:
            return n

    assert str(caught.value).startswith("task 'gang': ") and message in str(caught.value)
    assert "Gang: " not in str(caught.value)  # the user wrote no Gang


def test_a_bad_notice_signal_fails_at_decoration():
    with pytest.raises(DefinitionError, match=r"^task 'gang': .*notice_signal must be one of SIGTERM, SIGUSR1"):

        @task(plugin=Ranks.notice("SIGKILL"))
        def gang(n: int) -> int:
            return n


def test_a_distributed_task_carries_its_preemption_grace_and_its_plugins_notice_signal():
    from datetime import timedelta

    from plugins.jax import Jax

    @task(plugin=Jax(), gang=Gang(preemption_grace=timedelta(minutes=5)))
    def jax_train(n: int) -> int:
        return n

    defn = definition_of(jax_train)
    assert defn.preemption_grace == timedelta(minutes=5) and defn.plugin.notice_signal == "SIGUSR1"
    assert definition_of(train).preemption_grace is None  # the cluster's default applies
    assert Jax(notice_signal="SIGTERM").notice_signal == "SIGTERM"  # hand the notice to JAX's own notifier


@pytest.mark.parametrize(
    ("wf", "expected"),
    [
        (pipeline, {"train": "high"}),
        (via_helper, {"train": "high"}),
        (via_child, {"train": "high"}),
        (via_module, {"rushed": "urgent"}),
        (quiet, {}),  # another workflow's task in the same file is not this run's
    ],
)
def test_the_priorities_of_the_tasks_a_workflow_calls_are_found(wf: Any, expected: dict[str, str]):
    assert task_priorities(definition_of(wf)) == expected


# -- the envelope ------------------------------------------------------------------------------
def test_an_envelope_without_a_priority_is_encoded_as_before_priorities_existed():
    code = CodeRef("flows", "pipeline")
    old = pack(
        {
            "code": {"module": "flows", "qualname": "pipeline", "bundle": None, "bundle_sha": None},
            "inputs": {"n": 1},
            "run": {"run_id": "r", "pipeline": "pipeline", "tenant": "default", "artifacts": "/tmp/a"},
        }
    )
    envelope = Envelope(code, {"n": 1}, RunContext("r", "pipeline", "default", "/tmp/a"))
    assert envelope.encode("test") == old  # recorded histories replay with the same payloads
    assert Envelope.decode(old) == envelope and Envelope.decode(old).run.priority is None


def test_an_envelope_carries_the_runs_priority():
    run = RunContext("r", "pipeline", "team-a", "/tmp/a", priority="high")
    blob = Envelope(CodeRef("flows", "pipeline"), {}, run).encode("test")
    assert unpack(blob)["run"]["priority"] == "high"
    assert Envelope.decode(blob).run == run


# -- prepare_run: tenant and priority --------------------------------------------------------------
def test_the_tenant_defaults_to_gangflow_tenant_then_default(monkeypatch, tmp_path):
    def tenant_of(**options: Any) -> RunContext:
        return prepare_run(pipeline, {"n": 2}, artifacts=str(tmp_path), bundle=False, **options)[1].run

    monkeypatch.delenv("GANGFLOW_TENANT", raising=False)
    assert default_tenant() == "default" and tenant_of().tenant == "default"
    monkeypatch.setenv("GANGFLOW_TENANT", "team-b")
    assert tenant_of().tenant == "team-b"
    assert tenant_of(tenant="team-a").tenant == "team-a"  # given wins over the environment
    assert (tenant_of(priority="high").priority, tenant_of().priority) == ("high", None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tenant": ""}, "tenant must be a name (a non-empty str without surrounding spaces), got ''"),
        ({"tenant": 7}, "tenant must be a name"),
        ({"priority": "high "}, "priority must be a name (a non-empty str without surrounding spaces), got 'high '"),
    ],
)
def test_a_malformed_tenant_or_priority_is_bad_input(tmp_path, options: dict[str, Any], message: str):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_run(pipeline, {"n": 2}, artifacts=str(tmp_path), bundle=False, **options)


# -- the check against the cluster's queue configuration -------------------------------------------
QUEUES = {
    "tenants": {"team-a": {}, "team-b": {}},
    "config": {
        "cohorts": [{"name": "research"}],
        "tenants": [{"name": "team-a", "cohort": "research"}, {"name": "team-b", "cohort": "research"}],
        "priority_classes": [{"name": "low", "value": 10}, {"name": "high", "value": 100}],
    },
}
UNCONFIGURED = {"tenants": {"default": {}}, "config": {"tenants": [{"name": "default"}], "priority_classes": []}}


def run_of(tenant: str = "team-a", priority: str | None = None) -> RunContext:
    return RunContext("r", "pipeline", tenant, "/tmp/a", priority)


def test_known_tenants_and_classes_pass():
    check_tenancy(QUEUES, run_of("team-a", "low"), {"train": "high"})
    check_tenancy(QUEUES, run_of("team-b"), {})
    check_tenancy(None, run_of("default"), {})  # no Scheduler: the default tenant, as before tenants
    check_tenancy(UNCONFIGURED, run_of("default"), {})


@pytest.mark.parametrize(
    ("queues", "run", "tasks", "message"),
    [
        (QUEUES, run_of("team-c"), {}, "unknown tenant 'team-c': the cluster's tenants are team-a, team-b"),
        (QUEUES, run_of("default"), {}, "unknown tenant 'default': the cluster's tenants are team-a, team-b"),
        (QUEUES, run_of(priority="urgent"), {}, "unknown priority class 'urgent' (the run): the cluster's "),
        (QUEUES, run_of(), {"train": "urgent"}, "unknown priority class 'urgent' (task 'train'): the cluster's"),
        (None, run_of("team-a"), {}, f"the cluster's tenants are default; {NO_QUEUE_CONFIG}"),
        (None, run_of("default", "high"), {}, f"priority classes are none; {NO_QUEUE_CONFIG}"),
        (None, run_of("default"), {"train": "high"}, "(task 'train'): the cluster's priority classes are none;"),
        (UNCONFIGURED, run_of("team-a"), {}, NO_QUEUE_CONFIG),
    ],
)
def test_an_unknown_tenant_or_class_is_refused_naming_the_known_ones(queues, run, tasks, message):
    with pytest.raises(TenancyError) as caught:
        check_tenancy(queues, run, tasks)
    assert message in str(caught.value)
    if queues is QUEUES:
        assert "low, high" in str(caught.value) or "team-a, team-b" in str(caught.value)
        assert "gangflow queues show" in str(caught.value)


RESTRICTED = {
    "tenants": {"team-a": {}, "team-b": {}},
    "config": {
        "tenants": [{"name": "team-a", "priority_classes": ["low"]}, {"name": "team-b", "priority_classes": []}],
        "priority_classes": [{"name": "low", "value": 10}, {"name": "high", "value": 100}],
    },
}


def test_a_class_the_tenant_may_not_use_is_refused_naming_the_ones_it_may():
    check_tenancy(RESTRICTED, run_of("team-a", "low"), {"train": "low"})
    check_tenancy(RESTRICTED, run_of("team-b"), {})  # naming no class: the default, always allowed
    with pytest.raises(TenancyError) as caught:
        check_tenancy(RESTRICTED, run_of("team-a", "high"), {})
    assert str(caught.value).startswith(
        "priority class 'high' (the run) is not allowed for tenant 'team-a': its priority classes are low"
    )
    with pytest.raises(TenancyError, match=r"'high' \(task 'train'\) is not allowed for tenant 'team-a'"):
        check_tenancy(RESTRICTED, run_of("team-a"), {"train": "high"})
    with pytest.raises(TenancyError, match="not allowed for tenant 'team-b': its priority classes are none"):
        check_tenancy(RESTRICTED, run_of("team-b", "low"), {})
    # a class nobody has is still "unknown", whatever the tenant may use
    with pytest.raises(TenancyError, match="unknown priority class 'urgent'"):
        check_tenancy(RESTRICTED, run_of("team-a", "urgent"), {})


def test_without_the_config_only_the_tenant_names_are_checked():
    names_only = {"tenants": {"team-a": {}}}  # a Scheduler that answers "queues" without "config"
    check_tenancy(names_only, run_of("team-a", "whatever"), {"train": "whatever"})
    with pytest.raises(TenancyError, match="unknown tenant 'team-b'"):
        check_tenancy(names_only, run_of("team-b"), {})


# -- the CLI's options --------------------------------------------------------------------------
def test_run_takes_tenant_and_priority_and_queues_its_actions():
    parser = build_parser()
    assert {"--tenant", "--priority"} <= set(run_options(parser))
    args = parser.parse_args(["run", "flow.py:wf", "--tenant", "team-a", "--priority", "high"])
    assert (args.tenant, args.priority) == ("team-a", "high")
    assert parser.parse_args(["run", "flow.py:wf"]).tenant is None  # the client's default: $GANGFLOW_TENANT
    apply = parser.parse_args(["queues", "apply", "q.yaml", "--json"])
    assert (apply.action, apply.file, apply.json) == ("apply", "q.yaml", True)
    show = parser.parse_args(["queues", "show"])
    assert (show.action, show.file, show.json) == ("show", None, False)
    assert parser.parse_args(["dev", "--queues", "q.yaml"]).queues == "q.yaml"


def cli(*args: str, cwd: Path | None = None) -> Any:
    return gangflow_cli(*args, cwd=cwd, GANGFLOW_ADDRESS=NOWHERE, COLUMNS="120")


def main(*args: str) -> Any:
    """``cli`` in this process: for what is refused before anything is contacted (no process start)."""
    return gangflow_main(*args, GANGFLOW_ADDRESS=NOWHERE, COLUMNS="120")


def test_queues_apply_refuses_a_bad_file_before_contacting_anything(tmp_path):
    bad = tmp_path / "queues.yaml"
    bad.write_text(
        textwrap.dedent("""\
        tenants:
          - name: team-a
            quota: {gpu: 2}
          - name: team-b
            quota: {gpu: -1}
    """)
    )
    done = cli("queues", "apply", str(bad))  # a real process: what a user sees, exit status included
    assert done.returncode == 2, done.stderr
    assert "tenants[1].quota.gpu" in done.stderr and "cannot reach" not in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1

    missing = main("queues", "apply", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml: no such file" in missing.stderr
    no_file = main("queues", "apply")
    assert no_file.returncode == 2 and "needs the FILE to apply" in no_file.stderr
    stray = main("queues", "show", str(bad))
    assert stray.returncode == 2 and "takes no FILE" in stray.stderr


def test_dev_refuses_a_bad_queue_file_before_starting_anything(tmp_path):
    bad = tmp_path / "queues.yaml"
    bad.write_text("tenants: []\n")
    done = cli("dev", "--headless", "--state-dir", str(tmp_path / "state"), "--queues", str(bad))
    assert done.returncode == 2, done.stderr
    assert "queues.yaml: tenants" in done.stderr and "Traceback" not in done.stderr
    assert "Temporal on" not in done.stdout and not (tmp_path / "state").exists()


def test_run_refuses_a_malformed_tenant_before_contacting_anything(tmp_path):
    (tmp_path / "flow.py").write_text(
        "from engine import workflow\n\n@workflow\nasync def wf(n: int = 1) -> int:\n    return n\n"
    )
    done = cli("run", "flow.py:wf", "--tenant", " x", cwd=tmp_path)
    assert done.returncode == 2 and "tenant must be a name" in done.stderr and "cannot reach" not in done.stderr


# -- the tables ---------------------------------------------------------------------------------
SHOWN = {
    "tenants": {
        "team-a": {
            "nominal": {"gpu": 2, "cpu": 16.0, "mem": 64 * 2**30},
            "used": {"gpu": 3, "cpu": 2.0, "mem": 0},
            "borrowed": {"gpu": 1, "cpu": 0, "mem": 0},
            "lent": {"gpu": 0, "cpu": 0, "mem": 0},
            "pending": 4,
            "share": 0.25,
        },
        "team-b": {
            "nominal": {"gpu": 2, "cpu": None, "mem": None},
            "used": {"gpu": 0, "cpu": 0, "mem": 0},
            "borrowed": {"gpu": 0, "cpu": 0, "mem": 0},
            "lent": {"gpu": 1, "cpu": 0, "mem": 0},
            "pending": 0,
            "share": 0.0,
        },
    },
    "config": {"tenants": [{"name": "team-a", "cohort": "research", "weight": 2.0}, {"name": "team-b"}]},
}


def printed(show: Any, data: Any) -> str:
    with render.console.capture() as captured:
        show(data)
    return captured.get()


def test_queues_show_prints_quota_use_borrowing_lending_pending_and_share():
    text = printed(render_queues.show_queues, SHOWN)
    for expected in ("team-a", "cohort research", "weight 2", "mem 64Gi", "cpu 16", "cpu ∞", "0.25", "4"):
        assert expected in text, text
    assert printed(render_queues.show_queues, {"tenants": {}}).strip() == "no tenants"


def test_queue_shows_tenants_priorities_and_preemption_and_copes_with_older_schedulers():
    base: dict[str, Any] = {"nodes": [], "totals": {}}
    old = {
        **base,
        "running": [{"gang_id": "r1.train-1", "nodes": [{"node_id": "n0", "gpu_ids": [0]}]}],
        "pending": [{"gang_id": "r2.train-1", "position": 1, "reason": "waiting"}],
    }
    text = printed(render_queues.show_queue, old)  # no tenant, priority or preempting keys: still a table
    assert "r1.train-1" in text and "r2.train-1" in text and "waiting" in text
    new = {
        **base,
        "running": [
            {
                "gang_id": "r1.train-1",
                "tenant": "team-b",
                "priority": "low",
                "preempting": True,
                "nodes": [{"node_id": "n0", "gpu_ids": [0, 1]}],
            }
        ],
        "pending": [
            {
                "gang_id": "r3.train-1",
                "tenant": "team-a",
                "priority": "high",
                "position": 1,
                "reason": "team-a is at its quota of 2 GPUs and cannot borrow: cohort has 0 idle",
            }
        ],
        "tenants": SHOWN["tenants"],
    }
    text = printed(render_queues.show_queue, new)
    assert "preempting" in text and "team-b" in text and "low" in text and "high" in text
    assert "tenants" in text and "3/2" in text  # the per-tenant summary: GPUs used / quota
