"""DataFrames, arrays and tensors between tasks on a real Temporal dev server and a real worker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import gangflow_cli, make_client, run
from temporalio.client import WorkflowFailureError

from engine.types import unpack

pytest.importorskip("torch")  # the example's tensors (torch is in gangflow[all]; guard anyway)
pytest.importorskip("pyarrow")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import dataframe_pipeline


def test_dataframe_array_and_tensor_travel_by_reference_between_tasks(server, worker, artifacts):
    import pandas as pd

    async def main() -> tuple[object, object, list[object]]:
        client = await make_client(server, artifacts)
        run_id = await client.start(dataframe_pipeline.pipeline, {"rows": 32, "seed": 1})
        fit = await client.result(run_id, dataframe_pipeline.pipeline)
        sample_id = await client.start(dataframe_pipeline.sample, {"rows": 5})
        frame = await client.result(sample_id, dataframe_pipeline.sample)
        history = await client.temporal.get_workflow_handle(run_id).fetch_history()
        results = [
            unpack(e.activity_task_completed_event_attributes.result.payloads[0].data)
            for e in history.events
            if e.HasField("activity_task_completed_event_attributes")
        ]
        return fit, frame, results

    fit, frame, results = run(main())
    assert fit.rows == 32 and fit.first_id == 100  # the frame's index came through the parquet file
    assert 0 < fit.positives < 32 and fit.slope > 0
    # the workflow's own result: the client downloads the frame, index and dtypes intact
    assert isinstance(frame, pd.DataFrame) and list(frame.index) == [100, 101, 102, 103, 104]
    assert frame.index.name == "id" and str(frame["label"].dtype) == "int64" and str(frame["x"].dtype) == "float64"
    # what the tasks returned through Temporal: File references (content sha256), never the data
    frame_ref, (array_ref, tensor_ref), _ = results
    assert [r["name"] for r in (frame_ref, array_ref, tensor_ref)] == ["dataframe.parquet", "array.npy", "tensor.pt"]
    assert all(r["kind"] == "file" and len(r["sha256"]) == 64 and "/cas/" in r["uri"] for r in (frame_ref, array_ref))


def test_a_schema_violation_fails_the_run_naming_the_column_without_retrying(server, worker, artifacts):
    async def main() -> tuple[str, list[object]]:
        client = await make_client(server, artifacts)
        run_id = await client.start(dataframe_pipeline.broken, {"rows": 4})
        with pytest.raises(WorkflowFailureError):
            await client.wait(run_id)
        info = await client.status(run_id)
        return str(info.error), info.tasks

    error, tasks = run(main())
    assert [(t.name, t.status, t.attempt) for t in tasks] == [("load_unlabelled", "failed", 0)]  # not retried (0-based)
    assert "task 'load_unlabelled'" in error
    assert "DataFrame column 'label' has dtype float64, expected int64" in error
    assert "TypeMismatch" in error


def test_the_cli_reports_the_schema_violation_as_the_readme_shows(server, worker, artifacts):
    done = gangflow_cli(
        "run",
        "examples/dataframe_pipeline.py:broken",
        GANGFLOW_ADDRESS=server.address,
        GANGFLOW_ARTIFACTS=artifacts,
    )
    assert done.returncode == 1, done.stderr
    assert "DataFrame column 'label' has dtype float64, expected int64" in " ".join(done.stderr.split())
