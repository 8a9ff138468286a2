"""The per-rank view without a server: rows from node agents' heartbeat details (of any agent version),
report ages as a person reads them, the status table, the saved last reports of a finished gang, the Web
UI's rank map, and ``logs -f``'s tail of a log folder (whole lines, new files, the final flush)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from engine.artifacts.store import ArtifactStore
from engine.cli import render
from engine.cli.logs import LogTail, wanted
from engine.cli.ranks import with_ranks
from engine.client import RunInfo
from engine.rank.view import format_age, format_metrics, rank_rows, summary_line
from engine.runtime.history import TaskRecord, failure_attempts
from engine.runtime.ranks import attempt_steps, last_attempt_ranks, merge_attempts, rank_details, save_ranks
from engine.scheduling import NodeAssignment
from workflows.gang import _rank_map
from workflows.gang_failures import ended_line

NOW = 1_000_000.0


def heartbeat(node: str, ranks: dict[str, int], progress: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "pids": list(ranks.values()), "ranks": ranks, "progress": progress}


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (None, "no report yet"),
        (float("nan"), "no report yet"),
        (-2.0, "0 s ago"),
        (0.4, "0 s ago"),
        (3.9, "3 s ago"),
        (59.9, "59 s ago"),
        (60, "1 min ago"),
        (3599, "59 min ago"),
        (3600, "1 h ago"),
        (2 * 3600 + 5 * 60 + 7, "2 h 5 min ago"),
    ],
)
def test_age_reads_as_a_person_says_it(seconds: float | None, said: str) -> None:
    assert format_age(seconds) == said


def test_rows_join_pids_and_reports_across_nodes_by_rank() -> None:
    nodes = [
        heartbeat("node-1", {"2": 302, "3": 303}, {"2": {"step": 7, "time": NOW - 3, "pid": 302, "loss": 0.5}}),
        heartbeat("node-0", {"0": 300, "1": 301}, {"0": {"step": 9, "time": NOW - 1.5, "pid": 300, "loss": 0.25}}),
    ]
    rows = rank_rows(nodes, NOW)
    assert [(r["node"], r["rank"], r["pid"]) for r in rows] == [
        ("node-0", 0, 300),
        ("node-0", 1, 301),
        ("node-1", 2, 302),
        ("node-1", 3, 303),
    ]
    assert rows[0]["step"] == 9 and rows[0]["metrics"] == {"loss": 0.25} and rows[0]["age_s"] == 1.5
    assert rows[1]["step"] is None and rows[1]["age_s"] is None and rows[1]["metrics"] == {}  # not reported yet


def test_rows_from_an_agent_without_a_rank_map_and_from_garbage() -> None:
    old = {"node": "node-0", "pids": [41, 42], "progress": {"1": {"step": 3, "time": NOW + 5, "pid": 42}}}
    rows = rank_rows([old, "nonsense", {"progress": {"x": {}, "2": "not a report"}, "ranks": {"y": 1}}], NOW)
    assert [(r["rank"], r["pid"], r["step"]) for r in rows] == [(1, 42, 3)]
    assert rows[0]["age_s"] == 0.0  # a rank's clock ahead of ours is not "-5 s ago"
    assert rank_rows([], NOW) == []


def test_metrics_put_loss_first_and_summary_says_every_rank() -> None:
    assert format_metrics({"acc": 0.91234, "loss": 0.123456, "epoch": 2}) == "loss 0.1235 · acc 0.9123 · epoch 2"
    assert format_metrics({}) == ""
    rows = rank_rows(
        [heartbeat("n0", {"0": 10, "1": 11}, {"0": {"step": 40, "time": NOW - 2, "pid": 10, "loss": 0.12}})], NOW
    )
    assert summary_line(rows) == "rank 0 (pid 10) step 40 loss 0.12, 2 s ago; rank 1 (pid 11) no report yet"


def test_status_table_shows_node_rank_pid_step_loss_and_age() -> None:
    rows = rank_rows(
        [heartbeat("node-0", {"0": 4242, "1": 4243}, {"0": {"step": 12, "time": NOW - 75, "pid": 4242, "loss": 0.5}})],
        NOW,
    )
    info = RunInfo("r", "wf", "RUNNING", None, None, tasks=[TaskRecord("prep", "task"), TaskRecord("train", "gang")])
    out = io.StringIO()
    original = render.console
    render.console = Console(file=out, width=120, highlight=False)
    try:
        render.show_ranks(info, {1: {"gang_id": "r.train-1", "attempt": 2, "live": True, "ranks": rows}})
    finally:
        render.console = original
    text = out.getvalue()
    assert "train ranks (attempt 2, running)" in text
    first = next(line for line in text.splitlines() if "4242" in line)
    assert "node-0" in first and "12" in first and "loss 0.5" in first and "1 min ago" in first
    second = next(line for line in text.splitlines() if "4243" in line)
    assert "—" in second and "no report yet" in second
    out.truncate(0)
    render.console = Console(file=out, width=120, highlight=False)
    try:
        render.show_ranks(info, {1: {"gang_id": "r.train-1", "attempt": 0, "live": False, "ranks": rows}})
    finally:
        render.console = original
    assert "train ranks (attempt 0, last reports)" in out.getvalue()


def test_json_carries_the_view_under_its_task() -> None:
    data = {"tasks": [{"name": "prep"}, {"name": "train"}]}
    view = {"gang_id": "r.train-1", "attempt": 0, "live": False, "ranks": []}
    assert with_ranks(data, {1: view}) == {"tasks": [{"name": "prep"}, {"name": "train", "ranks": view}]}


@pytest.mark.parametrize("root", ["local", "memory://rank-view"])
def test_saved_reports_of_the_last_attempt(tmp_path, root: str) -> None:
    store = ArtifactStore(str(tmp_path) if root == "local" else root)
    assert last_attempt_ranks(store, "run-1", "train-1") is None
    save_ranks(store, "run-1", "train-1", 0, 0, heartbeat("node-0", {"0": 1}, {}))
    save_ranks(store, "run-1", "train-1", 1, 0, heartbeat("node-0", {"0": 2}, {}))
    save_ranks(store, "run-1", "train-1", 1, 1, heartbeat("node-1", {"1": 3}, {}))
    save_ranks(store, "run-1", "train-10", 5, 0, heartbeat("node-0", {"0": 9}, {}))  # another call: not mixed in
    store.fs.pipe_file(f"{store.root}/ranks/run-1/train-1.attempt1.node2.json", b"{half")  # a torn write
    attempt, nodes = last_attempt_ranks(store, "run-1", "train-1") or (None, [])
    assert attempt == 1 and sorted(n["node"] for n in nodes) == ["node-0", "node-1"]
    assert [r["pid"] for r in rank_rows(nodes, NOW)] == [2, 3]


def test_ui_rank_map_is_markdown_per_node() -> None:
    nodes = [
        NodeAssignment(node_id="node-0", address="10.0.0.1", node_rank=0, gpu_ids=(0, 1)),
        NodeAssignment(node_id="b", address="10.0.0.2", node_rank=1, gpu_ids=()),
    ]
    text = _rank_map(nodes, 2, "run-7")
    assert "| node-0 | 0 | 0–1 |" in text and "| b | 1 | 2–3 |" in text and "gangflow status run-7" in text
    assert "| b | 1 | 1 |" in _rank_map(nodes, 1, "r")


def test_wanted_picks_task_call_and_rank() -> None:
    assert wanted("train-1.rank3.attempt0.log", "train", 3) and wanted("train-1.rank3.attempt0.log", "train-1", None)
    assert not wanted("train-1.rank3.attempt0.log", "train", 2) and not wanted("prep.1.attempt1.log", None, 0)
    assert wanted("prep.1.attempt1.log", "prep", None) and not wanted("prep.1.attempt1.json", None, None)


@pytest.mark.parametrize("root", ["local", "memory://log-tail"])
def test_tail_prints_whole_lines_new_files_and_the_rest_at_the_end(tmp_path, root: str) -> None:
    store = ArtifactStore(str(tmp_path) if root == "local" else root)
    folder = store.log_path("run-1")
    if store.local:
        store.fs.makedirs(folder, exist_ok=True)
    out: list[str] = []
    tail = LogTail(store, folder, None, None)
    assert tail.poll(lambda name: out.append(f"== {name}"), out.append) is False  # no folder yet: nothing

    def put(name: str, text: str) -> None:
        path = f"{folder}/{name}"
        old = store.fs.cat_file(path).decode() if store.fs.exists(path) else ""
        store.fs.pipe_file(path, (old + text).encode())

    def poll(final: bool = False) -> list[str]:
        out.clear()
        tail.poll(lambda name: out.append(f"== {name}"), out.append, final=final)
        return list(out)

    put("t-1.rank0.attempt0.log", "one\ntw")
    assert poll() == ["== t-1.rank0.attempt0.log", "one\n"]  # "tw" waits for its newline
    assert poll() == []
    put("t-1.rank0.attempt0.log", "o\nthree\n")
    put("t-1.rank1.attempt0.log", "")
    assert poll() == ["two\nthree\n", "== t-1.rank1.attempt0.log"]  # a new (empty) file: its header
    put("t-1.rank1.attempt0.log", "héllo\n")
    put("t-1.rank0.attempt0.log", "four")
    assert poll() == ["héllo\n"]
    assert poll(final=True) == ["== t-1.rank0.attempt0.log", "four"]  # the end: a last line without newline
    store.fs.pipe_file(f"{folder}/notes.json", json.dumps({}).encode())
    assert poll(final=True) == []


class _Gang:
    """What rank_details reads of a node's gang (engine.executor.launcher.NodeGang)."""

    def __init__(self) -> None:
        self.ranks: list[Any] = []
        self.procs: list[Any] = []
        self.pids: list[int] = []
        self.started = NOW - 30
        self.reports: dict[int, dict[str, Any]] = {}

    def progress(self) -> dict[int, dict[str, Any]]:
        return dict(self.reports)


