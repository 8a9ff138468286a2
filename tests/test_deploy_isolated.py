"""deploy/kubernetes/overlays/isolated: the isolated layout on Kubernetes, checked without a cluster.

The overlay is rendered with `kubectl kustomize` and validated against the Kubernetes schemas as the other
overlays are (tests/test_deploy_kubernetes.py, whose helpers this file uses). Then what makes it a boundary:
each tenant's worker runs in a namespace of its own as a non-root user on a read-only root filesystem, names
only its own tenant and only Secrets of its own namespace, and may reach Temporal's frontend and the artifact
store only; the platform worker serves exactly the tenants that have a folder, a queue entry and rank
secrets on the node agents; the node agents run as root with exactly the capabilities docs/deploy.md
names; the Nexus endpoints Job creates what engine/runtime/platform.py's ensure_endpoints creates, and
refuses an endpoint aimed at another tenant's queue (its script runs here against a stand-in `temporal`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import test_deploy_kubernetes as kube
import yaml

from engine.core.protocol import PLATFORM_NAMESPACE, gang_endpoint, gangs_queue, tenant_namespace
from engine.scheduling.config import load_queue_config

OVERLAY = "isolated"
FOLDER = kube.KUBE / "overlays" / OVERLAY
TENANTS = sorted(p.name for p in (FOLDER / "tenants").iterdir() if (p / "kustomization.yaml").is_file())
#: where a tenant's task secrets are mounted (DIR/<tenant>), in its worker and on the node agents
SECRETS_DIR = "/etc/gangflow/secrets"
#: what the node agent may do beyond an unprivileged container, each for a reason docs/deploy.md gives
NODE_CAPABILITIES = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID", "SYS_ADMIN"}
#: the Secrets the operator creates in each namespace (docs/deploy.md); a pod may require no other
PLATFORM_SECRETS = {
    "gangflow-temporal",
    "gangflow-node-temporal",
    "gangflow-operator-temporal",
    "gangflow-temporal-tls",
}
TENANT_SECRETS = {"gangflow-temporal", "gangflow-temporal-tls"}
#: addresses a tenant's worker must not reach: a node (its agent, its ranks' rendezvous ports), a pod, the
#: cloud's instance metadata (the node's credentials), the loopback of a host-network pod
FORBIDDEN_ADDRESSES = ["10.0.0.7", "10.244.1.9", "172.20.3.4", "192.168.1.10", "100.64.0.12", "169.254.169.254"]
#: an S3 endpoint's address
STORE_ADDRESS = "52.216.8.1"


def objects() -> tuple[dict[str, Any], ...]:
    return kube.render(OVERLAY)


def namespace_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("namespace"))


def what(obj: dict[str, Any]) -> str:
    return f"{namespace_of(obj)}/{obj['kind']}/{obj['metadata']['name']}"


def tenant_pods(tenant: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, t) for o, t in kube.pod_templates(objects()) if namespace_of(o) == tenant_namespace(tenant)]


def platform_config(name: str) -> dict[str, str]:
    (data,) = [
        o.get("data", {})
        for o in kube.by_kind(objects(), "ConfigMap")
        if namespace_of(o) == PLATFORM_NAMESPACE and o["metadata"]["name"].startswith(f"{name}-")
    ]
    return dict(data)


def in_namespace(namespace: str) -> tuple[dict[str, Any], ...]:
    return tuple(o for o in objects() if namespace_of(o) == namespace or o["kind"] == "Namespace")


def environment(obj: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment, envFrom resolved in the object's own namespace (as Kubernetes does)."""
    return kube.environment(in_namespace(namespace_of(obj)), container)


def commands(namespace: str) -> list[tuple[str, dict[str, Any], dict[str, Any], Any]]:
    """(where, pod template, container, parsed gangflow args) of the gangflow containers in a namespace."""
    found = []
    for obj, template in kube.pod_templates(objects()):
        if namespace_of(obj) != namespace:
            continue
        for container in kube.containers(template):
            if kube.runs_gangflow(container):
                where = f"{what(obj)} container {container['name']}"
                argv = kube.expand(container.get("args", []), environment(obj, container), where)
                found.append((where, template, container, kube.parse_gangflow(argv, where)))
    return found


