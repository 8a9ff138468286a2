"""engine.runtime.gateway.stamp_user: every request that starts a workflow gets the verified token's subject as its
run's user (memo ``gangflow_user``), whatever the client wrote there; other memo keys and requests that start
nothing are left as they came."""

from __future__ import annotations

import getpass
from typing import Any

import temporalio.api.workflowservice.v1 as api
import temporalio.converter
from conftest import ROOT
from temporalio.api.common.v1 import Memo
from temporalio.api.schedule.v1 import Schedule, ScheduleAction, ScheduleSpec
from temporalio.api.workflow.v1 import NewWorkflowExecutionInfo

from engine.client import load_workflow_file, prepare_run, start_options
from engine.core.protocol import USER_MEMO
from engine.runtime.gateway import stamp_user

CONVERTER = temporalio.converter.default().payload_converter
EXAMPLE = f"{ROOT}/examples/scheduled_report.py:report"


def _memo(values: dict[str, Any]) -> Memo:
    return Memo(fields={key: CONVERTER.to_payloads([value])[0] for key, value in values.items()})


def _read(memo: Memo) -> dict[str, Any]:
    return {key: CONVERTER.from_payload(payload) for key, payload in memo.fields.items()}


FORGED = {USER_MEMO: "someone-else", "gangflow": {"artifacts": "/store", "bundle": "abc"}}
STAMPED = {**FORGED, USER_MEMO: "alice"}


def _memos_of(request: Any) -> list[Memo]:
    if isinstance(request, api.ExecuteMultiOperationRequest):
        return [op.start_workflow.memo for op in request.operations if op.HasField("start_workflow")]
    if isinstance(request, api.CreateScheduleRequest | api.UpdateScheduleRequest):
        return [request.schedule.action.start_workflow.memo]
    return [request.memo]


def test_each_way_of_starting_a_workflow_gets_the_tokens_subject() -> None:
    action = ScheduleAction(start_workflow=NewWorkflowExecutionInfo(workflow_id="nightly", memo=_memo(FORGED)))
    update = api.ExecuteMultiOperationRequest.Operation(update_workflow=api.UpdateWorkflowExecutionRequest())
    requests = [
        api.StartWorkflowExecutionRequest(namespace="gf-team-a", memo=_memo(FORGED)),
        api.SignalWithStartWorkflowExecutionRequest(namespace="gf-team-a", memo=_memo(FORGED)),
        api.ExecuteMultiOperationRequest(
            namespace="gf-team-a",
            operations=[
                api.ExecuteMultiOperationRequest.Operation(
                    start_workflow=api.StartWorkflowExecutionRequest(namespace="gf-team-a", memo=_memo(FORGED))
                ),
                update,
            ],
        ),
        api.CreateScheduleRequest(namespace="gf-team-a", schedule=Schedule(action=action)),
        api.UpdateScheduleRequest(namespace="gf-team-a", schedule=Schedule(action=action)),
    ]
    for request in requests:
        assert stamp_user(request, "alice"), type(request).__name__
        memos = _memos_of(request)
        assert [_read(memo) for memo in memos] == [STAMPED], type(request).__name__
        # the bytes the default data converter writes for the string: any worker's converter reads them
        assert memos[0].fields[USER_MEMO] == CONVERTER.to_payloads(["alice"])[0]
        assert not stamp_user(request, "alice")  # already the subject's: nothing to change, forwarded as it came
    assert requests[2].operations[1] == update  # the update of a multi-operation is no start


def test_a_start_without_a_memo_gets_one_and_a_request_that_starts_nothing_is_unchanged() -> None:
    bare = api.StartWorkflowExecutionRequest(namespace="gf-team-a")
    assert stamp_user(bare, "team-a") and _read(bare.memo) == {USER_MEMO: "team-a"}
    unchanged = [
        api.SignalWorkflowExecutionRequest(namespace="gf-team-a", input=None),
        api.CreateScheduleRequest(namespace="gf-team-a", schedule=Schedule(spec=ScheduleSpec(cron_string=["@daily"]))),
        api.UpdateScheduleRequest(namespace="gf-team-a"),
        api.DescribeNamespaceRequest(namespace="gf-team-a"),
    ]
    for request in unchanged:
        raw = request.SerializeToString()
        assert not stamp_user(request, "alice"), type(request).__name__
        assert request.SerializeToString() == raw, type(request).__name__


def test_the_client_names_its_login_and_the_gateway_replaces_it(tmp_path: Any) -> None:
    defn = load_workflow_file(EXAMPLE)
    defn, envelope = prepare_run(defn, {"region": "eu"}, artifacts=str(tmp_path), bundle=False)
    memo = start_options(defn, envelope)["memo"]
    assert memo[USER_MEMO] == getpass.getuser() and "gangflow" in memo
    request = api.StartWorkflowExecutionRequest(namespace="gf-team-a", memo=_memo(memo))
    assert stamp_user(request, "team-a")
    assert _read(request.memo) == {**memo, USER_MEMO: "team-a"}
