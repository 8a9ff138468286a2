"""``File`` and ``Directory``: values that travel as content-addressed references.

A task returns ``File("model.pt")``; when the value leaves the task it is uploaded to the run's artifact
store and replaced on the wire by a small reference (URI, sha256, name). The consuming task receives a
``File`` whose ``path`` is a local copy. In workflow code a File is only a reference: it can be passed
on to other tasks, but not opened (workflow code must not do I/O).

Upload and download are not done here (this package is pure): the runtime passes callables through
pydantic's validation / serialization context under the keys ``"upload"`` and ``"fetch"``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["Artifact", "Directory", "File"]

A = TypeVar("A", bound="Artifact")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _checked_ref(ref: dict[str, Any]) -> tuple[str, str, str]:
    """A reference's (name, uri, sha256), refused (ValueError: a type error, never retried) when its name or
    digest could steer a reader's cache path outside its folder (``../../somewhere``, ``a/b``)."""
    name, uri, sha = str(ref["name"]), str(ref["uri"]), str(ref["sha256"])
    if name in ("", ".", "..") or any(c in name for c in ("/", "\\", "\x00")):
        raise ValueError(f"refusing an artifact reference whose name {name!r} is not a plain file name")
    if not _SHA256.match(sha):
        raise ValueError(f"refusing an artifact reference whose sha256 {sha!r} is not 64 hex digits")
    return name, uri, sha


class Artifact(os.PathLike[str]):
    """Common base of File and Directory (a local path and/or an uploaded reference)."""

    kind: ClassVar[str] = "artifact"
    __slots__ = ("_path", "name", "sha256", "size", "uri")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path: str | None = os.path.abspath(os.fspath(path))
        self.name: str = os.path.basename(self._path.rstrip(os.sep)) or self.kind
        self.uri: str | None = None
        self.sha256: str | None = None
        self.size: int | None = None

    @classmethod
    def from_ref(cls: type[A], ref: dict[str, Any]) -> A:
        art = cls.__new__(cls)
        art._path = None
        art.name, art.uri, art.sha256 = _checked_ref(ref)
        art.size = int(ref["size"]) if ref.get("size") is not None else None
        return art

    def ref(self) -> dict[str, Any]:
        """The wire form: only valid once the artifact has been uploaded."""
        if self.uri is None or self.sha256 is None:
            raise ValueError(f"{self!r} has not been uploaded to an artifact store")
        return {"kind": self.kind, "uri": self.uri, "sha256": self.sha256, "name": self.name, "size": self.size}

    @property
    def path(self) -> str:
        """Local filesystem path. Not available in workflow code, where artifacts are references."""
        if self._path is None:
            raise RuntimeError(
                f"{type(self).__name__} {self.name!r} is a reference ({self.uri}); it has no local path here. "
                "Workflow code cannot read files: pass it to a task, which receives a local copy."
            )
        return self._path

    def _bind_path(self, path: str) -> None:
        self._path = path

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self._path if self._path is not None else str(self.uri)

    def __repr__(self) -> str:
        where = self._path if self._path is not None else self.uri
        digest = f", sha256={self.sha256[:12]}" if self.sha256 else ""
        return f"{type(self).__name__}({where!r}{digest})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Artifact)
        if self.sha256 and other.sha256:
            return self.sha256 == other.sha256
        return self._path == other._path and self.uri == other.uri

    def __hash__(self) -> int:
        return hash((self.kind, self.sha256 or self._path))

    # -- pydantic integration -------------------------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(cls._serialize, info_arg=True),
        )

    @classmethod
    def _validate(cls, value: Any, info: core_schema.ValidationInfo) -> Artifact:
        if isinstance(value, cls):
            art: Artifact = value
        elif isinstance(value, str | os.PathLike) and not isinstance(value, Artifact):
            art = cls(value)
        elif isinstance(value, dict) and value.get("kind") == cls.kind and "uri" in value:
            art = cls.from_ref(value)
        else:
            raise ValueError(f"expected a {cls.__name__} (a local path or a gangflow reference)")
        fetch: Callable[[Artifact], str] | None = (info.context or {}).get("fetch")
        if fetch is not None and art._path is None:
            art._bind_path(fetch(art))
        return art

    @staticmethod
    def _serialize(value: Artifact, info: core_schema.SerializationInfo) -> dict[str, Any]:
        if value.uri is None:
            upload: Callable[[Artifact], None] | None = (info.context or {}).get("upload")
            if upload is None:
                raise ValueError(f"{value!r} is a local path and cannot be uploaded here; create Files inside tasks")
            upload(value)
        return value.ref()


class File(Artifact):
    """A single file, uploaded to the artifact store when it leaves a task."""

    kind: ClassVar[str] = "file"
    __slots__ = ()

    def open(self, mode: str = "rb") -> Any:
        return open(self.path, mode)

    def read_bytes(self) -> bytes:
        with open(self.path, "rb") as handle:
            return handle.read()


class Directory(Artifact):
    """A directory tree, uploaded as one deterministic archive when it leaves a task."""

    kind: ClassVar[str] = "dir"
    __slots__ = ()
