"""Permissions on the dev stack: ``gangflow dev --auth`` (a namespace and a token per tenant, the authorizing
gateway in front of the dev server) and ``gangflow auth token TENANT``.

The gateway is dev-only (engine/runtime/gateway.py says why); a production server does the same with
Temporal's own authorizer, configured with the JWKS the dev stack writes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.protocol import PLATFORM_NAMESPACE, tenant_namespace, tenant_user
from engine.executor.process import spawn
from engine.runtime.connection import CREDENTIAL_ENV
from engine.runtime.relay import GATEWAY_SOCKET_ENV
from engine.runtime.secrets import SECRET_ENV_PREFIX, SECRETS_DIR_ENV
from engine.scheduling.config import QueueConfig

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError
from .devstacks import state_dir_for
from .render import print_unwrapped

if TYPE_CHECKING:
    from engine.runtime.gateway import Gateway
    from engine.runtime.tokens import DevKeys

__all__ = ["DevAuth", "add_auth_parser", "auth_state", "cmd_auth", "dev_auth", "isolated", "tenant_owner"]

_INSTALL = "pip install 'gangflow[auth]'"
_MAX_TTL_S = 366 * 86400
#: Linux's limit on a Unix socket's path (108 bytes with its terminating NUL)
_MAX_SOCKET_PATH = 107


def auth_state(state_dir: str | os.PathLike[str]) -> Path | None:
    """The JWKS of a ``dev --auth`` state dir, None for a stack without --auth."""
    jwks = Path(state_dir).resolve() / "auth" / "jwks.json"
    return jwks if jwks.is_file() else None


def isolated(state_dir: str | os.PathLike[str]) -> bool:
    """Whether this stack keeps tenants apart by OS user: ``dev --auth`` run as root."""
    return os.geteuid() == 0 and auth_state(state_dir) is not None


def tenant_owner(state_dir: str | os.PathLike[str], tenant: str) -> int | None:
    """The uid (and gid) that owns ``tenant``'s folders on an isolated stack, None elsewhere."""
    return tenant_user(tenant).uid if isolated(state_dir) else None


# POSIX ACLs as Linux stores them (the system.posix_acl_* attributes): a version, then (tag, perm, id) entries
_ACL_VERSION, _USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER, _NO_ID = 2, 0x01, 0x02, 0x04, 0x10, 0x20, 0xFFFFFFFF


