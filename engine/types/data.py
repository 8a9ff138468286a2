"""DataFrames, pyarrow Tables, numpy arrays and torch tensors as typed values that travel by reference.

A task annotated ``-> pd.DataFrame`` returns a frame; when it leaves the task it is written to a file
(parquet for DataFrames and Tables, ``.npy`` for arrays, ``torch.save`` for tensors), uploaded to the run's
artifact store through the same ``"upload"`` hook as a :class:`~engine.types.File`, and replaced on the wire by
that File's reference: ``{"kind": "file", "uri", "sha256", "name", "size"}``. The content decides the bytes,
the bytes the sha256, so the same frame gives the same reference whatever task made it (and the cache key,
which counts Files by sha256, treats it as the same input). A task that declares the type receives the object
back, downloaded (once per store, checked against the sha256) through the ``"fetch"`` hook only there. Workflow
code gets a :class:`DataRef` instead: it can pass it on to tasks, not look inside (workflow code does no I/O).

The libraries are optional and never imported here: an annotation naming ``pandas.DataFrame`` means pandas is
already loaded, so the type is recognised and converted through ``sys.modules`` (``import engine`` stays free
of pandas and torch, and the pure package stays pure). Writing parquet needs pyarrow (``gangflow[data]``).

Tensors travel as dense CPU tensors, detached from the autograd graph (the file must load anywhere and a view
must not carry its whole base storage); move them with ``.to(device)`` in the consumer.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

from engine.types.files import File
from engine.types.schema import ColumnCheck, Schema, SchemaViolation

__all__ = ["DataRef", "DataValueError", "brief", "data_type", "prepare"]


class DataValueError(SchemaViolation):
    """A data value is not what its annotation declares; the message is complete (the codec prefixes where)."""


@dataclass(frozen=True)
class _Kind:
    name: str  # as messages and type names show it
    module: str  # the library the class lives in (looked up in sys.modules, never imported)
    attr: str
    filename: str  # the name of the uploaded file, fixed so equal content gives an equal reference
    suffixes: tuple[str, ...]  # the file names this kind can read back
    save: Callable[[Any, str], None]
    load: Callable[[str], Any]
    library: str = ""  # for Schema: "pandas" / "pyarrow"; "" = no columns to check

    def cls(self) -> Any:
        mod = sys.modules.get(self.module)
        return getattr(mod, self.attr, None) if mod is not None else None


def _save_frame(frame: Any, path: str) -> None:
    frame.to_parquet(path)  # a RangeIndex travels as metadata, any other index as columns: both come back


def _load_frame(path: str) -> Any:
    return sys.modules["pandas"].read_parquet(path)


def _save_table(table: Any, path: str) -> None:
    import pyarrow.parquet as pq  # the one import here: pyarrow is loaded (a Table), its parquet module may not be

    pq.write_table(table, path)


def _load_table(path: str) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(path)


def _save_array(array: Any, path: str) -> None:
    numpy = sys.modules["numpy"]  # loaded: the value is an array
    numpy.save(path, array, allow_pickle=False)  # object arrays would need pickle: refused (not data)


def _load_array(path: str) -> Any:
    return sys.modules["numpy"].load(path, allow_pickle=False)  # loaded: the annotation is numpy.ndarray


def _save_tensor(tensor: Any, path: str) -> None:
    torch = sys.modules["torch"]  # loaded: the value is a tensor
    torch.save(tensor.detach().cpu().contiguous().clone(), path)


def _load_tensor(path: str) -> Any:
    torch = sys.modules["torch"]  # loaded: the annotation being validated is torch.Tensor
    return torch.load(path, map_location="cpu", weights_only=True)


_KINDS = (
    _Kind("DataFrame", "pandas", "DataFrame", "dataframe.parquet", (".parquet",), _save_frame, _load_frame, "pandas"),
    _Kind("Table", "pyarrow", "Table", "table.parquet", (".parquet",), _save_table, _load_table, "pyarrow"),
    _Kind("ndarray", "numpy", "ndarray", "array.npy", (".npy",), _save_array, _load_array),
    _Kind("Tensor", "torch", "Tensor", "tensor.pt", (".pt",), _save_tensor, _load_tensor),
)


def _a(name: str) -> str:
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _kind_of(annotation: Any) -> _Kind | None:
    for kind in _KINDS:
        cls = kind.cls()
        if cls is not None and (annotation is cls or typing.get_origin(annotation) is cls):  # npt.NDArray too
            return kind
    return None


def _kind_of_value(value: Any) -> _Kind | None:
    for kind in _KINDS:
        cls = kind.cls()
        if cls is not None and isinstance(value, cls):
            return kind
    return None


def brief(value: Any) -> str | None:
    """A one-line description of a data value for messages (``DataFrame(3 rows; columns x, label)``), or None
    when ``value`` is not one (its repr is used then; a frame's is many lines)."""
    kind = _kind_of_value(value)
    if kind is None:
        return None
    if kind.library:
        names = [str(c) for c in (value.columns if kind.name == "DataFrame" else value.column_names)]
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        return f"{kind.name}({len(value)} rows; columns {shown or 'none'})"
    return f"{kind.name}(shape={tuple(value.shape)}, dtype={value.dtype})"


class DataRef(File):
    """A data value (DataFrame, Table, ndarray, Tensor) as workflow code holds it: a reference to its file in
    the artifact store. Pass it to tasks; a task declaring the type receives the object."""

    __slots__ = ("declared",)
    #: the kind names each slot for messages: how the reference was declared
    declared: str

    @classmethod
    def of(cls, ref: File | dict[str, Any], declared: str) -> DataRef:
        out = cls.from_ref(ref.ref() if isinstance(ref, File) else ref)
        out.declared = declared
        return out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "declared":
            raise AttributeError(name)
        raise AttributeError(
            f"{getattr(self, 'declared', 'data')} {self.name!r} is a reference in workflow code (no .{name} here): "
            "workflow code does no I/O; pass it to a task, which receives the object"
        )

    def __repr__(self) -> str:
        digest = f", sha256={self.sha256[:12]}" if self.sha256 else ""
        return f"DataRef({getattr(self, 'declared', 'data')}, {self.uri!r}{digest})"  # the CLI prints it


class _DataType:
    """The Annotated metadata that lets pydantic validate and serialize one data kind (with its Schema)."""

    kind_field: ClassVar[str] = "gangflow-data"

    def __init__(self, kind: _Kind, schema: Schema | None) -> None:
        if schema is not None and not kind.library:
            raise TypeError(f"{schema!r} applies to a DataFrame or a pyarrow Table, not to {_a(kind.name)}")
        self.kind = kind
        self.schema = schema
        self.checks: tuple[ColumnCheck, ...] = schema.resolve(kind.library) if schema is not None else ()

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            self._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(self._serialize, info_arg=True),
        )

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        # what the cache's interface hash reads: the kind and its schema, so changing either changes the key
        described: dict[str, Any] = {"type": "object", "format": self.kind_field, "title": self.kind.name}
        if self.schema is not None:
            described["x-schema"] = self.schema.describe()
        return described

    # -- checks ----------------------------------------------------------------------------------------
    def _check(self, value: Any) -> Any:
        if self.schema is not None:
            if self.kind.name == "DataFrame":
                dtypes = {str(c): d for c, d in value.dtypes.items()}  # schema names are strings
                columns, dtype_of = list(dtypes), dtypes.__getitem__
            else:
                columns, dtype_of = list(value.column_names), lambda c: value.schema.field(c).type
            self.schema.check(self.kind.name, self.checks, columns, dtype_of)
        return value

    def _as_ref(self, value: Any) -> DataRef:
        if isinstance(value, File) and value.uri is not None:
            ref = value if isinstance(value, DataRef) else DataRef.of(value, self.kind.name)
        elif isinstance(value, dict) and value.get("kind") == File.kind and "uri" in value:
            ref = DataRef.of(value, self.kind.name)
        else:
            shown = brief(value) or repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise DataValueError(f"expected {_a(self.kind.name)}, got {shown} ({type(value).__name__})")
        if not ref.name.endswith(self.kind.suffixes):
            raise DataValueError(
                f"expected {_a(self.kind.name)}, got a reference to {ref.name!r} "
                f"({_a(self.kind.name)} is read from a {' / '.join(self.kind.suffixes)} file)"
            )
        return ref

    # -- pydantic hooks --------------------------------------------------------------------------------
    def _validate(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        cls = self.kind.cls()
        if cls is not None and isinstance(value, cls):
            return self._check(value)
        ref = self._as_ref(value)
        fetch: Callable[[File], str] | None = (info.context or {}).get("fetch")
        if fetch is None:
            return ref  # workflow code (or a caller without a store): keep the reference, download nothing
        return self._check(self.kind.load(fetch(ref)))

    def _serialize(self, value: Any, info: core_schema.SerializationInfo) -> dict[str, Any]:
        if isinstance(value, File):
            return value.ref()
        upload: Callable[[File], None] | None = (info.context or {}).get("upload")
        if upload is None:
            raise ValueError(
                f"{_a(self.kind.name)} made in workflow code cannot be stored from there; build it in a task"
            )
        with tempfile.TemporaryDirectory(prefix="gangflow-data-") as tmp:
            path = os.path.join(tmp, self.kind.filename)
            try:
                self.kind.save(value, path)
            except ImportError as exc:
                raise ValueError(
                    f"storing {_a(self.kind.name)} needs {exc.name or exc}: pip install 'gangflow[data]'"
                ) from None
            except (ValueError, TypeError) as exc:  # e.g. parquet's non-string column names, object arrays
                raise ValueError(f"cannot store this {self.kind.name} as {self.kind.filename}: {exc}") from None
            stored = File(path)
            upload(stored)
        return stored.ref()


def data_type(annotation: Any, schema: Schema | None = None) -> _DataType:
    """The pydantic hooks for a data type, refused (TypeError) for another type."""
    kind = _kind_of(annotation)
    if kind is None:
        raise TypeError(f"{schema!r} applies to a DataFrame or a pyarrow Table, not to {annotation!r}")
    return _DataType(kind, schema)


def _any_loaded() -> bool:
    return any(kind.module in sys.modules for kind in _KINDS)


def prepare(annotation: Any) -> Any:
    """``annotation`` with each data type (also inside ``list[...]``, ``tuple[...]``, ``Optional[...]``,
    ``dict[str, ...]``) replaced by an ``Annotated`` form pydantic can validate; unchanged when it has none.
    Raises TypeError for a Schema on a type that has no columns, or one naming an unknown dtype."""
    if not _any_loaded():
        return annotation
    return _rewrite(annotation)


def _rewrite(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(tp)
        schemas = [m for m in meta if isinstance(m, Schema)]
        rest = [m for m in meta if not isinstance(m, Schema)]
        kind = _kind_of(base)
        if kind is None:
            if schemas:
                raise TypeError(f"{schemas[0]!r} applies to a DataFrame or a pyarrow Table, not to {base!r}")
            inner = _rewrite(base)
            return tp if inner is base else typing.Annotated[inner, *meta]
        if len(schemas) > 1:
            raise TypeError(f"{base.__name__} has more than one Schema")
        return typing.Annotated[base, _DataType(kind, schemas[0] if schemas else None), *rest]
    kind = _kind_of(tp)
    if kind is not None:
        return typing.Annotated[tp, _DataType(kind, None)]
    if origin is None or origin is typing.Literal:
        return tp
    args = typing.get_args(tp)
    new = tuple(_rewrite(a) if not isinstance(a, list) else a for a in args)
    if all(a is b for a, b in zip(new, args, strict=True)):
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[new]  # noqa: UP007 - rebuilding from a tuple of members
    copy_with = getattr(tp, "copy_with", None)
    return copy_with(new) if copy_with is not None else types.GenericAlias(origin, new)
