"""A script that fails on one process, as any program might: what it printed ends the task's error."""

import os
import sys

if os.environ.get("RANK") == sys.argv[1]:
    print(f"process {os.environ['RANK']}: cannot read the shard", file=sys.stderr, flush=True)
    sys.exit(1)
