"""The public surface is pinned (httpx's ``test_exported_members``): what users import from the facades is
listed here, name by name, so adding, renaming or dropping one is a visible decision, not a side effect. Every
public module declares ``__all__``, every name in it exists, and the packages ship ``py.typed``."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "workflows", "plugins")

PUBLIC = {
    "engine": [
        "Approval",
        "DefinitionError",
        "Directory",
        "File",
        "Gang",
        "GangPlugin",
        "GangflowError",
        "InputError",
        "NonDeterministicCall",
        "PayloadTooLargeError",
        "Preemption",
        "ProcessSpec",
        "RankContext",
        "Rejected",
        "Resources",
        "Retry",
        "Schema",
        "Secret",
        "Topology",
        "TypeMismatchError",
        "WaitTimedOut",
        "approve",
        "available_plugins",
        "checkpoint",
        "current_rank",
        "now",
        "plugin",
        "preemption",
        "random",
        "report",
        "run_local",
        "secret",
        "sleep",
        "task",
        "uuid4",
        "wait_for_input",
        "workflow",
    ],
    "engine.client": [
        "DEFAULT_TENANT",
        "NO_QUEUE_CONFIG",
        "Client",
        "ClusterClient",
        "InputRefused",
        "RunInfo",
        "RunNotWaiting",
        "ScheduleInfo",
        "ScheduleNotFoundError",
        "ScheduleOptions",
        "Schedules",
        "TenancyError",
        "approve",
        "check_tenancy",
        "default_tenant",
        "load_workflow_file",
        "log_rank",
        "prepare_run",
        "send_input",
        "start_options",
        "task_priorities",
        "to_jsonable",
        "waiting",
    ],
    "engine.checkpoint": [
        "NOTICE_FILE_ENV",
        "NOTICE_SIGNAL_ENV",
        "Preemption",
        "directory",
        "latest_step",
        "load_latest",
        "load_torch",
        "preemption",
        "save",
        "save_torch",
        "stop_requested",
    ],
    "engine.types": [
        "MAX_PAYLOAD_BYTES",
        "Artifact",
        "DataRef",
        "Directory",
        "File",
        "Schema",
        "ValueCodec",
        "check_payload_size",
        "pack",
        "type_name",
        "unpack",
    ],
    "plugins.pytorch": ["PyTorch"],
    "plugins.jax": ["Jax"],
    "plugins.xgboost": ["XGBoost"],
    "plugins.mpi": ["MPI"],
}
#: public on purpose but kept out of ``__all__``: ``from engine import *`` must not shadow the builtin
NOT_STARRED = {"engine": ["map"]}
#: programs run with ``python -m``, never imported for names
PROGRAMS = {"engine.cli.__main__", "plugins.xgboost.tracker"}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_exported_members(module: str):
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == sorted(PUBLIC[module]), f"{module}.__all__ changed: update PUBLIC here"
    missing = [name for name in [*imported.__all__, *NOT_STARRED.get(module, [])] if not hasattr(imported, name)]
    assert missing == [], f"{module} exports names it does not have"


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if any(p.startswith("_") and p != "__init__" for p in parts[:-1]) or (
                parts[-1].startswith("_") and parts[-1] not in ("__init__", "__main__")
            ):
                continue  # private by name: no promise to keep
            found.append((name, path))
    return found


def _bound(tree: ast.Module) -> set[str]:
    """The names a module's top level binds (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m for m, _ in _modules()])
def test_every_public_module_declares_all(module: str, path: Path):
    """Read, not imported (some modules need extras such as jwt or kubernetes): each public module has an
    ``__all__`` naming only what it binds (a submodule, or a name its ``__getattr__`` makes, aside)."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if module in PROGRAMS or (path.name == "__init__.py" and not body):
        return  # a program, or a package with nothing of its own to export
    declared = [n for n in tree.body if isinstance(n, ast.Assign) and any(_is_all(t) for t in n.targets)]
    assert declared, f"{module} ({path.relative_to(ROOT)}) has no __all__"
    names = ast.literal_eval(declared[-1].value)
    lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
    folder = path.parent if path.name == "__init__.py" else None
    unbound = [
        name
        for name in names
        if name not in _bound(tree)
        and not (folder is not None and ((folder / f"{name}.py").exists() or (folder / name).is_dir()))
    ]
    assert lazy or unbound == [], f"{module}.__all__ names what it does not define: {unbound}"


def _is_all(target: ast.expr) -> bool:
    return isinstance(target, ast.Name) and target.id == "__all__"


def test_the_packages_are_marked_typed():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").is_file(), f"{package}/py.typed is missing"
        assert "py.typed" in data.get(package, []), f"pyproject.toml does not ship {package}/py.typed"


def test_the_errors_gangflow_raises_share_one_base():
    """``except GangflowError`` catches what gangflow raises on purpose; the stdlib bases stay for old code."""
    pytest.importorskip("jwt")  # engine.runtime.tokens needs the auth extra
    from engine.artifacts.loader import CodeNotFoundError
    from engine.errors import GangflowError
    from engine.runtime.tokens import TokenError
    from engine.types.schema import SchemaViolation

    for error, stdlib in ((TokenError, Exception), (CodeNotFoundError, LookupError), (SchemaViolation, ValueError)):
        assert issubclass(error, GangflowError) and issubclass(error, stdlib), error
    assert CodeNotFoundError.kind == "CodeNotFound"  # the failure type it always had
