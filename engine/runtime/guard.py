"""The determinism guard on a worker: a workflow runner that watches user workflows while they run.

User workflows run unsandboxed (see ``workflows/shell.py``). This runner is Temporal's unsandboxed runner
plus :mod:`engine.core.guard`'s hook, installed on the worker thread for the length of each activation of
the user-workflow shell and removed after it. GangTask and the Scheduler (gangflow's own workflows) run
without it, so they pay nothing. The hook raises only for calls made by a workflow body (the shell marks
the body with ``guarding``), so the shell's own code and the libraries it calls are never refused.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import temporalio.workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

from engine.core.guard import hooked
from workflows.shell import UserWorkflow

__all__ = ["GuardedWorkflowRunner"]


class _GuardedInstance(WorkflowInstance):
    """A workflow instance whose activations run under the guard's hook."""

    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        with hooked():
            return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> temporalio.workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()  # the deadlock detector interrupts and reports this thread

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class GuardedWorkflowRunner(WorkflowRunner):
    """Runs unsandboxed workflows; those of the ``guarded`` classes (the user-workflow shell) under the
    determinism guard. Pass it as ``unsandboxed_workflow_runner`` to a Worker or a Replayer."""

    def __init__(self, guarded: Collection[type] = (UserWorkflow,)) -> None:
        self._inner = UnsandboxedWorkflowRunner()
        self._guarded = frozenset(guarded)

    def prepare_workflow(self, defn: temporalio.workflow._Definition) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = self._inner.create_instance(det)
        return _GuardedInstance(instance) if det.defn.cls in self._guarded else instance

    def set_worker_level_failure_exception_types(self, types: Sequence[type[BaseException]]) -> None:
        self._inner.set_worker_level_failure_exception_types(types)
