"""The policy's hot modules compiled with mypyc: the same code and the same decisions, less CPU per event.

The admission cycle walks every pending queue's head after each event; at a thousand nodes that walk is most of
the Scheduler's CPU, and it is plain Python over dicts, tuples and small classes, which mypyc (mypy's compiler,
as black and mypy ship themselves) turns into C without a change to the source. ``make native`` (``build``)
compiles ``MODULES`` into ``build/native/`` beside the package, with a stamp of the sources it compiled. When
``engine.scheduling`` is imported, ``load`` puts that build ahead of the sources on the package's path only if
the stamp matches the sources as they are now: a module edited after the build runs as Python (a warning says
the build is stale), never as the old compiled code. Nothing needs the build: without it (the default, and what
CI runs) the policy is the Python source, deciding the same.

``GANGFLOW_NATIVE=0`` turns a build off; ``GANGFLOW_NATIVE_DIR`` names one elsewhere (an installed package).
Compiled classes cannot be subclassed or given new attributes from Python; nothing in gangflow does either.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["MODULES", "build", "build_dir", "load", "loaded"]

#: what is compiled: the modules an event's cycle runs through (the rest, config, events, views, snapshot,
#: run a few times per run or per user command and stay Python)
MODULES = (
    "cycle",
    "flavors",
    "inventory",
    "lenders",
    "lost_work",
    "node_waits",
    "policy",
    "preemption",
    "state",
    "tenancy",
    "topology",
    "usage_decay",
    "users",
)
SOURCE = Path(__file__).resolve().parent
STAMP = "stamp.json"
#: the compiled modules' shared library, in the package so that the package's path finds it too
GROUP = "engine.scheduling.native_policy"

_log = logging.getLogger("engine.scheduling")


def build_dir() -> Path:
    """Where the build is looked for: ``GANGFLOW_NATIVE_DIR``, else ``build/native`` beside the package."""
    named = os.environ.get("GANGFLOW_NATIVE_DIR")
    return Path(named) if named else SOURCE.parents[1] / "build" / "native"


def _stamp() -> dict[str, str]:
    """What a build must match: the sources of ``MODULES`` and the interpreter it was compiled for."""
    digest = hashlib.sha256()
    for name in MODULES:
        digest.update(name.encode() + b"\0" + (SOURCE / f"{name}.py").read_bytes())
    return {"sources": digest.hexdigest(), "python": sys.implementation.cache_tag}


def load(path: list[str]) -> str | None:
    """Put a fresh build ahead of the sources on the package's ``path`` (its ``__path__``). Returns why not
    (None: loaded); a stale build is said as a warning, as it means compiled code no longer matches the source."""
    if os.environ.get("GANGFLOW_NATIVE", "1") == "0":
        return "turned off (GANGFLOW_NATIVE=0)"
    where = build_dir()
    package = where / "engine" / "scheduling"
    try:
        built = json.loads((where / STAMP).read_text())
    except (OSError, ValueError):
        return f"not built ({where / STAMP} is absent: make native)"
    if built != _stamp():
        why = f"stale: {where} was built from other sources or another Python (make native again)"
        _log.warning("the compiled policy is %s; the policy runs as Python", why)
        return why
    path.insert(0, str(package))
    return None


def loaded() -> bool:
    """Whether the policy runs compiled in this process (the benchmark says which it measured)."""
    return f"{GROUP}__mypyc" in sys.modules  # only a loaded build has it: the sources have no such module


def build(into: Path | None = None) -> Path:
    """Compile ``MODULES`` with mypyc into ``into`` (``build_dir()``) and stamp it. Needs the dev extra (mypy,
    which carries mypyc) and a C compiler; about three minutes on two cores."""
    from mypyc.build import mypycify  # the dev extra: only a build needs it

    setuptools = importlib.import_module("setuptools")  # untyped in some versions: read as Any either way

    into = (into or build_dir()).resolve()
    root = SOURCE.parents[1]
    (into / STAMP).unlink(missing_ok=True)  # a half-done build is never loaded
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(root)  # mypy names the modules from the paths: engine/scheduling/x.py -> engine.scheduling.x
        try:
            paths = [f"engine/scheduling/{name}.py" for name in MODULES]
            extensions = mypycify(paths, opt_level="3", group_name=GROUP, target_dir=tmp)
            dist = setuptools.Distribution({"name": "gangflow-native", "ext_modules": extensions})
            command = dist.get_command_obj("build_ext")
            command.build_lib = str(into)
            command.build_temp = str(Path(tmp) / "obj")
            dist.run_command("build_ext")
        finally:
            os.chdir(cwd)
    (into / STAMP).write_text(json.dumps(_stamp()))
    return into
