"""Tenants, quotas and priorities through the CLI a user types, on real stacks of their own (the queue
configuration is the Scheduler's, shared by every run on a server, so these tests never touch the
session's): ``queues apply`` refuses a bad file and changes nothing, applies the example, ``queues show
--json`` has the issue's shape, ``run`` refuses an unknown tenant or priority class with exit 2 before
anything starts, ``run --tenant team-a --priority high`` runs a gang on a 4-node cluster, a gang asking for a
flavor lands on the node agent labelled for it (and a flavor or label the cluster lacks is refused with exit 2),
a gang that requires one rack gets two nodes of one rack where a topology-blind choice would span two (and one
that no rack can hold is rejected, saying so; one that prefers a rack with a wait waits for one and takes it
once it frees), two tenants' quotas per flavor hold apart (team-a's second a100 gang waits, naming its full
a100 quota, while team-b's a100 gang runs on the a100 GPUs left), and ``dev --queues`` applies its file once
the stack is up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_WARM_IMPORTS, ROOT, Stack, gang_task, gangflow_cli, stack_fixture

from engine.cli.operators import QUEUE_DEPRECATED
from engine.runtime import free_port
from engine.runtime.devserver import DevServer

EXAMPLE = str(ROOT / "examples" / "queues.yaml")

FLOW = """
import os
import time
from dataclasses import dataclass

from engine import Gang, GangPlugin, Resources, Topology, task, workflow


@dataclass(frozen=True)
class Ranks(GangPlugin):
    nnodes: int = 2
    nproc_per_node: int = 1


@task(plugin=Ranks(), resources=Resources(gpu=1))
def hold(marker: str) -> int:
    # each rank waits for the test to have looked at the queue (a minute at most: nothing is left behind)
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return int(os.environ["RANK"])


@workflow
async def train(marker: str) -> int:
    return await hold(marker=marker)


@task(plugin=Ranks(), gang=Gang(priority="urgent"))
def rushed(n: int) -> int:
    return n


@workflow
async def rush(n: int = 1) -> int:
    return await rushed(n=n)


@workflow
async def plain(n: int = 1) -> int:
    return n


@dataclass(frozen=True)
class OneNode(GangPlugin):
    nnodes: int = 1
    nproc_per_node: int = 1


@task(plugin=OneNode(), resources=Resources(gpu=1, flavor="h100"))
def where() -> str:
    return os.environ["GANGFLOW_NODE_ID"] + " " + os.environ["GANGFLOW_NODE_LABELS"]


@workflow
async def on_h100() -> str:
    return await where()


@task(plugin=OneNode(), resources=Resources(gpu=1, flavor=["a100", "h200"]))
def nowhere() -> str:
    return "never"


@workflow
async def on_h200() -> str:
    return await nowhere()


@task(plugin=OneNode(), resources=Resources(gpu=1, node_selector={"zone": "b"}))
def elsewhere() -> str:
    return "never"


@workflow
async def in_zone_b() -> str:
    return await elsewhere()


@task(plugin=Ranks(), resources=Resources(gpu=2, flavor="a100"), placement=Topology(required="rack"))
def racked() -> str:
    return os.environ["GANGFLOW_NODE_ID"]


@workflow
async def in_one_rack() -> str:
    return await racked()


@task(
    plugin=Ranks(nnodes=3),
    resources=Resources(gpu=1, flavor="a100"),
    placement=Topology(required="rack"),
    gang=Gang(lost_node_wait=3),
)
def too_wide() -> str:
    return "never"


@workflow
async def in_a_rack_too_small() -> str:
    return await too_wide()


@task(plugin=Ranks(), resources=Resources(gpu=1, flavor="a100"))
def hold_a100(marker: str) -> int:
    # as hold, on two a100 nodes; two minutes at most: the test looks at three runs meanwhile
    deadline = time.monotonic() + 120
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return int(os.environ["RANK"])


@workflow
async def train_a100(marker: str) -> int:
    return await hold_a100(marker=marker)


@task(plugin=OneNode(), resources=Resources(gpu=2, flavor="a100"))
def held(marker: str) -> str:
    # as hold, on one whole a100 node (the first by id: q0)
    deadline = time.monotonic() + 120
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return os.environ["GANGFLOW_NODE_ID"]


@workflow
async def hold_q0(marker: str) -> str:
    return await held(marker=marker)


