"""The task runner: ``python -m engine.executor.task SPEC`` runs one plain task in a process of its own.

A worker runs a task that declares secrets here rather than in one of its threads, so that the secrets
live only in this process (its environment and private files), never in the worker's. It does what the
worker's thread would: load the task from the run's bundle, read the inputs, run the body, validate and
encode the result (uploading File outputs). The result goes to the spec's ``result_path``; a failure to
``error_path`` as JSON (the exception's type name, its message, whether retrying could help), which the
worker turns into the same typed failure an in-thread task gives. Output goes to stdout, which the worker
redacts into the task's log. Nothing here imports Temporal.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from engine.core.atomic import write_atomic
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.executor.body import TaskBody, call_body
from engine.types.codec import unpack

__all__ = ["call_body", "main"]


def _fail(spec: dict[str, Any], kind: str, message: str, non_retryable: bool) -> None:
    error = {"type": kind, "message": message, "non_retryable": non_retryable}
    write_atomic(spec["error_path"], json.dumps(error).encode(), durable=False)


def _run(spec: dict[str, Any]) -> int:
    try:
        body = TaskBody(Envelope.decode(spec["envelope"]))
        inputs = body.inputs()
    except GangflowError as exc:  # CodeNotFoundError among them
        _fail(spec, exc.kind, str(exc), not exc.retryable)
        return 1
    try:
        result = body.call(inputs)
    except Exception as exc:
        traceback.print_exc()  # into the task's log
        # what Temporal makes of an exception raised in the worker: its class name, retried per the task's policy
        _fail(spec, type(exc).__name__, str(exc), False)
        return 1
    try:
        blob = body.encode(result)
    except GangflowError as exc:
        _fail(spec, exc.kind, str(exc), not exc.retryable)
        return 1
    write_atomic(spec["result_path"], blob, durable=False)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = unpack(Path(args[0]).read_bytes())
    try:
        code = _run(spec)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt from the body: a failure all the same
        traceback.print_exc()
        _fail(spec, type(exc).__name__, str(exc), False)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
