"""A person in the loop: train, wait for a threshold, ask for approval, promote.

    gangflow dev                                                  # in one shell
    gangflow run examples/approval_pipeline.py:pipeline           # prints the run id
    gangflow status RUN                      # waiting for input 'threshold' (float) since ...
    gangflow input RUN threshold 0.9         # a wrong type (abc) exits 2 and the run keeps waiting
    gangflow status RUN                      # waiting for approval: promote model ... ?
    gangflow approve RUN --comment "looks good"      # or --reject: the run fails with the comment

Both waits are durable (a workflow condition and a timer): the run may wait for days, through worker
restarts, and costs nothing meanwhile. A timeout raises engine.WaitTimedOut naming what was not answered.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

import engine
from engine import task, workflow


class Model(BaseModel):
    name: str
    accuracy: float


class Promotion(BaseModel):
    model: str
    accuracy: float
    threshold: float
    promoted: bool
    approved_by: str | None = None
    comment: str | None = None


@task
def train(name: str) -> Model:
    return Model(name=name, accuracy=0.93)


@task
def promote(model: Model) -> str:
    return f"models/production/{model.name}"


@workflow
async def pipeline(
    name: str = "resnet", input_timeout_s: float = 86400.0, approval_timeout_s: float = 86400.0
) -> Promotion:
    model = await train(name=name)
    threshold = await engine.wait_for_input(
        "threshold",
        float,
        timeout=timedelta(seconds=input_timeout_s),
        prompt=f"minimum accuracy to promote {model.name} (it has {model.accuracy})",
    )
    if model.accuracy < threshold:
        return Promotion(model=model.name, accuracy=model.accuracy, threshold=threshold, promoted=False)
    approval = await engine.approve(
        f"promote {model.name} (accuracy {model.accuracy})?", timeout=timedelta(seconds=approval_timeout_s)
    )
    await promote(model=model)
    return Promotion(
        model=model.name,
        accuracy=model.accuracy,
        threshold=threshold,
        promoted=True,
        approved_by=approval.by,
        comment=approval.comment,
    )
