"""Where a task call goes: the dispatcher of the surrounding workflow run.

Calling a task inside a workflow does not run its body; it asks the *current dispatcher* to schedule it.
The Temporal workflow shell installs a dispatcher that schedules activities and child workflows;
``engine.run_local`` installs one that runs tasks in-process. Outside any dispatcher a task is a plain
Python function. The dispatcher lives in a context variable, so concurrent workflow runs in one worker
process (each its own asyncio task) never see each other's.

The dispatcher is also where a workflow body gets the time, randomness, ids and timers that stay the
same on replay (``engine.now()``, ``engine.random()``, ``engine.uuid4()``, ``engine.sleep()``): the
Temporal shell answers from workflow history, the local dispatchers from the real clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import random as stdlib_random
import uuid as stdlib_uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engine.core.definitions import TaskDefinition, WorkflowDefinition
    from engine.core.waits import WaitRequest

__all__ = ["DirectDispatcher", "Dispatcher", "InProcess", "RealClock", "current_dispatcher", "using_dispatcher"]


class Dispatcher(Protocol):
    async def run_task(self, task: TaskDefinition, inputs: dict[str, Any]) -> Any: ...

    async def run_workflow(self, wf: WorkflowDefinition, inputs: dict[str, Any]) -> Any: ...

    async def map_task(
        self,
        task: TaskDefinition,
        items: list[dict[str, Any]],
        concurrency: int,
        min_success_ratio: float,
        chunk_size: int | None = None,
    ) -> list[Any]:
        """``engine.map``: the task once per item (inputs by name, already checked); see engine/core/mapping.py."""
        ...

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def random(self) -> stdlib_random.Random:
        """A random generator that yields the same sequence on every replay of the run."""
        ...

    def uuid4(self) -> stdlib_uuid.UUID: ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (>= 0; a durable timer on Temporal)."""
        ...

    async def wait_for(self, request: WaitRequest) -> Any:
        """Wait for a person's answer (engine.approve / engine.wait_for_input; see engine/core/waits.py)."""
        ...


_current: contextvars.ContextVar[Dispatcher | None] = contextvars.ContextVar("gangflow_dispatcher", default=None)


def current_dispatcher() -> Dispatcher | None:
    return _current.get()


@contextmanager
def using_dispatcher(dispatcher: Dispatcher | None) -> Iterator[None]:
    token = _current.set(dispatcher)
    try:
        yield
    finally:
        _current.reset(token)


class RealClock:
    """``now`` / ``random`` / ``uuid4`` / ``sleep`` from the real clock and the random module's own
    generator: what a run that is never replayed uses (plain Python, ``run_local``)."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def random(self) -> stdlib_random.Random:
        return stdlib_random._inst

    def uuid4(self) -> stdlib_uuid.UUID:
        return stdlib_uuid.uuid4()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class InProcess(RealClock):
    """What a run in this process (plain Python, ``run_local``) does beyond the clock: an ``engine.map``'s items
    are concurrent calls of ``run_task``, and a wait for a person fails at once, since nobody can answer it."""

    async def run_task(self, task: TaskDefinition, inputs: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def map_task(
        self,
        task: TaskDefinition,
        items: list[dict[str, Any]],
        concurrency: int,
        min_success_ratio: float,
        chunk_size: int | None = None,
    ) -> list[Any]:
        from engine.core.mapping import map_in_process  # engine.core.mapping imports this module

        return await map_in_process(self.run_task, task, items, concurrency, min_success_ratio)

    async def wait_for(self, request: WaitRequest) -> Any:
        from engine.core.waits import no_one_to_ask  # engine.core.waits imports this module

        raise no_one_to_ask(request)


class DirectDispatcher(InProcess):
    """Runs task bodies in-process with no encoding: what ``await my_workflow(...)`` does in plain Python."""

    async def run_task(self, task: TaskDefinition, inputs: dict[str, Any]) -> Any:
        with using_dispatcher(None):  # a task body calling another task runs it directly
            result = task.fn(**inputs)
            if inspect.isawaitable(result):
                result = await result
        return result

    async def run_workflow(self, wf: WorkflowDefinition, inputs: dict[str, Any]) -> Any:
        return await wf.fn(**inputs)
