"""The commands that run a part of the stack until stopped (``worker``, ``node``, ``codec-server``) or
all of it on this machine (``dev``, and ``demo``, which also runs a pipeline on its throwaway stack)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from engine.artifacts.store import default_artifact_root
from engine.client import Client, load_workflow_file, prepare_run, to_jsonable
from engine.core.definitions import WorkflowDefinition
from engine.core.labels import format_labels
from engine.core.protocol import DEFAULT_TENANT, PLATFORM_NAMESPACE, TASK_QUEUE, TenantRoute, tenant_namespace
from engine.core.resources import parse_memory
from engine.core.wire import Envelope
from engine.errors import GangflowError, InputError
from engine.executor.gpus import detect_gpus, node_labels
from engine.executor.ports import free_port
from engine.executor.process import spawn, stop_processes
from engine.executor.standby import default_warm_modules
from engine.runtime import DevServer, Endpoint, build_worker, connect, ensure_search_attributes, preload
from engine.runtime.codec_server import CodecServer
from engine.runtime.connection import CredentialsRefused
from engine.runtime.encryption import keys_from_env
from engine.runtime.keeper import kept_scheduler
from engine.runtime.metrics import MetricsEndpoint, Source, node_source, scheduler_source, sdk_metrics_port
from engine.runtime.node import DRAIN_TIMEOUT_S, NodeActivities, NodeConfig, run_node
from engine.runtime.platform import artifacts_for, build_gang_workers, ensure_endpoints
from engine.runtime.relay import GATEWAY_SOCKET_ENV, start_relay
from engine.runtime.secrets import SECRETS_DIR_ENV
from engine.scheduling.config import QueueConfig, QueueConfigError

from .auth import dev_auth

if TYPE_CHECKING:
    from engine.runtime.gateway import Gateway
from .common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    endpoint_for,
    follow,
    read_queue_file,
    stop_event,
    until_signalled,
)
from .demo_tenants import TenantsDemo
from .devstacks import dev_node_labels, recorded
from .render import console, err_console, print_json, print_unwrapped, show_failure, show_status
from .secrets import configure_secrets_dir

__all__ = [
    "DEMO_GPUS",
    "DEMO_NODES",
    "add_layout_options",
    "cmd_codec_server",
    "cmd_demo",
    "cmd_dev",
    "cmd_node",
    "cmd_worker",
]

#: the demo stands in for a 2-server cluster with 2 GPUs each
DEMO_NODES, DEMO_GPUS = 2, 2
#: how long the node agents of `gangflow dev` / `demo` get to stop their own ranks (SIGTERM, 5 s, SIGKILL) and exit
_NODE_STOP_GRACE_S = 15.0


async def _connect(endpoint: Endpoint, wait: float = 30.0) -> TemporalClient:
    """Wait for a server that may still be booting (started beside this process), or fail with one line."""
    try:
        return await connect(endpoint, wait=wait)
    except CredentialsRefused as exc:  # says why (an expired token: when), and is not retried
        raise CliError(str(exc)) from None
    except RuntimeError as exc:
        raise CliError(f"cannot reach Temporal at {endpoint.address}: {exc}") from None


def _metrics_sdk(args: argparse.Namespace, host: str) -> int | None:
    """``--metrics-port``, checked before anything starts (a port in use too: the endpoint itself listens once
    the process is connected); with one, the Temporal SDK exports its metrics (on a loopback port of its own,
    returned) for the endpoint to serve beside gangflow's. Must run before the process's first client."""
    port: int | None = args.metrics_port
    if port is None:
        return None
    if not 0 < port < 65536:
        raise CliError(f"--metrics-port must be a port between 1 and 65535, got {port}", EXIT_BAD_INPUT)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds it
        try:
            probe.bind((host, port))
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise CliError(f"--metrics-port {port}: cannot listen on {host}: {why}", EXIT_BAD_INPUT) from None
    return sdk_metrics_port()


@contextlib.asynccontextmanager
async def _metrics(args: argparse.Namespace, host: str, sdk_port: int | None) -> AsyncIterator[list[Source]]:
    """While inside: ``/metrics`` on ``host:--metrics-port``, serving the sources the caller adds to the list
    (none served without the option)."""
    if args.metrics_port is None:
        yield []
        return
    endpoint = MetricsEndpoint(args.metrics_port, host, sdk_port)  # the port was checked free (_metrics_sdk)
    console.print(f"metrics on http://{host}:{endpoint.port}/metrics")
    try:
        yield endpoint.sources
    finally:
        endpoint.stop()


@dataclass(frozen=True)
class _Platform:
    """``gangflow worker --platform``: the Nexus handlers for these tenants, with the roots pinned for them."""

    tenants: tuple[str, ...]
    artifacts: Callable[[str], str]


async def _serve(
    temporal: TemporalClient,
    modules: Sequence[str] = (),
    task_queue: str = TASK_QUEUE,
    ready: Callable[[], Awaitable[None]] | None = None,
    *,
    route: TenantRoute | None = None,
    platform: _Platform | None = None,
    stopping: Callable[[], object] | None = None,
) -> None:
    """Run a worker until SIGINT / SIGTERM; ``ready`` runs once the worker polls (what needs one of its
    workflows to answer, such as the Scheduler taking a queue configuration); ``stopping`` as soon as the signal
    comes, before the worker's own graceful shutdown. A worker that is not a tenant's starts the Scheduler before
    it polls and keeps it running (engine.runtime.keeper)."""
    await ensure_search_attributes(temporal)
    preload(modules)
    workers = [build_worker(temporal, task_queue=task_queue, route=route)]
    if platform is not None:
        await ensure_endpoints(temporal, platform.tenants)
        workers += build_gang_workers(temporal, platform.tenants, platform.artifacts)
    async with contextlib.AsyncExitStack() as running:
        if route is None:  # the worker of the Scheduler's queue keeps it running (a tenant's worker has none)
            await running.enter_async_context(kept_scheduler(temporal, task_queue))
        for worker in workers:
            await running.enter_async_context(worker)
        stopped = stop_event()
        if ready is not None:
            await ready()
        await stopped.wait()
        if stopping is not None:
            stopping()


def add_layout_options(p: argparse.ArgumentParser) -> None:
    """``gangflow worker``'s role in the isolated layout (docs/security.md): a tenant's, or the platform's."""
    p.add_argument(
        "--artifacts",
        help="with --tenant: the tenant's artifact root, pinned over what its clients name "
        "(default $GANGFLOW_ARTIFACTS)",
    )
    p.add_argument(
        "--platform",
        action="store_true",
        help="the platform's worker (namespace gangflow-system): the Scheduler, the gangs, and a Nexus handler "
        "per tenant of --tenants",
    )
    p.add_argument("--tenants", metavar="A,B", help="with --platform: the tenants whose endpoints it serves")
    p.add_argument(
        "--tenant-artifacts",
        metavar="TEMPLATE",
        help="with --platform: each tenant's artifact root, e.g. 's3://bucket/{tenant}' (default "
        "$GANGFLOW_ARTIFACTS/{tenant})",
    )


