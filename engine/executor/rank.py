"""The rank runner: ``python -m engine.executor.rank SPEC`` is what each rank process executes.

It loads the task from the run's code bundle, lets the plugin set the framework up (process group,
coordinator), runs the task body, and hands the result back through files written *before* the
framework is torn down: rank 0 writes the encoded result, every rank writes a done marker. The process
then leaves with ``os._exit`` so a framework's noisy abort during interpreter shutdown cannot turn a
finished rank into a failure (torch/gloo sometimes abort at exit after a correct run).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from engine.core.atomic import write_atomic
from engine.core.gang import RankContext, own_rank_env
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.executor.body import TaskBody
from engine.executor.proctitle import set_process_title
from engine.executor.standby import become_rank
from engine.rank import progress
from engine.types.codec import unpack

__all__ = ["main"]


def _run(spec: dict[str, Any], rank: RankContext) -> None:
    envelope = Envelope.decode(spec["envelope"])
    # whose process this is, in ps and top: an adopted standby's arguments say only "--standby torch"
    title = f"gangflow rank {rank.rank}/{rank.world_size} {envelope.code.qualname} attempt {rank.attempt}"
    set_process_title(f"{title} run {envelope.run.run_id}")
    body = TaskBody(envelope)
    plugin = body.defn.plugin
    if plugin is None:
        raise TypeError(f"{body.defn.name} is not a distributed task")
    inputs = body.inputs()
    plugin.setup(rank)
    try:
        result = body.call(inputs)
        progress.flush()  # the last engine.report (often the final step) before the agent reads it
        if rank.rank == 0:
            write_atomic(spec["result_path"], body.encode(result))
        Path(spec["done_dir"], f"rank{rank.rank}").touch()
    finally:
        plugin.teardown(rank)


def _adopt(rank: RankContext) -> None:
    """Under a launcher (MPI) the node's environment is shared by its ranks: give this process the
    per-rank variables (its own GPUs among them), and its own progress file and log. (Started by a node
    agent, a rank has them already, and setting them again changes nothing.)"""
    os.environ.update(own_rank_env(rank))
    if "{rank}" in os.environ.get("GANGFLOW_PROGRESS_FILE", ""):
        os.environ["GANGFLOW_PROGRESS_FILE"] = os.environ["GANGFLOW_PROGRESS_FILE"].format(rank=rank.rank)
    if log := os.environ.get("GANGFLOW_RANK_LOG"):
        fd = os.open(log.format(rank=rank.rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--standby"]:  # a warm standby: wait for the rank to become (engine.executor.standby)
        args = become_rank(args[1] if len(args) > 1 else "")
    spec = unpack(Path(args[0] if args else os.environ["GANGFLOW_RANK_SPEC"]).read_bytes())
    rank = RankContext.from_env()
    _adopt(rank)
    code = 0
    try:
        _run(spec, rank)
    except BaseException as exc:
        traceback.print_exc()
        # the first word names the error for retry policies: a gangflow error's kind (TypeMismatch is never
        # retried), else the exception's class name (what ``Retry(non_retryable=...)`` lists)
        kind = exc.kind if isinstance(exc, GangflowError) else type(exc).__name__
        report = f"{kind}: {exc}\n{''.join(traceback.format_exception(exc))}"
        write_atomic(Path(spec["error_dir"], f"rank{rank.rank}"), report.encode())
        code = 1
    progress.flush()  # os._exit skips the atexit hook that would write a held-back report
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
