"""gangflow: typed, durable ML pipelines on Temporal.

from engine import task, workflow, Resources, Retry, File, Directory
@task(plugin=PyTorch(nnodes=2), gang=Gang(max_restarts=1, preemptible=False)): a distributed task's options
@task(plugin=PyTorch(nnodes=4), placement=Topology(required="rack")): all its nodes in one rack
engine.now(), engine.random(), engine.uuid4(), await engine.sleep(s): replay-safe in a workflow body
engine.preemption(): in a rank, the preemption notice (deadline, reason) or None
@task(secrets=[Secret("hf-token", env="HF_TOKEN")]); engine.secret("hf-token") inside the task
@task(cache=True, cache_version="1"); await engine.map(task, items, concurrency=16, min_success_ratio=1.0)
await engine.approve("promote?"), await engine.wait_for_input("threshold", float) in a workflow body
Annotated[pd.DataFrame, Schema(x="float64")] for a checked DataFrame input or output
"""

from engine import checkpoint  # the module: `from engine import checkpoint`, then checkpoint.save(...)
from engine.core import (
    DefinitionError,
    Gang,
    GangflowError,
    InputError,
    PayloadTooLargeError,
    Resources,
    Retry,
    Topology,
    TypeMismatchError,
    task,
    workflow,
)
from engine.core.determinism import now, random, sleep, uuid4
from engine.core.gang import GangPlugin, ProcessSpec, RankContext, current_rank
from engine.core.guard import NonDeterministicCall
from engine.core.mapping import map as map  # not in __all__: `from engine import *` keeps the builtin map
from engine.core.plugins import available_plugins, plugin
from engine.core.secrets import Secret, secret
from engine.core.waits import Approval, Rejected, WaitTimedOut, approve, wait_for_input
from engine.rank import Preemption, preemption
from engine.rank.progress import report
from engine.types import Directory, File, Schema

__all__ = [
    "Approval",
    "DefinitionError",
    "Directory",
    "File",
    "Gang",
    "GangPlugin",
    "GangflowError",
    "InputError",
    "NonDeterministicCall",
    "PayloadTooLargeError",
    "Preemption",
    "ProcessSpec",
    "RankContext",
    "Rejected",
    "Resources",
    "Retry",
    "Schema",
    "Secret",
    "Topology",
    "TypeMismatchError",
    "WaitTimedOut",
    "approve",
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
    "wait_for_input",
    "workflow",
]


def __getattr__(name: str) -> object:
    # run_local needs the artifact store (fsspec); import it on first use so ``import engine`` stays
    # cheap and sandbox-safe for workflow modules.
    if name == "run_local":
        from engine.executor.local import run_local

        return run_local
    raise AttributeError(name)
