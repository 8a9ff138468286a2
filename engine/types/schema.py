"""``Schema``: the columns and dtypes a DataFrame or pyarrow Table must have where it crosses a task boundary.

``Annotated[pd.DataFrame, Schema(x=float, label=int)]`` (Flyte's ``kwtypes`` spelling) or
``Annotated[pd.DataFrame, Schema({"x": "float64", "label": "int64"})]`` (pandera's / pandas' dtype names) is
checked when a task returns the frame and again when a task receives it; a frame missing a column or with
another dtype fails the task with a :class:`~engine.errors.TypeMismatchError` naming the column. Like pandera,
extra columns are allowed unless ``strict=True``.

A Python type names the canonical dtype: ``int`` is int64, ``float`` float64, ``bool`` bool, ``datetime`` any
datetime64 (any timestamp in arrow), ``str`` any string column (object or the string dtypes). Any other spec is
what ``pandas.api.types.pandas_dtype`` (for DataFrames) or ``pyarrow.type_for_alias`` (for Tables, which also
takes the pandas names: ``float64`` is arrow's ``double``) understands, compared exactly.

Pure: pandas and pyarrow are not imported here; the checks use the modules the annotation itself came from.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import GangflowError

__all__ = ["ColumnCheck", "Schema", "SchemaViolation"]


class SchemaViolation(GangflowError, ValueError):
    """A value does not have the schema's columns or dtypes (a ValueError, so pydantic reports it as a
    validation error; the codec turns it into a TypeMismatchError)."""

    kind = "SchemaViolation"


@dataclass(frozen=True)
class ColumnCheck:
    """One column's requirement, resolved against the library of the declared type."""

    column: str
    expected: str  # as the messages show it
    matches: Callable[[Any], bool]  # dtype (pandas) or DataType (arrow) -> ok?


class Schema:
    """Required columns and their dtypes; see the module docs for the accepted spellings."""

    __slots__ = ("columns", "strict")

    def __init__(self, columns: Mapping[str, Any] | None = None, /, *, strict: bool = False, **more: Any) -> None:
        merged = {**dict(columns or {}), **more}
        if not merged:
            raise TypeError("Schema() needs at least one column, e.g. Schema(x=float, label=int)")
        for name in merged:
            if not isinstance(name, str) or not name:
                raise TypeError(f"Schema column names must be non-empty strings, got {name!r}")
        self.columns: dict[str, Any] = merged
        self.strict = bool(strict)

    def __repr__(self) -> str:
        def show(spec: Any) -> str:
            return spec.__name__ if isinstance(spec, type) else repr(str(spec))

        parts = [f"{k}={show(v)}" if k.isidentifier() else f"{k!r}: {show(v)}" for k, v in self.columns.items()]
        return f"Schema({', '.join(parts)}{', strict=True' if self.strict else ''})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and (self.columns, self.strict) == (other.columns, other.strict)

    def __hash__(self) -> int:
        return hash((tuple((k, str(v)) for k, v in self.columns.items()), self.strict))

    # -- pydantic: the same check inside a pydantic model or dataclass field (``frame: Rows``) ------------
    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from engine.types.data import data_type  # data builds on this module: resolved at use, not import

        return data_type(source, self).__get_pydantic_core_schema__(source, handler)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Any:
        return {"type": "object", "format": "gangflow-data", "x-schema": self.describe()}

    def describe(self) -> dict[str, Any]:
        """A JSON-able form (the interface hash of a cached task includes it)."""
        cols = {k: v.__name__ if isinstance(v, type) else str(v) for k, v in self.columns.items()}
        return {"columns": cols, "strict": self.strict}

    # -- resolving (at decoration time, so a typo in a dtype fails there) ------------------------------
    def resolve(self, library: str) -> tuple[ColumnCheck, ...]:
        """The checks for a ``pandas`` DataFrame or a ``pyarrow`` Table. Raises TypeError for an unknown dtype."""
        resolve = _pandas_check if library == "pandas" else _arrow_check
        checks = []
        for column, spec in self.columns.items():
            try:
                checks.append(resolve(column, spec))
            except (TypeError, ValueError, KeyError) as exc:
                raise TypeError(f"{self!r}: column {column!r} has an unknown dtype {spec!r} ({exc})") from None
        return tuple(checks)

    # -- checking --------------------------------------------------------------------------------------
    def check(
        self, what: str, checks: tuple[ColumnCheck, ...], columns: list[str], dtype_of: Callable[[str], Any]
    ) -> None:
        """Raise SchemaViolation naming the first missing column or wrong dtype (and the extra columns when
        strict). ``what`` names the value (``DataFrame``), ``dtype_of`` reads one column's dtype."""
        have = set(columns)
        for check in checks:
            if check.column not in have:
                shown = ", ".join(map(str, columns[:20])) + (", ..." if len(columns) > 20 else "") or "none"
                raise SchemaViolation(
                    f"{what} has no column {check.column!r} (its columns: {shown}); {self!r} requires it"
                )
            dtype = dtype_of(check.column)
            if not check.matches(dtype):
                raise SchemaViolation(
                    f"{what} column {check.column!r} has dtype {dtype}, expected {check.expected} ({self!r})"
                )
        if self.strict:
            extra = [c for c in columns if c not in self.columns]
            if extra:
                raise SchemaViolation(f"{what} has columns not in {self!r}: {', '.join(map(repr, extra))}")


def _pandas_check(column: str, spec: Any) -> ColumnCheck:
    pd = sys.modules["pandas"]  # loaded: the annotation being resolved is pandas.DataFrame
    if spec is str:
        return ColumnCheck(column, "a string dtype", lambda d: pd.api.types.is_string_dtype(d))
    if spec is dt.datetime:
        return ColumnCheck(column, "datetime64", lambda d: pd.api.types.is_datetime64_any_dtype(d))
    expected = pd.api.types.pandas_dtype({int: "int64", float: "float64", bool: "bool"}.get(spec, spec))
    return ColumnCheck(column, str(expected), lambda d: bool(d == expected))


def _arrow_check(column: str, spec: Any) -> ColumnCheck:
    pa = sys.modules["pyarrow"]  # loaded: the annotation being resolved is pyarrow.Table
    if spec is str:
        return ColumnCheck(column, "string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t))
    if spec is dt.datetime:
        return ColumnCheck(column, "timestamp", lambda t: pa.types.is_timestamp(t))
    spec = {int: "int64", float: "float64", bool: "bool"}.get(spec, spec)
    if isinstance(spec, str):
        expected = pa.type_for_alias(spec)
    elif isinstance(spec, pa.DataType):
        expected = spec
    else:  # a numpy dtype or scalar type (np.float32): numpy is loaded, the spec came from it
        expected = pa.from_numpy_dtype(sys.modules["numpy"].dtype(spec))
    return ColumnCheck(column, str(expected), lambda t: bool(t == expected))