def _worker_layout(args: argparse.Namespace) -> tuple[TenantRoute | None, _Platform | None]:
    """``--tenant`` (a tenant's worker) or ``--platform`` (the platform's), checked before anything connects."""
    if args.tenant and args.platform:
        raise CliError("--tenant and --platform exclude each other: a worker serves one namespace", EXIT_BAD_INPUT)
    if (args.tenants or args.tenant_artifacts) and not args.platform:
        raise CliError("--tenants and --tenant-artifacts go with --platform", EXIT_BAD_INPUT)
    try:
        if args.tenant:
            tenant_namespace(args.tenant)
            return TenantRoute(args.tenant, args.artifacts or default_artifact_root()), None
        if args.platform:
            tenants = tuple(t for t in (args.tenants or "").split(",") if t)
            if not tenants:
                raise CliError("--platform needs --tenants a,b,... (one Nexus handler per tenant)", EXIT_BAD_INPUT)
            for tenant in tenants:
                tenant_namespace(tenant)
            return None, _Platform(
                tenants, artifacts_for(args.tenant_artifacts or f"{default_artifact_root()}/{{tenant}}")
            )
    except (ValueError, GangflowError) as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    return None, None


async def cmd_worker(args: argparse.Namespace) -> int:
    route, platform = _worker_layout(args)
    sdk_port = _metrics_sdk(args, "0.0.0.0")
    configure_secrets_dir(args, route.tenant if route else None)
    if args.namespace is None:  # a role names its namespace (GANGFLOW_NAMESPACE is a client's, maybe a template)
        args.namespace = tenant_namespace(route.tenant) if route else PLATFORM_NAMESPACE if platform else None
    endpoint = endpoint_for(args)
    relay = None
    if route is not None and os.environ.get(GATEWAY_SOCKET_ENV):
        # in a network namespace of its own (dev --auth as root): the gateway's socket is the only way out
        relay, address = await start_relay(os.environ[GATEWAY_SOCKET_ENV])
        endpoint = dataclasses.replace(endpoint, address=address)
    # relayed: started by dev --auth before its gateway, on a loaded machine it may wait longer for it
    temporal = await _connect(endpoint, wait=30.0 if relay is None else 120.0)
    role = f", tenant {route.tenant}, artifacts {route.artifacts}" if route else ""
    role += f", platform for {', '.join(platform.tenants)}" if platform else ""
    console.print(
        f"gangflow worker on {endpoint.address} (namespace {endpoint.namespace}, queue {args.task_queue}{role})"
    )
    try:
        async with _metrics(args, "0.0.0.0", sdk_port) as sources:
            if route is None:  # the Scheduler's worker (a tenant's cannot read the platform's namespace)
                sources.append(scheduler_source(temporal))
            await _serve(temporal, args.load, args.task_queue, route=route, platform=platform)
    finally:
        if relay is not None:
            relay.close()
    return EXIT_OK


