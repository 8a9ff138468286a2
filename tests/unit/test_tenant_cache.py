"""Each artifact store (each tenant's root) has its own local cache: fetched files, directories and extracted code
bundles of one store are never handed to a reader of another, even for the same sha256; a cached copy changed
since it was fetched or extracted is fetched again; a reference into another store is refused."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine import Directory, File, TypeMismatchError
from engine.artifacts import ArtifactStore, pack_code
from engine.artifacts.loader import CodeLoader, CodeNotFoundError
from engine.artifacts.store import cache_dir, store_key
from engine.core.definitions import TaskDefinition
from engine.core.wire import CodeRef
from engine.types import ValueCodec, pack, unpack

FLOW = """
from pathlib import Path

from engine import task


@task
def config() -> str:
    return (Path(__file__).parent / "config.txt").read_text()
"""


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ArtifactStore, ArtifactStore]:
    """Two tenants' roots on one machine (one cache folder, as on a shared node)."""
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(str(tmp_path / "artifacts" / "team-a")), ArtifactStore(str(tmp_path / "artifacts" / "team-b"))


def uploaded(store: ArtifactStore, value: Any, annotation: Any) -> dict[str, Any]:
    return dict(unpack(pack(ValueCodec(annotation).to_wire(value, "x", store.context()))))


def read(store: ArtifactStore, ref: dict[str, Any], annotation: Any = File) -> Any:
    return ValueCodec(annotation).from_wire(ref, "x", store.context())


