"""Secrets on the dev stack: ``gangflow secret set TENANT NAME`` (the value from stdin) and ``gangflow secret
list TENANT``, and the ``--secrets-dir`` option of ``gangflow worker`` and ``gangflow node``.

The dev stack keeps a tenant's secrets as files ``<state>/secrets/<tenant>/<name>`` (folder 0700, file 0600),
the layout a Kubernetes Secret of the tenant mounted at ``<secrets dir>/<tenant>`` also gives; its worker(s)
and node agents resolve them from there (engine/runtime/secrets.py). No command ever prints a value.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engine.core.protocol import tenant_namespace
from engine.core.secrets import SECRET_NAME, check_secret_name

from .common import EXIT_BAD_INPUT, EXIT_OK, CliError
from .devstacks import state_dir_for
from .render import console

__all__ = ["add_secret_parser", "add_secrets_dir_option", "cmd_secret", "configure_secrets_dir"]

#: engine/runtime/tokens.py's tenant names (a path component here: nothing else may pass)
#: a secret is a token or a key, not a data set: anything larger is a mistake (a file piped in by accident)
_MAX_VALUE = 1024 * 1024


def add_secrets_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secrets-dir",
        metavar="DIR",
        help="resolve tasks' secrets from DIR/<tenant>/<name> (default $GANGFLOW_SECRETS_DIR; the dev stack's is "
        "<state>/secrets)",
    )
    parser.add_argument(
        "--tenant-secrets",
        metavar="DIR",
        help="with worker --tenant: the tenant's own secrets, DIR/<name> (a folder of that tenant's only, as the "
        "isolated layout gives each tenant's worker)",
    )


def _check_folder(option: str, folder: str | None) -> str | None:
    if folder is not None and (not folder or (os.path.exists(folder) and not os.path.isdir(folder))):
        raise CliError(f"{option} {folder!r} is not a directory", EXIT_BAD_INPUT)
    return os.path.abspath(folder) if folder else None


def configure_secrets_dir(args: argparse.Namespace, tenant: str | None = None) -> None:
    """``--secrets-dir`` / ``--tenant-secrets`` for this process (a worker or node agent), checked before
    anything starts; ``tenant``: the one tenant a tenant's worker serves (its environment holds that tenant's
    secrets, and ``--tenant-secrets`` its folder)."""
    from engine.runtime.secrets import configure

    folder = _check_folder("--secrets-dir", getattr(args, "secrets_dir", None))
    own = _check_folder("--tenant-secrets", getattr(args, "tenant_secrets", None))
    if own is not None and tenant is None:
        raise CliError("--tenant-secrets goes with worker --tenant (a folder of that tenant's)", EXIT_BAD_INPUT)
    configure(folder, tenant, own)


def add_secret_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "secret",
        help="set or list a tenant's secrets on the dev stack (values are never printed)",
        usage="gangflow secret set TENANT NAME [--state-dir DIR] < VALUE | "
        "gangflow secret list TENANT [--state-dir DIR]",
        allow_abbrev=False,
    )
    p.add_argument("action", choices=("set", "list"), help="set: NAME's value from stdin; list: the names only")
    p.add_argument("tenant", metavar="TENANT", help="whose secret (a tenant of the queue configuration)")
    p.add_argument("name", nargs="?", metavar="NAME", help="with set: the secret's name")
    p.add_argument(
        "--state-dir",
        help="the dev stack's state dir (default: that of the running 'gangflow dev' $GANGFLOW_ADDRESS names, or "
        "of the only one running)",
    )
    p.add_argument(
        "--api-key",
        metavar="TOKEN",
        help="on a dev --auth stack: the tenant's token (default $GANGFLOW_API_KEY; gangflow auth token TENANT)",
    )


def _tenant_folder(args: argparse.Namespace) -> Path:
    tenant = str(args.tenant)
    try:
        namespace = tenant_namespace(tenant)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    args.state_dir = state_dir_for(args.state_dir, f"gangflow secret {args.action}")
    _check_token(args, namespace)
    return Path(args.state_dir) / "secrets" / tenant


def _check_token(args: argparse.Namespace, namespace: str) -> None:
    """On a ``dev --auth`` stack (its state dir has a JWKS) a tenant's secrets take the tenant's token: write
    to set, read to list. A stack without --auth keeps no boundary between tenants to check."""
    from .auth import auth_state

    jwks = auth_state(args.state_dir)
    if jwks is None:
        return
    token = args.api_key or os.environ.get("GANGFLOW_API_KEY")
    if not token:
        raise CliError(
            f"secret {args.action} on a dev --auth stack needs {args.tenant}'s token: --api-key or "
            f"$GANGFLOW_API_KEY (gangflow auth token {args.tenant} --state-dir {args.state_dir})",
            EXIT_BAD_INPUT,
        )
    from engine.runtime.tokens import ROLES, TokenError, TokenVerifier

    need = ROLES["write"] if args.action == "set" else ROLES["read"]
    try:
        roles = TokenVerifier.from_file(jwks).claims(f"Bearer {token}").role_in(namespace)
    except TokenError as exc:
        raise CliError(f"secret {args.action}: the token was refused ({exc})", EXIT_BAD_INPUT) from None
    if roles < need:
        raise CliError(
            f"secret {args.action}: the token gives no {'write' if need == ROLES['write'] else 'read'} role on "
            f"{namespace} (tenant {args.tenant}'s namespace)",
            EXIT_BAD_INPUT,
        )


async def cmd_secret(args: argparse.Namespace) -> int:
    folder = _tenant_folder(args)
    if args.action == "list":
        if args.name is not None:
            raise CliError("secret list takes TENANT only", EXIT_BAD_INPUT)
        # secret files only: not a half-written value, nor a mounted Kubernetes Secret's ..data link
        names = sorted(p.name for p in folder.iterdir() if SECRET_NAME.fullmatch(p.name)) if folder.is_dir() else []
        for name in names:
            console.print(name, markup=False, highlight=False)
        return EXIT_OK
    if args.name is None:
        raise CliError("secret set needs TENANT and NAME (the value comes from stdin)", EXIT_BAD_INPUT)
    try:
        name = check_secret_name(args.name)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    raw = sys.stdin.buffer.read(_MAX_VALUE + 1)
    if len(raw) > _MAX_VALUE:
        raise CliError(f"the value of secret {name!r} is larger than {_MAX_VALUE} bytes", EXIT_BAD_INPUT)
    try:
        value = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")  # what `echo VALUE |` adds
    except UnicodeDecodeError:
        raise CliError(f"the value of secret {name!r} is not UTF-8 text", EXIT_BAD_INPUT) from None
    if not value:
        raise CliError(f"the value of secret {name!r} is empty (it is read from stdin)", EXIT_BAD_INPUT)
    from .auth import tenant_owner

    # as root on a dev --auth stack, the tenant's folder and files are its own user's (its worker runs as that
    # user), the folder of all tenants only traversable: no tenant lists or reads another's
    owner = tenant_owner(args.state_dir, args.tenant)
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder.parent, 0o700 if owner is None else 0o711)
    os.chmod(folder, 0o700)
    # a new file, then a rename: a reader never sees half a value, and the mode is 0600 from the start
    tmp = folder / f".{name}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    if owner is not None:
        os.chown(tmp, owner, owner)
        os.chown(folder, owner, owner)
    os.replace(tmp, folder / name)
    console.print(f"secret {name} set for tenant {args.tenant} ({folder / name})", markup=False, highlight=False)
    return EXIT_OK