@task(plugin=Ranks(), resources=Resources(gpu=2, flavor="a100"), placement=Topology(preferred="rack", wait=120))
def rack_if_soon() -> str:
    return os.environ["GANGFLOW_NODE_ID"]


@workflow
async def in_one_rack_soon() -> str:
    return await rack_if_soon()
"""

#: two flavors and two racks over the stack's four node agents (the labels ``labelled`` gives them)
FLAVORS = """\
flavors:
  - {name: h100, node_labels: {gpu: h100}}
  - {name: a100, node_labels: {gpu: a100}}
topology: [rack]
tenants:
  - {name: team-a, quota: {gpu: 4}}
"""

#: FLAVORS' flavors and topology, two tenants with quotas per flavor and no cohort (neither may borrow)
PER_FLAVOR = """\
flavors:
  - {name: h100, node_labels: {gpu: h100}}
  - {name: a100, node_labels: {gpu: a100}}
topology: [rack]
tenants:
  - {name: team-a, quota: {a100: {gpu: 2}, h100: {gpu: 2}}}
  - {name: team-b, quota: {a100: {gpu: 4}}}
"""

#: FLAVORS with room for three a100 nodes' GPUs (the preferred-with-a-wait test holds one and places two)
ROOMY = FLAVORS.replace("quota: {gpu: 4}", "quota: {gpu: 8}")

BAD = """\
cohorts: [{name: research}]
tenants:
  - {name: team-a, cohort: research, quota: {gpu: 2}}
  - {name: team-b, cohort: research, quota: {gpu: -1}}
"""


def cli(address: str, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return gangflow_cli(*args, cwd=cwd, GANGFLOW_ADDRESS=address, COLUMNS="120", **env)


def shown(address: str) -> dict[str, Any]:
    done = cli(address, "queues", "show", "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def run_on(stack: Stack, project: Path, flow: str) -> subprocess.CompletedProcess[str]:
    """``gangflow run flow.py:<flow> --tenant team-a --json``, to its end, with the stack's artifact store."""
    return cli(
        stack.server.address,
        "run",
        f"flow.py:{flow}",
        "--tenant",
        "team-a",
        "--json",
        cwd=project,
        GANGFLOW_ARTIFACTS=stack.artifacts,
    )


def run_ids(address: str) -> set[str]:
    listed = cli(address, "list", "--json", "--limit", "100")
    assert listed.returncode == 0, listed.stderr
    return {run["run_id"] for run in json.loads(listed.stdout)}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("queues-project")
    (folder / "flow.py").write_text(FLOW)
    return folder


async def _configured(stack: Stack) -> None:
    await stack.wait_nodes()
    applied = cli(stack.server.address, "queues", "apply", EXAMPLE)
    assert applied.returncode == 0, applied.stderr


#: server, worker and four node agents with two GPU slots each, the example configuration applied (its gangs import
#: no torch, nor do the standbys)
stack = stack_fixture("q", count=4, gpus=2, ready=_configured, env=NO_WARM_IMPORTS)


def test_without_a_scheduler_only_the_default_tenant_runs(tmp_path, project):
    """A bare server: no Scheduler, so no queue configuration."""
    server = DevServer(tmp_path / "server", ui=False).start()
    try:
        address = server.address
        show = cli(address, "queues", "show")
        assert show.returncode == 1 and "no Scheduler is running here" in show.stderr
        assert "gangflow queues apply FILE" in show.stderr and "Traceback" not in show.stderr

        for options, named in ((["--tenant", "team-a"], "unknown tenant 'team-a'"), (["--priority", "high"], "'high'")):
            refused = cli(address, "run", "flow.py:plain", "--detach", *options, cwd=project)
            assert refused.returncode == 2, refused.stderr
            assert named in refused.stderr and "no queue configuration is applied here" in refused.stderr
            assert "Traceback" not in refused.stderr
        from_env = cli(address, "run", "flow.py:plain", "--detach", cwd=project, GANGFLOW_TENANT="team-b")
        assert from_env.returncode == 2 and "unknown tenant 'team-b'" in from_env.stderr
        assert run_ids(address) == set()  # nothing was started
    finally:
        server.stop()


