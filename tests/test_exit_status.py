"""The test run's exit status survives an abort during interpreter shutdown.

temporalio's core sometimes aborts the interpreter at exit (sdk-python#300: ``PyGILState_Release``,
exit code 134) after every test passed. The conftest ends the process with the run's own status before
shutdown; here an ``atexit`` abort stands in for that crash, deterministically.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

TEST_FILE = """
import atexit, os
atexit.register(os.abort)  # what the temporalio core does, sometimes, at interpreter exit

def test_passes():
    assert {outcome}
"""


@pytest.mark.parametrize(("outcome", "guarded", "expected"), [(True, True, 0), (False, True, 1), (True, False, -6)])
def test_exit_status_is_the_tests_own(tmp_path, outcome, guarded, expected):
    (tmp_path / "test_abort.py").write_text(TEST_FILE.format(outcome=outcome))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    if not guarded:
        env["GANGFLOW_PYTEST_NO_OS_EXIT"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == expected, done.stdout + done.stderr