def _acl(uid: int) -> bytes:
    """Owner and ``uid`` rwx, nobody else anything."""
    entries = [
        (_USER_OBJ, 7, _NO_ID),
        (_USER, 7, uid),
        (_GROUP_OBJ, 0, _NO_ID),
        (_MASK, 7, _NO_ID),
        (_OTHER, 0, _NO_ID),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def _own_folder(path: Path, uid: int, *, inherited: bool = False) -> None:
    """``path`` (made if missing) ``uid``'s, 0700; ``inherited``: also what anyone (a root client) creates in it
    later stays ``uid``'s to read and write, through a default ACL (a tenant's artifact root, which its clients,
    the platform and its own worker all write)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    for folder, _, files in os.walk(path):  # what an earlier run left there too
        for name in (folder, *(os.path.join(folder, f) for f in files)):
            os.lchown(name, uid, uid)
        if inherited:
            os.setxattr(folder, "system.posix_acl_access", _acl(uid))
            os.setxattr(folder, "system.posix_acl_default", _acl(uid))


def _blocked(path: Path) -> Path | None:
    """The highest folder above ``path`` that others may not search (a 0700 home or temporary folder): what
    a tenant's user cannot pass on the way to ``path``. None when nothing blocks it."""
    top = None
    for folder in path.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            top = folder
    return top


#: run as root in the worker's new network and mount namespaces, before it becomes the tenant's user: the
#: loopback up, then ``cover TOP REL...``: TOP replaced by an empty tmpfs, each REL (a path inside it) bound
#: back in from the real TOP (seen meanwhile through a staging folder made in STAGE, outside every TOP)
_ISOLATE = """set -e
ip link set lo up
cover() {
  top=$1; shift
  stage=$(mktemp -d "$STAGE/gangflow-stage.XXXXXX")
  mount --bind "$top" "$stage"
  mount -t tmpfs -o mode=0711,size=1m gangflow "$top"
  for rel; do mkdir -p "$top/$rel"; mount --bind "$stage/$rel" "$top/$rel"; done
  umount -l "$stage"
  rmdir "$stage"
}
"""


def _isolation_script(state: Path, own: Sequence[Path]) -> str:
    """The script that leaves a tenant's worker only ``own`` of ``state`` (the rest under an empty tmpfs), and
    lets it reach the interpreter and its standard library where a private folder (root's home) holds them."""
    covers: dict[Path, list[Path]] = {_blocked(state) or state: list(own)}
    for needed in {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}:
        top = _blocked(needed)
        if top is not None and not any(needed.is_relative_to(t) for t in covers):
            covers.setdefault(top, []).append(needed)
    stage = next(p for p in (Path("/tmp"), Path("/var/tmp")) if not any(p.resolve().is_relative_to(t) for t in covers))
    lines = [_ISOLATE, f"STAGE={shlex.quote(str(stage))}"]
    for top, paths in covers.items():
        lines.append(" ".join(["cover", shlex.quote(str(top)), *(shlex.quote(str(p.relative_to(top))) for p in paths)]))
    lines.append('exec "$@"')
    return "\n".join(lines)


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
    #: the gateway's Unix socket, the only way out of the tenants' workers' network namespaces (as root)
    socket: Path | None = None

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (*(_namespace(t) for t in self.tenants), PLATFORM_NAMESPACE)

    async def start_gateway(self, upstream: str, port: int) -> Gateway:
        from engine.runtime.gateway import Gateway
        from engine.runtime.tokens import TokenVerifier

        try:
            verifier = TokenVerifier.from_file(self.keys.jwks_file)
            socket = str(self.socket) if self.socket is not None else None
            return await Gateway(upstream, verifier, port=port, socket=socket).start()
        except RuntimeError as exc:  # grpc: the port is taken
            raise CliError(f"the auth gateway cannot listen on port {port}: {exc}") from None

    def show(self, gateway: str, state: Path) -> None:
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

    def lock_down(self, state: Path) -> None:
        """As root: the state dir is the platform's (0711, its files 0600 and folders 0700: the signing key, the
        tokens, Temporal's database, the logs), but for each tenant's artifact root, secrets and home, which
        are the tenant's own user's (engine.core.protocol.tenant_user). Not as root: nothing changes (one
        user runs everything; docs/security.md)."""
        if os.geteuid() != 0:
            return
        if len(str(state / "gateway" / "gateway.sock")) > _MAX_SOCKET_PATH:
            raise OSError(f"{state}: too long a path for the gateway's Unix socket; use a shorter --state-dir")
        state.mkdir(parents=True, exist_ok=True)
        os.chmod(state, 0o711)
        shared = {"artifacts", "secrets", "home", "gateway"}
        for entry in state.iterdir():
            if entry.name not in shared and not entry.is_symlink():
                os.chmod(entry, 0o700 if entry.is_dir() else 0o600)
        for name in shared:
            (state / name).mkdir(mode=0o711, exist_ok=True)
            os.chmod(state / name, 0o711)
        (state / "gateway").mkdir(mode=0o711, exist_ok=True)
        os.chmod(state / "gateway", 0o711)
        for tenant in self.tenants:
            uid = tenant_user(tenant).uid
            artifacts, secrets, home = self._folders(state, tenant)
            _own_folder(artifacts, uid, inherited=True)
            _own_folder(secrets, uid)
            _own_folder(home, uid)

    @staticmethod
    def _folders(state: Path, tenant: str) -> tuple[Path, ...]:
        """A tenant's own folders in the state dir: its artifact root, its secrets, its home."""
        return tuple(state / kind / tenant for kind in ("artifacts", "secrets", "home"))

    def spawn_workers(self, gateway: str, state: Path) -> list[subprocess.Popen[bytes]]:
        """One worker per tenant, in its namespace, through the gateway with the tenant's own token (in the
        environment, not on a command line ``ps`` shows), its artifact root pinned under the state dir, its own
        secrets folder, and no other credential or secrets directory. As root, each runs as its tenant's user
        (no capabilities, no new privileges), so its tasks reach only what that user may."""
        workers = []
        for tenant in self.tenants:
            home = state / "home" / tenant
            env = {
                k: v
                for k, v in os.environ.items()
                if k not in (*CREDENTIAL_ENV, SECRETS_DIR_ENV) and not k.startswith(SECRET_ENV_PREFIX)
            }
            env |= {
                "GANGFLOW_API_KEY": (self.tokens / f"{tenant}.jwt").read_text().strip(),
                "HOME": str(home),
                "TMPDIR": str(home),
                "GANGFLOW_CACHE": str(home / "cache"),
            }
            command = [sys.executable, "-m", "engine.cli", "worker", "--tenant", tenant, "--address", gateway]
            command += ["--namespace", _namespace(tenant), "--artifacts", str(state / "artifacts" / tenant)]
            command += ["--tenant-secrets", str(state / "secrets" / tenant)]
            if os.geteuid() == 0:
                user = tenant_user(tenant)
                self.socket = self.socket or state / "gateway" / "gateway.sock"
                env |= {"USER": user.name, "LOGNAME": user.name, GATEWAY_SOCKET_ENV: str(self.socket)}
                # network and mount namespaces of its own, then the tenant's user: its tasks reach no port of
                # this machine (not Temporal's own, not a node agent's), only the gateway's socket, and see of
                # the state dir their tenant's folders only (the rest is under an empty tmpfs)
                script = _isolation_script(state, (self.socket.parent, *self._folders(state, tenant)))
                command = [
                    shutil.which("unshare") or "unshare",
                    "--net",
                    "--mount",
                    "--",
                    "sh",
                    "-c",
                    script,
                    "sh",
                    shutil.which("setpriv") or "setpriv",
                    f"--reuid={user.uid}",
                    f"--regid={user.uid}",
                    "--clear-groups",
                    "--inh-caps=-all",
                    "--no-new-privs",
                    "--pdeathsig=TERM",  # a change of uid clears the parent-death signal: set it again
                    "--",
                    *command,
                ]
            log = state / f"worker-{tenant}.log"
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))  # the platform's to read
            workers.append(spawn(command, log=log, env=env))
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
    p.add_argument(
        "--state-dir",
        help="the dev stack's state dir (default: that of the running 'gangflow dev --auth' $GANGFLOW_ADDRESS "
        "names, or of the only one running)",
    )
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
    args.state_dir = state_dir_for(args.state_dir, "gangflow auth token")
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