def _host_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _total_memory() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def _node_config(args: argparse.Namespace) -> NodeConfig:
    gpus = detect_gpus() if args.gpus is None else args.gpus
    mem = parse_memory(args.mem) if args.mem else _total_memory()
    if args.standby is not None and args.standby < 0:
        raise ValueError(f"--standby must be 0 or more, got {args.standby}")
    if args.drain_timeout is not None and not 0 <= args.drain_timeout <= 86400:
        raise ValueError(f"--drain-timeout must be between 0 and 86400 seconds, got {args.drain_timeout:g}")
    return NodeConfig(
        node_id=args.node_id,
        address=args.advertise_addr or _host_address(),
        gpus=gpus,
        cpus=float(args.cpus or os.cpu_count() or 1),
        mem=mem,
        scheduler_queue=args.task_queue,
        standby=max(1, gpus) if args.standby is None else args.standby,
        warm=default_warm_modules() if args.warm is None else tuple(m for m in args.warm.split(",") if m),
        drain_timeout_s=DRAIN_TIMEOUT_S if args.drain_timeout is None else args.drain_timeout,
        labels=node_labels(args.labels),
    )


async def cmd_node(args: argparse.Namespace) -> int:
    configure_secrets_dir(args)
    try:
        config = _node_config(args)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    sdk_port = _metrics_sdk(args, "0.0.0.0")
    endpoint = endpoint_for(args)
    if args.advertise_addr is None and config.address.startswith("127."):
        # e.g. Debian maps the host name to 127.0.1.1: fine on one machine, unreachable from any other
        err_console.print(
            f"[yellow]warning:[/] this node advertises {config.address}, a loopback address: ranks on other "
            "machines cannot reach it; pass --advertise-addr with this machine's cluster IP"
        )
    temporal = await _connect(endpoint)
    console.print(
        f"gangflow node {config.node_id} on {endpoint.address}: {config.gpus} GPU(s), {config.cpus:g} CPU(s), "
        f"reachable at {config.address}; queue node/{config.node_id}; {config.standby} standby rank process(es)"
        + (f" with {', '.join(config.warm)} imported" if config.standby and config.warm else "")
        + (f"; labels {format_labels(config.labels)}" if config.labels else "")
    )
    activities = NodeActivities(config)
    async with _metrics(args, "0.0.0.0", sdk_port) as sources:
        sources.append(node_source(activities))
        await run_node(temporal, config, stop_event(), activities)
    return EXIT_OK


async def cmd_codec_server(args: argparse.Namespace) -> int:
    try:
        keys = keys_from_env()
        if args.jwks is not None and not Path(args.jwks).is_file():
            raise InputError(f"--jwks {args.jwks}: no such file")
        codec = CodecServer(args.host, args.port, origins=tuple(args.allow_origin), keys=keys, jwks=args.jwks)
    except (InputError, ValueError) as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    codec.start()
    console.print(
        f"codec endpoint on {codec.url}: set it as the Temporal UI's codec endpoint (TEMPORAL_CODEC_ENDPOINT)"
    )
    try:
        await until_signalled()
    finally:
        codec.stop()
    return EXIT_OK