def test_details_say_when_the_ranks_started_and_where_each_attempt_began() -> None:
    gang = _Gang()
    gang.reports = {0: {"step": 35, "first_step": 20, "time": NOW}, 1: {"step": 36, "first_step": 21, "time": NOW}}
    details = rank_details("n0", gang)  # type: ignore[arg-type]
    assert details["started"] == NOW - 30 and details["at"] >= NOW and "first_step" not in str(details["summary"])
    other = {"node": "n1", "progress": {"2": {"step": 40, "first_step": 19}, "3": "junk"}, "at": NOW + 5}
    steps = attempt_steps([details, other])
    assert (steps["first_step"], steps["last_step"], steps["started_at"]) == (19, 40, NOW - 30)
    assert steps["ended_at"] == details["at"]  # the latest details
    assert attempt_steps([{"node": "old agent", "progress": {"0": {"step": 3}}}]) == {
        "first_step": None,
        "last_step": 3,
        "started_at": None,
        "ended_at": None,
    }


def test_attempts_join_the_gangs_record_with_the_saved_steps() -> None:
    saved = {
        0: [{"progress": {"0": {"step": 30, "first_step": 0}}, "started": 100.0, "at": 140.0}],
        1: [{"progress": {"0": {"step": 60, "first_step": 30}}, "started": 150.0, "at": 170.0}],
    }
    recorded = [
        {"attempt": 0, "kind": "preempted", "ended": "preempted by b-1 of team-b (reclaim)", "reason": "x",
         "started_at": 99.0, "ended_at": 141.0, "duration_s": 42.0, "nodes": ["n1", "n2"]},
        {"attempt": 1, "kind": "completed", "ended": "completed", "reason": "completed",
         "started_at": 149.0, "ended_at": 171.0, "duration_s": 22.0, "nodes": ["n1", "n2"]},
    ]  # fmt: skip
    merged = merge_attempts(recorded, saved, "completed")
    assert [(a["attempt"], a["ended"], a["duration_s"], a["first_step"], a["last_step"]) for a in merged] == [
        (0, "preempted by b-1 of team-b (reclaim)", 42.0, 0, 30),
        (1, "completed", 22.0, 30, 60),
    ]
    # the isolated layout, a completed run: no record of the gang's own, the saved details give times and steps
    alone = merge_attempts([], saved, "completed")
    assert [(a["attempt"], a["ended"], a["duration_s"], a["last_step"]) for a in alone] == [
        (0, None, 40.0, 30),
        (1, "completed", 20.0, 60),
    ]
    # ... a failed one: its failure names the failed attempts
    error = (
        "RankFailed: user error in the task body, not restarted (1 attempt(s) allowed ...):\n"
        "  attempt 0 [system] node n1 lost (heartbeat timeout)\n"
        "  attempt 1 [user] rank 1 (node n2, local rank 0) exited with code 1: KeyError: 'x'\n"
        "last failure: rank 1 (node n2, local rank 0) exited with code 1: KeyError: 'x'\n"
        "RankFailed: user error ...:\n  attempt 0 [system] node n1 lost (heartbeat timeout)\n"
    )
    failed = merge_attempts(failure_attempts(error), saved, "failed")
    assert [(a["attempt"], a["kind"], a["ended"]) for a in failed] == [
        (0, "system", "node n1 lost (heartbeat timeout)"),
        (1, "user", "rank 1 (node n2, local rank 0) exited with code 1: KeyError: 'x'"),
    ]
    assert failure_attempts(None) == [] and failure_attempts("ValueError: no list here") == []


