"""What a new user reads first: --version, every option explained, a workflow's own parameters under
``gangflow run FILE.py:WF --help`` (as ``pyflyte run`` lists them), and output that a pipe gets unwrapped."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import gangflow_main

from engine.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a pipe, as a script would read it
    env["GANGFLOW_ADDRESS"] = "127.0.0.1:9"  # nothing listens: nothing here may need a server
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _undocumented(sub, f"{path} {name}")
        elif action.help is None and not isinstance(action, argparse._HelpAction):
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_and_argument_has_help_text():
    assert _undocumented(build_parser(), "gangflow") == []


def test_version():
    done = _cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("gangflow 0."), done.stdout + done.stderr


def test_run_help_lists_the_workflows_parameters_with_types_and_defaults(tmp_path: Path):
    (tmp_path / "flow.py").write_text(
        textwrap.dedent(
            """
            from engine import workflow

            @workflow
            async def train(data_path: str, total_steps: int = 100, lr: float = 0.001, tags: list[str] = []) -> int:
                return total_steps
            """
        )
    )
    done = _cli("run", "flow.py:train", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [" ".join(line.split()) for line in done.stdout.splitlines()]
    assert "--data-path str (required)" in lines
    assert "--total-steps int (default 100)" in lines and "--lr float (default 0.001)" in lines
    assert "--tags list[str] (default [])" in lines
    assert "--detach" in done.stdout  # gangflow's own options are still there

    # in this process (conftest.gangflow_main: no process start); the file's own --help above is a real one
    broken = gangflow_main("run", "nope.py:train", "--help", cwd=tmp_path, GANGFLOW_ADDRESS="127.0.0.1:9")
    assert broken.returncode == 0
    assert "nope.py:train: cannot list its parameters: nope.py: no such file" in broken.stdout


def test_output_to_a_pipe_is_not_wrapped_at_80_columns():
    done = _cli("plugins")
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert len(rows) == 4 and all(row.split()[0] in {"jax", "mpi", "pytorch", "xgboost"} for row in rows), rows
    assert max(map(len, rows)) > 80  # one line each, however long


def test_a_workflow_file_that_fails_to_import_is_bad_input_shown_in_the_authors_frames(tmp_path: Path):
    """A typo in an import, a syntax error or a module that raises as it loads: exit 2 before anything starts,
    with the author's own frames under the paths they wrote (not gangflow's and importlib's traceback, exit 1)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "boom.py").write_text("def f():\n    return 1 / 0\n\n\nX = f()\n")
    (tmp_path / "deep.py").write_text("from engine import workflow\nimport lib.boom\n")
    (tmp_path / "typo.py").write_text("from lib.nothere import x\n")
    (tmp_path / "syntax.py").write_text(
        "from engine import workflow\n\n@workflow\nasync def w() -> int\n    return 1\n"
    )
    done = _cli("run", "deep.py:w", cwd=tmp_path)  # a real process, the entry point included
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == [
        "error: deep.py could not be imported:",
        '  File "deep.py", line 2, in <module>',
        "    import lib.boom",
        '  File "lib/boom.py", line 5, in <module>',
        "    X = f()",
        '  File "lib/boom.py", line 2, in f',
        "    return 1 / 0",
        "ZeroDivisionError: division by zero",
    ]
    typo = gangflow_main("run", "typo.py:w", cwd=tmp_path, GANGFLOW_ADDRESS="127.0.0.1:9")
    assert typo.returncode == 2
    assert "typo.py could not be imported:" in typo.stderr and "No module named 'lib.nothere'" in typo.stderr
    syntax = gangflow_main("run", "syntax.py:w", cwd=tmp_path, GANGFLOW_ADDRESS="127.0.0.1:9")
    assert syntax.returncode == 2
    assert "  File \"syntax.py\", line 4\n    async def w() -> int\nSyntaxError: expected ':'" in syntax.stderr
