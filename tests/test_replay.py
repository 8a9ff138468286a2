"""Replay every recorded history (tests/histories/) with the *current* workflow code.

Runs in flight replay their history on whichever worker picks them up next, so a change to workflows/
that makes old histories non-deterministic (a new activity, timer or signal before an existing one, a
changed child id) breaks every run in flight on upgrade. This test fails first, without a server: each
history is a real run recorded by ``tests/histories/record.py`` (examples and failure scenarios), with the
user code it was pinned to (its code bundle). A deliberate change: rerun the recorder and commit the new
histories with it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from temporalio.api.enums.v1 import EventType

from engine.artifacts.loader import LOADER
from engine.core.protocol import GANG_TYPE, LEGACY_GANG_TYPE, SCHEDULER_TYPE
from engine.runtime.worker import build_replayer

sys.path.insert(0, str(ROOT / "tests" / "histories"))
import catalog

HISTORIES = catalog.recorded()
RERECORD = "after a deliberate change, record again: .venv/bin/python tests/histories/record.py"


@pytest.fixture(scope="module")
def bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The recorded runs' code bundles, extracted where the worker's loader looks for them."""
    cache = tmp_path_factory.mktemp("replay-cache")
    refs: dict[str, set[str]] = {}
    for recorded in HISTORIES:
        for sha, uri in catalog.bundle_refs(recorded.history()).items():
            refs.setdefault(sha, set()).add(uri)
    previous = os.environ.get("GANGFLOW_CACHE")
    os.environ["GANGFLOW_CACHE"] = str(cache)
    catalog.install_bundles(refs)
    yield cache
    if previous is None:
        os.environ.pop("GANGFLOW_CACHE", None)
    else:
        os.environ["GANGFLOW_CACHE"] = previous


def test_recorded_code_loads(bundle_cache: Path) -> None:
    """Every workflow and task the histories name loads from its saved bundle (else each replay below
    would fail with a non-determinism error that hides the cause)."""
    for recorded in HISTORIES:
        for ref in catalog.code_refs(recorded.history()):
            try:
                LOADER.load(ref)
            except Exception as exc:
                pytest.fail(
                    f"{recorded.test_id}: cannot load {ref.module}.{ref.qualname} from bundle {ref.bundle_sha}: "
                    f"{exc}\n(catalog.install_bundles extracts bundles with engine.artifacts.loader.install_bundle, "
                    "where the loader looks for them)",
                    pytrace=False,
                )


@pytest.mark.parametrize("recorded", HISTORIES, ids=[r.test_id for r in HISTORIES])
def test_recorded_history_replays_with_current_code(recorded: catalog.Recorded, bundle_cache: Path) -> None:
    replayer = build_replayer(recorded.route())  # the worker's own workflows, runner, code loader and layout
    result = asyncio.run(replayer.replay_workflow(recorded.history(), raise_on_replay_failure=False))
    if result.replay_failure is not None:
        pytest.fail(
            f"{recorded.path.relative_to(ROOT)} no longer replays: runs in flight would break on upgrade.\n"
            f"{type(result.replay_failure).__name__}: {result.replay_failure}\n{RERECORD}",
            pytrace=False,
        )


def _workflow_type(recorded: catalog.Recorded) -> str:
    first = recorded.history().events[0]
    assert first.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
    return str(first.workflow_execution_started_event_attributes.workflow_type.name)


def test_every_scenario_is_recorded() -> None:
    missing = sorted(set(catalog.SCENARIOS) - {r.scenario for r in HISTORIES})
    assert not missing, f"no recorded history for {', '.join(missing)}; {RERECORD} {' '.join(missing)}"


def test_gang_scenarios_include_the_scheduler_and_their_gangs() -> None:
    by_scenario: dict[str, set[str]] = {}
    for recorded in HISTORIES:
        by_scenario.setdefault(recorded.scenario, set()).add(_workflow_type(recorded))
    gang_types = {GANG_TYPE, LEGACY_GANG_TYPE}  # histories recorded before the rename hold GangRuns
    for scenario, types in by_scenario.items():
        if types & gang_types:
            assert SCHEDULER_TYPE in types, f"{scenario}: a gang ran, but the Scheduler's history was not recorded"
    gang_scenarios = {s for s, types in by_scenario.items() if types & gang_types}
    assert {"ddp_pipeline", "node_loss", "rank_kill", "cancel_gang", "user_error_rank"} <= gang_scenarios
