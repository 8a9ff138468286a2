"""The task cache end to end: examples/cached_pipeline.py on the session's dev server and worker.

Each task of the example appends its name to a log file when its body runs, so the tests count executions.
The tests share the session's artifact store (a worker resolves a bundle's tasks to the store it first loaded
that bundle from); the log file's path is an input of every task, so each test's cache keys are its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cache_flows
from conftest import ROOT, gangflow_cli, make_client, run
from temporalio.client import WorkflowFailureError

from engine.artifacts import cache_index
from engine.artifacts.store import ArtifactStore
from engine.client import load_workflow_file

PIPELINE = "examples/cached_pipeline.py:pipeline"


def _executed(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _cli(*args: str, server: Any, store: Path) -> Any:
    # wide enough that a status cell never wraps; the tenant as a user without GANGFLOW_TENANT has it
    env = {k: v for k, v in os.environ.items() if k != "GANGFLOW_TENANT"}
    return gangflow_cli(
        *args, env=env, GANGFLOW_ADDRESS=server.address, GANGFLOW_ARTIFACTS=str(store), COLUMNS="200", timeout=60
    )


def _all(store: Path) -> set[tuple[str, str, str]]:
    return {(e.task, e.key, e.run_id) for e in cache_index.list_entries(ArtifactStore(str(store)), "default")}


def _entries(store: Path, runs: set[str], task: str | None = None) -> list[cache_index.CacheEntry]:
    """The entries that runs of this test made."""
    return [e for e in cache_index.list_entries(ArtifactStore(str(store)), "default", task) if e.run_id in runs]


def test_a_second_run_executes_nothing_and_a_new_input_only_what_depends_on_it(server, worker, artifacts, tmp_path):
    store, log = Path(artifacts), tmp_path / "executed.log"
    pipeline = load_workflow_file(str(ROOT / PIPELINE))
    inputs = {"rows": 60, "epochs": 2, "log": str(log)}

    async def main() -> tuple[str, str]:
        client = await make_client(server, str(store))
        first = await client.start(pipeline, inputs)
        loss = await client.result(first, pipeline)
        assert _executed(log) == ["prepare", "train", "evaluate"]

        second = await client.start(pipeline, inputs)
        assert await client.result(second, pipeline) == loss
        assert _executed(log) == ["prepare", "train", "evaluate"], "the second run executed a task"
        tasks = (await client.status(second)).tasks
        assert [(t.name, t.status, t.cached_from) for t in tasks] == [
            (name, "cached", first) for name in ("prepare", "train", "evaluate")
        ]
        assert [t.kind for t in tasks] == ["task", "task", "lightweight"]

        # another number of epochs: the data set is still the same, the model and its evaluation are not
        third = await client.start(pipeline, {**inputs, "epochs": 3})
        assert await client.result(third, pipeline) != loss
        assert _executed(log)[3:] == ["train", "evaluate"]
        tasks = (await client.status(third)).tasks
        assert [(t.name, t.status) for t in tasks] == [
            ("prepare", "cached"),
            ("train", "completed"),
            ("evaluate", "completed"),
        ]

        # overwrite: nothing is read, every entry is replaced by this run's
        fourth = await client.start(pipeline, inputs, cache="overwrite")
        assert await client.result(fourth, pipeline) == loss
        assert _executed(log)[5:] == ["prepare", "train", "evaluate"]
        entries = _entries(store, {first, third, fourth})
        assert sorted((e.task, e.run_id == third) for e in entries) == [
            ("evaluate", False),
            ("evaluate", True),
            ("prepare", False),
            ("train", False),
            ("train", True),
        ]
        assert {e.run_id for e in entries} == {third, fourth}
        return first, second

    first, second = run(main())

    status = _cli("status", second, server=server, store=store)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(f"cached (from run {first})") == 3, status.stdout
    as_json = json.loads(_cli("status", second, "--json", server=server, store=store).stdout)
    assert [(t["name"], t["status"]) for t in as_json["tasks"]] == [
        ("prepare", "cached"),
        ("train", "cached"),
        ("evaluate", "cached"),
    ]
    assert {t["cached_from"] for t in as_json["tasks"]} == {first}

    # --no-cache: every task runs again, and the cache is left as it was (neither read nor written)
    before = _all(store)
    done = _cli(
        "run", PIPELINE, "--rows", "60", "--epochs", "2", "--log", str(log), "--no-cache", "--json",
        server=server, store=store,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _executed(log)[8:] == ["prepare", "train", "evaluate"]
    assert _all(store) == before


def test_a_missing_or_corrupt_cached_file_is_recomputed(server, worker, artifacts, tmp_path):
    store, log = Path(artifacts), tmp_path / "executed.log"
    pipeline = load_workflow_file(str(ROOT / PIPELINE))
    inputs = {"rows": 40, "epochs": 1, "log": str(log)}
    objects = ArtifactStore(str(store))

    runs: set[str] = set()

    def artifact(task: str) -> Path:
        (entry,) = _entries(store, runs, task)
        return Path(objects._cas_path(entry.artifacts[0]["sha256"]))

    async def main() -> None:
        client = await make_client(server, str(store))
        runs.add(await client.start(pipeline, inputs))
        loss = await client.result(next(iter(runs)), pipeline)
        assert _executed(log) == ["prepare", "train", "evaluate"]

        model = artifact("train")
        model.write_bytes(b'{"w": 1000, "b": 0}')  # damaged: never handed to evaluate as the cached model
        rerun = await client.start(pipeline, inputs)
        runs.add(rerun)
        assert await client.result(rerun, pipeline) == loss
        assert _executed(log)[3:] == ["train"]  # the model again; the data set and the evaluation from the cache
        assert [t.status for t in (await client.status(rerun)).tasks] == ["cached", "completed", "cached"]
        assert model.read_bytes() != b'{"w": 1000, "b": 0}'  # the recomputed model took its place

        artifact("prepare").unlink()  # gone
        runs.add(again := await client.start(pipeline, inputs))
        assert await client.result(again, pipeline) == loss
        assert _executed(log)[4:] == ["prepare"]
        assert artifact("prepare").exists()

    run(main())


def test_a_failed_call_is_not_cached(server, worker, artifacts, tmp_path):
    store, log, flag = Path(artifacts), tmp_path / "executed.log", tmp_path / "flag"
    flag.touch()
    inputs = {"flag": str(flag), "log": str(log)}

    async def main() -> None:
        client = await make_client(server, str(store))
        failed = await client.start(cache_flows.fails_while_flagged, inputs)
        try:
            await client.wait(failed)
        except WorkflowFailureError:
            pass
        else:
            raise AssertionError("the run should have failed")
        assert _entries(store, {failed}) == []
        flag.unlink()
        assert await client.result(await client.start(cache_flows.fails_while_flagged, inputs)) == 7
        assert _executed(log) == ["flaky", "flaky"]  # the failure was not a hit
        assert await client.result(await client.start(cache_flows.fails_while_flagged, inputs)) == 7
        assert _executed(log) == ["flaky", "flaky"]

    run(main())


def test_a_distributed_task_is_cached_too(server, worker, cluster, artifacts, tmp_path):
    store, log = Path(artifacts), tmp_path / "executed.log"
    inputs = {"n": 10, "log": str(log)}

    async def main() -> None:
        client = await make_client(server, str(store))
        assert await client.result(await client.start(cache_flows.cached_gang, inputs)) == 45
        second = await client.start(cache_flows.cached_gang, inputs)
        assert await client.result(second) == 45
        assert _executed(log) == ["gang_sum"]
        (record,) = (await client.status(second)).tasks
        assert (record.name, record.kind, record.status) == ("gang_sum", "gang", "cached")

    run(main())
