"""engine.executor.process and ports: real child processes started, signalled and stopped."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import alive

from engine.executor.ports import free_port
from engine.executor.process import spawn, stop_processes

#: ignores SIGTERM, says it is ready, and sleeps: only SIGKILL ends it
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
)
#: forks a grandchild that sleeps (its pid is printed), then sleeps itself
FORKS = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
    "print(pid, flush=True)\n"
    "time.sleep(60)\n"
)


def wait_for(log: Path, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in (content := log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {log}: {content!r}"
        time.sleep(0.02)
    return content


def test_spawn_appends_output_and_stderr_to_the_log(tmp_path):
    log = tmp_path / "logs" / "rank0.log"  # the folder is created
    log.parent.mkdir()
    log.write_text("earlier attempt\n")
    proc = spawn([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], log=log)
    assert proc.wait(30) == 0
    assert log.read_text().splitlines() == ["earlier attempt", "out", "err"]


def test_spawn_gives_env_cwd_and_a_closed_stdin(tmp_path):
    log = tmp_path / "x.log"
    code = "import os, sys; print(os.environ['N'], os.getcwd(), repr(sys.stdin.read()))"
    proc = spawn([sys.executable, "-c", code], log=log, env={"N": "7"}, cwd=tmp_path)
    assert proc.wait(30) == 0
    assert log.read_text().strip() == f"7 {tmp_path} ''"


def test_spawn_pipes_output_when_asked_and_still_creates_the_log(tmp_path):
    log = tmp_path / "launcher.log"
    proc = spawn([sys.executable, "-c", "print('HYDRA_LAUNCH: x')"], log=log, pipe_output=True)
    out, _ = proc.communicate(timeout=30)
    assert out.decode().strip() == "HYDRA_LAUNCH: x"
    assert log.exists() and log.read_text() == ""


def test_spawn_of_a_missing_program_fails_at_once(tmp_path):
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "no-such-program")], log=tmp_path / "x.log")


def test_stop_ends_a_process_that_exits_on_sigterm_quickly(tmp_path):
    proc = spawn([sys.executable, "-c", "import time; time.sleep(60)"], log=tmp_path / "x.log")
    started = time.monotonic()
    stop_processes([proc], 30)
    assert proc.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 20  # did not sit out the grace


def test_stop_kills_what_ignores_sigterm_after_the_grace(tmp_path):
    log = tmp_path / "x.log"
    procs = [spawn([sys.executable, "-c", STUBBORN], log=log) for _ in range(2)]
    deadline = time.monotonic() + 30
    while log.read_text().count("ready") < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    stop_processes(procs, 1.0)
    assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    assert time.monotonic() - started < 15  # one grace for all of them, not one each


def test_stop_resumes_a_stopped_process_so_it_can_handle_sigterm(tmp_path):
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "x.log"
    proc = spawn([sys.executable, "-c", code], log=log)
    wait_for(log, "ready")
    proc.send_signal(signal.SIGSTOP)
    stop_processes([proc], 20)
    assert proc.returncode == 3  # its handler ran: not killed after the grace


def test_stop_with_group_reaches_the_children(tmp_path):
    log = tmp_path / "x.log"
    proc = spawn([sys.executable, "-c", FORKS], log=log, new_session=True)
    child = int(wait_for(log, "\n").split()[0])
    assert alive(child)
    stop_processes([proc], 10, group=True)
    deadline = time.monotonic() + 10
    while alive(child):  # reaped by init once its parent is gone
        assert time.monotonic() < deadline, "the grandchild outlived the stop of its group"
        time.sleep(0.05)


def test_stop_without_group_leaves_the_children(tmp_path):
    log = tmp_path / "x.log"
    proc = spawn([sys.executable, "-c", FORKS], log=log, new_session=True)
    child = int(wait_for(log, "\n").split()[0])
    stop_processes([proc], 10)
    try:
        time.sleep(0.3)
        assert alive(child)
    finally:
        stop_processes([proc], 10, group=True)  # the group outlives its leader: clean it up


def test_stop_of_finished_processes_does_nothing(tmp_path):
    proc = spawn([sys.executable, "-c", "pass"], log=tmp_path / "x.log")
    proc.wait(30)
    stop_processes([proc], 1)
    stop_processes([], 1)
    assert proc.returncode == 0


def test_free_port_can_be_bound(tmp_path):
    for host in ("127.0.0.1", ""):
        port = free_port(host)
        assert 0 < port < 65536
        with socket.socket() as sock:
            sock.bind((host, port))
