"""DataFrames, pyarrow Tables, numpy arrays and torch tensors as typed values passed by reference (no server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import pytest
from pydantic import BaseModel

from engine import DefinitionError, File, Schema, TypeMismatchError, run_local, task, workflow
from engine.artifacts import ArtifactStore
from engine.core.cache_key import canonical, interface_hash
from engine.core.definitions import definition_of
from engine.types import DataRef, ValueCodec, pack, unpack

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(str(tmp_path / "store"))


def roundtrip(annotation: object, value: object, store: ArtifactStore) -> tuple[object, dict[str, object]]:
    """Producer → wire (msgpack bytes, as Temporal carries them) → consumer."""
    codec = ValueCodec(annotation)
    wire = unpack(pack(codec.to_wire(value, "out", store.context())))
    return codec.from_wire(wire, "in", store.context()), wire


def frame() -> object:
    return pd.DataFrame({"x": [0.5, 1.5, 2.5], "label": [0, 1, 1]}, index=pd.Index([7, 8, 9], name="id"))


# -- round trips ----------------------------------------------------------------------------------------
def test_a_dataframe_round_trips_with_its_dtypes_and_index(store: ArtifactStore) -> None:
    original = pd.DataFrame(
        {
            "i": np.array([1, 2, 3], dtype="int64"),
            "f32": np.array([0.5, 1.5, 2.5], dtype="float32"),
            "flag": [True, False, True],
            "when": pd.to_datetime(["2026-01-01", "2026-01-02", "2026-01-03"]),
            "cat": pd.Categorical(["a", "b", "a"]),
            "maybe": pd.array([1, None, 3], dtype="Int64"),
        },
        index=pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)], names=["group", "n"]),
    )
    back, wire = roundtrip(pd.DataFrame, original, store)
    pd.testing.assert_frame_equal(back, original)  # values, dtypes (category, nullable Int64 too), index names
    assert wire["kind"] == "file" and wire["name"] == "dataframe.parquet"
    ranged = pd.DataFrame({"x": [1.0, 2.0]}, index=pd.RangeIndex(10, 12))
    pd.testing.assert_frame_equal(roundtrip(pd.DataFrame, ranged, store)[0], ranged)


def test_a_numpy_array_round_trips_with_dtype_and_shape(store: ArtifactStore) -> None:
    for array in (np.arange(12, dtype="int16").reshape(3, 4), np.zeros((2, 0, 3), dtype="float32"), np.array(3.5)):
        back, wire = roundtrip(np.ndarray, array, store)
        assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)
        assert wire["name"] == "array.npy"


def test_a_tensor_comes_back_dense_detached_and_equal(store: ArtifactStore) -> None:
    torch = pytest.importorskip("torch")
    weights = torch.arange(12, dtype=torch.float64).reshape(3, 4).requires_grad_()
    back, wire = roundtrip(torch.Tensor, weights, store)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float64 and back.shape == (3, 4)
    assert torch.equal(back, weights.detach()) and not back.requires_grad
    assert wire["name"] == "tensor.pt"
    # a view travels as its own values, not its base's whole storage
    big = torch.zeros(100_000)
    view_ref = ValueCodec(torch.Tensor).to_wire(big[:4], "out", store.context())
    assert view_ref["size"] < 5_000
    assert view_ref["sha256"] == ValueCodec(torch.Tensor).to_wire(torch.zeros(4), "out", store.context())["sha256"]


def test_a_pyarrow_table_round_trips_and_reads_back_as_a_dataframe(store: ArtifactStore) -> None:
    table = pa.table({"x": [1.0, 2.0], "name": ["a", "b"]})
    back, wire = roundtrip(pa.Table, table, store)
    assert back.equals(table) and wire["name"] == "table.parquet"
    as_frame = ValueCodec(pd.DataFrame).from_wire(wire, "in", store.context())  # parquet either way
    assert list(as_frame["x"]) == [1.0, 2.0]
    frame_wire = ValueCodec(pd.DataFrame).to_wire(frame(), "out", store.context())
    as_table = ValueCodec(pa.Table).from_wire(frame_wire, "in", store.context())
    assert as_table.column("label").to_pylist() == [0, 1, 1]


def test_data_types_nest_in_tuples_lists_and_optionals(store: ArtifactStore) -> None:
    back, wire = roundtrip(tuple[np.ndarray, list[pd.DataFrame]], (np.ones(2), [frame(), frame()]), store)
    assert np.array_equal(back[0], np.ones(2)) and len(back[1]) == 2
    pd.testing.assert_frame_equal(back[1][1], frame())
    assert wire[1][0]["sha256"] == wire[1][1]["sha256"]
    assert roundtrip(Optional[np.ndarray], None, store)[0] is None


# -- content addressing -------------------------------------------------------------------------------
def test_the_same_content_gives_the_same_sha_whatever_the_store_or_object(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    one, two = ArtifactStore(str(tmp_path / "one")), ArtifactStore(str(tmp_path / "two"))
    codec = ValueCodec(pd.DataFrame)
    a = codec.to_wire(frame(), "out", one.context())
    b = codec.to_wire(frame().copy(), "out", two.context())  # another object, another store (another tenant)
    assert a["sha256"] == b["sha256"] and a["uri"] != b["uri"]
    changed = frame()
    changed.loc[9, "x"] = 3.0
    assert codec.to_wire(changed, "out", one.context())["sha256"] != a["sha256"]
    # the cache key counts the reference by its content only, as it does a File's
    assert canonical(a) == canonical(b) == {"$artifact": ["file", a["sha256"]]}


# -- schemas ------------------------------------------------------------------------------------------
ROWS = Annotated[pd.DataFrame, Schema(x=float, label=int)]


def test_a_frame_that_matches_its_schema_passes_both_ways(store: ArtifactStore) -> None:
    with_extra = frame().assign(note=["a", "b", "c"])  # extra columns are allowed unless strict
    back, _ = roundtrip(ROWS, with_extra, store)
    assert list(back.columns) == ["x", "label", "note"]
    spelled = Annotated[pd.DataFrame, Schema({"x": "float64", "label": "int64", "note": str})]
    roundtrip(spelled, with_extra, store)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (frame().drop(columns="label"), "DataFrame has no column 'label' (its columns: x); Schema(x=float, label=int)"),
        (frame().astype({"label": "float64"}), "DataFrame column 'label' has dtype float64, expected int64"),
        (frame().astype({"x": "float32"}), "DataFrame column 'x' has dtype float32, expected float64"),
        ([1, 2], "expected a DataFrame, got [1, 2] (list)"),
    ],
)
def test_a_returned_frame_that_breaks_its_schema_is_refused_naming_the_column(store, value, message) -> None:
    with pytest.raises(TypeMismatchError) as info:
        ValueCodec(ROWS).to_wire(value, "task 'load': return value", store.context())
    assert str(info.value).startswith("task 'load': return value: ")
    assert message in str(info.value)


def test_an_input_is_checked_against_its_schema_when_the_task_receives_it(store: ArtifactStore) -> None:
    wire = ValueCodec(pd.DataFrame).to_wire(frame().drop(columns="x"), "out", store.context())  # no schema
    with pytest.raises(TypeMismatchError, match=r"task 'fit': input 'frame': DataFrame has no column 'x'"):
        ValueCodec(ROWS).from_wire(wire, "task 'fit': input 'frame'", store.context())


def test_a_strict_schema_refuses_extra_columns(store: ArtifactStore) -> None:
    strict = Annotated[pd.DataFrame, Schema(x=float, label=int, strict=True)]
    with pytest.raises(TypeMismatchError, match=r"DataFrame has columns not in Schema\(.*strict=True\): 'note'"):
        ValueCodec(strict).to_wire(frame().assign(note=1), "out", store.context())


def test_a_pyarrow_table_is_checked_against_its_schema(store: ArtifactStore) -> None:
    codec = ValueCodec(Annotated[pa.Table, Schema(x="float64", name=str)])
    codec.to_wire(pa.table({"x": [1.0], "name": ["a"]}), "out", store.context())
    with pytest.raises(TypeMismatchError, match=r"Table column 'x' has dtype int64, expected double"):
        codec.to_wire(pa.table({"x": [1], "name": ["a"]}), "out", store.context())


class Batch(BaseModel):
    name: str
    rows: ROWS  # a Schema makes a DataFrame field work inside a pydantic model too


def test_a_frame_with_a_schema_travels_inside_a_pydantic_model(store: ArtifactStore) -> None:
    back, wire = roundtrip(Batch, Batch(name="a", rows=frame()), store)
    assert wire["rows"]["name"] == "dataframe.parquet"
    pd.testing.assert_frame_equal(back.rows, frame())
    assert isinstance(ValueCodec(Batch).from_wire(wire, "workflow").rows, DataRef)
    with pytest.raises(TypeMismatchError, match=r"return value: DataFrame has no column 'label' .*\(at rows\)"):
        ValueCodec(Batch).to_wire({"name": "b", "rows": frame()[["x"]]}, "return value", store.context())


def test_a_misused_schema_fails_at_definition_time() -> None:
    with pytest.raises(DefinitionError, match=r"Schema\(x=int\) applies to a DataFrame or a pyarrow Table"):

        @task
        def bad(a: Annotated[np.ndarray, Schema(x=int)]) -> None: ...

    with pytest.raises(DefinitionError, match=r"column 'x' has an unknown dtype 'flot64'"):

        @task
        def typo() -> Annotated[pd.DataFrame, Schema(x="flot64")]: ...

    with pytest.raises(TypeError, match="at least one column"):
        Schema()


def test_the_schema_is_part_of_the_interface_hash() -> None:
    @task
    def plain(frame: pd.DataFrame) -> None: ...

    @task
    def checked(frame: ROWS) -> None: ...

    @task
    def checked_too(frame: Annotated[pd.DataFrame, Schema(x=float, label=int)]) -> None: ...

    hashes = [interface_hash(definition_of(t).interface) for t in (plain, checked, checked_too)]
    assert hashes[0] != hashes[1] == hashes[2]


# -- workflow code holds references -------------------------------------------------------------------
def test_workflow_code_gets_a_reference_it_can_pass_on_but_not_open(store: ArtifactStore) -> None:
    codec = ValueCodec(pd.DataFrame)
    wire = codec.to_wire(frame(), "out", store.context())
    ref = codec.from_wire(wire, "workflow")  # no store in workflow code: nothing is downloaded
    assert isinstance(ref, DataRef) and ref.sha256 == wire["sha256"]
    assert codec.to_wire(ref, "task input") == wire
    with pytest.raises(AttributeError, match=r"DataFrame 'dataframe.parquet' is a reference in workflow code"):
        _ = ref.shape
    with pytest.raises(TypeMismatchError, match="a DataFrame made in workflow code cannot be stored from there"):
        codec.to_wire(frame(), "task 'fit': input 'frame'")


def test_a_reference_to_another_kind_of_data_is_refused(store: ArtifactStore) -> None:
    wire = ValueCodec(np.ndarray).to_wire(np.ones(3), "out", store.context())
    with pytest.raises(TypeMismatchError, match=r"expected a DataFrame, got a reference to 'array.npy'"):
        ValueCodec(pd.DataFrame).from_wire(wire, "in", store.context())


def test_a_task_declaring_file_receives_the_parquet_file(store: ArtifactStore) -> None:
    wire = ValueCodec(pd.DataFrame).to_wire(frame(), "out", store.context())
    received = ValueCodec(File).from_wire(wire, "in", store.context())
    pd.testing.assert_frame_equal(pd.read_parquet(received.path), frame())


def test_values_that_cannot_be_stored_say_why(store: ArtifactStore) -> None:
    with pytest.raises(TypeMismatchError, match=r"cannot store this ndarray as array.npy: Object arrays"):
        ValueCodec(np.ndarray).to_wire(np.array([object()]), "out", store.context())


# -- end to end in one process --------------------------------------------------------------------------
@task
def load(rows: int) -> ROWS:
    return pd.DataFrame({"x": np.linspace(0.0, 1.0, rows), "label": np.arange(rows)})


@task
def unlabelled(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"x": np.linspace(0.0, 1.0, rows)})


@task
def total(frame: ROWS) -> float:
    return float(frame["x"].sum())


@workflow
async def weighted(rows: int = 4, labelled: bool = True) -> float:
    frame = await (load(rows=rows) if labelled else unlabelled(rows=rows))
    return await total(frame=frame)


def test_run_local_passes_frames_and_checks_inputs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    assert run_local(weighted, artifacts=str(tmp_path / "a"), rows=3) == pytest.approx(1.5)
    with pytest.raises(TypeMismatchError, match=r"task 'total': input 'frame': DataFrame has no column 'label'"):
        run_local(weighted, artifacts=str(tmp_path / "a"), rows=3, labelled=False)


def test_import_engine_imports_neither_pandas_nor_torch() -> None:
    code = (
        "import sys, engine, engine.types; print(sorted(m for m in ('pandas', 'torch', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
