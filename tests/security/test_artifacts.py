"""Attacks on the node's caches of code bundles and artifacts, and on archive extraction (issue 20, attacks 3 and 4),
and the cache's safety under concurrent fetchers and crashes (issue 21). Without a stack: the store, loader and
extraction APIs directly, in real processes where processes matter.

Each attack is what a tenant could do with write access to a shared cache or to its own artifact store (a crafted
bundle or Directory archive), asserting it fails: planted code never runs, nothing is written outside the cache
folder, an archive over the caps is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from engine import Directory, File
from engine.artifacts import ArtifactStore, pack_code
from engine.artifacts.extract import MAX_BYTES_ENV, MAX_FILES_ENV, ArchiveRefused, limits
from engine.artifacts.loader import CodeLoader, CodeNotFoundError
from engine.artifacts.store import cache_dir
from engine.core.wire import CodeRef
from engine.types import ValueCodec, pack, unpack

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]

FLOW = """
from pathlib import Path

from engine import task


@task
def whoami() -> str:
    return "original {tag}"
"""


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(str(tmp_path / "artifacts"))


def uploaded(store: ArtifactStore, value: Any, annotation: Any) -> dict[str, Any]:
    return dict(unpack(pack(ValueCodec(annotation).to_wire(value, "x", store.context()))))


def read(store: ArtifactStore, ref: dict[str, Any], annotation: Any = File) -> Any:
    return ValueCodec(annotation).from_wire(ref, "x", store.context())


def code_ref(tmp_path: Path, store: ArtifactStore, tag: str) -> CodeRef:
    project = tmp_path / f"project-{tag}"
    project.mkdir(parents=True)
    (project / "flow.py").write_text(FLOW.format(tag=f"{tag} {tmp_path}"))
    packed = pack_code(project / "flow.py")
    uri, sha = store.put_bytes(packed.data)
    return CodeRef(packed.module, "whoami", uri, sha)


def crafted_ref(store: ArtifactStore, data: bytes, module: str = "flow") -> CodeRef:
    uri, sha = store.put_bytes(data)
    return CodeRef(module, "whoami", uri, sha)


def zip_of(*members: tuple[str | zipfile.ZipInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def in_new_process(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a rank, a worker): a new process verifies what it takes from the cache."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def no_leftovers(folder: Path) -> None:
    """Nothing half-written is left under a name a reader would take."""
    if folder.exists():
        names = [p.name for p in folder.iterdir()]
        assert all(n.endswith(".lock") for n in names), names


# -- attack 3: planting code or data in the cache -------------------------------------------------------------
LOAD_AND_CALL = """
    import sys
    from engine.artifacts import ArtifactStore
    from engine.artifacts.loader import LOADER
    from engine.core.wire import CodeRef
    module, uri, sha, root = sys.argv[1:] if len(sys.argv) > 4 else {args}
    print(LOADER.load(CodeRef(module, "whoami", uri, sha), ArtifactStore(root)).fn())
