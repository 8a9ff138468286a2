"""XGBoost's Rabit tracker as a gangflow coordinator process (one fresh tracker per attempt).

    python -m plugins.xgboost.tracker --workers N --host ADDR --port PORT --timeout SECONDS

It always ends: when the workers are done, or after ``--timeout`` (XGBoost's own ``wait_for`` would
otherwise wait forever for a worker that died).
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=int, required=True)
    args = parser.parse_args()
    from xgboost.tracker import RabitTracker

    tracker = RabitTracker(
        n_workers=args.workers, host_ip=args.host, port=args.port, sortby="task", timeout=args.timeout
    )
    tracker.start()
    print(f"tracker for {args.workers} workers on {args.host}:{args.port}", flush=True)
    tracker.wait_for(timeout=args.timeout)
    print("tracker done", flush=True)


if __name__ == "__main__":
    main()
