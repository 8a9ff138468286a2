"""Secrets a task declares by name: ``@task(secrets=[Secret("hf-token", env="HF_TOKEN")])``.

A definition holds names only, never values: the value is resolved where the task runs (the tenant's
worker for a plain task, the node agent for the ranks of a distributed one) and handed to that task's own
process only, as the environment variable ``env``, as a private file ``mount``, and always through
:func:`secret`. Nothing here imports Temporal: user code and the rank runner use it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import DefinitionError, GangflowError

__all__ = [
    "MOUNTS_ENV",
    "SECRET_NAME",
    "VALUES_ENV",
    "Secret",
    "SecretError",
    "SecretNotFoundError",
    "check_secret_name",
    "check_secrets",
    "secret",
]

#: a secret's name: what a Kubernetes Secret key and a file name both allow, lower case
SECRET_NAME = re.compile(r"[a-z0-9]([-_.a-z0-9]*[a-z0-9])?")
_MAX_NAME = 253
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: in a task's process: the private folder holding its secrets with a relative ``mount=`` name
MOUNTS_ENV = "GANGFLOW_SECRET_MOUNTS"
#: in a task's process: the private folder :func:`secret` reads the declared values from (one file per name)
VALUES_ENV = "GANGFLOW_SECRET_VALUES"


class SecretError(GangflowError):
    """A secret is asked for that the running task did not declare, or outside a task that declares any."""

    kind = "SecretError"


class SecretNotFoundError(SecretError):
    """A declared secret is not set for the run's tenant where the task runs. Never retried: setting it is
    an operator's job, and the message says which secret and tenant (never a value, never another tenant)."""

    kind = "SecretNotFound"


def check_secret_name(name: object) -> str:
    """``name`` when it is a valid secret name, else ValueError saying what a name may be."""
    if not isinstance(name, str) or len(name) > _MAX_NAME or not SECRET_NAME.fullmatch(name):
        raise ValueError(
            f"secret name {name!r} must be lower-case letters and digits, with '-', '_' or '.' inside "
            f"(at most {_MAX_NAME} characters)"
        )
    return name


@dataclass(frozen=True)
class Secret:
    """A secret a task needs, by name. ``env``: the environment variable that holds its value in the task's
    process; ``mount``: a file holding it, either a plain file name (created in the private folder
    ``$GANGFLOW_SECRET_MOUNTS``) or an absolute path (created there, and removed when the task ends).
    Inside the task, ``engine.secret(name)`` returns the value in any case."""

    name: str
    env: str | None = None
    mount: str | None = None

    def __post_init__(self) -> None:
        try:
            check_secret_name(self.name)
        except ValueError as exc:
            raise DefinitionError(str(exc)) from None
        if self.env is not None and (
            not isinstance(self.env, str) or not _ENV_NAME.fullmatch(self.env) or self.env.startswith("GANGFLOW_")
        ):
            raise DefinitionError(
                f"secret {self.name!r}: env={self.env!r} must be an environment variable name (letters, digits "
                "and _, not starting with a digit) outside gangflow's own GANGFLOW_*"
            )
        if self.mount is not None and not _valid_mount(self.mount):
            raise DefinitionError(
                f"secret {self.name!r}: mount={self.mount!r} must be a file name without '/' (created in the "
                "task's private secrets folder) or an absolute path without '..'"
            )


def _valid_mount(mount: object) -> bool:
    if not isinstance(mount, str) or not mount or "\0" in mount:
        return False
    if mount.startswith("/"):
        return mount != "/" and not mount.endswith("/") and ".." not in mount.split("/")
    return "/" not in mount and mount not in (".", "..")


def check_secrets(owner: str, secrets: object) -> tuple[Secret, ...]:
    """A task's ``secrets=`` as a tuple: Secret objects only, no name, env or mount path twice."""
    if secrets is None:
        return ()
    if isinstance(secrets, Secret | str | bytes) or not isinstance(secrets, Iterable):
        raise DefinitionError(f"{owner}: secrets must be a list of Secret(...), got {secrets!r}")
    found = tuple(secrets)
    for item in found:
        if not isinstance(item, Secret):
            raise DefinitionError(f"{owner}: secrets must be a list of Secret(...), got {item!r} in it")
    for what in ("name", "env", "mount"):
        seen: set[str] = set()
        for item in found:
            value = getattr(item, what)
            if value is not None and value in seen:
                raise DefinitionError(f"{owner}: two secrets declare {what} {value!r}")
            if value is not None:
                seen.add(value)
    return found


def secret(name: str) -> str:
    """The value of the secret ``name`` that the running task declared (``@task(secrets=[Secret(name)])``).

    Works in the task's own process (a plain task with secrets, a rank); raises SecretError for a name the
    task did not declare, or in a task that declares none."""
    folder = os.environ.get(VALUES_ENV)
    if not folder:
        raise SecretError(
            f"secret {name!r}: the running task declares no secrets (declare it: @task(secrets=[Secret({name!r})]))"
        )
    try:
        check_secret_name(name)
        return (Path(folder) / name).read_text(encoding="utf-8")
    except (ValueError, OSError):
        declared = sorted(p.name for p in Path(folder).iterdir()) if os.path.isdir(folder) else []
        raise SecretError(
            f"secret {name!r} is not declared by the running task (it declares: {', '.join(declared) or 'none'})"
        ) from None
