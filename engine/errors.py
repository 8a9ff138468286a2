"""Errors gangflow raises on purpose (a leaf module: the pure packages and user code import it).

They are plain exceptions (no Temporal import) so the pure packages and user code can raise and catch
them; the runtime maps them onto Temporal failure types by their ``kind``.
"""

from __future__ import annotations

__all__ = [
    "SYSTEM_ERROR_TYPES",
    "DefinitionError",
    "GangflowError",
    "InputError",
    "InputUnavailableError",
    "NodeNotFoundError",
    "PayloadTooLargeError",
    "QueueConfigError",
    "TypeMismatchError",
]


class GangflowError(Exception):
    """Base class of every error gangflow raises on purpose."""

    #: a stable name used as the Temporal failure type, so retry policies and the CLI can match it
    kind = "GangflowError"
    #: whether retrying the same call could ever succeed
    retryable = False


class DefinitionError(GangflowError, TypeError):
    """A @task or @workflow definition is invalid (raised at import time by the decorator)."""

    kind = "DefinitionError"


class TypeMismatchError(GangflowError, TypeError):
    """A value does not match the declared type of a parameter or result. Never retried."""

    kind = "TypeMismatch"


class InputError(TypeMismatchError):
    """Inputs given to a task or workflow are missing, unknown or of the wrong type."""

    kind = "InputError"


class PayloadTooLargeError(GangflowError, ValueError):
    """A value is too large to travel through Temporal; it should be a File or Directory."""

    kind = "PayloadTooLarge"


class NodeNotFoundError(GangflowError, LookupError):
    """An operator named a node the Scheduler does not know (``gangflow node drain``: exit 2); the message
    lists the nodes it knows."""

    kind = "NodeNotFound"


class QueueConfigError(GangflowError, ValueError):
    """A queue configuration that cannot be used (``engine.scheduling.config``); the message starts with the
    field at fault. A ValueError too, as it was before it joined this tree."""

    #: the failure type the Scheduler's ``apply_queues`` update already answers with
    kind = "QueueConfigError"


class InputUnavailableError(GangflowError, OSError):
    """The platform could not deliver what a task call needs: its code bundle or a File / Directory input could
    not be fetched, verified or unpacked into the node's cache. The platform's fault, not the task body's: a rank
    that raises it fails its attempt as a *system* failure (a restart, not one of the task's ``retries``), and a
    plain task's try that raises it is tried again without spending one of its ``retries`` (a bounded number of
    times; see :data:`SYSTEM_ERROR_TYPES`). The one :class:`GangflowError` that is worth retrying: the same input
    may well arrive on the next try. An OSError too, as callers catching a failed download expect."""

    kind = "InputUnavailableError"
    retryable = True


#: the exception types (a rank's error report's first word) that make a failed rank the platform's fault
SYSTEM_ERROR_TYPES = frozenset({InputUnavailableError.__name__})
