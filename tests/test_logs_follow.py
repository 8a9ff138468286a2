"""``gangflow logs RUN -f`` and the per-rank view of ``gangflow status``, on real node agents: a 2-node gang
whose ranks report steps and print on cue (tests/fixtures/rank_reports.py), followed by real CLI processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import rank_reports
from conftest import ROOT, gangflow_cli, make_client, run, until
from temporalio.api.sdk.v1 import WorkflowMetadata

from engine.cli.ranks import rank_views


class Follower:
    """``gangflow logs ARGS -f`` as a real process; its stdout collected line by line as it comes."""

    def __init__(self, address: str, *args: str) -> None:
        env = {**os.environ, "GANGFLOW_ADDRESS": address, "COLUMNS": "120"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "logs", *args, "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
            # as a terminal starts it: a suite started in the background (`make test &`) has SIGINT ignored,
            # which a child inherits, and then the Ctrl-C below would never reach it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    async def printed(self, text: str, timeout: float = 30) -> None:
        async def seen() -> bool:
            return any(text in line for line in self.lines)

        await until(f"the follower prints {text!r}", seen, timeout=timeout)

    def finish(self, timeout: float = 20) -> tuple[int, str, str]:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(5)
        assert self.proc.stderr is not None
        return rc, "\n".join(self.lines), self.proc.stderr.read()


def _gang_task(status: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in status["tasks"] if t["kind"] == "gang")


def test_logs_follow_and_per_rank_status(server, worker, cluster, artifacts, tmp_path: Path):
    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(rank_reports.reports, {"marker_dir": str(tmp_path)})

        def status_json() -> dict[str, Any]:
            done = gangflow_cli("status", run_id, "--json", GANGFLOW_ADDRESS=server.address)
            assert done.returncode == 0, done.stderr
            return dict(json.loads(done.stdout))

        async def both_ranks_reported() -> bool:
            views = list((await rank_views(client, await client.status(run_id))).values())
            return bool(views) and len(views[0]["ranks"]) == 2 and all(r["step"] for r in views[0]["ranks"])

        await until("both ranks report", both_ranks_reported, timeout=60)
        view = _gang_task(status_json())["ranks"]  # what a user gets
        assert view["live"] is True and view["attempt"] == 0 and view["gang_id"] == f"{run_id}.reporting-1"
        rows = view["ranks"]
        assert [r["rank"] for r in rows] == [0, 1] and {r["node"] for r in rows} == {"node-0", "node-1"}
        assert all(isinstance(r["pid"], int) and r["pid"] > 0 for r in rows)
        assert all(0 < r["metrics"]["loss"] <= 1.0 and 0 <= r["age_s"] < 30 for r in rows)

        # the Web UI: the GangTask's current details map ranks to nodes; each node's heartbeat has a summary
        gang_id = view["gang_id"]
        metadata = await client.temporal.get_workflow_handle(gang_id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
        assert "| node-0 | 0 | 0 |" in metadata.current_details and "| node-1 | 1 | 1 |" in metadata.current_details
        summaries = [node["summary"] for node in (await client.gang(gang_id))["nodes"]]
        assert sorted(summary.split(" (pid")[0] for summary in summaries) == ["rank 0", "rank 1"], summaries
        assert all(" loss " in summary and " s ago" in summary for summary in summaries), summaries

        table = gangflow_cli("status", run_id, GANGFLOW_ADDRESS=server.address, COLUMNS="200")
        assert table.returncode == 0, table.stderr
        text = table.stdout
        assert "reporting ranks (attempt 0, running)" in text
        for row in rows:
            line = next(line for line in text.splitlines() if f" {row['pid']} " in f" {line} ")
            assert row["node"] in line and "loss" in line and " s ago" in line, line

        # following: what was printed before it started, then what is printed after, then the next task
        whole = Follower(server.address, run_id)
        one_rank = Follower(server.address, run_id, "--task", "reporting", "--rank", "1")
        interrupted = Follower(server.address, run_id)
        for follower in (whole, one_rank, interrupted):
            await follower.printed("starting")
        interrupted.proc.send_signal(signal.SIGINT)
        (tmp_path / "shout").touch()
        await whole.printed("rank 0 heard the shout")
        await whole.printed("rank 1 heard the shout")
        (tmp_path / "stop").touch()
        started = time.monotonic()
        rc, out, err = whole.finish()
        assert rc == 0, err
        for line in ("rank 0 starting", "rank 1 done at step", "wrap_up got"):
            assert line in out, out
        assert "reporting-1.rank0.attempt0.log" in out and "wrap_up." in out  # a header per new log file
        assert out.index("heard the shout") < out.index("done at step") < out.index("wrap_up got")
        assert f"{run_id}: run completed" in err
        rc, out, err = one_rank.finish()
        assert rc == 0 and "rank 1 done at step" in out and "rank 0" not in out and "wrap_up" not in out, out
        rc, out, err = interrupted.finish()
        assert rc == 130 and err == "", err
        print(f"logs -f exited {time.monotonic() - started:.1f} s after the ranks were told to stop")

        # the finished run's current details: the call's last step and its goodput, as `gangflow status` has it
        metadata = await client.temporal.get_workflow_handle(run_id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
        line = next(line for line in metadata.current_details.splitlines() if "reporting-1" in line)
        assert line.startswith("- **reporting-1** · *completed* · completed attempt 0 on node-"), line
        assert ": step " in line and " · goodput " in line, line

        # a finished gang: its last attempt's last reports
        final = _gang_task(status_json())["ranks"]
        assert final["live"] is False and final["attempt"] == 0
        assert [r["rank"] for r in final["ranks"]] == [0, 1] and all(
            r["step"] >= rows[0]["step"] for r in final["ranks"]
        )

    run(main())


def test_logs_follow_refuses_a_bad_rank_and_an_unknown_run(server):
    bad = gangflow_cli("logs", "any-run", "--rank", "-1", "-f", GANGFLOW_ADDRESS=server.address)
    assert bad.returncode == 2 and "--rank -1" in bad.stderr
    unknown = gangflow_cli("logs", "no-such-run-xyz", "--follow", GANGFLOW_ADDRESS=server.address)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.strip().startswith("error: run 'no-such-run-xyz'")