def _spawn_nodes(
    address: str, count: int, gpus: int, state: Path, namespace: str = "default", labels: Sequence[str] = ()
) -> list[subprocess.Popen[bytes]]:
    """Node agents beside the dev worker, each a real ``gangflow node`` process standing in for a server. They
    stop at once (no drain): the whole stack is stopping, its worker first, so no Scheduler would answer. The
    server's address goes in their environment (readable by their own user only), not on their command line
    (``/proc/<pid>/cmdline`` is anyone's to read); their logs are 0600."""
    node = [sys.executable, "-m", "engine.cli", "node", "--gpus", str(gpus), "--namespace", namespace]
    node += ["--drain-timeout", "0"]
    env = {**os.environ, "GANGFLOW_ADDRESS": address}
    nodes = []
    for i in range(count):
        log = state / f"node-{i}.log"
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        own = ["--labels", labels[i]] if i < len(labels) and labels[i] else []
        nodes.append(spawn([*node, "--node-id", f"node-{i}", "--advertise-addr", "127.0.0.1", *own], log=log, env=env))
    return nodes


async def _apply_queues(temporal: TemporalClient, file: str, config: QueueConfig) -> None:
    """``dev --queues``: hand the (already validated) queue configuration to the Scheduler."""
    try:
        applied = await Client(temporal).apply_queues(config)
    except QueueConfigError as exc:  # the Scheduler refused it: nothing was applied
        raise CliError(f"{file}: not applied: {exc}", EXIT_BAD_INPUT) from None
    except GangflowError as exc:
        raise CliError(f"{file}: not applied: {exc}") from None
    tenants = ", ".join(sorted(applied.get("tenants") or {}))
    console.print(f"queue configuration {file} applied: tenants {tenants}; see 'gangflow queues show'")


#: the banner's last line: what to try first
_TRY = "  gangflow run examples/quickstart.py:pipeline"


