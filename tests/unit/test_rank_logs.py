"""A node launch's logs in its working folder reach the run's store while its ranks run (engine.runtime.rank_logs):
appended as they grow, in full at the end; a log a rank replaced with a symlink, a FIFO or a hard link is not
copied (the agent is root, the working folder the gang's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.artifacts.store import ArtifactStore
from engine.runtime.rank_logs import RankLogs


def _logs(tmp_path: Path) -> tuple[RankLogs, Path, Path]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    store = ArtifactStore(str(tmp_path / "store"))
    return RankLogs(store, "run-1", workdir), workdir, Path(store.log_path("run-1"))


def test_a_log_reaches_the_store_while_it_grows_and_in_full_at_the_end(tmp_path: Path) -> None:
    logs, workdir, folder = _logs(tmp_path)
    log = workdir / "train-1.rank0.attempt0.log"
    log.write_text("")
    assert logs.due()
    logs.sync()
    assert (folder / log.name).read_text() == ""  # there as soon as the rank started, however little it printed
    assert not logs.due()  # at most one look a second
    with log.open("a") as handle:
        handle.write("attempt 0: rank 0 starts at step 0\n")
    logs.sync()
    assert (folder / log.name).read_text() == "attempt 0: rank 0 starts at step 0\n"
    with log.open("a") as handle:
        handle.write("x" * 100)
    logs.sync(limit=10)  # bounded per look: a rank printing without pause cannot hold the agent
    assert (folder / log.name).read_text().endswith("\n" + "x" * 10)
    logs.finish()
    assert (folder / log.name).read_text() == log.read_text()


def test_a_symlink_a_fifo_or_a_hard_link_in_place_of_a_log_is_not_copied(tmp_path: Path) -> None:
    logs, workdir, folder = _logs(tmp_path)
    secret = tmp_path / "agent-only"
    secret.write_text("the agent's token")
    (workdir / "a.rank0.attempt0.log").symlink_to(secret)
    os.link(secret, workdir / "b.rank1.attempt0.log")
    os.mkfifo(workdir / "c.rank2.attempt0.log")  # opened without waiting for a writer
    (workdir / "d.rank3.attempt0.log").write_text("mine")
    logs.sync()
    logs.finish()
    assert sorted(p.name for p in folder.iterdir()) == ["d.rank3.attempt0.log"]


def test_the_agent_opens_a_ranks_log_without_following_a_symlink_or_waiting_on_a_fifo(tmp_path: Path) -> None:

    from engine.executor.rankfiles import open_log_for_append

    target = tmp_path / "root-only"
    target.write_text("")
    (tmp_path / "planted.log").symlink_to(target)
    with pytest.raises(OSError):
        open_log_for_append(tmp_path / "planted.log")
    os.mkfifo(tmp_path / "fifo.log")
    with pytest.raises(OSError):
        open_log_for_append(tmp_path / "fifo.log")  # refused at once, no reader waited for
    assert target.read_text() == ""
    fd = open_log_for_append(tmp_path / "rank0.log")
    os.write(fd, b"mine\n")
    os.close(fd)
    assert (tmp_path / "rank0.log").read_text() == "mine\n"