def secret_references(template: dict[str, Any]) -> list[tuple[str, bool]]:
    """(Secret name, optional) for every Secret a pod template names: volumes, projected volumes, env, envFrom."""
    refs: list[tuple[str, bool]] = []
    for volume in template["spec"].get("volumes", []):
        if "secret" in volume:
            refs.append((volume["secret"]["secretName"], bool(volume["secret"].get("optional"))))
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                refs.append((source["secret"]["name"], bool(source["secret"].get("optional"))))
    for container in kube.containers(template):
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.append((ref["name"], bool(ref.get("optional"))))
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                refs.append((source["secretRef"]["name"], bool(source["secretRef"].get("optional"))))
    return refs


def volume_of(template: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume


# -- it renders and validates like the other overlays ------------------------------------------------------


def test_the_overlay_renders_a_platform_and_a_namespace_per_tenant() -> None:
    assert len(TENANTS) >= 2, "the overlay shows at least two tenants"
    namespaces = {o["metadata"]["name"] for o in kube.by_kind(objects(), "Namespace")}
    assert namespaces == {PLATFORM_NAMESPACE, *map(tenant_namespace, TENANTS)}
    for obj in objects():
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "gangflow", f"{what(obj)} lacks app.kubernetes.io/part-of"
        if obj["kind"] != "Namespace":
            assert namespace_of(obj) in namespaces, f"{what(obj)} is in no namespace of the overlay"
    names = {(namespace_of(o), o["kind"], o["metadata"]["name"]) for o in objects()}
    for expected in [
        ("Deployment", "gangflow-worker"),
        ("DaemonSet", "gangflow-node"),
        ("Job", "gangflow-queues-apply"),
        ("Job", "gangflow-nexus-endpoints"),
        ("Deployment", "gangflow-codec-server"),
    ]:
        assert (PLATFORM_NAMESPACE, *expected) in names, f"no {expected} in {PLATFORM_NAMESPACE}"
    for tenant in TENANTS:
        for kind in ("Deployment", "ServiceAccount", "PodDisruptionBudget"):
            assert (tenant_namespace(tenant), kind, "gangflow-tenant-worker") in names, f"{tenant}: no {kind}"
    for obj, template in kube.pod_templates(objects()):
        for container in kube.containers(template):
            assert kube.image_name(container["image"]) in kube.GANGFLOW_IMAGES, f"{what(obj)}: {container['image']}"


@pytest.mark.parametrize("version", kube.KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(version: str) -> None:
    kube.test_every_object_validates_against_the_kubernetes_schema(OVERLAY, version)


def test_every_gangflow_command_line_parses() -> None:
    kube.test_every_gangflow_command_line_parses(OVERLAY)


def test_every_gangflow_variable_is_one_gangflow_reads() -> None:
    kube.test_every_gangflow_variable_is_one_gangflow_reads(OVERLAY)


def test_node_agents_outlast_their_drain() -> None:
    kube.test_node_agents_outlast_their_drain(OVERLAY)


def test_gpu_node_agents() -> None:
    kube.test_gpu_node_agents(OVERLAY)


def test_references_resolve_in_their_own_namespace() -> None:
    """A pod sees the ConfigMaps and Secrets of its own namespace only: every reference must resolve there,
    and a required Secret must be one docs/deploy.md tells the operator to create in that namespace."""
    for obj, template in kube.pod_templates(objects()):
        local = in_namespace(namespace_of(obj))
        maps = kube.config_maps(local)
        operator = PLATFORM_SECRETS if namespace_of(obj) == PLATFORM_NAMESPACE else TENANT_SECRETS
        for volume in template["spec"].get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in maps, f"{what(obj)}: ConfigMap {volume['configMap']['name']}"
            assert "persistentVolumeClaim" not in volume, f"{what(obj)}: a claim would be shared by namespaces"
        for container in kube.containers(template):
            environment(obj, container)  # envFrom ConfigMaps must be rendered in the namespace
            mounts = {v["name"] for v in template["spec"].get("volumes", [])}
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in mounts, f"{what(obj)}: no volume {mount['name']}"
        for name, optional in secret_references(template):
            assert optional or name in operator, f"{what(obj)} requires Secret {name}, which no one creates"
    # the budgets select the pods of their namespace
    for budget in kube.by_kind(objects(), "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        assert any(
            selector.items() <= t["metadata"]["labels"].items()
            for o, t in kube.pod_templates(objects())
            if namespace_of(o) == namespace_of(budget)
        ), what(budget)


def test_the_operators_secrets_are_documented() -> None:
    text = (kube.ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## The isolated overlay") :]
    created = set(re.findall(r"create secret generic ([a-z0-9-]+)", section))
    created = {name.replace("-TENANT", "") for name in created}
    missing = sorted((PLATFORM_SECRETS | TENANT_SECRETS) - created)
    assert not missing, f"docs/deploy.md's isolated overlay section does not say to create {missing}"
    assert "gangflow-secrets" in created, "nor the tenants' task secrets"


# -- the tenants: one list, in every place that names them ------------------------------------------------------


def test_every_part_names_the_same_tenants() -> None:
    listed = platform_config("gangflow-tenants")["TENANTS"].split(",")
    assert sorted(listed) == TENANTS, f"TENANTS {listed} but tenant folders {TENANTS}"
    (queues,) = [
        d["queues.yaml"] for n, d in kube.config_maps(in_namespace(PLATFORM_NAMESPACE)).items() if "queues" in n
    ]
    assert sorted(t.name for t in load_queue_config(queues).tenants) == TENANTS, "queues.yaml's tenants"
    (platform,) = [c for c in commands(PLATFORM_NAMESPACE) if c[3].command == "worker"]
    assert platform[3].platform and sorted(platform[3].tenants.split(",")) == TENANTS
    for where, _, container, args in kube.node_agents(OVERLAY):
        assert args.secrets_dir == SECRETS_DIR, where
        mounted = sorted(
            m["mountPath"].removeprefix(f"{SECRETS_DIR}/")
            for m in container["volumeMounts"]
            if m["mountPath"].startswith(f"{SECRETS_DIR}/")
        )
        assert mounted == TENANTS, f"{where}: rank secrets mounted for {mounted}, tenants {TENANTS}"
    for tenant in TENANTS:
        assert tenant_namespace(tenant)  # a valid tenant name
        text = (FOLDER / "tenants" / tenant / "kustomization.yaml").read_text()
        assert yaml.safe_load(text)["namespace"] == tenant_namespace(tenant), f"tenants/{tenant}: its namespace"


def test_each_tenants_root_is_the_one_the_platform_pins() -> None:
    (platform,) = [c for c in commands(PLATFORM_NAMESPACE) if c[3].command == "worker"]
    template = platform[3].tenant_artifacts
    assert "{tenant}" in template
    platform_address = platform_config("gangflow-config")["GANGFLOW_ADDRESS"]
    for tenant in TENANTS:
        (worker,) = [c for c in commands(tenant_namespace(tenant)) if c[3].command == "worker"]
        where, _, _, args = worker
        assert args.tenant == tenant and not args.platform, where
        assert args.artifacts == template.replace("{tenant}", tenant), f"{where}: root {args.artifacts}"
        (obj,) = [o for o, _ in tenant_pods(tenant)]
        env = environment(obj, worker[2])
        assert env["GANGFLOW_ADDRESS"] == platform_address, f"{where}: another Temporal than the platform's"


# -- a tenant's worker holds its own tenant only ---------------------------------------------------------------


@pytest.mark.parametrize("tenant", TENANTS)
def test_tenant_workers_are_unprivileged(tenant: str) -> None:
    pods = tenant_pods(tenant)
    assert pods, f"{tenant}: no pod"
    (namespace,) = [
        o for o in kube.by_kind(objects(), "Namespace") if o["metadata"]["name"] == tenant_namespace(tenant)
    ]
    assert namespace["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "restricted"
    for obj, template in pods:
        spec = template["spec"]
        context = spec.get("securityContext", {})
        assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) != 0, f"{what(obj)} may run as root"
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", what(obj)
        assert spec.get("automountServiceAccountToken") is False, f"{what(obj)} mounts an API token"
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), f"{what(obj)}: a host namespace"
        assert not [v for v in spec.get("volumes", []) if "hostPath" in v], f"{what(obj)} mounts the host"
        for container in kube.containers(template):
            own = container.get("securityContext", {})
            where = f"{what(obj)}: {container['name']}"
            assert own.get("runAsUser", 1) != 0 and own.get("runAsNonRoot", True) is True, where
            assert own.get("allowPrivilegeEscalation") is False and not own.get("privileged"), where
            assert own.get("readOnlyRootFilesystem") is True, f"{where}: a writable root filesystem"
            assert own.get("capabilities") == {"drop": ["ALL"]}, f"{where}: capabilities {own.get('capabilities')}"
            resources = container.get("resources", {})
            assert resources.get("requests") and resources.get("limits", {}).get("memory"), f"{where}: resources"


@pytest.mark.parametrize("tenant", TENANTS)
def test_no_tenant_worker_mounts_another_tenants_secret(tenant: str) -> None:
    """Its Secrets are its namespace's (a pod can name no other), under names that are not the platform's
    nor another tenant's, and only its own folder of the secrets directory exists in its worker."""
    others = [t for t in TENANTS if t != tenant]
    for obj, template in tenant_pods(tenant):
        assert namespace_of(obj) == tenant_namespace(tenant)
        for name, _ in secret_references(template):
            assert name not in PLATFORM_SECRETS - TENANT_SECRETS, f"{what(obj)} names the platform's Secret {name}"
            assert not any(other in name for other in others), f"{what(obj)} names Secret {name}"
        for container in kube.containers(template):
            secret_mounts = [m for m in container.get("volumeMounts", []) if "secret" in volume_of(template, m)]
            folders = [m["mountPath"] for m in secret_mounts if m["mountPath"].startswith(SECRETS_DIR)]
            assert folders == [f"{SECRETS_DIR}/{tenant}"], f"{what(obj)}: secrets mounted at {folders}"
            assert all(m.get("readOnly") for m in secret_mounts), f"{what(obj)}: a Secret mounted writable"
    (worker,) = [c for c in commands(tenant_namespace(tenant)) if c[3].command == "worker"]
    assert worker[3].secrets_dir == SECRETS_DIR


@pytest.mark.parametrize("tenant", TENANTS)
def test_each_tenant_deployment_names_only_its_own_tenant(tenant: str) -> None:
    others = [t for t in TENANTS if t != tenant]
    for obj, template in tenant_pods(tenant):
        for container in kube.containers(template):
            env = environment(obj, container)
            where = f"{what(obj)}: {container['name']}"
            assert env.get("GANGFLOW_TENANT") == tenant, f"{where}: GANGFLOW_TENANT {env.get('GANGFLOW_TENANT')}"
            assert "GANGFLOW_SECRETS_DIR" not in env and "GANGFLOW_ENCRYPTION_KEYS" not in env, where
            text = json.dumps([env, container.get("args", []), template["metadata"].get("labels", {})])
            for other in [*others, PLATFORM_NAMESPACE]:
                assert not re.search(rf"(?<![\w-]){re.escape(other)}(?![\w-])", text), f"{where} names {other}"


# -- what a tenant's worker can reach ------------------------------------------------------------------------


def _policies(namespace: str) -> list[dict[str, Any]]:
    return [p for p in kube.by_kind(objects(), "NetworkPolicy") if namespace_of(p) == namespace]


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def _allows(rule: dict[str, Any], address: str, port: int) -> bool:
    """Whether an egress rule lets a connection to a non-pod address (a node, the store, the metadata service)
    through; rules naming pods by selector let no such address through."""
    if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
        return False
    peers = rule.get("to")
    if not peers:
        return True
    ip = ipaddress.ip_address(address)
    for peer in peers:
        block = peer.get("ipBlock")
        if (
            block
            and ip in ipaddress.ip_network(block["cidr"])
            and not any(ip in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
        ):
            return True
    return False


@pytest.mark.parametrize("tenant", TENANTS)
def test_network_policies_confine_each_tenant(tenant: str) -> None:
    namespace = tenant_namespace(tenant)
    policies = _policies(namespace)
    defaults = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert any(
        set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
        for p in defaults
    ), f"{namespace}: no default-deny NetworkPolicy"
    for obj, template in tenant_pods(tenant):
        labels = template["metadata"]["labels"]
        mine = [p for p in policies if _selects(p, labels)]
        assert mine, f"{what(obj)}: no NetworkPolicy selects it"
        rules = [rule for p in mine for rule in p["spec"].get("egress", [])]
        assert not [p for p in mine for _ in p["spec"].get("ingress", [])], f"{what(obj)} accepts connections"
        for rule in rules:
            assert rule.get("to") and rule.get("ports"), f"{what(obj)}: an egress rule open to anything: {rule}"
            for peer in rule["to"]:
                # pods by selector: only DNS and Temporal, never a tenant's or the platform's namespace
                names = peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                if "ipBlock" not in peer:
                    assert names in ("kube-system", "temporal") and peer.get("podSelector"), f"{what(obj)}: {peer}"
        for address in FORBIDDEN_ADDRESSES:
            for port in (443, 7233, 29500, 22):
                assert not any(_allows(r, address, port) for r in rules), f"{what(obj)} reaches {address}:{port}"
        assert any(_allows(r, STORE_ADDRESS, 443) for r in rules), f"{what(obj)} cannot reach the artifact store"
        env = environment(obj, kube.containers(template)[0])
        temporal_port = int(env["GANGFLOW_ADDRESS"].rsplit(":", 1)[1])
        assert any(
            p.get("port") == temporal_port
            for r in rules
            for p in r["ports"]
            if any(
                peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "frontend"
                for peer in r["to"]
            )
        ), f"{what(obj)} cannot reach Temporal's frontend on port {temporal_port}"


def test_the_platform_namespace_accepts_only_the_codec_server() -> None:
    policies = _policies(PLATFORM_NAMESPACE)
    assert any(
        p["spec"]["podSelector"] == {} and "Ingress" in p["spec"]["policyTypes"] and not p["spec"].get("ingress")
        for p in policies
    )
    open_to = [p for p in policies if p["spec"].get("ingress")]
    assert [p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in open_to] == ["codec-server"]


# -- the node agents: root, with the capabilities they need -------------------------------------------------


def test_node_agents_run_as_root_with_named_capabilities_only() -> None:
    (daemonset,) = kube.by_kind(objects(), "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsUser"] == 0 and spec["securityContext"]["runAsNonRoot"] is False
    assert not spec.get("hostPID") and not spec.get("hostIPC"), "the agent needs no host PID or IPC namespace"
    host_paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    assert host_paths == ["/sys/fs/cgroup"], f"the agent mounts only the host's cgroup tree, not {host_paths}"
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert not context.get("privileged"), "not privileged: the capabilities it needs, named"
    # Kubernetes counts SYS_ADMIN as escalation: false beside it passes only through kubernetes#119568
    assert context.get("allowPrivilegeEscalation") is True
    assert context["capabilities"]["drop"] == ["ALL"]
    added = set(context["capabilities"]["add"])
    assert added == NODE_CAPABILITIES, f"capabilities {sorted(added)}"
    assert not [c for c in added if c.startswith("CAP_")]
    docs = (kube.ROOT / "docs" / "deploy.md").read_text()
    section = docs[docs.index("## The isolated overlay") :]
    undocumented = sorted(c for c in added if f"`{c}`" not in section)
    assert not undocumented, (
        f"docs/deploy.md's isolated overlay section does not say why the agent needs {undocumented}"
    )
    # its own credential, required; no tenant's, and not the platform worker's
    refs = dict(secret_references(daemonset["spec"]["template"]))
    key = [v for v in container["env"] if v["name"] == "GANGFLOW_API_KEY"]
    assert (
        key[0]["valueFrom"]["secretKeyRef"]["name"] == "gangflow-node-temporal"
        and refs["gangflow-node-temporal"] is False
    )
    assert "gangflow-temporal" not in refs, "the node agents use the node credential, not the platform worker's"
    # each tenant's rank secrets: readable by root only
    for mount in container["volumeMounts"]:
        if mount["mountPath"].startswith(f"{SECRETS_DIR}/"):
            volume = volume_of(daemonset["spec"]["template"], mount)
            assert mount.get("readOnly") and volume["secret"].get("defaultMode") == 0o400, mount
            tenant = mount["mountPath"].rsplit("/", 1)[1]
            assert volume["secret"]["secretName"] == f"gangflow-secrets-{tenant}", mount


def test_platform_pods_other_than_the_agents_stay_unprivileged() -> None:
    for obj, template in kube.pod_templates(objects()):
        if obj["kind"] == "DaemonSet":
            continue
        spec = template["spec"]
        assert spec["securityContext"].get("runAsNonRoot") is True, f"{what(obj)} may run as root"
        assert spec.get("automountServiceAccountToken") is False, what(obj)
        for container in kube.containers(template):
            context = container.get("securityContext", {})
            assert context.get("allowPrivilegeEscalation") is False, what(obj)
            assert context.get("capabilities") == {"drop": ["ALL"]}, what(obj)
            assert container.get("resources", {}).get("requests"), f"{what(obj)} requests nothing"
    assert not [o for o in objects() if o["apiVersion"].startswith("rbac.authorization.k8s.io")]


def test_queue_configuration_job_applies_the_tenants_file() -> None:
    (job,) = [j for j in kube.by_kind(objects(), "Job") if j["metadata"]["name"] == "gangflow-queues-apply"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["queues", "apply"]
    assert dict(secret_references(job["spec"]["template"]))["gangflow-temporal"] is False


# -- the Nexus endpoints Job ------------------------------------------------------------------------------------

#: a stand-in for the temporal CLI: `endpoint get` answers from $ENDPOINTS (a JSON object name -> target,
#: in the form `temporal operator nexus endpoint get -o json` prints), `endpoint create` is logged
_FAKE_TEMPORAL = r"""#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
assert args[:3] == ["operator", "nexus", "endpoint"], args
opts = dict(zip(args[4::2], args[5::2]))
with open(os.environ["CALLS"], "a") as log:
    log.write(json.dumps(args) + "\n")
known = json.loads(os.environ.get("ENDPOINTS", "{}"))
if args[3] == "get":
    if opts["--name"] not in known:
        sys.exit("Error: failed getting nexus endpoint: endpoint not found")
    namespace, queue = known[opts["--name"]]
    target = {"worker": {"namespace": namespace, "taskQueue": queue}}
    print(json.dumps({"id": "x", "spec": {"name": opts["--name"], "target": target}}, indent=2))
"""


def _run_endpoints_job(
    tmp_path: Path, endpoints: dict[str, tuple[str, str]], tenants: str | None = None
) -> tuple[int, list[list[str]], str]:
    (job,) = [j for j in kube.by_kind(objects(), "Job") if j["metadata"]["name"] == "gangflow-nexus-endpoints"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    env = environment(job, container)
    # the temporal CLI's variables: the same Temporal and CA as gangflow's
    expanded = kube.expand([env["TEMPORAL_ADDRESS"], env["TEMPORAL_TLS_SERVER_CA_CERT_PATH"]], env, what(job))
    assert expanded == [env["GANGFLOW_ADDRESS"], env["GANGFLOW_TLS_CA"]]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "temporal").write_text(_FAKE_TEMPORAL)
    (bin_dir / "temporal").chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    calls.write_text("")
    run_env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "ENDPOINTS": json.dumps(endpoints),
        "TENANTS": env["TENANTS"] if tenants is None else tenants,
        "GANGFLOW_NAMESPACE": env["GANGFLOW_NAMESPACE"],
    }
    done = subprocess.run(
        ["/bin/sh", "-c", container["args"][0]], env=run_env, capture_output=True, text=True, timeout=60
    )
    return done.returncode, [json.loads(line) for line in calls.read_text().splitlines()], done.stdout + done.stderr


CREATE = ["operator", "nexus", "endpoint", "create"]


def test_endpoints_job_creates_what_ensure_endpoints_creates(tmp_path: Path) -> None:
    code, calls, output = _run_endpoints_job(tmp_path, {})
    assert code == 0, output
    created = [c for c in calls if c[3] == "create"]
    expected = [
        [
            *CREATE,
            "--name",
            gang_endpoint(t),
            "--target-namespace",
            PLATFORM_NAMESPACE,
            "--target-task-queue",
            gangs_queue(t),
        ]
        for t in platform_config("gangflow-tenants")["TENANTS"].split(",")
    ]
    assert created == expected
    # run again: every endpoint exists with its target, nothing is created
    existing = {gang_endpoint(t): (PLATFORM_NAMESPACE, gangs_queue(t)) for t in TENANTS}
    code, calls, output = _run_endpoints_job(tmp_path, existing)
    assert code == 0 and not [c for c in calls if c[3] == "create"], output


def test_endpoints_job_refuses_an_endpoint_aimed_at_another_tenant(tmp_path: Path) -> None:
    first, second = TENANTS[:2]
    hijacked = {gang_endpoint(first): (PLATFORM_NAMESPACE, gangs_queue(second))}
    code, calls, output = _run_endpoints_job(tmp_path, hijacked)
    assert code == 2, output
    assert gang_endpoint(first) in output and "another target" in output
    assert not [c for c in calls if c[3] == "create"]


@pytest.mark.parametrize("tenants", ["team-a,../x", "team-a,Team-B", "team-a,-b", "team-a,$(id)", "team-a,*"])
def test_endpoints_job_refuses_a_bad_tenant_name(tmp_path: Path, tenants: str) -> None:
    code, calls, output = _run_endpoints_job(tmp_path, {}, tenants)
    assert code == 2 and "is not a tenant name" in output, output
    assert all(c[5] == gang_endpoint("team-a") for c in calls), calls


@pytest.mark.parametrize("dockerfile", sorted(set(kube.GANGFLOW_IMAGES.values())))
def test_images_carry_no_setuid_file(dockerfile: str) -> None:
    """A rank the root agent started as its own user must not become root again through a setuid binary
    (the agent keeps SYS_ADMIN in its bounding set, and its container allows privilege escalation)."""
    steps = kube._dockerfile(dockerfile)
    users = [i for i, (op, _) in enumerate(steps) if op == "USER"]
    stripped = [i for i, (op, a) in enumerate(steps) if op == "RUN" and "-perm /6000" in a and "chmod a-s" in a]
    assert stripped and users and stripped[-1] < users[-1], f"{dockerfile}: setuid and setgid bits are not removed"
    assert not [a for op, a in steps[stripped[-1] + 1 :] if op in ("RUN", "COPY", "ADD")], (
        f"{dockerfile}: a step after the removal may bring a setuid file back"
    )