async def cmd_dev(args: argparse.Namespace) -> int:
    state = Path(args.state_dir).resolve()
    # what `gangflow secret set TENANT NAME` writes: this worker, its tenants' workers and node agents read it
    os.environ.setdefault(SECRETS_DIR_ENV, str(state / "secrets"))
    # --auth runs gRPC's own threads here (the gateway): a child forked while they run can hang in gRPC's
    # fork handlers before it reaches exec. The helpers are started before the gateway, and without handlers.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    # checked before anything starts: a bad file is bad input (exit 2), not a stack that half came up
    queues = read_queue_file(args.queues) if args.queues else None
    labels = dev_node_labels(args.node_labels, args.nodes)
    auth = dev_auth(args, queues)
    sdk_port = _metrics_sdk(args, "127.0.0.1")
    server = DevServer(
        state,
        # --auth: clients reach Temporal through the gateway on --port, the platform directly on another
        port=None if auth else args.port,
        ui_port=args.ui_port,
        # --auth: no Web UI, which would show every namespace to anyone without a token (docs/security.md)
        ui=not args.headless and auth is None,
        namespaces=auth.namespaces if auth else (),
    )
    # the codec endpoint answers the stack's own Web UI only, not any page served from this machine
    ui_origins = (server.ui_url, server.ui_url.replace("127.0.0.1", "localhost"))
    codec = CodecServer(origins=ui_origins if server.ui else ()).start()
    server.codec_endpoint = codec.url
    try:
        server.start()
        if auth:
            auth.lock_down(state)
    except (OSError, RuntimeError, TimeoutError) as exc:
        codec.stop()
        server.stop()
        raise CliError(str(exc)) from None
    # --auth is the isolated layout: the platform (this process's worker, the node agents) in gangflow-system,
    # one worker per tenant in its own namespace, reaching Temporal through the gateway with its own token
    namespace = PLATFORM_NAMESPACE if auth else "default"
    gateway_port = (args.port or free_port()) if auth else 0
    helpers: list[subprocess.Popen[bytes]] = []
    stopped: list[asyncio.Future[None]] = []  # the helpers' stop, once the signal came
    gateway: Gateway | None = None
    try:
        if auth:  # the port clients use first: the gateway's; Temporal's own is the platform's
            print_unwrapped(
                f"gangflow dev --auth: clients connect to the gateway on 127.0.0.1:{gateway_port}; Temporal on "
                f"{server.address}, the platform's way in (the Scheduler and gangs in gangflow-system, the node agents)"
            )
        else:
            console.print(
                f"[bold]gangflow dev[/]: Temporal on {server.address}"
                + (f", Web UI {server.ui_url}" if server.ui else "")
            )
        if auth and not args.headless:
            print_unwrapped("  no Web UI with --auth: it would show every tenant's namespace without a token")
        print_unwrapped(f"state in {state}; in another shell:")
        if auth:
            auth.show(f"127.0.0.1:{gateway_port}", state)
        else:
            # one line however narrow the terminal: a wrapped second line would be pasted as a separate command
            print_unwrapped(f"  export GANGFLOW_ADDRESS={server.address} GANGFLOW_ARTIFACTS={state / 'artifacts'}")
        helpers += _spawn_nodes(server.address, args.nodes, args.gpus_per_node, state, namespace, labels)
        if args.nodes:
            console.print(
                f"{args.nodes} node agent(s) with {args.gpus_per_node} GPU slot(s) each; see 'gangflow cluster'"
            )
        temporal = await _connect(Endpoint.resolve(server.address, namespace))
        platform = None
        if auth:
            # registering search attributes takes an admin: the platform does it for the tenants' namespaces
            for tenant_ns in auth.namespaces:
                await ensure_search_attributes(await _connect(Endpoint.resolve(server.address, tenant_ns)))
            helpers += auth.spawn_workers(f"127.0.0.1:{gateway_port}", state)  # they wait for the gateway
            gateway = await auth.start_gateway(server.address, gateway_port)
            platform = _Platform(auth.tenants, artifacts_for(f"{state / 'artifacts'}/{{tenant}}"))

        async def ready() -> None:
            if queues is not None:
                await _apply_queues(temporal, args.queues, queues)
            if args.nodes:  # a gang submitted before this line would wait for them: say ready once it need not
                await _wait_for_nodes(Client(temporal), args.nodes)
            console.print(_TRY)  # the ready line: the Scheduler runs, the agents registered, tenants can connect

        def stopping() -> None:
            # SIGTERM reaches this process alone (Ctrl-C reaches the terminal's whole process group): the
            # helpers stop at once, beside this worker's own shutdown, not one after the other (over 27 s)
            stopped.append(asyncio.ensure_future(asyncio.to_thread(stop_processes, helpers, _NODE_STOP_GRACE_S)))

        # where `gangflow secret set` / `auth token` without --state-dir find this stack
        with recorded(f"127.0.0.1:{gateway_port}" if auth else server.address, server.address, state):
            async with _metrics(args, "127.0.0.1", sdk_port) as sources:
                sources.append(scheduler_source(temporal))
                await _serve(temporal, ready=ready, platform=platform, stopping=stopping)
    finally:
        # in a thread: the tenants' workers shut down through the gateway, which runs on this event loop (a
        # blocking wait here held their last calls until the grace ran out and they were killed)
        await (stopped[0] if stopped else asyncio.to_thread(stop_processes, helpers, _NODE_STOP_GRACE_S))
        if gateway is not None:
            await gateway.stop()
        server.stop()
        codec.stop()
    return EXIT_OK


def _example(name: str) -> Path:
    """An example file: the one under the current directory (a checkout), else the package's own."""
    here = Path.cwd() / "examples" / name
    return here if here.exists() else Path(__file__).resolve().parents[2] / "examples" / name


def _default_demo_file() -> str:
    return f"{_example('ddp_pipeline.py')}:pipeline"


