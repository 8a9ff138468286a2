"""Prometheus metrics: ``--metrics-port N`` on ``gangflow worker``, ``gangflow node`` and ``gangflow dev``.

What a platform team graphs and alerts on, in Prometheus's text format on ``/metrics`` (``prometheus_client``
serves it, in a thread of the process). The names follow Prometheus's conventions with a ``gangflow_`` prefix,
and Kueue's words where Kueue has the same thing (``nominal_quota``, ``resource_usage``, ``pending``,
``admitted_active``), with gangflow's *tenant* and *gang* where Kueue says cluster queue and workload:

* the platform's worker (the one that keeps the Scheduler running) asks the Scheduler at each scrape for its
  ``queues`` and ``describe`` views: per tenant (and flavor) its nominal quota, usage, borrowed and lent
  resources, per tenant its pending and running gangs and fair share; per node its GPUs, allocated GPUs, whether
  it is alive, drained and sandboxed; since the cluster began (engine.scheduling.counters, carried across
  continue-as-new), admissions, preemptions by cause, the admission wait (``gangflow_admission_wait_seconds``, a
  histogram), gang restarts by cause and the ended attempts' GPU-seconds by goodput cause;
  ``gangflow_scheduler_up`` says whether the Scheduler answered (0: every other family is absent, not zero: an
  alert on ``gangflow_scheduler_up == 0`` is the one to write);
* a node agent says what it runs itself: its GPUs, the gang attempts running there, whether it holds its
  lease, whether it sandboxes;
* both add the Temporal SDK's own metrics (``temporal_*``: workflow and activity task latencies, poll
  failures, sticky cache), which the SDK exports on a loopback port of its own: the scrape reads them from
  there and serves them beside gangflow's, so one target per process is enough.

Goodput comes from the same counters: each GangTask tells the Scheduler the goodput ledger of each attempt
once it ended (workflows.gang_ledger), so ``gangflow_gpu_seconds_total{tenant,flavor,cause}`` and
``gangflow_goodput_ratio{tenant}`` cover every ended attempt in the cluster; ``gangflow usage`` reads the same
ledgers run by run.

A scrape is answered from the process's event loop (the Scheduler's views are two queries); one that takes
longer than ``SCRAPE_TIMEOUT_S`` or fails answers what it has, with ``gangflow_scheduler_up 0``. Nothing is
kept between scrapes: the Scheduler's state is the one source of truth, and Prometheus keeps the history.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from engine.core.protocol import DESCRIBE_QUERY, QUEUES_QUERY, SCHEDULER_ID
from engine.executor.ports import free_port

if TYPE_CHECKING:
    from engine.runtime.node import NodeActivities

__all__ = [
    "SCRAPE_TIMEOUT_S",
    "MetricsEndpoint",
    "Source",
    "node_source",
    "scheduler_families",
    "scheduler_source",
    "sdk_metrics_port",
]

log = logging.getLogger("gangflow.metrics")

#: a scrape waits this long for the Scheduler's answer (Prometheus's own default scrape timeout is 10 s)
SCRAPE_TIMEOUT_S = 8.0
#: what one scrape of a process collects: its families, built on its event loop
Source = Callable[[], Awaitable[list[Metric]]]
_RESOURCES = ("gpu", "cpu", "mem")


def sdk_metrics_port() -> int:
    """Make the Temporal SDK export its metrics on a free loopback port, and return it. Must run before the
    process's first Temporal client: the SDK's runtime is made once per process, with its telemetry."""
    port = free_port("127.0.0.1")
    telemetry = TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}"))
    Runtime.set_default(Runtime(telemetry=telemetry), error_if_already_set=False)
    return port


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"gangflow_{name}", doc, labels=labels)


def scheduler_families(queues: dict[str, Any], described: dict[str, Any]) -> list[Metric]:
    """The Scheduler's ``queues`` and ``describe`` views as metric families (pure: the unit tests call it)."""
    per_resource = {  # the view's key -> (metric, help)
        "nominal": ("nominal_quota", "the tenant's nominal quota (gpu: GPUs, cpu: CPUs, mem: bytes; none: unlimited)"),
        "used": ("resource_usage", "what the tenant's running gangs hold"),
        "borrowed": ("borrowed_resources", "what the tenant holds above its nominal quota, from its cohort"),
        "lent": ("lent_resources", "what of the tenant's nominal quota other tenants of its cohort hold"),
    }
    # Kueue's labels: a tenant whose quota names flavors has a sample per flavor (they add up to its whole), one
    # without has its whole under flavor="" (so ``sum by (tenant)`` is the tenant's whole either way)
    labels = ["tenant", "cohort", "flavor", "resource"]
    families = {key: _gauge(f"tenant_{name}", doc, labels) for key, (name, doc) in per_resource.items()}
    pending = _gauge("pending_gangs", "gangs of the tenant waiting for admission", ["tenant"])
    share = _gauge("tenant_fair_share", "the tenant's dominant share over its weight (lowest goes first)", ["tenant"])
    active = _gauge("admitted_active_gangs", "gangs of the tenant admitted and not released", ["tenant"])
    preempting = _gauge("preempting_gangs", "running gangs of the tenant told to leave (preempted)", ["tenant"])
    running: dict[str, int] = {}
    leaving: dict[str, int] = {}
    for gang in described.get("running", []):
        tenant = str(gang.get("tenant"))
        running[tenant] = running.get(tenant, 0) + 1
        leaving[tenant] = leaving.get(tenant, 0) + (1 if gang.get("preempting") else 0)
    for tenant, row in sorted(queues.get("tenants", {}).items()):
        cohort = str(row.get("cohort") or "")
        flavors = row.get("flavors") or {"": row}
        for key, family in families.items():
            for flavor, part in sorted(flavors.items()):
                values = part.get(key) or {}
                for resource in _RESOURCES:
                    value = values.get(resource)
                    if value is not None:
                        family.add_metric([tenant, cohort, flavor, resource], float(value))
        pending.add_metric([tenant], float(row.get("pending", 0)))
        if row.get("share") is not None:
            share.add_metric([tenant], float(row["share"]))
        active.add_metric([tenant], float(running.get(tenant, 0)))
        preempting.add_metric([tenant], float(leaving.get(tenant, 0)))
    node_gpus = _gauge("node_gpus", "GPUs the node offers", ["node"])
    allocated = _gauge("node_allocated_gpus", "GPUs of the node held by gangs", ["node"])
    alive = _gauge("node_alive", "1 while the node's lease lives, 0 once it is lost", ["node"])
    drained = _gauge("node_drained", "1 while an operator (or the stopping agent) has drained the node", ["node"])
    sandboxed = _gauge("node_sandboxed", "1 when the node's agent confines its ranks (runs as root)", ["node"])
    for node in described.get("nodes", []):
        node_id = [str(node.get("node_id"))]
        node_gpus.add_metric(node_id, float(node.get("gpus_total") or 0))
        allocated.add_metric(node_id, float(len(node.get("used_gpu_ids") or [])))
        alive.add_metric(node_id, 1.0 if node.get("alive") else 0.0)
        drained.add_metric(node_id, 1.0 if node.get("drained") else 0.0)
        sandboxed.add_metric(node_id, 1.0 if node.get("sandboxed") else 0.0)
    counters = described.get("counters") or {}
    admitted = CounterMetricFamily(
        "gangflow_admitted_gangs", "gangs of the tenant admitted (each attempt counts)", labels=["tenant"]
    )
    for tenant, count in sorted((counters.get("admitted") or {}).items()):
        admitted.add_metric([str(tenant)], float(count))
    preempted = _per_tenant_cause(
        "gangflow_preempted_gangs",
        "running gangs of the tenant preempted, by cause (reclaim, priority, backfill, defrag, drain)",
        counters.get("preempted"),
    )
    lost = _per_tenant_cause(
        "gangflow_preemption_cost_gpu_seconds",
        "GPU-seconds of work the tenant's preempted gangs were expected to lose (since their last checkpoint, "
        "save, restore and relaunch), by cause",
        counters.get("preemption_cost_gpu_s"),
    )
    restarts = _per_tenant_cause(
        "gangflow_gang_restarts",
        "gang attempts of the tenant that ended early and were followed by another, by cause "
        "(node_lost, preemption, drain, rank_failure)",
        counters.get("restarts"),
    )
    return [
        *families.values(),
        pending,
        share,
        active,
        preempting,
        node_gpus,
        allocated,
        alive,
        drained,
        sandboxed,
        admitted,
        preempted,
        lost,
        _wait_histogram(counters),
        restarts,
        *_goodput(counters),
    ]


