"""The envelope every workflow start and task call carries through Temporal (one msgpack payload).

It names the code to run (module + qualname, and the content-addressed code bundle it comes from), the
inputs already validated and encoded for their declared types, and the run context shared by every
task of a run (run id, pipeline, tenant, priority class, artifact store).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine.types.codec import check_payload_size, pack, unpack

__all__ = ["CodeRef", "Envelope", "RunContext"]


@dataclass(frozen=True)
class CodeRef:
    """Where a task's or workflow's code lives. ``bundle`` is the URI of a code bundle, or None when the
    module is importable on the worker as is (a preloaded package)."""

    module: str
    qualname: str
    bundle: str | None = None
    bundle_sha: str | None = None


@dataclass(frozen=True)
class RunContext:
    run_id: str
    pipeline: str
    tenant: str
    artifacts: str
    #: the run's priority class (``gangflow run --priority``); a task's own ``Gang(priority=...)`` wins over it
    priority: str | None = None
    #: how the run's ``cache=True`` tasks use the cache: "use", "skip" (--no-cache) or "overwrite"
    #: (--overwrite-cache); see engine.core.cache_key
    cache: str = "use"

    def to_wire(self) -> dict[str, Any]:
        # Without a priority (or with the default cache mode) the envelope stays byte for byte what it was
        # before priorities (or caching) existed.
        wire = asdict(self)
        if wire["priority"] is None:
            del wire["priority"]
        if wire["cache"] == "use":
            del wire["cache"]
        return wire


@dataclass(frozen=True)
class Envelope:
    code: CodeRef
    inputs: dict[str, Any]
    run: RunContext

    def encode(self, where: str) -> bytes:
        blob = pack({"code": asdict(self.code), "inputs": self.inputs, "run": self.run.to_wire()})
        return check_payload_size(blob, where)

    @classmethod
    def decode(cls, blob: bytes) -> Envelope:
        data = unpack(blob)
        # envelopes recorded before priorities existed have no "priority": it defaults to None
        return cls(CodeRef(**data["code"]), dict(data["inputs"]), RunContext(**data["run"]))
