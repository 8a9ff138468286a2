"""Secrets where a task runs: resolved for the run's tenant, handed to the task's own process, redacted.

The process that runs a task (the tenant's worker for a plain task, the node agent for the ranks of a
distributed one) reads the values from its *secrets directory* (``--secrets-dir`` or
``$GANGFLOW_SECRETS_DIR``): the file ``DIR/<tenant>/<name>``, trailing newline stripped. A Kubernetes Secret
of the tenant mounted at ``DIR/<tenant>`` gives exactly that layout. The values go only into the
environment and private files of the task's (or rank's) own process, never into this process's
``os.environ``, and every text that leaves that process (task and rank logs, failure messages) passes the
:class:`Redactor` first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from engine.core.protocol import tenant_namespace
from engine.core.secrets import MOUNTS_ENV, VALUES_ENV, Secret, SecretError, SecretNotFoundError

__all__ = [
    "SECRETS_DIR_ENV",
    "SECRET_ENV_PREFIX",
    "Redactor",
    "configure",
    "env_name",
    "materialize",
    "resolve",
    "secrets_dir",
    "task_environment",
]

SECRETS_DIR_ENV = "GANGFLOW_SECRETS_DIR"
#: shorter values are not redacted: replacing every "abc" in a log would hide more than it protects
MIN_REDACTED = 4

#: a tenant's worker also takes its tenant's secrets from its own environment: ``GANGFLOW_SECRET_HF_TOKEN``
SECRET_ENV_PREFIX = "GANGFLOW_SECRET_"

_configured: str | None = None
_own_tenant: str | None = None
_own_folder: str | None = None


def configure(directory: str | None, tenant: str | None = None, own_folder: str | None = None) -> None:
    """This process's secrets directory (``--secrets-dir``), which wins over ``$GANGFLOW_SECRETS_DIR``, and
    the one tenant it serves, if it serves one (``gangflow worker --tenant``): only such a process reads
    secrets from its environment, where nothing says whose they are otherwise. ``own_folder`` (``worker
    --tenant --tenant-secrets DIR``): that tenant's folder alone (``DIR/<name>``), what the isolated layout
    hands a tenant's worker instead of a directory of every tenant's."""
    global _configured, _own_tenant, _own_folder
    _configured, _own_tenant, _own_folder = directory, tenant, own_folder


def env_name(name: str) -> str:
    """``hf-token`` → ``GANGFLOW_SECRET_HF_TOKEN`` (a Kubernetes Secret's key through ``envFrom``, say)."""
    return SECRET_ENV_PREFIX + re.sub(r"[-.]", "_", name).upper()


def secrets_dir() -> Path | None:
    """Where this process resolves secrets: ``--secrets-dir``, else ``$GANGFLOW_SECRETS_DIR``, else none."""
    found = _configured or os.environ.get(SECRETS_DIR_ENV)
    return Path(found) if found else None


def resolve(secrets: Sequence[Secret], tenant: str, root: Path | None = None) -> dict[str, str]:
    """The values of ``secrets`` for ``tenant``, by name. SecretNotFoundError (never retried) names the first
    missing one and the tenant only: not a value, not the tenants that do have it."""
    if not secrets:
        return {}
    root = secrets_dir() if root is None else root
    try:
        tenant_namespace(tenant)  # a tenant's name, so never a path
    except (ValueError, TypeError):
        raise SecretNotFoundError(
            f"the run's tenant {tenant!r} is not a tenant name: its secrets cannot be resolved"
        ) from None
    values: dict[str, str] = {}
    for item in secrets:
        where = f"secret {item.name!r} of tenant {tenant!r}"
        from_env = os.environ.get(env_name(item.name)) if tenant == _own_tenant else None
        if from_env:
            values[item.name] = from_env
            continue
        if _own_folder is not None and tenant == _own_tenant:
            folder = Path(_own_folder)
        elif root is not None:
            folder = root / tenant
        else:
            raise SecretNotFoundError(
                f"{where}: this worker or node agent has no secrets directory (--secrets-dir or ${SECRETS_DIR_ENV})"
            )
        path = folder / item.name
        try:
            # a Kubernetes Secret volume links each key to a versioned folder inside the mount: follow links,
            # but only to files that stay inside the tenant's own folder
            real = path.resolve(strict=True)
            if not real.is_relative_to(folder.resolve(strict=True)) or not real.is_file():
                raise FileNotFoundError(path)
            value = real.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise SecretNotFoundError(
                f"{where} is not set where this task runs (gangflow secret set {tenant} {item.name})"
            ) from None
        value = value.removesuffix("\n").removesuffix("\r")
        if not value:
            raise SecretNotFoundError(f"{where} is empty")
        values[item.name] = value
    return values


class Redactor:
    """Replaces every resolved value (``MIN_REDACTED`` characters or more) with ``[secret:<name>]``; a
    multi-line value also line by line, since logs are handled a line at a time."""

    def __init__(self, values: Mapping[str, str]) -> None:
        pairs: dict[str, str] = {}
        for name, value in values.items():
            for piece in (value, *value.splitlines()):
                piece = piece.strip("\r\n")
                if len(piece) >= MIN_REDACTED:
                    pairs.setdefault(piece, f"[secret:{name}]")
        # the longest first: a value that contains another is replaced whole
        self.pairs = sorted(pairs.items(), key=lambda kv: -len(kv[0]))

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def __call__(self, text: str) -> str:
        for value, mark in self.pairs:
            if value in text:
                text = text.replace(value, mark)
        return text


def _write_private(path: Path, value: str, *, exclusive: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value)


@contextlib.contextmanager
def materialize(secrets: Sequence[Secret], values: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """The environment a task's process gets for its secrets: each ``env=``, plus a private (0700) folder
    with a 0600 file per value (what ``engine.secret`` reads) and per relative ``mount=``; an absolute
    ``mount=`` is created exclusively at that path. Everything is removed when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="gangflow-secrets-"))  # 0700
    created: list[Path] = []
    try:
        (folder / "values").mkdir(mode=0o700)
        (folder / "mounts").mkdir(mode=0o700)
        env = {VALUES_ENV: str(folder / "values"), MOUNTS_ENV: str(folder / "mounts")}
        for item in secrets:
            value = values[item.name]
            _write_private(folder / "values" / item.name, value)
            if item.env is not None:
                env[item.env] = value
            if item.mount is None:
                continue
            if not item.mount.startswith("/"):
                _write_private(folder / "mounts" / item.mount, value)
                continue
            try:
                _write_private(Path(item.mount), value, exclusive=True)
            except OSError as exc:
                raise SecretError(
                    f"secret {item.name!r}: cannot create its mount {item.mount} ({exc.strerror}; another task may "
                    "hold it)"
                ) from None
            created.append(Path(item.mount))
        yield env
    finally:
        for path in created:
            with contextlib.suppress(OSError):
                path.unlink()
        shutil.rmtree(folder, ignore_errors=True)


def task_environment(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """A task process's environment: ``base`` without where secrets come from (and without another task's
    secret folders), plus ``extra``."""
    dropped = {SECRETS_DIR_ENV, VALUES_ENV, MOUNTS_ENV}
    kept = {k: v for k, v in base.items() if k not in dropped and not k.startswith(SECRET_ENV_PREFIX)}
    return {**kept, **extra}
