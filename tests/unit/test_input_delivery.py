"""An input the platform cannot deliver (a File missing from the store, a code bundle that cannot be fetched) fails
a rank as a *system* failure: restarted from the gang's restart budget, never counted against the task's
``retries`` (issue 21: a cache race lost whole runs as "user error in the task body, not restarted")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.exceptions import ActivityError, ApplicationError

from engine import File
from engine.artifacts import ArtifactStore, pack_code
from engine.core.wire import CodeRef, Envelope, RunContext
from engine.errors import SYSTEM_ERROR_TYPES, InputUnavailableError
from engine.executor.body import TaskBody, deliver_code
from engine.executor.launcher import RankFailure
from engine.runtime.node import FAILURE_TYPES
from engine.types import ValueCodec, pack
from workflows.gang_failures import classify

FLOW = """
from engine import File, GangPlugin, task


class Ranks(GangPlugin):
    nnodes, nproc_per_node = 1, 1


@task(plugin=Ranks())
def train(data: File) -> int:
    return len(data.read_bytes())  # {tag}
"""


def _envelope(tmp_path: Path, store: ArtifactStore, tag: str) -> tuple[Envelope, Path]:
    """A distributed task's call whose File input is in ``store``; returns it and the input's object."""
    project = tmp_path / f"project-{tag}"
    project.mkdir(parents=True)
    (project / "flow.py").write_text(FLOW.format(tag=f"{tag} {tmp_path}"))
    packed = pack_code(project / "flow.py")
    uri, sha = store.put_bytes(packed.data)
    (tmp_path / "data.json").write_text('{"rows": 3}')
    ref = ValueCodec(File).to_wire(File(tmp_path / "data.json"), "data", store.context())
    run = RunContext("run-1", "pipe", "team-a", store.uri_root)
    envelope = Envelope(CodeRef(packed.module, "train", uri, sha), {"data": ref}, run)
    return envelope, Path(store._cas_path(ref["sha256"]))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(str(tmp_path / "artifacts"))


def test_a_missing_input_or_bundle_raises_input_unavailable(store: ArtifactStore, tmp_path: Path) -> None:
    envelope, obj = _envelope(tmp_path, store, "missing-input")
    obj.unlink()  # the object is gone from the store (and was never cached here)
    body = TaskBody(envelope, store)
    with pytest.raises(InputUnavailableError, match=r"cannot deliver the input 'data\.json'"):
        body.inputs()

    envelope, _ = _envelope(tmp_path / "b", ArtifactStore(str(tmp_path / "b" / "artifacts")), "missing-bundle")
    Path(envelope.code.bundle or "").unlink()
    with pytest.raises(InputUnavailableError, match="cannot deliver the code bundle"):
        TaskBody(envelope)
    with pytest.raises(InputUnavailableError, match="cannot deliver the code bundle"):  # what a node agent calls
        deliver_code(envelope.code, ArtifactStore(envelope.run.artifacts))


def test_an_oserror_of_the_users_own_module_stays_the_users(store: ArtifactStore, tmp_path: Path) -> None:
    project = tmp_path / "own"
    project.mkdir()
    (project / "flow.py").write_text(f"open({str(tmp_path / 'no-such-file')!r})\n")
    packed = pack_code(project / "flow.py")
    uri, sha = store.put_bytes(packed.data)
    run = RunContext("run-1", "pipe", "team-a", store.uri_root)
    with pytest.raises(FileNotFoundError) as raised:
        TaskBody(Envelope(CodeRef(packed.module, "train", uri, sha), {}, run), store)
    assert not isinstance(raised.value, InputUnavailableError)


def test_a_rank_whose_input_is_missing_fails_as_a_system_failure(store: ArtifactStore, tmp_path: Path) -> None:
    """A real rank process (python -m engine.executor.rank), its error report, and how the node agent and GangTask
    classify it."""
    envelope, obj = _envelope(tmp_path, store, "rank")
    obj.unlink()
    work = tmp_path / "work"
    (work / "errors").mkdir(parents=True)
    (work / "done").mkdir()
    spec = work / "spec"
    spec.write_bytes(
        pack(
            {
                "envelope": envelope.encode("test"),
                "result_path": str(work / "result"),
                "done_dir": str(work / "done"),
                "error_dir": str(work / "errors"),
            }
        )
    )
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": "0",
        "GANGFLOW_NNODES": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    done = subprocess.run(
        [sys.executable, "-P", "-m", "engine.executor.rank", str(spec)], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    error = (work / "errors" / "rank0").read_text()
    assert error.startswith("InputUnavailableError: cannot deliver the input 'data.json'")

    failure = RankFailure(0, 0, "n1", 1, error, log_tail="")
    assert failure.error_type in SYSTEM_ERROR_TYPES and failure.kind == "system"
    assert failure.priority < RankFailure(1, 0, "n1", 1, "ValueError: x", "").priority  # the root cause first
    # the node agent reports it with this type, and GangTask counts it as a system failure (a restart)
    cause = ApplicationError(failure.describe(), {"error_type": failure.error_type}, type=FAILURE_TYPES[failure.kind])
    err = ActivityError(
        "activity failed",
        scheduled_event_id=1,
        started_event_id=2,
        identity="n1",
        activity_type="run_gang",
        activity_id="1",
        retry_state=None,
    )
    err.__cause__ = cause
    verdict = classify(err, "n1")
    assert verdict is not None and verdict.system and not verdict.node_lost
    # an ordinary exception in the body stays the user's
    user = RankFailure(0, 0, "n1", 1, "FileNotFoundError: the user's own open()", "")
    assert user.kind == "user"