def _per_tenant_cause(name: str, doc: str, rows: Any) -> CounterMetricFamily:
    """A counter family from the Scheduler's ``[[tenant, cause, value], ...]`` rows (engine.scheduling.counters)."""
    family = CounterMetricFamily(name, doc, labels=["tenant", "cause"])
    for tenant, cause, value in rows or []:
        family.add_metric([str(tenant), str(cause)], float(value))
    return family


def _goodput(counters: dict[str, Any]) -> list[Metric]:
    """Where the ended attempts' GPU-seconds went, per tenant, flavor and cause (their ledgers, told by their
    GangTasks: engine.scheduling.counters), and each tenant's goodput ratio since the cluster began."""
    spent = CounterMetricFamily(
        "gangflow_gpu_seconds",
        "GPU-seconds the tenant's ended gang attempts held, by flavor and cause: productive, or a badput cause "
        "of the goodput ledger (launch, checkpoint, restore, lost_failure, lost_preemption, lost_drain, hang, idle)",
        labels=["tenant", "flavor", "cause"],
    )
    held: dict[str, float] = {}
    productive: dict[str, float] = {}
    for tenant, flavor, cause, seconds in counters.get("gpu_seconds") or []:
        spent.add_metric([str(tenant), str(flavor), str(cause)], float(seconds))
        held[str(tenant)] = held.get(str(tenant), 0.0) + float(seconds)
        if cause == "productive":
            productive[str(tenant)] = productive.get(str(tenant), 0.0) + float(seconds)
    ratio = _gauge(
        "goodput_ratio",
        "productive over held GPU-seconds of the tenant's ended gang attempts since the cluster began (over a "
        'window: the rate of gangflow_gpu_seconds_total{cause="productive"} over the rate of all of it)',
        ["tenant"],
    )
    for tenant, seconds in sorted(held.items()):
        if seconds > 0:
            ratio.add_metric([tenant], productive.get(tenant, 0.0) / seconds)
    return [spent, ratio]