"""


def test_rewriting_a_cached_bundle_file_its_zip_and_a_manifest_does_not_run_planted_code(store, tmp_path):
    ref = code_ref(tmp_path, store, "victim")
    args = repr((ref.module, ref.bundle, ref.bundle_sha, store.uri_root))
    first = in_new_process(LOAD_AND_CALL.format(args=args))
    assert first.returncode == 0 and first.stdout.startswith("original victim"), first.stderr
    folder = store.cache_path("bundles", ref.bundle_sha or "")
    marker = tmp_path / "pwned"
    planted = (
        f"open({str(marker)!r}, 'w').write('x')\n"
        "from engine import task\n@task\ndef whoami() -> str:\n    return 'planted'\n"
    )
    # the attacker rewrites the module, the cached zip beside it (so file and "archive" agree), and writes a
    # manifest of its own choosing (what the cache used to believe)
    (folder / "flow.py").write_text(planted)
    folder.with_name(folder.name + ".zip").write_bytes(zip_of(("flow.py", planted.encode())))
    (folder / ".gangflow-manifest.json").write_text(
        json.dumps({"sha256": ref.bundle_sha, "files": {"flow.py": hashlib.sha256(planted.encode()).hexdigest()}})
    )
    again = in_new_process(LOAD_AND_CALL.format(args=args))
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("original victim") and not marker.exists()
    assert "planted" not in (folder / "flow.py").read_text()  # re-extracted from the store


def test_a_module_planted_beside_a_bundles_files_is_never_imported_in_its_name(store, tmp_path):
    ref = code_ref(tmp_path, store, "extra")
    loader = CodeLoader()
    folder = loader.folder_for(ref, store)
    assert folder is not None
    (folder / "planted.py").write_text("raise SystemExit('planted code ran')\n")
    package = loader._bundle_for(ref.bundle or "", ref.bundle_sha or "", store).package
    with pytest.raises(ModuleNotFoundError, match="not a file of the code bundle"):
        __import__(f"{package}.planted")


def test_a_rewritten_cached_file_or_directory_is_not_handed_out_even_with_its_times_restored(store, tmp_path):
    (tmp_path / "w.bin").write_bytes(b"weights" * 100)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.py").write_text("x = 1\n")
    file_ref, dir_ref = (
        uploaded(store, File(tmp_path / "w.bin"), File),
        uploaded(store, Directory(tmp_path / "d"), Directory),
    )
    cached, folder = Path(read(store, file_ref).path), Path(read(store, dir_ref, Directory).path)
    before = cached.stat()
    cached.write_bytes(b"poisons" * 100)  # same size
    os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
    (folder / "a.py").write_text("x = 2\n")
    # a later process re-hashes; this one notices the inode's change time
    got = in_new_process(
        f"""
        from engine.artifacts import ArtifactStore
        from engine import File
        from engine.types import ValueCodec
        s = ArtifactStore({store.uri_root!r})
        print(ValueCodec(File).from_wire({file_ref!r}, "x", s.context()).read_bytes()[:7].decode())
        """
    )
    assert got.stdout.strip() == "weights", got.stderr
    cached.write_bytes(b"poisons" * 100)
    assert read(store, file_ref).read_bytes() == b"weights" * 100
    assert (Path(read(store, dir_ref, Directory).path) / "a.py").read_text() == "x = 1\n"


@pytest.mark.skipif(not ROOT, reason="the cache is root-owned and read-only to others only where the agent is root")
def test_as_root_the_cache_is_root_owned_and_read_only_to_others(store, tmp_path):
    # a rank user made a folder of the cache world-writable before the agent first used it
    (tmp_path / "cache" / "stores").mkdir(parents=True)
    os.chmod(tmp_path / "cache" / "stores", 0o777)
    (tmp_path / "f.txt").write_text("data")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "d" / "run.sh", 0o775)
    (tmp_path / "d" / "open.txt").write_text("x")
    os.chmod(tmp_path / "d" / "open.txt", 0o666)
    fetched = Path(read(store, uploaded(store, File(tmp_path / "f.txt"), File)).path)
    folder = Path(read(store, uploaded(store, Directory(tmp_path / "d"), Directory), Directory).path)
    CodeLoader().folder_for(code_ref(tmp_path, store, "perm"), store)
    for path in [tmp_path / "cache", *(tmp_path / "cache").rglob("*")]:
        info = os.lstat(path)
        assert info.st_uid == 0 and not info.st_mode & 0o022, (path, oct(info.st_mode))
        if stat.S_ISDIR(info.st_mode):
            assert stat.S_IMODE(info.st_mode) == 0o755, path
    assert stat.S_IMODE(fetched.stat().st_mode) == 0o644
    assert stat.S_IMODE((folder / "run.sh").stat().st_mode) == 0o755


@pytest.mark.skipif(not ROOT, reason="only root is refused a symlinked cache folder (another user could plant one)")
def test_as_root_a_symlink_planted_in_the_cache_is_refused(store, tmp_path):
    (tmp_path / "f.txt").write_text("data")
    ref = uploaded(store, File(tmp_path / "f.txt"), File)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stores = tmp_path / "cache" / "stores"
    stores.mkdir(parents=True)
    (stores / store.cache_path("artifacts", ref["sha256"]).relative_to(stores).parts[0]).symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a plain folder"):
        store.fetch(ValueCodec(File).from_wire(ref, "x", {}))
    assert not any(elsewhere.iterdir())


# -- attack 4: crafted archives ---------------------------------------------------------------------------------
def test_a_bundle_with_dotdot_or_absolute_names_is_refused_and_writes_nothing_outside(store, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    victim.chmod(0o600)
    absolute = tmp_path / "absolute.txt"
    for name, why in (("../../../../victim.txt", "'..' component"), (str(absolute), "absolute name")):
        info = zipfile.ZipInfo(name)
        info.external_attr = 0o100755 << 16  # the old extraction chmod-ed this path, outside the bundle
        ref = crafted_ref(store, zip_of(("flow.py", b"x = 1\n"), (info, b"planted")))
        with pytest.raises(CodeNotFoundError, match=why):
            CodeLoader().load(ref, store)
        assert not store.cache_path("bundles", ref.bundle_sha or "").exists()
        no_leftovers(store.cache_path("bundles", ref.bundle_sha or "").parent)
    assert victim.read_text() == "mine" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not absolute.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "cache", "victim.txt"]


def test_a_zip_bomb_is_refused_before_anything_is_written(store, tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_BYTES_ENV, str(1 << 20))
    bomb = zip_of(("flow.py", b"x = 1\n"), ("zeros.bin", bytes(4 << 20)))  # 4 MiB of zeros: a few KiB zipped
    assert len(bomb) < 64 << 10
    ref = crafted_ref(store, bomb)
    with pytest.raises(CodeNotFoundError, match=f"more than the {1 << 20} allowed"):
        CodeLoader().load(ref, store)
    no_leftovers(store.cache_path("bundles", ref.bundle_sha or "").parent)

    # the same bomb declaring a small size (a lying central directory) is cut off at the declared size and refused
    monkeypatch.setenv(MAX_BYTES_ENV, str(8 << 20))
    liar = bytearray(bomb)
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local header, central directory
        at = liar.rfind(signature)
        struct.pack_into("<I", liar, at + offset, 100)
    ref = crafted_ref(store, bytes(liar))
    with pytest.raises(CodeNotFoundError, match="refused"):
        CodeLoader().load(ref, store)
    no_leftovers(store.cache_path("bundles", ref.bundle_sha or "").parent)

    monkeypatch.setenv(MAX_FILES_ENV, "10")
    ref = crafted_ref(store, zip_of(*((f"m{i}.py", b"") for i in range(11))))
    with pytest.raises(CodeNotFoundError, match=f"holds 11 files, more than the 10 allowed \\({MAX_FILES_ENV}\\)"):
        CodeLoader().load(ref, store)


def test_the_caps_default_to_10_gib_and_100000_files_and_a_bad_setting_is_refused(monkeypatch):
    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)
    monkeypatch.delenv(MAX_FILES_ENV, raising=False)
    assert (limits().max_bytes, limits().max_files) == (10 << 30, 100_000)
    monkeypatch.setenv(MAX_FILES_ENV, "lots")
    with pytest.raises(ArchiveRefused, match=f"{MAX_FILES_ENV}='lots' is not a whole number"):
        limits()


def test_a_bundle_whose_members_clash_is_refused(store, tmp_path):
    ref = crafted_ref(store, zip_of(("flow.py", b"x = 1\n"), ("lib", b"a file"), ("lib/mod.py", b"y = 2\n")))
    with pytest.raises(CodeNotFoundError, match="clashes with another"):
        CodeLoader().load(ref, store)
    no_leftovers(store.cache_path("bundles", ref.bundle_sha or "").parent)


def test_a_symlink_in_a_bundle_is_refused(store, tmp_path):
    link = zipfile.ZipInfo("config.txt")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    ref = crafted_ref(store, zip_of(("flow.py", b"x = 1\n"), (link, b"/etc/shadow")))
    with pytest.raises(CodeNotFoundError, match="a symlink"):
        CodeLoader().load(ref, store)


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def dir_ref(store: ArtifactStore, data: bytes) -> dict[str, Any]:
    uri, sha = store.put_bytes(data)
    return {"kind": "dir", "uri": uri, "sha256": sha, "name": "data", "size": len(data)}


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (link("escape", "../../../../etc/passwd"), "outside"),
        (link("sub/escape", "../../x"), "outside"),
        (link("abs", "/etc/passwd"), "outside"),
        (link("hard", "../../outside.txt", tarfile.LNKTYPE), "outside"),
        (tarfile.TarInfo("../../evil.txt"), "'..' component"),
        (tarfile.TarInfo("/tmp/evil-gangflow.txt"), "absolute name"),
    ],
    ids=["symlink-up", "nested-symlink-up", "absolute-symlink", "hardlink-up", "dotdot-name", "absolute-name"],
)
def test_a_directory_archive_with_an_escaping_name_or_link_is_refused(store, tmp_path, member, why):
    ref = dir_ref(store, tar_of((tarfile.TarInfo("ok.txt"), b"fine"), (member, b"evil")))
    with pytest.raises(Exception, match=why):
        read(store, ref, Directory)
    target = store.cache_path("artifacts", ref["sha256"], "data")
    assert not target.exists()
    no_leftovers(target.parent)
    assert not Path("/tmp/evil-gangflow.txt").exists() and not (tmp_path.parent / "evil.txt").exists()


def test_a_directory_archive_over_the_caps_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_FILES_ENV, "3")
    ref = dir_ref(store, tar_of(*((tarfile.TarInfo(f"f{i}"), b"x") for i in range(4))))
    with pytest.raises(Exception, match="holds 4 files, more than the 3 allowed"):
        read(store, ref, Directory)
    monkeypatch.setenv(MAX_FILES_ENV, "100")
    monkeypatch.setenv(MAX_BYTES_ENV, "1000")
    big = dir_ref(store, tar_of((tarfile.TarInfo("big"), bytes(4000))))
    with pytest.raises(Exception, match=r"over the extraction cap|more than the 1000 allowed"):
        read(store, big, Directory)
    assert not store.cache_path("artifacts", big["sha256"], "data").exists()


# -- issue 21: concurrent fetchers and crashes ------------------------------------------------------------------
FETCHERS, TRIALS = 16, 20


def _fetcher(root: str, cache: str, refs: list[tuple[str, dict[str, Any]]], barrier: Any, errors: Any) -> None:
    os.environ["GANGFLOW_CACHE"] = cache
    store = ArtifactStore(root)
    for kind, ref in refs:
        barrier.wait()
        try:
            value = read(store, ref, File if kind == "file" else Directory)
            path = Path(value.path)
            got = path.read_bytes() if kind == "file" else (path / "part.bin").read_bytes()
            if hashlib.sha256(got).hexdigest() != ref["expect"]:
                errors.put(f"{kind} {ref['sha256'][:8]}: wrong content")
        except BaseException as exc:  # every failure is the finding
            errors.put(f"{kind} {ref['sha256'][:8]}: {type(exc).__name__}: {exc}")
        barrier.wait()  # everyone fetched: what each was handed must still be there
        if not os.path.exists(value.path):
            errors.put(f"{kind} {ref['sha256'][:8]}: the path handed out was removed")


def test_sixteen_processes_fetching_one_object_at_once_all_get_it(store, tmp_path):
    """16 processes fetch the same (new) object at the same moment, 20 times over (files and directories): none
    fails, each gets the content, and what each was handed stays (the race of issue 21)."""
    refs = []
    for trial in range(TRIALS):
        data = os.urandom(256 << 10) + str(trial).encode()
        if trial % 4 == 3:
            (tmp_path / f"d{trial}").mkdir()
            (tmp_path / f"d{trial}" / "part.bin").write_bytes(data)
            ref = uploaded(store, Directory(tmp_path / f"d{trial}"), Directory)
            refs.append(("dir", {**ref, "expect": hashlib.sha256(data).hexdigest()}))
        else:
            (tmp_path / f"f{trial}.bin").write_bytes(data)
            ref = uploaded(store, File(tmp_path / f"f{trial}.bin"), File)
            refs.append(("file", {**ref, "expect": hashlib.sha256(data).hexdigest()}))
    ctx = multiprocessing.get_context("spawn")  # real, independent interpreters
    barrier, errors = ctx.Barrier(FETCHERS, timeout=60), ctx.Queue()
    procs = [
        ctx.Process(target=_fetcher, args=(store.uri_root, os.environ["GANGFLOW_CACHE"], refs, barrier, errors))
        for _ in range(FETCHERS)
    ]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == [] and [p.exitcode for p in procs] == [0] * FETCHERS, found[:10]
    assert time.monotonic() - started < 60


SLOW_FETCH = """
    import os, sys, time
    import fsspec.implementations.local as local
    from engine import {kind}
    from engine.artifacts import ArtifactStore
    from engine.types import ValueCodec

    def get_file(self, src, dst, **kw):  # half the object, then hang: killed mid-download
        with open(src, "rb") as i, open(dst, "wb") as o:
            o.write(i.read(1000))
            o.flush()
        open({ready!r}, "w").close()
        time.sleep(600)

    local.LocalFileSystem.get_file = get_file
    ValueCodec({kind}).from_wire({ref!r}, "x", ArtifactStore({root!r}).context())
