"""A multi-process JAX program written as JAX's own docs write one: it knows nothing about gangflow.

    jax.distributed.initialize()   # no arguments: the cluster tells each process who it is

Each process contributes its index + 1; the gathered sum proves every process took part.
"""

import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

jax.distributed.initialize()

mine = np.array([jax.process_index() + 1.0])
gathered = multihost_utils.process_allgather(mine)
print(
    f"{sys.argv[1] if len(sys.argv) > 1 else 'jax'}: process {jax.process_index()} of {jax.process_count()}, "
    f"{jax.device_count()} devices, sum {gathered.sum():g}",
    flush=True,
)
jax.distributed.shutdown()
