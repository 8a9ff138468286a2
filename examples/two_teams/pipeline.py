"""Two teams, one cluster, a hard boundary between them (run it on `gangflow dev --auth`: README.md here).

Each team's runs live in its own Temporal namespace (gf-team-a, gf-team-b), with its own token, its own
artifact root and its own secrets; both share the cluster's GPUs under examples/queues.yaml's quotas. The
gang below runs in the platform namespace, reached through the team's Nexus endpoint: the platform decides
which team it belongs to from the endpoint, and where its artifacts go from its own configuration.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from engine import File, Resources, Secret, task, workflow
from plugins.pytorch import PyTorch


@task(secrets=[Secret("data-token", env="DATA_TOKEN")])
def prepare(n: int) -> File:
    """Writes the team's data into the team's own artifact root (its worker pins it). The token is the team's
    own (`gangflow secret set team-a data-token`): this task alone gets it, and its log shows it redacted."""
    print(f"reading the dataset with token {os.environ['DATA_TOKEN']}")
    path = os.path.join(tempfile.mkdtemp(), "data.txt")
    with open(path, "w") as out:
        out.writelines(f"{i}\n" for i in range(n))
    return File(path)


@task(plugin=PyTorch(nnodes=2, nproc_per_node=1, timeout=300), resources=Resources(gpu=1, cpu=1))
def train(data: File, seconds: float = 0.0) -> dict[str, Any]:
    """One rank per node sums its half of the data; the all-reduce gives every rank the total."""
    import time

    import torch
    import torch.distributed as dist

    with open(data.path) as lines:
        values = [int(line) for line in lines]
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(sum(values[rank::world]))])
    dist.all_reduce(total)
    time.sleep(seconds)  # long enough, in the tests, to cancel or terminate the run meanwhile
    return {"total": int(total.item()), "world": world}


@workflow
async def pipeline(n: int = 100, seconds: float = 0.0) -> dict[str, Any]:
    return await train(await prepare(n), seconds)