"""


@pytest.mark.parametrize("kind", ["File", "Directory"])
def test_a_fetcher_killed_mid_download_leaves_nothing_a_later_reader_trusts(store, tmp_path, kind):
    data = os.urandom(1 << 20)
    if kind == "File":
        (tmp_path / "big.bin").write_bytes(data)
        ref = uploaded(store, File(tmp_path / "big.bin"), File)
    else:
        (tmp_path / "big").mkdir()
        (tmp_path / "big" / "part.bin").write_bytes(data)
        ref = uploaded(store, Directory(tmp_path / "big"), Directory)
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(SLOW_FETCH.format(kind=kind, ref=ref, root=store.uri_root, ready=str(ready))),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the fetcher never started downloading"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    target = store.cache_path("artifacts", ref["sha256"], ref["name"])
    assert not target.exists()  # nothing under the name a reader takes
    started = time.monotonic()  # the dead writer's lock is gone with it: the next fetch does not wait
    value = read(store, ref, File if kind == "File" else Directory)
    assert time.monotonic() - started < 10
    got = Path(value.path).read_bytes() if kind == "File" else (Path(value.path) / "part.bin").read_bytes()
    assert got == data
    leftovers = [p.name for p in target.parent.iterdir() if p.name != ref["name"]]
    assert leftovers == [], leftovers  # the half-written copy was swept
    assert cache_dir() == tmp_path / "cache"
