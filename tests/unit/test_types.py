"""Type codec: every supported type round-trips; mismatches name the place, the type and the value."""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import pytest
from pydantic import BaseModel

from engine import Directory, File, PayloadTooLargeError, TypeMismatchError, run_local, task, workflow
from engine.artifacts import ArtifactStore, pack_code
from engine.types import ValueCodec, check_payload_size, pack, unpack


class Shade(enum.Enum):
    DARK = 1
    LIGHT = 2


@dataclass
class Box:
    w: int
    label: str


class Config(BaseModel):
    lr: float
    layers: list[int]
    box: Box


CASES = [
    (int, 3),
    (float, 0.5),
    (bool, False),
    (str, "ünïcode"),
    (bytes, b"\x00\x01"),
    (type(None), None),
    (Optional[int], None),
    (Optional[int], 4),
    (Union[int, str], "x"),
    (list[str], ["a"]),
    (dict[str, int], {"a": 1}),
    (dict[int, str], {1: "a"}),
    (tuple[int, str], (1, "a")),
    (set[int], {1, 2}),
    (Shade, Shade.LIGHT),
    (dt.datetime, dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)),
    (dt.date, dt.date(2026, 1, 2)),
    (Box, Box(1, "b")),
    (Config, Config(lr=0.1, layers=[1], box=Box(2, "c"))),
    (list[Config], [Config(lr=0.2, layers=[], box=Box(3, "d"))]),
]


@pytest.mark.parametrize(("annotation", "value"), CASES, ids=[repr(c[0]) for c in CASES])
def test_round_trip(annotation, value):
    codec = ValueCodec(annotation)
    wire = unpack(pack(codec.to_wire(value, "test")))
    assert codec.from_wire(wire, "test") == value


def test_mismatch_message_names_place_type_and_value():
    with pytest.raises(TypeMismatchError, match=r"task 'x': input 'rows': expected int, got 'many' \(str\)"):
        ValueCodec(int).to_wire("many", "task 'x': input 'rows'")
    with pytest.raises(TypeMismatchError, match=r"expected list\[int\]"):
        ValueCodec(list[int]).to_wire([1, "b"], "here")


def test_oversized_payload_is_refused_with_advice():
    with pytest.raises(PayloadTooLargeError, match="return a File or Directory"):
        check_payload_size(b"x" * 3_000_000, "the return value of task 'big'")


def test_files_and_directories_upload_and_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    store = ArtifactStore(str(tmp_path / "store"))
    (tmp_path / "f.txt").write_text("data")
    (tmp_path / "d" / "x").mkdir(parents=True)
    (tmp_path / "d" / "x" / "a.txt").write_text("a")
    codec = ValueCodec(tuple[File, Directory])
    wire = unpack(pack(codec.to_wire((File(tmp_path / "f.txt"), Directory(tmp_path / "d")), "t", store.context())))
    assert wire[0]["kind"] == "file" and wire[0]["uri"].startswith(str(tmp_path / "store"))
    ref_only = codec.from_wire(wire, "t")
    with pytest.raises(RuntimeError, match="Workflow code cannot read files"):
        ref_only[0].path
    f, d = codec.from_wire(wire, "t", store.context())
    assert Path(f.path).read_text() == "data" and Path(d.path, "x", "a.txt").read_text() == "a"
    # content addressing: the same directory packs to the same digest
    again = codec.to_wire((File(tmp_path / "f.txt"), Directory(tmp_path / "d")), "t", store.context())
    assert again == wire


def test_local_file_cannot_leave_a_workflow_without_a_store(tmp_path):
    with pytest.raises(TypeMismatchError, match="create Files inside tasks"):
        ValueCodec(File).to_wire(File(tmp_path / "nope"), "workflow result")


def test_missing_file_is_reported(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    with pytest.raises(TypeMismatchError, match=r"cannot encode value as File: FileNotFoundError: .*does not exist"):
        ValueCodec(File).to_wire(File(tmp_path / "missing.bin"), "t", store.context())


@task
def write(text: str) -> File:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "out.txt"
    path.write_text(text)
    return File(path)


@task
def read(f: File) -> str:
    return Path(f.path).read_text()


@task
def wrong() -> int:
    return "nope"  # type: ignore[return-value]


@workflow
async def local_flow(text: str) -> str:
    return await read(f=await write(text=text))


@workflow
async def local_wrong() -> int:
    return await wrong()


def test_run_local_checks_types_and_moves_files(tmp_path):
    assert run_local(local_flow, artifacts=str(tmp_path), text="hi") == "hi"
    with pytest.raises(TypeMismatchError, match="task 'wrong': return value: expected int"):
        run_local(local_wrong, artifacts=str(tmp_path))
    with pytest.raises(TypeMismatchError, match="input 'text': expected str"):
        run_local(local_flow, artifacts=str(tmp_path), text=["not", "text"])


def test_code_bundle_is_reproducible_and_names_the_module(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "flow.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "junk.py").write_text("")
    first, second = pack_code(tmp_path / "pkg" / "sub" / "flow.py"), pack_code(tmp_path / "pkg" / "sub" / "flow.py")
    assert first.data == second.data and first.module == "pkg.sub.flow" and first.root == tmp_path
    import io
    import zipfile

    assert sorted(zipfile.ZipFile(io.BytesIO(first.data)).namelist()) == [
        "pkg/__init__.py",
        "pkg/sub/__init__.py",
        "pkg/sub/flow.py",
    ]