def test_a_bad_file_is_refused_naming_the_field_and_changes_nothing(stack, tmp_path):
    address = stack.server.address
    before = shown(address)
    bad = tmp_path / "queues.yaml"
    bad.write_text(BAD)
    refused = cli(address, "queues", "apply", str(bad))
    assert refused.returncode == 2, refused.stderr
    assert "tenants[1].quota.gpu" in refused.stderr and "Traceback" not in refused.stderr
    assert shown(address) == before


def test_the_example_applies_and_show_json_has_the_issues_shape(stack):
    address = stack.server.address
    applied = cli(address, "queues", "apply", EXAMPLE)
    assert applied.returncode == 0, applied.stderr
    assert "team-a" in applied.stdout and "team-b" in applied.stdout and "cohort research" in applied.stdout

    data = shown(address)
    assert list(data) == ["tenants"] and sorted(data["tenants"]) == ["team-a", "team-b"]
    for entry in data["tenants"].values():
        assert {"nominal", "used", "borrowed", "lent", "pending", "share"} <= set(entry), entry
        for key in ("nominal", "used", "borrowed", "lent"):
            assert sorted(entry[key]) == ["cpu", "gpu", "mem"], entry
        assert isinstance(entry["pending"], int) and isinstance(entry["share"], int | float)
    assert data["tenants"]["team-a"]["nominal"] == {"gpu": 2, "cpu": 8, "mem": 32 * 2**30}

    again = cli(address, "queues", "apply", EXAMPLE, "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == data  # the same shape as `show --json`
    table = cli(address, "queues", "show")
    assert table.returncode == 0 and "team-a" in table.stdout and "mem 32Gi" in table.stdout


def test_an_unknown_tenant_or_priority_class_is_refused_before_anything_starts(stack, project):
    address = stack.server.address
    cases = [
        (["--tenant", "team-c"], {}, "unknown tenant 'team-c': the cluster's tenants are team-a, team-b"),
        ([], {}, "unknown tenant 'default'"),  # the example has no tenant "default"
        ([], {"GANGFLOW_TENANT": "team-c"}, "unknown tenant 'team-c'"),
        (["--tenant", "team-a", "--priority", "urgent"], {}, "unknown priority class 'urgent' (the run)"),
    ]
    for n, (options, env, message) in enumerate(cases):
        refused = cli(address, "run", "flow.py:plain", "--run-id", f"refused-{n}", *options, cwd=project, **env)
        assert refused.returncode == 2, (options, refused.stderr)
        assert message in refused.stderr and "Traceback" not in refused.stderr
    task_class = cli(address, "run", "flow.py:rush", "--run-id", "refused-task", "--tenant", "team-a", cwd=project)
    assert task_class.returncode == 2, task_class.stderr
    assert "unknown priority class 'urgent' (task 'rushed')" in task_class.stderr and "low, high" in task_class.stderr
    assert not any(run_id.startswith("refused-") for run_id in run_ids(address))


def test_a_run_as_team_a_at_high_priority_runs_its_gang(stack, project, tmp_path):
    address = stack.server.address
    marker = tmp_path / "go"
    started = cli(
        address,
        "run",
        "flow.py:train",
        "--tenant",
        "team-a",
        "--priority",
        "high",
        "--detach",
        "--json",
        "--marker",
        str(marker),
        cwd=project,
        GANGFLOW_ARTIFACTS=stack.artifacts,
    )
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    try:
        asyncio.run(stack.wait_for("the gang running", lambda q: any(g for g in q["running"]), 90))
        view = asyncio.run(stack.queue())
        (gang,) = view["running"]
        assert gang["gang_id"].startswith(run_id) and gang["tenant"] == "team-a"
        assert gang.get("priority", "high") == "high"  # the class travelled with the gang request
        listed = cli(address, "cluster")
        assert listed.returncode == 0 and "team-a" in listed.stdout and "deprecated" not in listed.stderr
        # the old name answers the same, with one deprecation line on stderr: its --json stays parseable
        old = cli(address, "queue", "--json")
        assert old.returncode == 0 and json.loads(old.stdout)["running"], old.stdout
        assert old.stderr.splitlines() == [QUEUE_DEPRECATED], old.stderr
    finally:
        marker.write_text("go")
    status = _wait_done(address, run_id)
    assert status["status"] == "COMPLETED", status
    assert (status["tenant"], status["priority"], status["result"]) == ("team-a", "high", 0)


#: the labels ``gangflow node --labels`` gives the stack's agents: one h100 node, three a100 nodes in two racks,
#: rack r1's two a100 nodes are q0 and q3 (a topology-blind choice of two a100 nodes takes q0 and q2 first)
LABELS = {
    "q0": {"gpu": "a100", "rack": "r1"},
    "q1": {"gpu": "h100", "rack": "r2", "zone": "a"},
    "q2": {"gpu": "a100", "rack": "r2"},
    "q3": {"gpu": "a100", "rack": "r1"},
}


@pytest.fixture(scope="module")
def labelled(stack: Stack) -> Iterator[Stack]:
    """The stack's agents restarted with ``LABELS`` and the FLAVORS configuration applied; the example
    configuration is applied again after (the agents' labels then match nothing)."""
    for node_id, labels in LABELS.items():
        stack.nodes[node_id].args = ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
    with ThreadPoolExecutor(len(LABELS)) as pool:  # all at once: each stop waits for its agent to drain and exit
        list(pool.map(lambda node_id: stack.nodes[node_id].restart(), LABELS))
    asyncio.run(
        stack.wait_for(
            "the agents registered with their labels",
            lambda q: {n["node_id"]: n.get("labels") for n in q["nodes"] if n["alive"]} == LABELS,
            90,
        )
    )

    apply(stack, FLAVORS)
    try:
        yield stack
    finally:
        apply(stack, Path(EXAMPLE).read_text())


def apply(stack: Stack, config: str) -> None:
    """``gangflow queues apply`` in this process: a CLI process each would cost seconds under load."""

    async def applied() -> None:
        await (await stack.client()).apply_queues(config)

    asyncio.run(applied())


def test_a_gang_asking_for_h100_lands_on_the_h100_node_and_an_unknown_flavor_is_refused(labelled, project):
    """Flavors on real node agents (``gangflow node --labels``: q1 is the h100 node, the others a100: a
    flavor-blind choice would take q0 first), the queue file declares both flavors; a gang asking for h100 runs
    on q1, which ``gangflow status`` names as its flavor, and its rank sees the node's id and labels; a run
    asking for a flavor (or a node label) the cluster lacks exits 2 naming what exists, before anything
    starts."""
    address = labelled.server.address
    before = run_ids(address)
    for flow, named in (
        (
            "on_h200",
            "asks for flavor 'h200', which the cluster's queue configuration does not declare: the "
            "cluster's flavors are h100, a100",
        ),
        (
            "in_zone_b",
            "no registered node carries zone=b; the nodes' labels are gpu=a100, gpu=h100, rack=r1, rack=r2, zone=a",
        ),
    ):
        refused = cli(address, "run", f"flow.py:{flow}", "--tenant", "team-a", "--detach", cwd=project)
        assert refused.returncode == 2 and named in refused.stderr, refused.stderr
    assert run_ids(address) == before  # nothing was started
    done = run_on(labelled, project, "on_h100")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["result"] == "q1 gpu=h100,rack=r2,zone=a", answer
    status = cli(address, "status", answer["run_id"], "--json")
    assert status.returncode == 0 and '"flavor": "h100"' in status.stdout, status.stdout
    # gangflow usage counts the attempt under its flavor (with the ledger the status shows)
    usage = cli(address, "usage", "--by", "flavor", "--tenant", "team-a", "--json")
    assert usage.returncode == 0, usage.stderr
    flavored = {row["flavor"]: row for row in json.loads(usage.stdout)["rows"]}
    assert flavored["h100"]["tenants"] == ["team-a"] and flavored["h100"]["allocated_gpu_s"] > 0, flavored
    shown_nodes = cli(address, "cluster")
    assert "gpu=h100,rack=r2,zone=a" in shown_nodes.stdout, shown_nodes.stdout
    assert "gpu=a100,rack=r1" in shown_nodes.stdout, shown_nodes.stdout


def test_a_gang_that_requires_one_rack_gets_two_nodes_of_one_rack(labelled, project):
    """``placement=Topology(required="rack")`` on real node agents: a 2-node a100 gang runs on q0 and q3 (rack r1
    holds two a100 nodes; r2 one, beside the h100 node), where the first two a100 nodes by id would span both
    racks; a 3-node one that no rack can hold waits for a node that could to register (its ``lost_node_wait``: 3 s
    here), then fails naming the most one rack has."""
    address = labelled.server.address
    done = run_on(labelled, project, "in_one_rack")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    status = json.loads(cli(address, "status", run_id, "--json").stdout)
    (attempt,) = gang_task(status)["attempts"]
    assert sorted(attempt["nodes"]) == ["q0", "q3"], attempt
    wide = run_on(labelled, project, "in_a_rack_too_small")
    assert wide.returncode != 0, wide.stdout
    said = wide.stdout + wide.stderr
    assert "needs 3 nodes in one rack" in said and "the most in one rack: 2" in said, said


def test_a_per_flavor_quota_holds_across_two_tenants(labelled: Stack, project: Path, tmp_path: Path) -> None:
    """Quotas per flavor, two tenants, no cohort: team-a's second a100 gang waits while its first holds its a100
    quota, saying so, and team-b's a100 gang runs meanwhile on the a100 GPUs left, its quota its own."""
    address = labelled.server.address
    marker = tmp_path / "go"
    a100 = {node_id for node_id, labels in LABELS.items() if labels["gpu"] == "a100"}
    with runs_under(labelled, PER_FLAVOR, marker) as runs:
        first = start(labelled, project, runs, "train_a100", "team-a", "--marker", str(marker))
        asyncio.run(labelled.wait_for("team-a's first gang running", lambda q: bool(gang_of(q, "running", first)), 90))
        second = start(labelled, project, runs, "train_a100", "team-a", "--marker", str(marker))
        other = start(labelled, project, runs, "train_a100", "team-b", "--marker", str(marker))
        asyncio.run(
            labelled.wait_for(
                "team-a's second gang waiting with a reason, team-b's running",
                lambda q: bool((g := gang_of(q, "pending", second)) and g["reason"] and gang_of(q, "running", other)),
                90,
            )
        )
        queue = asyncio.run(labelled.queue())
        waiting = gang_of(queue, "pending", second)
        assert waiting is not None and waiting["flavors"] == ["a100"], waiting
        assert waiting["reason"] == (
            "pending: team-a is at its a100 quota of 2 GPUs and has no cohort to borrow from; needs 2 GPUs on 2 "
            "nodes (1 GPU, 1 CPU per node); the gang asks for a100 only"
        ), waiting
        held = [g for run_id in (first, other) if (g := gang_of(queue, "running", run_id))]
        assert [(g["tenant"], g["flavor"]) for g in held] == [("team-a", "a100"), ("team-b", "a100")], held
        gpus = [(n["node_id"], gpu) for g in held for n in g["nodes"] for gpu in n["gpu_ids"]]
        assert len(gpus) == len(set(gpus)) == 4 and {node for node, _ in gpus} <= a100, held
        # what the user sees: the run's status names the reason, queues show the quotas used per flavor
        _wait_detail(address, second, "pending: team-a is at its a100 quota of 2 GPUs and has no cohort")
        tenants = shown(address)["tenants"]
        used = {(t, f): row["used"]["gpu"] for t, entry in tenants.items() for f, row in entry["flavors"].items()}
        assert used == {("team-a", "a100"): 2, ("team-a", "h100"): 0, ("team-b", "a100"): 2}, tenants
        assert (tenants["team-a"]["pending"], tenants["team-b"]["pending"]) == (1, 0), tenants

        released = time.time()  # no rank lets go before the marker: team-a's first gang releases after this
        marker.write_text("go")
        statuses = {run_id: _wait_done(address, run_id) for run_id in runs}
        attempts: dict[str, dict[str, Any]] = {}
        for run_id, status in statuses.items():
            assert (status["status"], status["result"]) == ("COMPLETED", 0), status
            (attempts[run_id],) = gang_task(status)["attempts"]  # one each: nobody was preempted
            assert attempts[run_id]["flavor"] == "a100" and set(attempts[run_id]["nodes"]) <= a100, status
        # team-b's was placed while team-a's first held its quota, team-a's second only once the first let go
        assert attempts[first]["started_at"] < attempts[other]["started_at"] < released, (released, attempts)
        assert attempts[second]["started_at"] > released, (released, attempts)
        # the first attempt ended when its gang let go of the GPUs, not once its release signal came back
        assert attempts[first]["ended_at"] <= attempts[second]["started_at"], attempts


def test_a_gang_preferring_a_rack_with_a_wait_waits_for_one_then_takes_it(
    labelled: Stack, project: Path, tmp_path: Path
) -> None:
    """``Topology(preferred="rack", wait=120)`` on real agents: with q0 held, the two a100 nodes left are in two
    racks; the gang waits, saying it waits for one rack, and takes r1 (q0, q3) once q0 is let go."""
    address = labelled.server.address
    marker = tmp_path / "go"
    with runs_under(labelled, ROOMY, marker) as runs:
        holder = start(labelled, project, runs, "hold_q0", "team-a", "--marker", str(marker))
        asyncio.run(labelled.wait_for("q0 held", lambda q: bool(gang_of(q, "running", holder)), 90))
        holding = gang_of(asyncio.run(labelled.queue()), "running", holder)
        assert holding is not None and [n["node_id"] for n in holding["nodes"]] == ["q0"], holding  # best fit
        racked = start(labelled, project, runs, "in_one_rack_soon", "team-a")
        said = "pending: waiting for one rack: needs 2 nodes (2 GPUs, 1 CPU per node) and could start over several"
        _wait_detail(address, racked, said)
        marker.write_text("go")
        status = _wait_done(address, racked)
        assert status["status"] == "COMPLETED", status
        (attempt,) = gang_task(status)["attempts"]
        assert sorted(attempt["nodes"]) == ["q0", "q3"], attempt


def start(stack: Stack, project: Path, runs: list[str], flow: str, tenant: str, *args: str) -> str:
    """``gangflow run flow.py:<flow> --tenant <tenant> --detach <args>``: its run id, added to ``runs``."""
    started = cli(
        stack.server.address,
        "run",
        f"flow.py:{flow}",
        "--tenant",
        tenant,
        "--detach",
        "--json",
        *args,
        cwd=project,
        GANGFLOW_ARTIFACTS=stack.artifacts,
    )
    assert started.returncode == 0, started.stderr
    run_id: str = json.loads(started.stdout)["run_id"]
    runs.append(run_id)
    return run_id


def gang_of(queue: dict[str, Any], state: str, run_id: str) -> dict[str, Any] | None:
    """The run's gang among the queue's ``running`` or ``pending`` ones, or None."""
    return next((g for g in queue[state] if g["gang_id"].startswith(f"{run_id}.")), None)


@contextlib.contextmanager
def runs_under(stack: Stack, config: str, marker: Path) -> Iterator[list[str]]:
    """``config`` applied; yields the list the test adds its runs to. Then every rank lets go (``marker``), the
    runs are cancelled if the test failed, their gangs leave the queue, and FLAVORS is applied again (what the
    module's other tests expect)."""
    apply(stack, config)
    runs: list[str] = []
    done = False
    try:
        yield runs
        done = True
    finally:
        marker.write_text("go")
        try:
            if not done:
                asyncio.run(_cancel(stack, runs))
            asyncio.run(
                stack.wait_for(
                    "the runs' gangs gone",
                    lambda q: not any(gang_of(q, state, r) for state in ("running", "pending") for r in runs),
                    90,
                )
            )
        finally:
            apply(stack, FLAVORS)


async def _cancel(stack: Stack, run_ids: list[str]) -> None:
    client = await stack.client()
    for run_id in run_ids:
        with contextlib.suppress(Exception):  # one that has ended already
            await client.cancel(run_id)


def _wait_detail(address: str, run_id: str, text: str, timeout: float = 60) -> None:
    """Until a task's detail in ``gangflow status RUN --json`` says ``text`` (a gang's pending reason)."""
    deadline = time.monotonic() + timeout
    while True:
        done = cli(address, "status", run_id, "--json")
        assert done.returncode == 0, done.stderr
        if any(text in (t["detail"] or "") for t in json.loads(done.stdout)["tasks"]):
            return
        assert time.monotonic() < deadline, done.stdout
        time.sleep(0.5)


def _wait_done(address: str, run_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        done = cli(address, "status", run_id, "--json")
        assert done.returncode == 0, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        if status["status"] != "RUNNING":
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def test_dev_applies_its_queue_file_once_the_stack_is_up(tmp_path):
    port = free_port()
    options = ["--port", str(port), "--ui-port", str(free_port()), "--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "dev", "--headless", *options, "--queues", EXAMPLE],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="200", PYTHONUNBUFFERED="1"),
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while not any("applied" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        assert "tenants team-a, team-b" in lines[-1], lines
        assert sorted(shown(f"127.0.0.1:{port}")["tenants"]) == ["team-a", "team-b"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
