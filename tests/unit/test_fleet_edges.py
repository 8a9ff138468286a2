"""GPU flavors outside the policy, checked without a server: node labels (Kubernetes syntax, ``gangflow node
--labels``, ``gangflow dev --node-labels``, what nvidia-smi reports), the rank environment that names the node,
``Resources(flavor=, node_selector=, tolerations=)`` and the gang request they become, and the client's refusal
of a flavor, node label or topology level the cluster lacks, as the platform's and a tenant's look show it."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import gangflow_cli

from engine import DefinitionError, Resources, Topology, task, workflow
from engine.cli.common import CliError
from engine.cli.devstacks import dev_node_labels
from engine.client import TenancyError
from engine.client._fleet import check_fleet, fleet_asks, fleet_facts, label_sets, topology_levels
from engine.core import definition_of
from engine.core.definitions import TaskDefinition
from engine.core.gang import GangPlugin, GangShape
from engine.core.glance import gang_line
from engine.core.labels import format_labels, node_env, parse_labels
from engine.executor.gpus import GPU_COUNT_LABEL, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, gpu_labels, node_labels
from engine.scheduling import GangRequest
from engine.scheduling.tenant_view import own_cluster, own_queues
from workflows.gang_failures import attempt_record
from workflows.gang_spec import GangSpec, gang_request

NOWHERE = "127.0.0.1:9"


class Ranks(GangPlugin):
    def __init__(self, nnodes: int = 2, nproc_per_node: int = 1) -> None:
        self.nnodes, self.nproc_per_node = nnodes, nproc_per_node


@task(plugin=Ranks(), resources=Resources(gpu=1, flavor=["h100", "a100"], node_selector={"zone": "a"}))
def train(n: int) -> int:
    return n


@task(plugin=Ranks(), resources=Resources(gpu=1, tolerations=["spot"]))
def tolerant(n: int) -> int:
    return n


@task(plugin=Ranks())
def anywhere(n: int) -> int:
    return n


@workflow
async def pipeline(n: int) -> int:
    return await train(n) + await anywhere(n) + await tolerant(n)


# -- labels ------------------------------------------------------------------------------------
def test_labels_follow_kubernetes_syntax() -> None:
    labels = parse_labels("gpu=h100, zone=a,capacity=spot,gangflow.io/gpu.product=NVIDIA-H100-80GB-HBM3,empty=")
    assert labels == {
        "gpu": "h100",
        "zone": "a",
        "capacity": "spot",
        "gangflow.io/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "empty": "",
    }
    assert format_labels({"zone": "a", "gpu": "h100"}) == "gpu=h100,zone=a"  # sorted by key
    assert parse_labels(format_labels(labels)) == labels
    assert node_env("node-1", {"zone": "a", "gpu": "h100"}) == {
        "GANGFLOW_NODE_ID": "node-1",
        "GANGFLOW_NODE_LABELS": "gpu=h100,zone=a",
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("gpu", "'gpu' is not key=value"),
        ("gpu=h100,,zone=a", "an empty item"),
        ("gpu=h100,gpu=a100", "'gpu' is given twice"),
        ("-gpu=h100", "label key '-gpu'"),
        ("Example.COM/gpu=h100", "is not a DNS subdomain"),
        ("gpu=h 100", "the value 'h 100' is not a valid name"),
        ("gpu=" + "x" * 64, "at most 63 characters"),
    ],
)
def test_bad_labels_are_named(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="--labels") as caught:
        parse_labels(text)
    assert says in str(caught.value)


def test_detected_gpu_labels_and_given_labels_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    csv = "NVIDIA H100 80GB HBM3, 81559 MiB\nNVIDIA H100 80GB HBM3, 81559 MiB\n"
    detected = {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", GPU_MEMORY_LABEL: "81559", GPU_COUNT_LABEL: "2"}
    assert gpu_labels(csv) == detected
    assert gpu_labels("") == {}
    # a real nvidia-smi stand-in on PATH: the agent runs the command and reads its output
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{csv}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert node_labels(None) == detected
    assert node_labels(f"gpu=h100,{GPU_PRODUCT_LABEL}=h100-sxm") == {
        **detected,
        "gpu": "h100",
        GPU_PRODUCT_LABEL: "h100-sxm",
    }
    with pytest.raises(ValueError, match="--labels"):
        node_labels("gpu")


def test_dev_node_labels_give_one_group_per_node() -> None:
    assert dev_node_labels("gpu=h100,rack=r1; ;gpu=a100", 3) == ["gpu=h100,rack=r1", "", "gpu=a100"]
    assert dev_node_labels(None, 2) == []
    with pytest.raises(CliError, match="2 group"):
        dev_node_labels("gpu=h100;gpu=a100", 3)
    with pytest.raises(CliError, match=r"node-1.*'gpu' is not key=value"):
        dev_node_labels("gpu=h100;gpu", 2)


def test_the_cli_refuses_bad_labels_before_anything_starts() -> None:
    result = gangflow_cli("node", "--node-id", "n1", "--labels", "gpu=h100,zone", "--address", NOWHERE)
    assert result.returncode == 2 and "'zone' is not key=value" in result.stderr, result.stderr
    result = gangflow_cli("dev", "--nodes", "2", "--node-labels", "gpu=h100", "--state-dir", "/nonexistent/x")
    assert result.returncode == 2 and "--node-labels" in result.stderr, result.stderr
    result = gangflow_cli("node", "drain", "n1", "--labels", "gpu=h100", "--address", NOWHERE)
    assert result.returncode == 2 and "no --labels" in result.stderr, result.stderr


# -- what a task asks --------------------------------------------------------------------------
def test_resources_say_where_a_gang_may_run() -> None:
    one = Resources(gpu=8, flavor="h100")
    assert one.flavors == ("h100",) and one.placed
    many = Resources(gpu=8, flavor=["h100", "a100"], node_selector={"zone": "a"}, tolerations=["spot"])
    assert many.flavor == ("h100", "a100") and many.flavors == ("h100", "a100")
    assert many.node_selector == {"zone": "a"} and many.tolerations == ("spot",)
    assert hash(many) == hash(
        Resources(gpu=8, flavor=["h100", "a100"], node_selector={"zone": "a"}, tolerations=["spot"])
    )
    assert not Resources(gpu=8).placed and Resources(gpu=8).flavors == ()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"flavor": ""}, "Resources.flavor '' is not a valid name"),
        ({"flavor": []}, "non-empty list"),
        ({"flavor": ["h100", "h100"]}, "'h100' more than once"),
        ({"flavor": 8}, "a flavor's name or a non-empty list"),
        ({"node_selector": ["zone=a"]}, "must be a dict of node labels"),
        ({"node_selector": {"zone": "a b"}}, "Resources.node_selector: label zone: the value 'a b'"),
        ({"node_selector": {"zone": 1}}, "is not a string"),
        ({"tolerations": "spot"}, "must be a list of taints"),
        ({"tolerations": ["spot light"]}, "Resources.tolerations: taint 'spot light'"),
    ],
)
def test_bad_placement_asks_are_refused_at_once(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError) as caught:
        Resources(gpu=1, **kwargs)
    assert says in str(caught.value)


def test_a_plain_task_may_not_ask_for_a_flavor() -> None:
    with pytest.raises(DefinitionError, match="a plain task runs on a worker's CPU queue"):

        @task(resources=Resources(flavor="h100"))
        def plain(n: int) -> int:
            return n

    with pytest.raises(DefinitionError, match="distributed task"):

        @task(resources=Resources(node_selector={"zone": "a"}), lightweight=True)
        def light(n: int) -> int:
            return n


def test_the_gang_request_carries_them_and_leaves_them_out_when_unset() -> None:
    shape = GangShape(nnodes=2, nproc_per_node=1, gpus_per_node=1, cpus_per_node=1.0, mem_per_node=None)
    spec = GangSpec(task="t", call="t-1", shape=shape, timeout_s=60, heartbeat_timeout_s=10, tenant="default")
    plain = gang_request(spec, "g")
    assert not {"flavors", "node_selector", "tolerations"} & set(plain)  # recorded histories replay
    spec = GangSpec(
        **{**spec.__dict__, "flavors": ["h100", "a100"], "node_selector": {"zone": "a"}, "tolerations": ["spot"]}
    )
    asked = gang_request(spec, "g")
    assert asked == {**plain, "flavors": ["h100", "a100"], "node_selector": {"zone": "a"}, "tolerations": ["spot"]}
    request = GangRequest.model_validate(asked)
    assert request.flavors == ("h100", "a100") and request.tolerations == ("spot",)


# -- refused before the run starts ---------------------------------------------------------------
QUEUES = {
    "tenants": {"default": {}},
    "config": {"flavors": [{"name": "h100", "node_labels": {"gpu": "h100"}}, {"name": "a100"}], "topology": ["rack"]},
}
NODES = [{"node_id": "n0", "labels": {"gpu": "h100", "zone": "a"}}, {"node_id": "n1", "labels": {"gpu": "a100"}}]


def test_the_asks_of_a_workflows_tasks_are_found() -> None:
    assert sorted(fleet_asks(definition_of(pipeline))) == ["tolerant", "train"]


def test_a_run_asking_for_what_the_cluster_has_passes() -> None:
    check_fleet(fleet_asks(definition_of(pipeline)), fleet_facts(QUEUES, "default"), label_sets(NODES), "default")


def _refusal(queues: Any, nodes: Any, tenant: str = "default", **resources: Any) -> str:
    @task(name="asks", plugin=Ranks(), resources=Resources(gpu=1, **resources))
    def asks(n: int) -> int:
        return n

    with pytest.raises(TenancyError) as caught:
        check_fleet({"asks": definition_of(asks)}, fleet_facts(queues, tenant), label_sets(nodes), tenant)
    return str(caught.value)


def test_an_unknown_flavor_or_label_is_refused_naming_what_exists() -> None:
    text = _refusal(QUEUES, NODES, flavor=["h100", "h200"])
    assert "task 'asks' asks for flavor 'h200'" in text and "the cluster's flavors are h100, a100" in text
    text = _refusal({"tenants": {}, "config": {}}, NODES, flavor="h100")
    assert "it declares no flavors" in text
    text = _refusal(None, [], flavor="h100")  # no Scheduler: nothing is declared
    assert "it declares no flavors" in text
    text = _refusal(QUEUES, NODES, node_selector={"zone": "b"})
    assert "no registered node carries zone=b" in text and "gpu=a100, gpu=h100, zone=a" in text
    text = _refusal(QUEUES, NODES, node_selector={"zone": "a", "gpu": "a100"})  # each exists, not together
    assert "no registered node carries all of them" in text
    text = _refusal(QUEUES, [], node_selector={"zone": "a"})
    assert "no node is registered" in text


def test_a_flavor_the_tenants_quota_does_not_name_is_refused() -> None:
    queues = {**QUEUES, "config": {**QUEUES["config"], "tenants": [{"name": "team-a", "quota": {"a100": {"gpu": 2}}}]}}
    text = _refusal(queues, NODES, "team-a", flavor="h100")
    assert "flavor 'h100', which tenant 'team-a' may not use: its quota names a100" in text
    check_fleet(fleet_asks(definition_of(pipeline)), fleet_facts(queues, "team-a"), label_sets(NODES), "team-a")
    assert fleet_facts(own_queues(queues, "team-a"), "team-a")[2] == ["a100"]  # as the tenant's look shows it
    assert fleet_facts(queues, "default")[2] is None  # a tenant not in the file: the Scheduler says why


def test_a_scheduler_from_before_flavors_is_not_asked_about_them() -> None:
    assert fleet_facts({"tenants": {}}, "default") == (None, None, None)  # answers without a config: cannot tell


def test_a_tenant_sees_flavor_names_and_label_sets_without_the_nodes() -> None:
    queues = own_queues(QUEUES, "default")
    assert queues["flavors"] == ["h100", "a100"] and queues["topology"] == ["rack"]
    assert fleet_facts(queues, "default") == (["h100", "a100"], ["rack"], None)
    cluster = own_cluster({"nodes": [*NODES, {"node_id": "n2", "labels": {"gpu": "a100"}}]}, "default")
    assert cluster["nodes"] == [] and cluster["label_sets"] == [{"gpu": "h100", "zone": "a"}, {"gpu": "a100"}]
    assert "n0" not in repr(cluster)


# -- shown -------------------------------------------------------------------------------------
def test_a_placed_gangs_line_names_its_flavor_and_one_without_flavors_reads_as_before() -> None:
    state = {"phase": "attempt 0: 2 ranks running on n1, n2", "placed": True, "attempt": 0}
    assert gang_line(state) == "attempt 0: 2 ranks running on n1, n2"
    assert gang_line({**state, "flavor": "h100"}) == "attempt 0: 2 ranks running on n1, n2 · flavor h100"
    assert "flavor" not in gang_line({**state, "placed": False, "flavor": "h100"})  # waiting again: none yet
    record = attempt_record(0, ["n1"], datetime.now(UTC), "h100")
    assert record["flavor"] == "h100" and "flavor" not in attempt_record(0, ["n1"], datetime.now(UTC))


def test_a_topology_level_the_queue_file_does_not_declare_is_refused() -> None:
    def racked(placement: Topology) -> TaskDefinition:
        @task(name="racked", plugin=Ranks(), resources=Resources(gpu=1), placement=placement)
        def body(n: int) -> int:
            return n

        return definition_of(body)

    for placement, level in ((Topology(required="rack"), "rack"), (Topology(preferred="host"), "host")):
        defn = racked(placement)
        assert topology_levels(defn) == [level]
        check_fleet({"racked": defn}, fleet_facts(QUEUES, "default"), None, "default")
    with pytest.raises(TenancyError, match=r"topology level 'block'.*its levels are rack, host"):
        check_fleet({"racked": racked(Topology(required="block"))}, fleet_facts(QUEUES, "default"), None, "default")


def test_gangflow_cluster_shows_each_nodes_labels_and_flavor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli.render_queues import show_queue
    from engine.scheduling import NodeRegistered, NodeSpec, Policy, load_queue_config

    monkeypatch.setenv("COLUMNS", "250")
    policy = Policy(load_queue_config(QUEUE_FILE), node_ttl_s=1e12)
    for node_id, labels in (("h", {"gpu": "h100", "zone": "a"}), ("plain", {})):
        policy.step(NodeRegistered(spec=NodeSpec(node_id=node_id, address="a", gpus=1, cpus=1, labels=labels)), 0.0)
    view = policy.describe()
    assert {n["node_id"]: n.get("labels", {}) for n in view["nodes"]} == {
        "h": {"gpu": "h100", "zone": "a"},
        "plain": {},
    }
    show_queue(view, now=0.0)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "labels" in lines["node"] and "gpu=h100,zone=a (flavor h100)" in lines["h"], lines


QUEUE_FILE = "flavors: [{name: h100, node_labels: {gpu: h100}}]\ntenants: [{name: default}]\n"


def test_a_sub_workflows_gang_keeps_its_checkpoints_and_rank_files_apart_from_its_runs_call_of_the_same_name() -> None:
    """Call ids count per workflow: a sub-workflow's ``train-1`` and its run's ``train-1`` once shared one
    checkpoint folder (the second resumed from the first's checkpoint), and their rank logs and saved rank
    reports one name (the run's call showed the sub-workflow's steps)."""
    from engine.client import log_rank
    from engine.core.gang import rank_files_key, scope_of

    assert scope_of("run-7", "run-7") == "" and scope_of("run-7.prep-1", "run-7") == "prep-1"
    assert scope_of("team-a:run-7.prep-1.inner-2", "run-7") == "prep-1.inner-2"  # a tenant's prefix before it
    assert rank_files_key("", "train-1") == "train-1"  # a run's own call: as before
    assert rank_files_key("prep-1.inner-2", "train-1") == "prep-1~inner-2~train-1"  # no dots: logs split on them
    assert log_rank(f"{rank_files_key('prep-1', 'train-1')}.rank3.attempt0.log") == 3
    shape = GangShape(nnodes=1, nproc_per_node=1, gpus_per_node=0, cpus_per_node=1.0, mem_per_node=None)
    top = GangSpec(task="train", call="train-1", shape=shape, timeout_s=1.0, heartbeat_timeout_s=1.0, tenant="a")
    nested = GangSpec(
        task="train", call="train-1", shape=shape, timeout_s=1.0, heartbeat_timeout_s=1.0, tenant="a", scope="prep-1"
    )
    assert top.checkpoint_key == "train-1"  # as before sub-workflows had their own
    assert nested.checkpoint_key == "prep-1/train-1"
    assert (top.files_key, nested.files_key) == ("train-1", "prep-1~train-1")
