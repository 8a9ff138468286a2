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

from engine.artifacts.loader import LOADER
from engine.artifacts.store import ArtifactStore
from engine.core.atomic import write_atomic
from engine.core.definitions import TaskDefinition
from engine.core.gang import RankContext
from engine.core.wire import Envelope
from engine.errors import GangflowError
from engine.executor.standby import become_rank
from engine.types.codec import check_payload_size, pack, unpack

__all__ = ["main"]


def _run(spec: dict[str, Any], rank: RankContext) -> None:
    envelope = Envelope.decode(spec["envelope"])
    store = ArtifactStore(envelope.run.artifacts)
    defn = LOADER.load(envelope.code, store)
    assert isinstance(defn, TaskDefinition) and defn.plugin is not None
    context = store.context()
    inputs = defn.interface.inputs_from_wire(envelope.inputs, context)
    defn.plugin.setup(rank)
    try:
        result = defn.fn(**inputs)
        if rank.rank == 0:
            wire = defn.interface.output_to_wire(result, context)
            write_atomic(spec["result_path"], check_payload_size(pack(wire), f"the return value of {defn.name!r}"))
        Path(spec["done_dir"], f"rank{rank.rank}").touch()
    finally:
        defn.plugin.teardown(rank)


def _adopt(rank: RankContext) -> None:
    """Under a launcher (MPI) the node's environment is shared by its ranks: give this process the
    per-rank names, its own GPUs, and its own progress file and log."""
    os.environ.update(
        RANK=str(rank.rank),
        WORLD_SIZE=str(rank.world_size),
        LOCAL_RANK=str(rank.local_rank),
        LOCAL_WORLD_SIZE=str(rank.local_world_size),
    )
    if "GANGFLOW_NODE_GPU_IDS" in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, rank.gpu_ids))
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
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
