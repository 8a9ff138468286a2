"""A distributed XGBoost worker written as XGBoost's docs write one: it knows nothing about gangflow.

The launcher gives each worker the tracker's address and its task id (``DMLC_TRACKER_URI``,
``DMLC_TRACKER_PORT``, ``DMLC_TASK_ID``, as Kubeflow's XGBoost jobs do); the worker joins the
communicator with them, and ``xgb.train`` on its own shard then trains one model together with its peers.
"""

import argparse
import hashlib
import os

import numpy as np
import xgboost as xgb
from xgboost import collective

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=5)
options = parser.parse_args()

args = {
    "dmlc_tracker_uri": os.environ["DMLC_TRACKER_URI"],
    "dmlc_tracker_port": int(os.environ["DMLC_TRACKER_PORT"]),
    "dmlc_task_id": os.environ["DMLC_TASK_ID"],
}
with collective.CommunicatorContext(**args):
    rank, world = collective.get_rank(), collective.get_world_size()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 5))
    y = 2 * x[:, 0] + rng.normal(scale=0.1, size=2000)
    shard = xgb.DMatrix(x[rank::world], y[rank::world])
    booster = xgb.train({"tree_method": "hist", "max_depth": 3, "seed": 0}, shard, num_boost_round=options.rounds)
    digest = hashlib.sha256(bytes(booster.save_raw("json"))).hexdigest()[:12]
    total = collective.allreduce(np.array([rank + 1.0]), collective.Op.SUM)[0]
    print(f"worker {rank} of {world}: {options.rounds} rounds, model {digest}, sum {total:g}", flush=True)