def bundle(tmp_path: Path, store: ArtifactStore, text: str) -> CodeRef:
    """A code bundle in ``store`` (its content unique to the test: bundles are imported once per process)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "flow.py").write_text(FLOW)
    (project / "config.txt").write_text(f"{text} {tmp_path}")
    packed = pack_code(project / "flow.py")
    uri, sha = store.put_bytes(packed.data)
    return CodeRef(packed.module, "config", uri, sha)


def fresh_folder(ref: CodeRef, store: ArtifactStore) -> Path:
    """The bundle's folder as a new process's loader finds it."""
    folder = CodeLoader().folder_for(ref, store)
    assert folder is not None
    return folder


def test_two_stores_holding_the_same_content_never_share_a_cached_copy(stores, tmp_path):
    a, b = stores
    (tmp_path / "f.txt").write_text("same bytes")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("same tree")
    file_a, file_b = uploaded(a, File(tmp_path / "f.txt"), File), uploaded(b, File(tmp_path / "f.txt"), File)
    dir_a, dir_b = uploaded(a, Directory(tmp_path / "d"), Directory), uploaded(b, Directory(tmp_path / "d"), Directory)
    assert file_a["sha256"] == file_b["sha256"] and dir_a["sha256"] == dir_b["sha256"]

    path_a, path_b = Path(read(a, file_a).path), Path(read(b, file_b).path)
    folder_a, folder_b = Path(read(a, dir_a, Directory).path), Path(read(b, dir_b, Directory).path)
    assert path_a != path_b and folder_a != folder_b
    assert path_a.read_text() == path_b.read_text() == "same bytes"
    stores_dir = cache_dir() / "stores"
    assert path_a.is_relative_to(stores_dir / store_key(a.uri_root))
    assert path_b.is_relative_to(stores_dir / store_key(b.uri_root))
    assert folder_a.is_relative_to(stores_dir / store_key(a.uri_root) / "artifacts")

    ref_a = bundle(tmp_path, a, "v1")
    ref_b = bundle(tmp_path, b, "v1")  # the same code, stored by the other tenant
    assert ref_a.bundle_sha == ref_b.bundle_sha and ref_a.bundle != ref_b.bundle
    loader = CodeLoader()
    code_a, code_b = loader.folder_for(ref_a, a), loader.folder_for(ref_b, b)
    assert code_a and code_b and code_a != code_b
    assert code_a.is_relative_to(stores_dir / store_key(a.uri_root) / "bundles")
    assert code_b.is_relative_to(stores_dir / store_key(b.uri_root) / "bundles")
    assert (code_b / "config.txt").read_text() == f"v1 {tmp_path}"
    # a reference given without the run's store is cached in the store it points into
    assert loader.folder_for(ref_b) == code_b


def test_a_tampered_copy_in_one_tenants_cache_is_fetched_again_and_the_others_is_untouched(stores, tmp_path):
    a, b = stores
    (tmp_path / "f.txt").write_text("weights")
    ref_a, ref_b = uploaded(a, File(tmp_path / "f.txt"), File), uploaded(b, File(tmp_path / "f.txt"), File)
    cached_a, cached_b = Path(read(a, ref_a).path), Path(read(b, ref_b).path)
    before_b = cached_b.stat()

    time.sleep(0.01)
    cached_a.write_text("poisoned")  # same size: a task of tenant A wrote into its input, or worse
    again = Path(read(a, ref_a).path)
    assert again == cached_a and again.read_text() == "weights"  # fetched again, never handed out
    assert read(b, ref_b).path == str(cached_b) and cached_b.read_text() == "weights"
    after_b = cached_b.stat()
    assert (after_b.st_ino, after_b.st_ctime_ns) == (before_b.st_ino, before_b.st_ctime_ns)  # not even rewritten


def test_a_reference_into_another_tenants_root_is_refused(stores, tmp_path):
    a, b = stores
    (tmp_path / "f.txt").write_text("theirs")
    theirs = uploaded(b, File(tmp_path / "f.txt"), File)
    with pytest.raises(TypeMismatchError, match="outside this run's store"):
        read(a, theirs)
    assert not (cache_dir() / "stores" / store_key(a.uri_root)).exists()  # nothing fetched into A's cache

    their_code = bundle(tmp_path, b, "b-only")
    with pytest.raises(CodeNotFoundError, match="outside this run's store"):
        CodeLoader().load(their_code, a)
    with pytest.raises(CodeNotFoundError, match="outside this run's store"):
        CodeLoader().folder_for(their_code, a)
    for sha in ("../../../escape" + "0" * 49, "ABC"):
        with pytest.raises(CodeNotFoundError, match="is not 64 hex digits"):
            CodeLoader().load(CodeRef(their_code.module, "config", their_code.bundle, sha), b)


def test_a_cached_bundle_whose_files_were_changed_is_extracted_again(stores, tmp_path):
    a, _ = stores
    ref = bundle(tmp_path, a, "original")
    folder = CodeLoader().folder_for(ref, a)
    assert folder is not None
    defn = CodeLoader().load(ref, a)
    assert isinstance(defn, TaskDefinition) and defn.fn() == f"original {tmp_path}"

    # a later process (a fresh loader) re-hashes what an earlier one extracted
    time.sleep(0.01)
    (folder / "config.txt").write_text(f"planted {tmp_path}")
    assert CodeLoader().folder_for(ref, a) == folder
    assert (folder / "config.txt").read_text() == f"original {tmp_path}"

    # the same process notices a change too (the file's change time moved)
    loader = CodeLoader()
    loader.folder_for(ref, a)
    time.sleep(0.01)
    (folder / "flow.py").write_text("raise SystemExit('planted code')\n")
    assert loader.folder_for(ref, a) == folder and "planted" not in (folder / "flow.py").read_text()

    # a removed file, or a folder without its cached zip (an extraction from before, or cut short), likewise
    (folder / "config.txt").unlink()
    assert (fresh_folder(ref, a) / "config.txt").is_file()
    folder.with_name(folder.name + ".zip").unlink()
    (folder / "config.txt").write_text("not checked")
    assert (fresh_folder(ref, a) / "config.txt").read_text() == f"original {tmp_path}"
    # a file added to the folder (a task's output) is no change to the bundle: kept, and nothing re-extracted
    (folder / "output.bin").write_bytes(b"a rank wrote this")
    assert CodeLoader().folder_for(ref, a) == folder and (folder / "output.bin").exists()


def test_a_bundle_whose_store_copy_is_corrupt_is_refused(stores, tmp_path):
    a, _ = stores
    ref = bundle(tmp_path, a, "corrupt")
    Path(ref.bundle or "").write_bytes(b"not the zip that was stored")
    with pytest.raises(CodeNotFoundError, match="does not match its sha256"):
        CodeLoader().load(ref, a)
    assert not a.cache_path("bundles", ref.bundle_sha or "").exists()
