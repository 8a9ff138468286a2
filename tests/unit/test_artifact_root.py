"""A wrong artifact root is refused by the CLI before the run starts: one line, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import gangflow_cli, gangflow_main

FLOW = "from engine import workflow\n\n@workflow\nasync def wf() -> int:\n    return 1\n"


@pytest.mark.parametrize(
    ("root", "reason"),
    [
        ("/etc/hostname/artifacts", "Not a directory"),  # under a file
        ("nosuch://bucket/gangflow", "Protocol not known: nosuch"),  # a scheme no fsspec backend serves
        ("/proc/gangflow", "No such file or directory"),  # a folder that cannot be made
    ],
)
def test_run_refuses_an_unusable_artifact_root_before_connecting(tmp_path: Path, root: str, reason: str):
    (tmp_path / "flow.py").write_text(FLOW)
    # nothing listens there: the refusal must come before any connection attempt (that would be exit 1)
    env = {"GANGFLOW_ADDRESS": "127.0.0.1:9", "GANGFLOW_CACHE": str(tmp_path / "cache"), "COLUMNS": "10000"}
    args = ("run", "flow.py:wf", "--artifacts", root)
    # the first as a user runs it (a real process), the others in this process (no process start)
    runner = gangflow_cli if root.startswith("/etc/") else gangflow_main
    done = runner(*args, cwd=tmp_path, **env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"artifact root {root!r} cannot be used: {reason}" in done.stderr and "Traceback" not in done.stderr
