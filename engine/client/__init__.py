"""The gangflow client: start, wait for, inspect, list and cancel runs; answer waiting runs; schedules; the
cluster's view and the operators' commands.

    from engine.client import Client

    client = await Client.connect()                     # GANGFLOW_ADDRESS / GANGFLOW_NAMESPACE, or arguments
    run_id = await client.start(pipeline, {"epochs": 3})
    result = await client.result(run_id, pipeline)

``Client.start`` validates the inputs against the workflow's signature and packs the workflow's code into a
content-addressed bundle *before* anything is sent to Temporal, so bad input leaves nothing behind and the
run is pinned to the exact code it started with. It also asks the Scheduler for the cluster's queue
configuration and refuses a tenant or priority class it does not have (``TenancyError``).

The modules behind this facade are private (``engine.client._*``); the names below are the client's API.
Importing it loads no workflow code and no Temporal worker machinery.
"""

from engine.client._client import Client, RunInfo, log_rank
from engine.client._cluster import ClusterClient
from engine.client._prepare import (
    NO_QUEUE_CONFIG,
    TenancyError,
    check_tenancy,
    default_tenant,
    load_workflow_file,
    prepare_run,
    start_options,
    task_priorities,
    to_jsonable,
)
from engine.client._schedules import ScheduleInfo, ScheduleNotFoundError, ScheduleOptions, Schedules
from engine.client._waits import InputRefused, RunNotWaiting, approve, send_input, waiting
from engine.core.protocol import DEFAULT_TENANT

__all__ = [
    "DEFAULT_TENANT",
    "NO_QUEUE_CONFIG",
    "Client",
    "ClusterClient",
    "InputRefused",
    "RunInfo",
    "RunNotWaiting",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "ScheduleOptions",
    "Schedules",
    "TenancyError",
    "approve",
    "check_tenancy",
    "default_tenant",
    "load_workflow_file",
    "log_rank",
    "prepare_run",
    "send_input",
    "start_options",
    "task_priorities",
    "to_jsonable",
    "waiting",
]