def _wait_histogram(counters: dict[str, Any]) -> HistogramMetricFamily:
    """Admission wait per tenant (submission to admission, the Scheduler's clock: engine.scheduling.counters),
    from its per-bucket counts (made cumulative here, as Prometheus's ``le`` buckets are)."""
    family = HistogramMetricFamily(
        "gangflow_admission_wait_seconds",
        "how long the tenant's gangs waited from their submission to their admission (each attempt counts)",
        labels=["tenant"],
    )
    bounds = [str(float(b)) for b in counters.get("wait_buckets") or []] + ["+Inf"]  # le="60.0", as the client's
    for tenant, total, counts in counters.get("waits") or []:
        if len(counts) != len(bounds):
            continue  # a view from another version's buckets: not misread
        cumulative = list(itertools.accumulate(int(n) for n in counts))
        family.add_metric([str(tenant)], list(zip(bounds, map(float, cumulative), strict=True)), float(total))
    return family


def scheduler_source(client: Client) -> Source:
    """The platform worker's families: the Scheduler's views, and whether it answered."""

    async def collect() -> list[Metric]:
        up = _gauge("scheduler_up", "1 when the Scheduler answered this scrape's queries", [])
        try:
            handle = client.get_workflow_handle(SCHEDULER_ID)
            queues = await handle.query(QUEUES_QUERY)
            described = await handle.query(DESCRIBE_QUERY)
            families = scheduler_families(queues, described)
        except Exception as exc:  # a scrape says the Scheduler is down, it does not fail
            log.warning("metrics: the Scheduler did not answer: %s", exc)
            up.add_metric([], 0.0)
            return [up]
        up.add_metric([], 1.0)
        return [up, *families]

    return collect


def node_source(activities: NodeActivities) -> Source:
    """A node agent's families: what it runs and holds itself (the Scheduler's view of it is the worker's)."""
    config = activities.config

    async def collect() -> list[Metric]:
        labels = [config.node_id]
        gpus = _gauge("node_agent_gpus", "GPUs this agent offers", ["node"])
        gpus.add_metric(labels, float(config.gpus))
        attempts = _gauge("node_agent_running_attempts", "gang attempts whose ranks run on this node", ["node"])
        attempts.add_metric(labels, float(len(activities.running)))
        lease = _gauge("node_agent_lease_held", "1 while this agent holds its node's lease", ["node"])
        lease.add_metric(labels, 1.0 if activities.lease.held else 0.0)
        sandbox = _gauge("node_agent_sandboxed", "1 when this agent confines its ranks", ["node"])
        sandbox.add_metric(labels, 1.0 if activities.cgroups is not None else 0.0)
        return [gpus, attempts, lease, sandbox]

    return collect


def _sdk_families(port: int | None) -> list[Metric]:
    """The Temporal SDK's metrics, read from its own exporter (empty when it does not answer)."""
    if port is None:
        return []
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as answer:
            text = answer.read().decode()
    except OSError as exc:
        log.warning("metrics: the Temporal SDK's exporter did not answer: %s", exc)
        return []
    return list(text_string_to_metric_families(text))


class _Collector(Collector):
    """Collects on the event loop (where the Temporal client lives) from the HTTP server's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sources: list[Source], sdk_port: int | None) -> None:
        self.loop, self.sources, self.sdk_port = loop, sources, sdk_port

    async def _gather(self) -> list[Metric]:
        families: list[Metric] = []
        for source in self.sources:
            families += await source()
        return families

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(self._gather(), self.loop)
        try:
            yield from future.result(SCRAPE_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            up = _gauge("scheduler_up", "1 when the Scheduler answered this scrape's queries", [])
            up.add_metric([], 0.0)
            yield up
        yield from _sdk_families(self.sdk_port)

    def describe(self) -> Iterable[Metric]:
        return []  # collected per scrape only (registering does not call collect)


class MetricsEndpoint:
    """``/metrics`` on ``host:port``, in a thread of this process, until ``stop``. ``sources`` may be added to
    after the start (the Scheduler's needs the Temporal client, which connects after the port is bound: a port
    in use is refused before anything connects)."""

    def __init__(self, port: int, host: str = "0.0.0.0", sdk_port: int | None = None) -> None:
        from prometheus_client import start_http_server

        self.sources: list[Source] = []
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(asyncio.get_running_loop(), self.sources, sdk_port))
        # OSError (the port is in use, not ours to bind) before anything else starts
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
