"""A wrong artifact root is refused by the CLI before the run starts: one line, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", "flow.py:wf", "--artifacts", root],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # nothing listens there: the refusal must come before any connection attempt (that would be exit 1)
        env=dict(os.environ, GANGFLOW_ADDRESS="127.0.0.1:9", GANGFLOW_CACHE=str(tmp_path / "cache"), COLUMNS="10000"),
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"artifact root {root!r} cannot be used: {reason}" in done.stderr and "Traceback" not in done.stderr
