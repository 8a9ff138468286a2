"""gangflow: typed, durable ML pipelines on Temporal.

from engine import task, workflow, Resources, Retry, File, Directory
engine.now(), engine.random(), engine.uuid4(), await engine.sleep(s): replay-safe in a workflow body
engine.preemption(): in a rank, the preemption notice (deadline, reason) or None
@task(secrets=[Secret("hf-token", env="HF_TOKEN")]); engine.secret("hf-token") inside the task
"""

from engine.checkpoint import Preemption, preemption
from engine.core import (
    DefinitionError,
    GangflowError,
    InputError,
    PayloadTooLargeError,
    Resources,
    Retry,
    TypeMismatchError,
    task,
    workflow,
)
from engine.core.determinism import now, random, sleep, uuid4
from engine.core.gang import GangPlugin, ProcessSpec, RankContext, current_rank
from engine.core.guard import NonDeterministicCall
from engine.core.plugins import available_plugins, plugin
from engine.core.secrets import Secret, secret
from engine.progress import report
from engine.types import Directory, File, Schema

__all__ = [
    "DefinitionError",
    "Directory",
    "File",
    "GangPlugin",
    "GangflowError",
    "InputError",
    "NonDeterministicCall",
    "PayloadTooLargeError",
    "Preemption",
    "ProcessSpec",
    "RankContext",
    "Resources",
    "Retry",
    "Schema",
    "Secret",
    "TypeMismatchError",
    "available_plugins",
    "checkpoint",
    "current_rank",
    "now",
    "plugin",
    "preemption",
    "random",
    "report",
    "run_local",
    "secret",
    "sleep",
    "task",
    "uuid4",
    "workflow",
]


def __getattr__(name: str) -> object:
    # run_local needs the artifact store (fsspec); import it on first use so ``import engine`` stays
    # cheap and sandbox-safe for workflow modules.
    if name == "run_local":
        from engine.local import run_local

        return run_local
    raise AttributeError(name)
