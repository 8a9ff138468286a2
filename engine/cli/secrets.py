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


def configure_secrets_dir(args: argparse.Namespace, tenant: str | None = None) -> None:
    """``--secrets-dir`` for this process (a worker or node agent), checked before anything starts;
    ``tenant``: the one tenant a tenant's worker serves (its environment holds that tenant's secrets)."""
    from engine.runtime.secrets import configure

    folder = getattr(args, "secrets_dir", None)
    if folder is not None and (not folder or (os.path.exists(folder) and not os.path.isdir(folder))):
        raise CliError(f"--secrets-dir {folder!r} is not a directory", EXIT_BAD_INPUT)
    configure(os.path.abspath(folder) if folder else None, tenant)


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
    p.add_argument("--state-dir", default=".gangflow", help="the dev stack's state dir (default .gangflow)")


def _tenant_folder(args: argparse.Namespace) -> Path:
    tenant = str(args.tenant)
    try:
        tenant_namespace(tenant)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_BAD_INPUT) from None
    return Path(args.state_dir) / "secrets" / tenant


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
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder.parent, 0o700)
    os.chmod(folder, 0o700)
    # a new file, then a rename: a reader never sees half a value, and the mode is 0600 from the start
    tmp = folder / f".{name}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    os.replace(tmp, folder / name)
    console.print(f"secret {name} set for tenant {args.tenant} ({folder / name})", markup=False, highlight=False)
    return EXIT_OK
