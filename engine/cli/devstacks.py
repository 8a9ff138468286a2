"""Where a running ``gangflow dev`` is: one record per stack in the machine's cache folder
(``<cache>/dev-stacks/<pid>.json``: the address clients use, Temporal's own, the state dir), written once its
banner is out and removed when it stops. ``gangflow secret set`` and ``gangflow auth token`` without
``--state-dir`` act on the running stack that ``$GANGFLOW_ADDRESS`` names (or the only one running), and refuse
when they cannot tell which, rather than writing to a ``./.gangflow`` no stack reads."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.artifacts.store import cache_dir
from engine.core.atomic import write_atomic
from engine.core.labels import parse_labels

from .common import EXIT_BAD_INPUT, CliError

__all__ = ["DevStackRecord", "dev_node_labels", "recorded", "running_stacks", "state_dir_for"]


@dataclass(frozen=True)
class DevStackRecord:
    pid: int
    #: what clients connect to: the gateway with --auth, else Temporal itself
    address: str
    #: Temporal itself (the platform's way in with --auth)
    temporal: str
    state_dir: str


def _folder() -> Path:
    return cache_dir() / "dev-stacks"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


@contextlib.contextmanager
def recorded(address: str, temporal: str, state_dir: Path) -> Iterator[DevStackRecord]:
    """This process's record while the block runs."""
    record = DevStackRecord(os.getpid(), address, temporal, str(state_dir))
    path = _folder() / f"{record.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(asdict(record)).encode())
    try:
        yield record
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def running_stacks() -> list[DevStackRecord]:
    """The records of the stacks still running (a record whose process is gone, a killed stack's, is removed)."""
    found = []
    folder = _folder()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            record = DevStackRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # half written or not ours
        if _alive(record.pid):
            found.append(record)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def state_dir_for(given: str | None, command: str) -> str:
    """``--state-dir`` when given; else the state dir of the running dev stack that ``$GANGFLOW_ADDRESS`` names,
    or of the only one running. A CliError (exit 2) saying what to pass when there is none or several."""
    if given is not None:
        return given
    stacks = running_stacks()
    address = os.environ.get("GANGFLOW_ADDRESS")
    # what "none" means, said once: none that serves the address the user set, or none at all
    none = "found; start one, or"
    if address:
        stacks = [s for s in stacks if address in (s.address, s.temporal)]
        none = f"serves $GANGFLOW_ADDRESS={address};"
    if len(stacks) == 1:
        return stacks[0].state_dir
    if not stacks:
        raise CliError(
            f"{command}: no running 'gangflow dev' {none} pass --state-dir DIR (the dev stack's state dir)",
            EXIT_BAD_INPUT,
        )
    listed = ", ".join(f"{s.state_dir} ({s.address})" for s in stacks)
    raise CliError(
        f"{command}: {len(stacks)} dev stacks run ({listed}): pass --state-dir DIR or set GANGFLOW_ADDRESS",
        EXIT_BAD_INPUT,
    )


def dev_node_labels(text: str | None, nodes: int) -> list[str]:
    """``gangflow dev --node-labels 'gpu=h100,rack=r1;gpu=a100,rack=r2'``: one group of labels per node agent,
    node-0's first (an empty group: none), checked whole before anything starts (exit 2 naming the fault)."""
    if text is None:
        return []
    groups = [group.strip() for group in text.split(";")]
    if len(groups) != nodes:
        raise CliError(
            f"--node-labels {text!r} has {len(groups)} group(s) separated by ';' for --nodes {nodes}: give one "
            "group per node agent, in order (an empty group for a node without labels)",
            EXIT_BAD_INPUT,
        )
    for i, group in enumerate(groups):
        if group:
            try:
                parse_labels(group, f"--node-labels (node-{i})")
            except ValueError as exc:
                raise CliError(str(exc), EXIT_BAD_INPUT) from None
    return groups