@pytest.mark.parametrize(
    ("reason", "ended"),
    [
        ("rank 1 (node n1, local rank 1) exited with code 1: KeyError: 'x'\n--- last lines", "rank 1 (node n1, "
         "local rank 1) exited with code 1"),
        ("rank 0 (node n1, local rank 0) was killed by SIGKILL\n--- last lines", "rank 0 (node n1, local rank 0) "
         "was killed by SIGKILL"),
        ("rank 0 (node n1, local rank 0) made no progress for 12 s (hung)", "rank 0 (node n1, local rank 0) made "
         "no progress for 12 s (hung)"),
        ("node n1 lost (heartbeat timeout)", "node n1 lost (heartbeat timeout)"),
        ("", ""),
    ],
)  # fmt: skip
def test_an_attempt_ends_in_a_few_words(reason: str, ended: str) -> None:
    assert ended_line(reason) == ended


def _status_text(info: RunInfo) -> str:
    out = io.StringIO()
    original = render.console
    render.console = Console(file=out, width=160, highlight=False)
    try:
        render.show_status(info)
    finally:
        render.console = original
    return out.getvalue()


def test_status_says_who_started_the_run_and_a_run_from_before_that_was_kept_says_nothing() -> None:
    started = RunInfo("r", "wf", "RUNNING", None, None, tenant="team-a", user="alice")
    assert "tenant team-a  started by alice" in _status_text(started)
    assert render.run_json(started)["user"] == "alice"
    older = RunInfo("r", "wf", "RUNNING", None, None, tenant="team-a")  # no gangflow_user memo
    assert "started by" not in _status_text(older) and render.run_json(older)["user"] is None


