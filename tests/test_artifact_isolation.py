"""A run handed a File reference that points outside its artifact store (another tenant's store, or any path
on the worker's machine) fails at once, naming the problem, without retrying and without reading the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from conftest import gangflow_cli

FLOW = """
from engine import File, task, workflow


@task(retries=3)
def size(f: File) -> int:
    return len(f.read_bytes())


@workflow
async def measure(f: File) -> int:
    return await size(f=f)
"""


def test_a_reference_outside_the_runs_store_is_refused_at_once(server, worker, artifacts, tmp_path: Path) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    secret = tmp_path / "other-tenant" / "cas" / "model.bin"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"someone else's weights")
    sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    ref = {"kind": "file", "uri": str(secret), "sha256": sha, "name": "model.bin", "size": 22}
    done = gangflow_cli(
        "run",
        "flow.py:measure",
        "--input-json",
        json.dumps({"f": ref}),
        "--json",
        cwd=tmp_path,
        GANGFLOW_ADDRESS=server.address,
        GANGFLOW_ARTIFACTS=artifacts,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = " ".join((done.stdout + done.stderr).split())
    assert "refusing an artifact reference outside this run's store" in said and str(secret) in said, said
    status = json.loads(
        gangflow_cli("status", json.loads(done.stdout)["run_id"], "--json", GANGFLOW_ADDRESS=server.address).stdout
    )
    (task,) = status["tasks"]
    assert task["name"] == "size" and task["status"] == "failed" and task["attempt"] == 0, task  # not retried
