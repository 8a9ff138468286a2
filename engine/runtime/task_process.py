"""A plain task that declares secrets runs in a process of its own (``engine.executor.task``).

The worker resolves the secrets for the run's tenant and gives them to that child alone: its environment
(``env=``) and a private folder (``mount=``, ``engine.secret``), never the worker's ``os.environ``, which
every other task running in the worker's threads can read. The child's output is redacted line by line
into the task's log; its failure comes back as the same typed failure (the exception's class name and
message, redacted) an in-thread task gives. A cancel kills the child's whole process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from temporalio.exceptions import ApplicationError

from engine.core.definitions import TaskDefinition
from engine.core.wire import Envelope
from engine.executor.process import spawn, stop_processes
from engine.runtime import logs
from engine.runtime.connection import CREDENTIAL_ENV
from engine.runtime.secrets import Redactor, materialize, resolve, task_environment
from engine.types.codec import pack

__all__ = ["TaskProcess", "run_in_process"]

#: a cancelled task's process gets this long after SIGTERM before SIGKILL
STOP_GRACE_S = 5.0
#: a line longer than this is passed on in pieces (a progress bar that never ends its line)
_MAX_LINE = 65536


class TaskProcess:
    """The child of one task attempt, for the activity to stop when it is cancelled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        with self.lock:
            self.proc = proc
            cancelled = self.cancelled
        if cancelled:  # the cancel came while it was starting
            stop_processes([proc], STOP_GRACE_S, group=True)

    def stop(self) -> None:
        """Stop the child (SIGTERM to its process group, SIGKILL after the grace); blocks until it is gone."""
        with self.lock:
            self.cancelled = True
            proc = self.proc
        if proc is not None:
            stop_processes([proc], STOP_GRACE_S, group=True)


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_in_process(
    envelope: Envelope, envelope_blob: bytes, defn: TaskDefinition, log: logs.LogSink, child: TaskProcess
) -> bytes:
    """Run the task in its own process with its secrets; the encoded result, or ApplicationError. Raises
    SecretNotFoundError (a GangflowError: the caller makes it non-retryable) before anything starts."""
    values = resolve(defn.secrets, envelope.run.tenant)
    redact = Redactor(values)
    with materialize(defn.secrets, values) as secret_env, tempfile.TemporaryDirectory(prefix="gangflow-task-") as tmp:
        work = Path(tmp)
        spec = {
            "envelope": envelope_blob,
            "result_path": str(work / "result"),
            "error_path": str(work / "error.json"),
        }
        (work / "spec.msgpack").write_bytes(pack(spec))
        # the worker's environment as in-thread tasks see it, less the platform's credentials
        base = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_ENV}
        env = task_environment(base, {**secret_env, "PYTHONUNBUFFERED": "1"})
        command = [sys.executable, "-m", "engine.executor.task", str(work / "spec.msgpack")]
        proc = spawn(command, env=env, new_session=True, parent_death=signal.SIGKILL, pipe_output=True)
        child.started(proc)
        out = proc.stdout
        try:
            with logs.capture(log):
                for raw in iter(lambda: out.readline(_MAX_LINE) if out is not None else b"", b""):
                    sys.stdout.write(redact(raw.decode(errors="replace")))
            code = proc.wait()
        finally:
            stop_processes([proc], 0.0, group=True)  # what it forked and left behind
        result, error = work / "result", work / "error.json"
        if code == 0 and result.exists():
            return result.read_bytes()
        if error.exists():
            failure = json.loads(error.read_text())
            raise ApplicationError(
                redact(str(failure.get("message", ""))),
                type=str(failure.get("type") or "TaskFailed"),
                non_retryable=bool(failure.get("non_retryable")),
            )
        raise ApplicationError(f"the process of task {defn.name!r} {_how(code)}", type="TaskProcessFailed")
