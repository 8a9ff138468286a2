"""engine.core.atomic: a file or folder appears whole under its name, or not at all."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.core.atomic import TEMP_PREFIX, write_atomic


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX))


def test_write_atomic_bytes_replace_the_old_content(tmp_path):
    target = tmp_path / "result"
    write_atomic(target, b"first")
    write_atomic(str(target), b"second", durable=False)
    assert target.read_bytes() == b"second"
    assert leftovers(tmp_path) == []


def test_write_atomic_takes_a_writer_function(tmp_path):
    target = tmp_path / "step-000000001.ckpt"
    write_atomic(target, lambda handle: handle.write(b"state"))
    assert target.read_bytes() == b"state"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "result"
    target.write_bytes(b"old")

    def broken(handle):
        handle.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(target, broken)
    assert target.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_write_atomic_gives_the_umask_permissions_of_a_plain_open(tmp_path):
    write_atomic(tmp_path / "a", b"x")
    (tmp_path / "b").write_bytes(b"x")
    assert (tmp_path / "a").stat().st_mode == (tmp_path / "b").stat().st_mode


def test_write_atomic_into_a_missing_folder_says_so(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "gone" / "result", b"x")


def test_readers_never_see_a_partial_file(tmp_path):
    target = tmp_path / "progress.json"
    write_atomic(target, b"0" * 100_000)
    seen: set[int] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(len(target.read_bytes()))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            write_atomic(target, str(i % 10).encode() * 100_000, durable=False)
    finally:
        stop.set()
        reader.join()
    assert seen == {100_000}
