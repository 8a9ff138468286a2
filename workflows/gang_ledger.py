"""A GangTask tells the Scheduler where each ended attempt's GPU-seconds went (``LEDGER_SIGNAL``), so the
cluster's goodput is a Prometheus family (``gangflow_gpu_seconds_total{tenant,flavor,cause}``,
engine.scheduling.counters) and not only what ``gangflow usage`` reads run by run.

The ledger is the one ``gangflow status`` prints (engine.runtime.ledger): the attempt's record, as the GangTask
has just ended it, and its ranks' reports the node agents saved in the run's store, read by an activity on
the GangTask's own task queue (``ATTEMPT_LEDGER``; not a local activity, whose result may reach the workflow a
task later than its marker was recorded, and the signal after it with it: workflows.scheduler ``_look``). The
platform computes it, not the tenant's run: a tenant cannot tell the Scheduler a goodput of its own making.
One activity and one signal per attempt, after its release (the GPUs go back first), however it ended (a
cancelled run's too, as ``gangflow usage`` counts it); one whose ledger cannot be read is not told. Gangs
recorded before this replay without it (``LEDGER_PATCH``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from engine.core.protocol import ATTEMPT_LEDGER, LEDGER_SIGNAL, SCHEDULER_ID
from engine.core.wire import Envelope
from workflows.gang_spec import GangSpec

__all__ = ["LEDGER_PATCH", "tell_ledger"]

#: workflow.patched id: from here on a GangTask tells the Scheduler each ended attempt's ledger
LEDGER_PATCH = "gang-tells-ledger"


async def tell_ledger(spec: GangSpec, envelope: bytes, record: dict[str, Any]) -> dict[str, Any] | None:
    """Read the ended attempt's ledger and signal it to the Scheduler; what was sent (None: nothing)."""
    if not workflow.patched(LEDGER_PATCH):
        return None
    run = Envelope.decode(envelope).run
    request = {"run_id": run.run_id, "call": spec.files_key, "artifacts": run.artifacts, "attempt": record}
    try:
        ledger = await workflow.execute_activity(
            ATTEMPT_LEDGER,
            request,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=2),
            summary=f"{spec.call} attempt {record.get('attempt')}: goodput ledger",
        )
    except ActivityError as exc:  # a count is worth less than the gang: never its failure
        workflow.logger.warning("no goodput ledger for %s: %s", spec.call, exc)
        return None
    if not isinstance(ledger, dict):
        return None
    payload = {
        "tenant": spec.tenant,
        "flavor": record.get("flavor"),
        "allocated_gpu_s": ledger.get("allocated_gpu_s"),
        "productive_gpu_s": ledger.get("productive_gpu_s"),
        "badput": ledger.get("badput"),
    }
    try:
        await workflow.get_external_workflow_handle(SCHEDULER_ID).signal(LEDGER_SIGNAL, payload)
    except Exception as exc:  # no Scheduler now: the attempt goes uncounted, the gang goes on
        workflow.logger.warning("could not tell the Scheduler the goodput ledger of %s: %s", spec.call, exc)
        return None
    return payload
