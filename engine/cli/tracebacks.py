"""A failed run's error as its author reads it: the cause chain and the author's own frames, each named by the
file they wrote (``flow.py``, not ``~/.cache/gangflow/stores/<key>/bundles/<sha>/flow.py``), as Flyte shows
a failed task. Temporal's, gangflow's and the standard library's frames stay out unless ``verbose``.

The text is the failure chain ``engine.runtime.history.format_failure`` writes: a message line per cause, its
stack trace indented below it.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["readable"]

#: a frame's header in a Python traceback
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
#: where a code bundle is extracted (a node's or a worker's cache): what follows is the author's own path
_BUNDLE = re.compile(r"^.*/bundles/[0-9a-f]{16,64}/")
#: the wrappers the Temporal SDK puts around a cause: no news for the author
_WRAPPERS = {"Activity task failed", "Child Workflow execution failed", "Nexus operation failed"}


#: the standard library and installed packages, wherever the worker that ran the code keeps them
_LIBRARY = re.compile(r"/(site-packages|dist-packages)/|/lib/python3\.\d+/")
#: a file of gangflow's own packages, by its path inside them (the worker's install may live elsewhere)
_OWN = re.compile(r"/((?:engine|workflows|plugins)/[\w/]+\.py)$")
_GANGFLOW = Path(__file__).resolve().parents[2]  # the folder holding engine/, workflows/, plugins/


def _internal(path: str) -> bool:
    """Not the author's frame: a library's, or gangflow's (a file this install of gangflow has too)."""
    if _LIBRARY.search(path):
        return True
    own = _OWN.search(path)
    return own is not None and (_GANGFLOW / own.group(1)).is_file()


def readable(error: str, *, verbose: bool = False) -> str:
    """``error`` with the author's frames only (bundle paths made relative), or whole when ``verbose``."""
    if verbose:
        return error
    out: list[str] = []
    keep = True  # whether the lines under the current frame header (its source line, carets) are kept
    for line in error.splitlines():
        frame = _FRAME.match(line)
        if frame is not None:
            path, number, where = frame.groups()
            own = _BUNDLE.sub("", path)
            keep = own != path or not _internal(path)
            if keep:
                out.append(f'  File "{own}", line {number}, in {where}')
            continue
        if not line.strip():
            continue
        if line.startswith(" "):  # a frame's source line or its ^^^ markers
            if keep and line.strip().strip("^~") != "":
                out.append("    " + line.strip())
            continue
        keep = True
        if line.strip() not in _WRAPPERS:
            out.append(line)
    return "\n".join(_without_repeats(out))


#: a cause's line: ``Type: message`` (the type a Python class or an ApplicationError's type)
_CAUSE = re.compile(r"^[A-Za-z_][\w.]*: (.+)$")


def _without_repeats(lines: list[str]) -> list[str]:
    """Without a cause that says again what another one says and shows none of the author's frames: an error
    raised through gangflow comes back as its task's failure, gangflow's error and the original exception, each
    with the same message ("SecretNotFound: ...", "SecretNotFoundError: ...")."""
    blocks: list[list[str]] = []
    for line in lines:
        if line.startswith(" ") and blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    kept = list(blocks)
    for block in blocks:
        cause = _CAUSE.match(block[0])
        said = cause.group(1) if cause else block[0]
        if len(block) == 1 and any(other is not block and said in other[0] for other in kept):
            kept.remove(block)
    return [line for block in kept for line in block]
