"""An existing program as each rank's command, on every plugin: ``script=`` / ``args=``, and MPI's ``command=``.

    @task(plugin=Jax(nnodes=2, script="train.py", args=("--steps", "100")))
    def train() -> None: ...        # the body is not used: every rank runs `python train.py --steps 100`

The program gets the plugin's rank environment (torchrun's, JAX's, XGBoost's or MPI's variables) and
runs in the code bundle's root, where a relative ``script`` path is looked up. ``args`` are fixed when
the task is defined (the task's inputs are not passed to the program); the task's result is ``None``.
A program that exits non-zero fails the task with the tail of its output, as a failing body does.

The checks run when the plugin is built (at import), so a wrong combination never reaches a node.
Nothing here imports a framework; ``run_script`` runs inside a rank, for plugins that prepare the
interpreter first (JAX, so that a bare ``jax.distributed.initialize()`` finds the gang).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Iterable
from typing import Any, ClassVar

from engine.core.gang import RankContext
from engine.errors import DefinitionError

__all__ = ["Scripted", "check_command", "python_command", "run_script", "script_args"]


def script_args(owner: str, args: Any, what: str = "args") -> tuple[str, ...]:
    """``args`` as a tuple of strings: numbers are written out, anything else is refused by name."""
    if isinstance(args, (str, bytes)):  # a string is iterable: "--steps 3" would become one arg per letter
        raise DefinitionError(f"{owner}: {what} must be a list or tuple of strings, got the string {args!r}")
    if not isinstance(args, Iterable):
        raise DefinitionError(f"{owner}: {what} must be a list or tuple of strings, got {args!r}")
    out = []
    for index, arg in enumerate(args):
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float, os.PathLike)):
            raise DefinitionError(f"{owner}: {what}[{index}] must be a string (or a number), got {arg!r}")
        out.append(os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg))
    return tuple(out)


def check_command(owner: str, command: Any) -> tuple[str, ...]:
    """An executable and its arguments: a non-empty list of strings whose first one names the program."""
    if isinstance(command, (str, bytes)):
        raise DefinitionError(
            f"{owner}: command must be a list of strings (the program, then its arguments), got the string "
            f"{command!r}; write command=[{', '.join(repr(w) for w in str(command).split()) or repr('prog')}]"
        )
    words = script_args(owner, command, "command")
    if not words or not words[0].strip():
        raise DefinitionError(f"{owner}: command must name a program, got an empty command {list(words)!r}")
    return words


def python_command(script: str, args: tuple[str, ...], *, module: str | None = None) -> list[str]:
    """``python SCRIPT ARGS...`` with the node's interpreter; through ``python -m MODULE`` when a plugin
    prepares the interpreter first (``-P``: the bundle root must not shadow that module)."""
    prefix = [sys.executable, "-P", "-m", module] if module else [sys.executable]
    return [*prefix, script, *args]


class Scripted:
    """The ``script=`` / ``args=`` options of a plugin (a frozen dataclass declaring both fields): call
    ``_check_script()`` from ``__post_init__``. ``command(rank)`` then runs the script on every rank."""

    script: str | None
    args: tuple[str, ...]
    #: run the script through ``python -P -m <module> SCRIPT ARGS`` (see ``run_script``)
    _script_module: ClassVar[str | None] = None

    def _check_script(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "args", script_args(owner, self.args))
        if self.script is None:
            if self.args:
                raise DefinitionError(f"{owner}: args={list(self.args)!r} are the script's arguments: add script=")
            return
        if not isinstance(self.script, (str, os.PathLike)) or not os.fspath(self.script).strip():
            raise DefinitionError(f"{owner}: script must be a path to a Python file, got {self.script!r}")
        object.__setattr__(self, "script", os.fspath(self.script))

    def command(self, rank: RankContext) -> list[str] | None:
        if self.script is None:
            return None
        return python_command(self.script, self.args, module=self._script_module)


def run_script(argv: list[str]) -> None:
    """Inside a rank: run ``argv[0]`` with arguments ``argv[1:]`` as ``python SCRIPT ARGS`` would (``__main__``,
    ``sys.argv``, the script's folder first on ``sys.path``)."""
    if not argv:
        raise SystemExit("usage: python -m <plugin module> SCRIPT [ARGS...]")
    script = argv[0]
    if not os.path.isfile(script):
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: no such file\n")
        raise SystemExit(2)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