def test_list_names_each_runs_user_in_the_table_and_in_the_two_line_form() -> None:
    runs = [
        RunInfo("pipeline-1a2b", "wf", "RUNNING", None, None, tenant="team-a", user="alice"),
        RunInfo("pipeline-3c4d", "wf", "COMPLETED", None, None, tenant="team-b"),  # from before the memo
    ]
    # a wide terminal: the table (a user column); a narrow one: two lines a run, the id alone on the first
    for width, expected in ((160, "RUNNING │ team-a │ alice"), (30, "RUNNING tenant team-a user alice")):
        out = io.StringIO()
        original = render.console
        render.console = Console(file=out, width=width, highlight=False)
        try:
            render.show_runs(runs)
        finally:
            render.console = original
        text = " ".join(out.getvalue().split())
        assert expected in text and text.count("alice") == 1 and "None" not in text, out.getvalue()


def test_status_lists_each_gangs_attempts_numbered_from_0() -> None:
    attempts = [
        {"attempt": 0, "kind": "preempted", "ended": "preempted by b-1 of team-b (reclaim)", "duration_s": 42.0,
         "first_step": 0, "last_step": 30, "nodes": ["n1", "n2"]},
        {"attempt": 1, "kind": "completed", "ended": "completed", "duration_s": 22.5, "first_step": 30,
         "last_step": 60, "nodes": ["n2", "n3"]},
    ]  # fmt: skip
    train = TaskRecord("train", "gang", status="completed", attempt=1, call="train-1", attempts=attempts)
    info = RunInfo("r", "wf", "COMPLETED", None, None, tasks=[TaskRecord("prep", "task", "completed"), train])
    text = _status_text(info)
    rows = [[cell.strip() for cell in line.split("│")] for line in text.splitlines() if "│" in line]
    assert rows[:2] == [
        ["1", "prep", "task", "completed", "0", "", ""],
        ["2", "train", "gang", "completed", "1", "", ""],  # the task table numbers attempts as the gang does
    ]
    assert "train-1 attempts" in text
    assert rows[2:] == [
        ["0", "preempted by b-1 of team-b (reclaim)", "42.0", "0 → 30", "n1, n2"],
        ["1", "completed", "22.5", "30 → 60", "n2, n3"],
    ]
    task = render.run_json(info)["tasks"][1]
    assert task["attempt"] == 1 and task["call"] == "train-1" and task["attempts"] == attempts
    assert "attempts" not in render.run_json(info)["tasks"][0]  # a plain task has tries, not gang attempts
