"""A real Prometheus server scrapes ``gangflow dev --metrics-port`` while a gang holds its node's GPUs, and
answers what ``gangflow queues show`` and ``gangflow cluster`` say, and once the gang ended what ``gangflow
usage`` says; ``promtool`` parses every query of the Grafana dashboard. Both need Debian's ``prometheus``
package (``apt-get install prometheus``) and are skipped with that reason where it is absent; the exposition
itself is checked everywhere (tests/unit/test_metrics.py, tests/test_cli_stack.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, gangflow_cli
from test_cli_stack import GANG, DevStack

from engine.runtime import free_port

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("promtool") is None,
        reason="no Prometheus server here (apt-get install prometheus)",
    ),
]


def test_promtool_parses_every_query_of_the_grafana_dashboard(tmp_path: Path) -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "gangflow-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    # as recording rules: the one promtool command that parses PromQL without a server
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_prometheus_scrapes_the_dev_stack_and_agrees_with_the_cli(tmp_path: Path) -> None:
    stack = DevStack(tmp_path / "state", free_port(), free_port())
    metrics_port, prom_port = free_port(), free_port()
    stack.start("--nodes", "1", "--gpus-per-node", "2", "--metrics-port", str(metrics_port))
    prometheus = None
    try:
        (tmp_path / "flow.py").write_text(GANG)
        markers = tmp_path / "markers"
        markers.mkdir()
        started = gangflow_cli(
            "run", "flow.py:holding", "--marker-dir", str(markers), "--detach", "--json", env=stack.env, cwd=tmp_path
        )
        assert started.returncode == 0, started.stderr
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs: [{{job_name: gangflow, static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]}}]\n"
        )
        log = (tmp_path / "prometheus.log").open("w")
        prometheus = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120  # the gang's ranks start, then Prometheus scrapes every second
        while True:
            try:
                held = _query(prom_port, 'gangflow_node_allocated_gpus{node="node-0"}')
            except OSError:
                held = []
            if held and float(held[0]["value"][1]) == 2:
                break
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (held, (tmp_path / "prometheus.log").read_text()[-3000:])
            time.sleep(0.5)
        # what Prometheus stored is what the CLI says (nothing changes meanwhile: the gang holds until cancelled)
        queues = json.loads(stack.cli("queues", "show", "--json").stdout)["tenants"]["default"]
        used = _query(prom_port, 'gangflow_tenant_resource_usage{tenant="default", resource="gpu"}')
        assert float(used[0]["value"][1]) == queues["used"]["gpu"] == 2
        pending = _query(prom_port, 'gangflow_pending_gangs{tenant="default"}')
        assert float(pending[0]["value"][1]) == queues["pending"] == 0
        cluster = json.loads(stack.cli("cluster", "--json").stdout)
        alive = _query(prom_port, "sum(gangflow_node_alive)")
        assert float(alive[0]["value"][1]) == cluster["totals"]["alive_nodes"] == 1
        up = _query(prom_port, 'up{job="gangflow"}')
        assert float(up[0]["value"][1]) == 1  # Prometheus's own view: the target answered its scrapes
        # once the run is cancelled its gang's attempt ends: its GPU-seconds by cause reach Prometheus (the
        # GangTask tells the Scheduler the attempt's ledger), as many as `gangflow usage` counts for the run
        run_id = json.loads(started.stdout)["run_id"]
        assert stack.cli("cancel", run_id).returncode == 0
        deadline = time.monotonic() + 120
        while not (spent := _query(prom_port, 'sum(gangflow_gpu_seconds_total{tenant="default"})')):
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        shown = stack.cli("usage", "--by", "run", "--json")
        assert shown.returncode == 0, shown.stderr
        (row,) = [r for r in json.loads(shown.stdout)["rows"] if r["run"] == run_id]
        assert float(spent[0]["value"][1]) == pytest.approx(row["allocated_gpu_s"], rel=0.01), row
        ratio = _query(prom_port, 'gangflow_goodput_ratio{tenant="default"}')
        assert 0 <= float(ratio[0]["value"][1]) <= 1, ratio
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)
        stack.stop()
