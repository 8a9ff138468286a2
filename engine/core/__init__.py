"""The authoring layer: @task, @workflow, typed interfaces, resources and retries (pure, sandbox-safe)."""

from engine.core.definitions import TaskDefinition, WorkflowDefinition, definition_of, task, workflow
from engine.core.dispatch import Dispatcher, current_dispatcher, using_dispatcher
from engine.core.interface import Interface, Param
from engine.core.options import Gang, TaskOptions
from engine.core.placement import Topology
from engine.core.resources import Resources, Retry
from engine.errors import (
    DefinitionError,
    GangflowError,
    InputError,
    PayloadTooLargeError,
    TypeMismatchError,
)

__all__ = [
    "DefinitionError",
    "Dispatcher",
    "Gang",
    "GangflowError",
    "InputError",
    "Interface",
    "Param",
    "PayloadTooLargeError",
    "Resources",
    "Retry",
    "TaskDefinition",
    "TaskOptions",
    "Topology",
    "TypeMismatchError",
    "WorkflowDefinition",
    "current_dispatcher",
    "definition_of",
    "task",
    "using_dispatcher",
    "workflow",
]
