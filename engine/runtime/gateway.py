"""A dev-only authorizing gateway in front of ``temporal server start-dev``: Temporal's JWT semantics, tested here.

DEV ONLY. ``start-dev`` has no authorizer (any caller, with any token or none, can read and cancel every
namespace's workflows), and no package reachable here ships the full server, whose ``global.authorization``
settings (JWKS key provider, default claim mapper, default authorizer) do this in production. So
``gangflow dev --auth`` puts this gateway in front of the dev server, and tenants' clients connect to it;
the tokens it takes are the ones a real server takes. It is a boundary only where tenants cannot
reach the upstream port: the dev stack's own worker and node agents (the platform) use that port directly,
and as root ``dev --auth`` runs each tenant's worker in a network namespace of its own, whose only way out
is this gateway's Unix socket (engine.runtime.relay); run as a normal user, the upstream port stays open on
127.0.0.1 to every local process.

Every unary RPC of the WorkflowService and the OperatorService (and the gRPC health check) is forwarded as
raw bytes after the check Temporal's authorization interceptor makes (common/authorization in the server),
and a request that starts a workflow has its user stamped (below):

- the bearer token is verified (RS256, a ``kid`` of the JWKS, expiry); a bad one gets PERMISSION_DENIED
  "Request unauthorized." for every call, as the server answers when its claim mapper fails;
- the health check and GetSystemInfo are allowed to anyone (what a client calls on connecting);
- a call whose request names a ``namespace`` needs a role there (or on ``temporal-system``); one that names
  none is cluster-wide and needs a role on ``temporal-system``;
- the role needed is Temporal's (common/api/metadata.go): read for the read-only APIs, admin for the
  namespace and cluster administration APIs and the OperatorService (but ListSearchAttributes), write for
  the rest (polling for tasks and answering them included: Temporal's worker role alone grants nothing);
- a workflow task completion that signals, cancels or starts a child in another namespace needs write there.

Who started a run: a request that starts a workflow (StartWorkflowExecution, SignalWithStartWorkflowExecution, the
starts of an ExecuteMultiOperation, the start_workflow action of CreateSchedule / UpdateSchedule) gets its memo
``gangflow_user`` set to the verified token's subject, replacing what the client wrote, and is forwarded
re-serialized (``stamp_user``). So a tenant's user who only starts runs (``gangflow run``, schedules) cannot pose
as another user. Whoever answers the tenant's workflow tasks (any writer may poll its queue) still builds its
gang requests, so it can name another user of the same tenant, never another tenant (the platform pins that from
the Nexus endpoint): the user orders fair share within a tenant, it authorizes nothing. A production server's
principal attribution (temporalio/temporal PR #9582) records the ``sub`` on history events, not in this memo.

Caller metadata is forwarded except ``authorization``; upstream errors come back with their details.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from types import ModuleType
from typing import Any, NoReturn

import grpc
import grpc.aio
import temporalio.api.operatorservice.v1 as operator_api
import temporalio.api.workflowservice.v1 as workflow_api
from google.protobuf.message import DecodeError, Message
from temporalio.api.common.v1 import Memo, Payload
from temporalio.api.enums.v1 import CommandType

from engine.core.protocol import USER_MEMO, gang_endpoint
from engine.runtime.tokens import ROLES, Claims, TokenError, TokenVerifier

__all__ = ["UNAUTHORIZED", "Gateway", "authorized", "required_role", "stamp_user"]

log = logging.getLogger(__name__)

UNAUTHORIZED = "Request unauthorized."
_WORKFLOW = "temporal.api.workflowservice.v1.WorkflowService"
_OPERATOR = "temporal.api.operatorservice.v1.OperatorService"
_SERVICES: dict[str, ModuleType] = {_WORKFLOW: workflow_api, _OPERATOR: operator_api}
_HEALTH = "/grpc.health.v1.Health/Check"
_ALWAYS_ALLOWED = frozenset({_HEALTH, f"/{_WORKFLOW}/GetSystemInfo"})
# Temporal's own tables (common/api/metadata.go); every other WorkflowService method needs write
_READ_ONLY_NAMES = (
    "CountActivityExecutions CountNexusOperationExecutions CountSchedules CountWorkers CountWorkflowExecutions "
    "DescribeActivityExecution DescribeBatchOperation DescribeDeployment DescribeNamespace "
    "DescribeNexusOperationExecution DescribeSchedule DescribeTaskQueue DescribeWorker DescribeWorkerDeployment "
    "DescribeWorkerDeploymentVersion DescribeWorkflowExecution DescribeWorkflowRule FetchWorkerConfig "
    "GetClusterInfo GetCurrentDeployment GetDeploymentReachability GetSearchAttributes GetSystemInfo "
    "GetWorkerBuildIdCompatibility GetWorkerTaskReachability GetWorkerVersioningRules "
    "GetWorkflowExecutionHistory GetWorkflowExecutionHistoryReverse ListActivityExecutions "
    "ListArchivedWorkflowExecutions ListBatchOperations ListClosedWorkflowExecutions ListDeployments "
    "ListNamespaces ListNexusOperationExecutions ListOpenWorkflowExecutions ListScheduleMatchingTimes "
    "ListSchedules ListTaskQueuePartitions ListWorkerDeployments ListWorkers ListWorkflowExecutions "
    "ListWorkflowRules PollActivityExecution PollNexusOperationExecution PollWorkflowExecutionTimeSkipping "
    "PollWorkflowExecutionUpdate QueryWorkflow ScanWorkflowExecutions "
    "ValidateWorkerDeploymentVersionComputeConfig ListSearchAttributes"
)
_READ_ONLY = frozenset(_READ_ONLY_NAMES.split())
_ADMIN = frozenset({"RegisterNamespace", "UpdateNamespace", "DeprecateNamespace"})
# the commands of a workflow task that act on another namespace, and the API each one amounts to
_CROSS_NAMESPACE = {
    CommandType.COMMAND_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION: (
        "signal_external_workflow_execution_command_attributes",
        "SignalWorkflowExecution",
    ),
    CommandType.COMMAND_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION: (
        "request_cancel_external_workflow_execution_command_attributes",
        "RequestCancelWorkflowExecution",
    ),
    CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION: (
        "start_child_workflow_execution_command_attributes",
        "StartWorkflowExecution",
    ),
}
_MAX_MESSAGE = 128 * 1024 * 1024
_OPTIONS = [("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE)]
# transport headers the upstream channel sets itself
_NOT_FORWARDED = frozenset({"authorization", "user-agent", "content-type", "te", "grpc-timeout", "grpc-encoding"})


def required_role(service: str, method: str) -> int:
    """The role bit a call needs (Temporal's default authorizer compares the caller's roles with it)."""
    if service == _OPERATOR:
        return ROLES["read"] if method in _READ_ONLY else ROLES["admin"]
    if method in _READ_ONLY:
        return ROLES["read"]
    return ROLES["admin"] if method in _ADMIN else ROLES["write"]


def authorized(claims: Claims, full_method: str, request: Message | None) -> bool:
    """Whether Temporal's default authorizer lets ``claims`` make this call (``request``: None for the
    health check, which has no namespace)."""
    if full_method in _ALWAYS_ALLOWED:
        return True
    service, _, method = full_method.strip("/").partition("/")
    has_namespace = request is not None and "namespace" in request.DESCRIPTOR.fields_by_name
    namespace: str | None = getattr(request, "namespace", "") if has_namespace else None
    if claims.role_in(namespace) < required_role(service, method):
        return False
    if isinstance(request, workflow_api.RespondWorkflowTaskCompletedRequest):
        for command in request.commands:
            if command.command_type == CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION:
                # An endpoint acts in the platform namespace as the tenant its target queue names: a tenant's
                # namespace may use its own endpoint only (self-hosted Temporal has no endpoint allowlist of
                # its own: docs/security.md says what a production server needs instead)
                endpoint = command.schedule_nexus_operation_command_attributes.endpoint
                if not namespace or endpoint != gang_endpoint(namespace.removeprefix("gf-")):
                    return False
                continue
            target = _CROSS_NAMESPACE.get(command.command_type)
            if target is None:
                continue
            other = getattr(command, target[0]).namespace
            if other and other != namespace and claims.role_in(other) < required_role(_WORKFLOW, target[1]):
                return False
    return True


def stamp_user(request: Message, subject: str) -> bool:
    """Set ``gangflow_user`` in the memo of each workflow start ``request`` carries to ``subject`` (the verified
    token's), replacing what the client sent; whether that changed the request (False: it starts no workflow,
    or already named ``subject``)."""
    memos: list[Memo] = []
    if isinstance(
        request, workflow_api.StartWorkflowExecutionRequest | workflow_api.SignalWithStartWorkflowExecutionRequest
    ):
        memos.append(request.memo)
    elif isinstance(request, workflow_api.ExecuteMultiOperationRequest):
        memos.extend(op.start_workflow.memo for op in request.operations if op.HasField("start_workflow"))
    elif isinstance(request, workflow_api.CreateScheduleRequest | workflow_api.UpdateScheduleRequest):
        action = request.schedule.action  # only a schedule that starts a workflow (reading sets nothing)
        memos.extend([action.start_workflow.memo] if action.HasField("start_workflow") else [])
    # a JSON string as the default data converter writes it: every worker reads it, an encrypting one too (its
    # codec passes unencrypted payloads through)
    user = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(subject).encode())
    changed = False
    for memo in memos:
        if USER_MEMO not in memo.fields or memo.fields[USER_MEMO] != user:
            memo.fields[USER_MEMO].CopyFrom(user)
            changed = True
    return changed


def _request_type(full_method: str) -> type[Message] | None:
    service, _, method = full_method.strip("/").partition("/")
    module = _SERVICES.get(service)
    found: Any = getattr(module, f"{method}Request", None) if module is not None else None
    return found if isinstance(found, type) and issubclass(found, Message) else None


async def _abort(
    context: grpc.aio.ServicerContext[bytes, bytes], code: grpc.StatusCode, details: str, trailing: Any = ()
) -> NoReturn:
    await context.abort(code, details, trailing)
    raise RuntimeError("unreachable: abort raises")  # tells the type checker so


class Gateway:
    """The gateway on ``host:port`` (0: a free port), forwarding to the dev server at ``upstream``."""

    def __init__(
        self,
        upstream: str,
        verifier: TokenVerifier,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        socket: str | None = None,
    ) -> None:
        """``socket``: a Unix socket to listen on as well (anyone may connect: the gateway is the tenants' way
        in), for tenants' workers in a network namespace of their own (engine.runtime.relay)."""
        self.upstream, self.verifier, self.host, self.port, self.socket = upstream, verifier, host, port, socket
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> Gateway:
        self._channel = grpc.aio.insecure_channel(self.upstream, options=_OPTIONS)
        self._server = grpc.aio.server(options=_OPTIONS)
        self._server.add_generic_rpc_handlers([_Handler(self)])
        self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")
        if self.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)  # a stale one of an earlier run
            self._server.add_insecure_port(f"unix:{self.socket}")
        await self._server.start()
        if self.socket is not None:
            os.chmod(self.socket, 0o666)  # connecting takes write permission: every tenant's user
        return self

    async def stop(self, grace: float = 1.0) -> None:
        server, channel, self._server, self._channel = self._server, self._channel, None, None
        if server is not None:
            await server.stop(grace)
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> Gateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def forward(self, full_method: str, raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        metadata = tuple(context.invocation_metadata() or ())
        tokens = [value for key, value in metadata if key == "authorization"]
        try:
            claims = self.verifier.claims(str(tokens[0]) if tokens else None)
        except TokenError as exc:
            log.info("refused %s: %s", full_method, exc)  # the reason goes to the log, never to the caller
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED, UNAUTHORIZED)
        request_type = _request_type(full_method)
        request = None
        if request_type is not None:
            try:
                request = request_type.FromString(raw)
            except DecodeError:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{full_method}: a malformed request")
        if not authorized(claims, full_method, request):
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED, UNAUTHORIZED)
        if request is not None and stamp_user(request, claims.subject):
            raw = request.SerializeToString()  # unknown fields kept: what the client sent, with its user
        forwarded = tuple(
            (key, value) for key, value in metadata if key not in _NOT_FORWARDED and not key.startswith(":")
        )
        if self._channel is None:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "the gateway is stopping")
        call = self._channel.unary_unary(full_method)
        try:
            response: bytes = await call(raw, metadata=forwarded, timeout=context.time_remaining())
        except grpc.aio.AioRpcError as exc:
            # the trailing metadata carries Temporal's error details (grpc-status-details-bin): the SDK
            # turns them into its typed errors (already started, not found ...)
            await _abort(context, exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ()))
        return response


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc ships no types
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        if method != _HEALTH and _request_type(method) is None:
            return None  # UNIMPLEMENTED: Temporal's authorizer also refuses methods it does not know

        async def call(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            return await self.gateway.forward(method, raw, context)

        return grpc.unary_unary_rpc_method_handler(call)
