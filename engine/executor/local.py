"""``run_local``: run a workflow in this process, for quick debugging, with the same checks as a run on
Temporal: inputs and outputs of every task are validated and encoded, and File / Directory values go
through a (temporary) artifact store, and the determinism guard watches the workflow body (a
``time.time()`` there fails here as it would on the cluster), so a pipeline that passes here fails on the
cluster only for reasons the cluster adds (durability, placement), not for types, serialization or replay.
``engine.now()`` / ``random()`` / ``uuid4()`` / ``sleep()`` use the real clock and randomness here.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

from engine.artifacts.store import ArtifactStore
from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of
from engine.core.dispatch import InProcess, using_dispatcher
from engine.core.gang import gang_contexts, rank_env
from engine.core.guard import guarding, hooked, rearm, unguarded
from engine.errors import InputError
from engine.executor.ports import free_port
from engine.executor.process import spawn, stop_processes
from engine.types.codec import check_payload_size, pack, unpack

__all__ = ["LocalDispatcher", "run_local"]


class LocalDispatcher(InProcess):
    """Runs each task in-process, round-tripping its inputs and result through the wire encoding."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        # its own generator: the guard refuses the random module's shared one inside a workflow body
        self._random = random.Random()

    def _roundtrip(self, wire: Any, where: str) -> Any:
        return unpack(check_payload_size(pack(wire), where))

    async def run_task(self, task: TaskDefinition, inputs: dict[str, Any]) -> Any:
        rearm()
        ctx = self.store.context()
        wire = self._roundtrip(task.interface.inputs_to_wire(inputs, ctx), f"the inputs of task {task.name!r}")
        args = task.interface.inputs_from_wire(wire, ctx)
        # a task body is not workflow code (an async one runs right here, on the workflow's loop)
        with using_dispatcher(None), unguarded():
            if task.gang is not None:
                result = await asyncio.to_thread(self._single_rank, task, args)
            elif task.is_async:
                result = await task.fn(**args)
            else:
                result = await asyncio.to_thread(task.fn, **args)
        out = self._roundtrip(task.interface.output_to_wire(result, ctx), f"the return value of task {task.name!r}")
        return task.interface.output_from_wire(out, ctx)

    def _single_rank(self, task: TaskDefinition, args: dict[str, Any]) -> Any:
        """A distributed task as one process (world size 1): the plugin sets its framework up as it
        would on a node, so the same body runs unchanged, just without peers."""
        (rank,) = gang_contexts(
            node_rank=0,
            nnodes=1,
            nproc_per_node=1,
            gpu_ids=(),
            master_addr="127.0.0.1",
            master_port=free_port(),
            run_id="local",
            attempt=0,
            checkpoint_dir=tempfile.mkdtemp(prefix="gangflow-checkpoints-"),
        )
        env = rank_env(task.plugin, rank, cpus_per_rank=os.cpu_count() or 1)
        command = task.plugin.command(rank)
        if command is not None:
            subprocess.run(command, env={**os.environ, **env}, check=True)
            return None
        coordinator = getattr(task.plugin, "coordinator", None)
        extra = coordinator(rank) if coordinator is not None else None  # e.g. XGBoost's tracker
        # no parent-death signal: this runs on a pool thread, whose exit would fire it (see engine.executor.process)
        helper = spawn(extra.command, env={**os.environ, **env, **extra.env}, parent_death=None) if extra else None
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            task.plugin.setup(rank)
            try:
                return task.fn(**args)
            finally:
                task.plugin.teardown(rank)
        finally:
            if helper is not None:
                stop_processes([helper])
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    async def run_workflow(self, wf: WorkflowDefinition, inputs: dict[str, Any]) -> Any:
        rearm()
        ctx = self.store.context()
        args = wf.interface.inputs_from_wire(wf.interface.inputs_to_wire(inputs, ctx), ctx)
        with guarding(wf.name, wf.module) as scope:
            result = await wf.fn(**args)
        scope.check()  # a forbidden call the body caught and swallowed still fails the run
        return wf.interface.output_from_wire(wf.interface.output_to_wire(result, ctx), ctx)

    def random(self) -> random.Random:
        return self._random

    async def sleep(self, seconds: float) -> None:
        rearm()
        await super().sleep(seconds)


def run_local(wf: Callable[..., Any], /, artifacts: str | None = None, **inputs: Any) -> Any:
    """Run ``wf`` to completion in this process and return its typed result."""
    defn = definition_of(wf)
    if not isinstance(defn, WorkflowDefinition):
        raise InputError(f"run_local expects a @workflow, got {wf!r}")
    store = ArtifactStore(artifacts or tempfile.mkdtemp(prefix="gangflow-local-"))
    dispatcher = LocalDispatcher(store)

    async def main() -> Any:
        with using_dispatcher(dispatcher), hooked():
            return await dispatcher.run_workflow(defn, inputs)

    return asyncio.run(main())
