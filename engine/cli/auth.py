"""Permissions on the dev stack: ``gangflow dev --auth`` (a namespace and a token per tenant, the authorizing
gateway in front of the dev server) and ``gangflow auth token TENANT``.

The gateway is dev-only (engine/runtime/gateway.py says why); a production server does the same with
Temporal's own authorizer, configured with the JWKS the dev stack writes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.protocol import PLATFORM_NAMESPACE, tenant_namespace
from engine.executor.process import spawn
from engine.scheduling.config import QueueConfig

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError
from .render import print_unwrapped

if TYPE_CHECKING:
    from engine.runtime.gateway import Gateway
    from engine.runtime.tokens import DevKeys

__all__ = ["DevAuth", "add_auth_parser", "cmd_auth", "dev_auth"]

_INSTALL = "pip install 'gangflow[auth]'"
_MAX_TTL_S = 366 * 86400


def _need_extra(what: str) -> None:
    try:
        import cryptography  # noqa: F401
        import grpc  # noqa: F401
        import jwt  # noqa: F401
    except ImportError as exc:
        raise CliError(f"{what} needs {exc.name}: {_INSTALL}", EXIT_BAD_INPUT) from None


def _namespace(tenant: str) -> str:
    try:
        return tenant_namespace(tenant)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None


@dataclass
class DevAuth:
    """What ``gangflow dev --auth`` sets up before the server starts: the key, a token file per tenant."""

    keys: DevKeys
    tenants: tuple[str, ...]
    tokens: Path

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (*(_namespace(t) for t in self.tenants), PLATFORM_NAMESPACE)

    async def start_gateway(self, upstream: str, port: int) -> Gateway:
        from engine.runtime.gateway import Gateway
        from engine.runtime.tokens import TokenVerifier

        try:
            return await Gateway(upstream, TokenVerifier.from_file(self.keys.jwks_file), port=port).start()
        except RuntimeError as exc:  # grpc: the port is taken
            raise CliError(f"the auth gateway cannot listen on port {port}: {exc}") from None

    def show(self, gateway: str, upstream: str, state: Path) -> None:
        first = self.tenants[0]
        print_unwrapped(f"--auth (dev only): the gateway on {gateway} checks Temporal's JWT permissions; as a tenant:")
        # one line: the namespace follows --tenant, the root and the token are the first tenant's
        print_unwrapped(
            f"  export GANGFLOW_ADDRESS={gateway} GANGFLOW_NAMESPACE='gf-{{tenant}}' GANGFLOW_TENANT={first} "
            f"GANGFLOW_ARTIFACTS={state / 'artifacts' / first} GANGFLOW_API_KEY=$(cat {self.tokens / f'{first}.jwt'})"
        )
        print_unwrapped(
            f"  tokens: {self.tokens}/<tenant>.jwt (another: gangflow auth token TENANT [--role read] --state-dir "
            f"{state}); JWKS: {self.keys.jwks_file}"
        )
        print_unwrapped(
            f"  {upstream} is Temporal itself: the platform's way in (the Scheduler and gangs in gangflow-system, "
            "the node agents)"
        )

    def spawn_workers(self, gateway: str, state: Path) -> list[subprocess.Popen[bytes]]:
        """One worker per tenant, in its namespace, through the gateway with the tenant's own token (in the
        environment, not on a command line ``ps`` shows), its artifact root pinned under the state dir."""
        workers = []
        for tenant in self.tenants:
            env = {**os.environ, "GANGFLOW_API_KEY": (self.tokens / f"{tenant}.jwt").read_text().strip()}
            command = [sys.executable, "-m", "engine.cli", "worker", "--tenant", tenant, "--address", gateway]
            command += ["--namespace", _namespace(tenant), "--artifacts", str(state / "artifacts" / tenant)]
            workers.append(spawn(command, log=state / f"worker-{tenant}.log", env=env))
        return workers


def dev_auth(args: argparse.Namespace, queues: QueueConfig | None) -> DevAuth | None:
    """``dev --auth``: checked and prepared before anything starts (exit 2 without the ``auth`` extra)."""
    if not getattr(args, "auth", False):
        return None
    _need_extra("gangflow dev --auth")
    from engine.runtime.tokens import DevKeys

    tenants = tuple(t.name for t in queues.tenants) if queues is not None and queues.tenants else ("default",)
    for tenant in tenants:
        _namespace(tenant)
    keys = DevKeys.load_or_create(args.state_dir)
    tokens = keys.directory / "tokens"
    tokens.mkdir(mode=0o700, exist_ok=True)
    for tenant in tenants:  # fresh each start: a day's validity from now
        path = tokens / f"{tenant}.jwt"
        path.write_text(keys.tenant_token(tenant) + "\n")
        os.chmod(path, 0o600)
    return DevAuth(keys, tenants, tokens)


def add_auth_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "auth",
        help="tokens for the dev stack's tenants (gangflow dev --auth)",
        usage="gangflow auth token TENANT [--role write|read] [--state-dir DIR] [--ttl SECONDS]",
        allow_abbrev=False,
    )
    p.add_argument("action", choices=("token",), help="token: print a token for TENANT's namespace (gf-TENANT)")
    p.add_argument("tenant", metavar="TENANT", help="a tenant of the queue configuration")
    p.add_argument("--role", default="write", help="write (default) or read")
    p.add_argument("--state-dir", default=".gangflow", help="the dev stack's state dir (default .gangflow)")
    p.add_argument("--ttl", type=float, default=None, metavar="SECONDS", help="validity (default 86400, a day)")


async def cmd_auth(args: argparse.Namespace) -> int:
    _need_extra("gangflow auth")
    from engine.runtime.tokens import DEFAULT_TTL_S, DevKeys

    if args.role not in ("write", "read"):
        raise CliError(f"--role {args.role!r}: expected write or read", EXIT_BAD_INPUT)
    ttl = DEFAULT_TTL_S if args.ttl is None else args.ttl
    if not 0 < ttl <= _MAX_TTL_S:
        raise CliError(f"--ttl must be between 1 and {_MAX_TTL_S} seconds, got {ttl:g}", EXIT_BAD_INPUT)
    _namespace(args.tenant)
    try:
        keys = DevKeys.load(args.state_dir)
    except FileNotFoundError as exc:
        raise CliError(
            f"{args.state_dir}: no dev key ({exc.filename}); start 'gangflow dev --auth --state-dir "
            f"{args.state_dir}' once to make it",
            EXIT_BAD_INPUT,
        ) from None
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    # the token alone on stdout: GANGFLOW_API_KEY=$(gangflow auth token team-a)
    print(keys.tenant_token(args.tenant, args.role, ttl))
    return EXIT_OK
