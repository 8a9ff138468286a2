"""What a reader of the artifact store refuses or repairs: references whose name or digest could steer a cache
path out of its folder, references to another store (another tenant's) or to a path of the sender's choosing,
content whose sha256 is not the reference's (files and directories alike), and a cached copy changed since it
was fetched."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from engine import Directory, File, TypeMismatchError
from engine.artifacts import ArtifactStore
from engine.types import ValueCodec, pack, unpack


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(str(tmp_path / "store"))


def uploaded(store: ArtifactStore, value: Any, annotation: Any) -> dict[str, Any]:
    return dict(unpack(pack(ValueCodec(annotation).to_wire(value, "x", store.context()))))


def read(store: ArtifactStore, ref: dict[str, Any], annotation: Any = File) -> Any:
    return ValueCodec(annotation).from_wire(ref, "x", store.context())


@pytest.mark.parametrize("name", ["../../somewhere", "a/b", "..", ".", "", "evil\\name", "nul\x00"])
def test_a_name_with_path_components_is_refused(store, tmp_path, name):
    (tmp_path / "f.txt").write_text("data")
    ref = {**uploaded(store, File(tmp_path / "f.txt"), File), "name": name}
    with pytest.raises(TypeMismatchError, match="is not a plain file name"):
        read(store, ref)
    assert not (tmp_path / "somewhere").exists()


@pytest.mark.parametrize("sha", ["../../../tmp/x" + "0" * 50, "ABC", "0" * 63])
def test_a_digest_that_is_not_a_sha256_is_refused(store, tmp_path, sha):
    (tmp_path / "f.txt").write_text("data")
    with pytest.raises(TypeMismatchError, match="is not 64 hex digits"):
        read(store, {**uploaded(store, File(tmp_path / "f.txt"), File), "sha256": sha})


def test_a_reference_into_another_store_or_anywhere_else_is_refused(store, tmp_path):
    other = ArtifactStore(str(tmp_path / "other-tenant"))
    (tmp_path / "f.txt").write_text("theirs")
    theirs = uploaded(other, File(tmp_path / "f.txt"), File)
    with pytest.raises(TypeMismatchError, match="outside this run's store"):
        read(store, theirs)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    anywhere = {"kind": "file", "uri": str(secret), "sha256": sha, "name": "secret.txt", "size": 9}
    with pytest.raises(TypeMismatchError, match="outside this run's store"):
        read(store, anywhere)
    # a path that walks out of the store's cas folder and back in is not the object either
    mine = uploaded(store, File(tmp_path / "f.txt"), File)
    sneaky = {**mine, "uri": mine["uri"].replace("/cas/", "/cas/../cas/")}
    assert read(store, sneaky).read_bytes() == b"theirs"  # the same object, spelled another way: allowed
    with pytest.raises(TypeMismatchError, match="outside this run's store"):
        read(store, {**mine, "uri": mine["uri"] + "/../../logs/x"})


def test_a_directory_archive_is_checked_like_a_file(store, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    ref = uploaded(store, Directory(tmp_path / "d"), Directory)
    Path(ref["uri"]).write_bytes(b"not the archive that was uploaded")
    with pytest.raises(OSError, match="is corrupt"):
        read(store, ref, Directory)


def test_a_cached_copy_changed_since_it_was_fetched_is_fetched_again(store, tmp_path):
    (tmp_path / "f.txt").write_text("original")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    file_ref = uploaded(store, File(tmp_path / "f.txt"), File)
    dir_ref = uploaded(store, Directory(tmp_path / "d"), Directory)
    cached = Path(read(store, file_ref).path)
    folder = Path(read(store, dir_ref, Directory).path)
    assert read(store, file_ref).path == str(cached)  # a second read is the cache

    time.sleep(0.01)
    cached.write_text("tampered")  # same size, new content: a task wrote into its input, or worse
    (folder / "extra.txt").write_text("planted")
    assert Path(read(store, file_ref).path).read_text() == "original"
    again = Path(read(store, dir_ref, Directory).path)
    assert sorted(p.name for p in again.iterdir()) == ["a.txt"] and (again / "a.txt").read_text() == "a"
    os.utime(cached, ns=(0, 0))  # even with its times put back, a rewrite shows in the inode's change time
    assert read(store, file_ref).read_bytes() == b"original"
