"""A nightly report, run on a schedule (see README "Schedules").

    gangflow schedule create nightly-report examples/scheduled_report.py:report --cron "0 3 * * *" \
        --input-json '{"region": "eu", "top": 3}'
    gangflow schedule trigger nightly-report     # one run now, as the schedule would start it

Every run gets the inputs given when the schedule was created; what changes from run to run (the day it
reports on) comes from ``engine.now()``: the time the run started, the same on every replay.
"""

from __future__ import annotations

from pydantic import BaseModel

from engine import now, task, workflow


class Report(BaseModel):
    region: str
    day: str
    top: list[str]


@task
def rank_products(region: str, day: str, top: int) -> list[str]:
    """Stands in for a query against a warehouse: the best sellers of a region on a day."""
    print(f"ranking the top {top} products of {region} on {day}")
    products = sorted(f"{region}-product-{i}" for i in range(10))
    return products[:top]


@workflow
async def report(region: str, top: int = 3) -> Report:
    day = now().date().isoformat()
    best = await rank_products(region=region, day=day, top=top)
    return Report(region=region, day=day, top=best)