async def _wait_for_nodes(client: Client, count: int, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.suppress(RPCError, TemporalError):
            if (await client.queue())["totals"]["alive_nodes"] >= count:
                return
        if loop.time() > deadline:
            raise CliError(f"{count} node agent(s) did not register within {timeout:.0f} s")
        await asyncio.sleep(0.2)


#: what a demo runs on its stack once the node agents are up: (client, Web UI address or None) -> exit code
_Play = Callable[[Client, str | None], Awaitable[int]]


async def cmd_demo(args: argparse.Namespace) -> int:
    if args.tenants and args.file:
        raise CliError(
            "--tenants runs its own pipelines (examples/multitenant.py as team-a and team-b): it takes no --file",
            EXIT_BAD_INPUT,
        )
    if args.tenants and args.nodes != DEMO_NODES:
        raise CliError(
            f"--tenants needs {DEMO_NODES} node agents (the 4 GPU slots examples/queues.yaml shares): "
            f"leave out --nodes (got {args.nodes})",
            EXIT_BAD_INPUT,
        )
    state = Path(tempfile.mkdtemp(prefix="gangflow-demo-"))
    try:
        artifacts, play = _prepare_demo(args, str(state / "artifacts"))
        return await _demo_stack(args, state, artifacts, play)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _prepare_demo(args: argparse.Namespace, artifacts: str) -> tuple[str, _Play]:
    """Validate and pack what the demo runs, before anything starts (bad input: exit 2)."""
    if args.tenants:
        tenants = TenantsDemo.prepare(_example("queues.yaml"), _example("multitenant.py"), artifacts)
        return tenants.artifacts, tenants.play
    try:
        defn = load_workflow_file(args.file or _default_demo_file())
        # the throwaway stack has no queue configuration: its only tenant is the default (whatever
        # GANGFLOW_TENANT says for the user's own cluster)
        defn, envelope = prepare_run(defn, {}, artifacts=artifacts, tenant=DEFAULT_TENANT)
    except GangflowError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None

    async def play(client: Client, ui_url: str | None) -> int:
        return await _demo_run(client, ui_url, defn, envelope)

    return envelope.run.artifacts, play


async def _demo_stack(args: argparse.Namespace, state: Path, artifacts: str, play: _Play) -> int:
    codec = CodecServer().start()
    server = DevServer(state, ui=not args.headless, codec_endpoint=codec.url).start()
    nodes = _spawn_nodes(server.address, args.nodes, DEMO_GPUS, state)
    try:
        temporal = await connect(Endpoint.resolve(server.address, "default"))
        client = Client(temporal, artifacts)
        async with kept_scheduler(temporal), build_worker(temporal):
            console.print(
                f"[bold]gangflow demo[/]: Temporal on {server.address}, {args.nodes} node agent(s) × {DEMO_GPUS} "
                f"GPU slot(s), state in {state}"
            )
            if args.nodes:
                await _wait_for_nodes(client, args.nodes)
            code = await play(client, None if args.headless else server.ui_url)
            if args.keep:
                console.print(f"stack left up: GANGFLOW_ADDRESS={server.address}; Ctrl-C to stop")
                await until_signalled()
            return code
    finally:
        stop_processes(nodes, _NODE_STOP_GRACE_S)
        server.stop()
        codec.stop()


async def _demo_run(client: Client, ui_url: str | None, defn: WorkflowDefinition, envelope: Envelope) -> int:
    run_id = await client.start_prepared(defn, envelope)
    if ui_url:
        console.print(f"watch it: {ui_url}/namespaces/default/workflows/{run_id}")
    try:
        data = await follow(client, run_id, quiet=False)
    except WorkflowFailureError:
        _, error = await client.tasks(run_id)
        show_failure(run_id, error)
        return EXIT_FAILED
    show_status(await client.status(run_id), result=False)
    # the demo's stack, its artifact store among it, is deleted as the demo exits: its last lines name the
    # result's files (name, size) but not where they were
    print_json(_forgotten(to_jsonable(data)))
    console.print(
        "the demo's throwaway stack and its files are deleted as it exits; a run on 'gangflow dev' keeps them",
        soft_wrap=True,
    )
    return EXIT_OK


def _forgotten(wire: Any) -> Any:
    """Wire data with each File / Directory reference as its kind, name and size only (its store is gone)."""
    if isinstance(wire, dict):
        if wire.get("kind") in ("file", "dir") and "uri" in wire and "sha256" in wire:
            kind = "File" if wire["kind"] == "file" else "Directory"
            return f"{kind} {wire.get('name')} ({wire.get('size')} bytes)"
        return {k: _forgotten(v) for k, v in wire.items()}
    if isinstance(wire, list):
        return [_forgotten(v) for v in wire]
    return wire
