"""The task cache without a server: the key (engine.core.cache_key), the entries in a store
(engine.artifacts.cache_index), the options of @task and of `gangflow run`, and the run context's wire form."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from engine import File, task
from engine.artifacts import cache_index
from engine.artifacts.store import ArtifactStore
from engine.cli.app import build_parser, run_options
from engine.cli.cache import cache_mode
from engine.core.cache_key import cache_key, canonical, check_cache_mode, interface_hash
from engine.core.definitions import TaskDefinition, definition_of
from engine.core.wire import CodeRef, Envelope, RunContext
from engine.errors import DefinitionError, InputError
from engine.types.codec import pack, unpack


def _defn(fn: object) -> TaskDefinition:
    defn = definition_of(fn)
    assert isinstance(defn, TaskDefinition)
    return defn


@task(cache=True, cache_version="1")
def fit(data: File, epochs: int, opts: dict[str, int] | None = None) -> File:
    raise NotImplementedError


@task(cache=True, cache_version="1")
def fit_float(data: File, epochs: float, opts: dict[str, int] | None = None) -> File:
    raise NotImplementedError


@task(cache=True, cache_version="1")
def fit_str(data: File, epochs: int, opts: dict[str, int] | None = None) -> str:
    raise NotImplementedError


def _uploaded(store: ArtifactStore, folder: Path, name: str, content: bytes) -> dict[str, object]:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    art = File(path)
    store.upload(art)
    return art.ref()


def _key(fn: object, wire: dict[str, object], version: str = "1") -> str:
    defn = _defn(fn)
    return cache_key(defn.name, version, defn.interface, wire)


def test_a_file_counts_by_content_not_by_path(tmp_path: Path) -> None:
    one, two = ArtifactStore(str(tmp_path / "a")), ArtifactStore(str(tmp_path / "b"))
    ref1 = _uploaded(one, tmp_path / "x", "data.csv", b"1,2,3\n")
    ref2 = _uploaded(two, tmp_path / "y" / "deeper", "other-name.csv", b"1,2,3\n")
    assert ref1["uri"] != ref2["uri"] and ref1["name"] != ref2["name"]
    assert _key(fit, {"data": ref1, "epochs": 3, "opts": None}) == _key(fit, {"data": ref2, "epochs": 3, "opts": None})
    ref3 = _uploaded(one, tmp_path / "x", "data.csv", b"1,2,4\n")
    assert _key(fit, {"data": ref1, "epochs": 3, "opts": None}) != _key(fit, {"data": ref3, "epochs": 3, "opts": None})


def test_the_order_of_keys_does_not_matter_but_values_do() -> None:
    ref = {"kind": "file", "uri": "/s/cas/ab/x", "sha256": "a" * 64, "name": "d", "size": 1}
    base = _key(fit, {"data": ref, "epochs": 3, "opts": {"a": 1, "b": 2}})
    assert base == _key(fit, {"opts": {"b": 2, "a": 1}, "epochs": 3, "data": ref})
    assert base != _key(fit, {"data": ref, "epochs": 4, "opts": {"a": 1, "b": 2}})
    assert base != _key(fit, {"data": ref, "epochs": 3, "opts": {"a": 1, "b": 3}})
    assert base != _key(fit, {"data": ref, "epochs": 3, "opts": None})


def test_a_new_version_or_interface_is_a_miss() -> None:
    ref = {"kind": "file", "uri": "/s/cas/ab/x", "sha256": "a" * 64, "name": "d", "size": 1}
    wire = {"data": ref, "epochs": 3, "opts": None}
    base = _key(fit, wire)
    assert base != _key(fit, wire, version="2")
    defn, other_in, other_out = _defn(fit), _defn(fit_float), _defn(fit_str)
    # the same name and inputs, another type of one input, or of the output: another key
    assert base != cache_key(defn.name, "1", other_in.interface, wire)
    assert base != cache_key(defn.name, "1", other_out.interface, wire)
    assert interface_hash(defn.interface) == interface_hash(defn.interface)  # computed once, then remembered
    assert len(base) == 64 and base == _key(fit, dict(wire))  # deterministic


def test_canonical_keeps_types_apart() -> None:
    assert canonical(b"a") != canonical("a")
    assert canonical({1: "x"}) != canonical({"1": "x"})
    assert canonical([1, 2]) != canonical([2, 1])
    assert canonical(float("nan")) == canonical(float("nan"))


def test_task_options_are_checked_at_import() -> None:
    def body(x: int) -> int:
        return x

    with pytest.raises(DefinitionError, match="cache_version applies to cached tasks only"):
        task(cache_version="1")(body)
    with pytest.raises(DefinitionError, match="cache_version must be a non-empty str"):
        task(cache=True, cache_version=2)(body)  # type: ignore[call-overload]
    with pytest.raises(DefinitionError, match="cache must be True or False"):
        task(cache="yes")(body)  # type: ignore[call-overload]
    assert _defn(task(cache=True)(body)).cache_version == "0"
    plain = _defn(task(body))
    assert (plain.cache, plain.cache_version) == (False, None)


def test_the_cache_mode_travels_only_when_it_is_not_the_default() -> None:
    run = RunContext("r", "p", "default", "/a")
    old = Envelope(CodeRef("m", "q"), {}, run).encode("x")
    assert "cache" not in unpack(old)["run"]  # an envelope without caching is what it was before caching
    assert Envelope.decode(old).run.cache == "use"
    skip = Envelope(CodeRef("m", "q"), {}, dataclasses.replace(run, cache="skip")).encode("x")
    assert Envelope.decode(skip).run.cache == "skip"
    assert check_cache_mode("overwrite") == "overwrite"
    with pytest.raises(InputError, match="cache must be one of"):
        check_cache_mode("sometimes")


def test_run_options() -> None:
    parser = build_parser()
    assert {"--no-cache", "--overwrite-cache"} <= run_options(parser).keys()
    assert cache_mode(parser.parse_args(["run", "f.py:wf", "--no-cache"])) == "skip"
    assert cache_mode(parser.parse_args(["run", "f.py:wf", "--overwrite-cache"])) == "overwrite"
    assert cache_mode(parser.parse_args(["run", "f.py:wf"])) == "use"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "f.py:wf", "--no-cache", "--overwrite-cache"])


def _entry(store: ArtifactStore, tmp_path: Path, key: str, content: bytes = b"model") -> cache_index.CacheEntry:
    ref = _uploaded(store, tmp_path / "src", "model.pt", content)
    result = pack({"model": ref, "loss": 0.5})
    return cache_index.CacheEntry(
        "train", "1", key, "run-1", "train-1", cache_index.now_iso(), result, cache_index.artifact_refs(unpack(result))
    )


def test_entries_record_list_lookup_and_clear(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    entry = _entry(store, tmp_path, "b" * 64)
    cache_index.record(store, "default", entry)
    path = Path(cache_index.entry_path(store, "default", "train", "b" * 64))
    assert path == tmp_path / "store" / "cache" / "default" / "train" / f"{'b' * 64}.json"
    assert json.loads(path.read_text())["run_id"] == "run-1"
    found = cache_index.lookup(store, "default", "train", "b" * 64)
    assert found is not None and found.result == entry.result and len(found.artifacts) == 1
    assert cache_index.lookup(store, "team-a", "train", "b" * 64) is None  # entries are per tenant
    assert cache_index.lookup(store, "default", "train", "c" * 64) is None
    assert [e.key for e in cache_index.list_entries(store, "default")] == ["b" * 64]
    assert cache_index.list_entries(store, "default", "prepare") == []
    assert cache_index.list_entries(store, "default")[0].size == len(entry.result) + len(b"model")
    assert cache_index.clear(store, "default", "prepare") == 0
    assert cache_index.clear(store, "default") == 1
    assert cache_index.lookup(store, "default", "train", "b" * 64) is None


def test_a_missing_or_corrupt_artifact_is_a_miss(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    entry = _entry(store, tmp_path, "d" * 64, b"weights")
    cache_index.record(store, "default", entry)
    obj = Path(store._cas_path(hashlib.sha256(b"weights").hexdigest()))
    obj.write_bytes(b"damaged")
    assert cache_index.lookup(store, "default", "train", "d" * 64) is None
    assert not obj.exists()  # removed, so the recomputed task uploads it again
    store.put_bytes(b"weights")
    assert cache_index.lookup(store, "default", "train", "d" * 64) is not None
    os.unlink(obj)
    assert cache_index.lookup(store, "default", "train", "d" * 64) is None


def test_bad_names_never_become_paths(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    with pytest.raises(ValueError, match="not a plain name"):
        cache_index.entry_path(store, "../other", "train", "a" * 64)
    with pytest.raises(ValueError, match="not a plain name"):
        cache_index.entry_path(store, "default", "train", "../../x")
    (tmp_path / "store" / "cache" / "default" / "train").mkdir(parents=True)
    (tmp_path / "store" / "cache" / "default" / "train" / f"{'e' * 64}.json").write_text("{not json")
    assert cache_index.lookup(store, "default", "train", "e" * 64) is None  # unreadable: a miss, not an error
    assert cache_index.list_entries(store, "default") == []


def _cache_cli(capsys: pytest.CaptureFixture[str], store: Path, *argv: str) -> tuple[int, str]:
    import asyncio

    from engine.cli.cache import cmd_cache

    args = build_parser().parse_args(["cache", *argv, "--artifacts", str(store), "--tenant", "default"])
    code = asyncio.run(cmd_cache(args))
    return code, capsys.readouterr().out


def test_gangflow_cache_list_and_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.common import CliError

    store = ArtifactStore(str(tmp_path / "store"))
    for n, key in enumerate(("a" * 64, "b" * 64)):
        entry = dataclasses.replace(_entry(store, tmp_path, key, b"m%d" % n), task=("train", "prepare")[n])
        cache_index.record(store, "default", entry)
    code, out = _cache_cli(capsys, tmp_path / "store", "list", "--json")
    rows = json.loads(out)
    assert code == 0 and sorted(r["task"] for r in rows) == ["prepare", "train"]
    assert {r["run_id"] for r in rows} == {"run-1"} and {r["version"] for r in rows} == {"1"}
    assert all(r["size"] > 0 and len(r["key"]) == 64 for r in rows)
    code, out = _cache_cli(capsys, tmp_path / "store", "list", "--task", "train")
    assert "train" in out and "prepare" not in out and "run-1" in out and "a" * 12 in out
    code, out = _cache_cli(capsys, tmp_path / "store", "clear", "--task", "train")
    assert "removed 1 cache entry of task train" in out
    assert [e.task for e in cache_index.list_entries(store, "default")] == ["prepare"]
    assert "removed 1 cache entry" in _cache_cli(capsys, tmp_path / "store", "clear")[1]
    assert "no cache entries" in _cache_cli(capsys, tmp_path / "store", "list")[1]
    with pytest.raises(CliError, match="is not a task name") as bad:
        _cache_cli(capsys, tmp_path / "store", "list", "--task", "../x")
    assert bad.value.code == 2


def test_the_hit_marker_names_the_task_and_the_source_run() -> None:
    from engine.core.protocol import hit_id, parse_hit_id

    assert parse_hit_id(hit_id("gang", "train", "nightly:2026-12-01")) == ("gang", "train", "nightly:2026-12-01")
    assert parse_hit_id("train-1#1") is None and parse_hit_id("cached:task") is None
