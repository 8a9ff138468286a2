"""The Temporal Web UI at a glance, in a real browser: a run's own page shows its gang's state and step.

Headless Chromium (Debian's ``chromium``) opens a running run's page in the dev server's Web UI and reads the
rendered text through the DevTools protocol: ``--dump-dom`` renders the single-page app only with a virtual time
budget, and leaves out the iframes in which the UI renders markdown (a workflow's current details among it). The
shared ``server`` fixture serves the UI only where a Chromium binary is found (its start
costs a fraction of a second more); elsewhere this module is skipped with that reason, and the markdown itself
is checked everywhere (tests/unit/test_glance.py). The run is a 2-node gang whose ranks report steps until told
to stop (tests/fixtures/rank_reports.py), on the shared worker and node agents.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import rank_reports
from conftest import chromium_binary, make_client, run, until

pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(chromium_binary() is None, reason="no Chromium here (apt-get install chromium)"),
]


#: the page's text and its iframes' (the same origin: the UI's markdown renderer)
_TEXT = """[document.body ? document.body.innerText : '',
  ...[...document.querySelectorAll('iframe')].map(f => {
    try { return f.contentDocument && f.contentDocument.body ? f.contentDocument.body.innerText : ''; }
    catch (e) { return ''; }
  })].join('\\n')"""


class Browser:
    """Headless Chromium, driven over its DevTools protocol (one page)."""

    def __init__(self, binary: str) -> None:
        import websocket  # websocket-client: a test dependency only where Chromium is

        self.profile = tempfile.TemporaryDirectory(prefix="gangflow-chromium-")
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in a container has no user namespace for Chromium's sandbox
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                f"--user-data-dir={self.profile.name}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        active = Path(self.profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.exists() and active.read_text().strip()):
            assert self.proc.poll() is None and time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.05)
        port = int(active.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.loads(answer.read())
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.seq = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.seq += 1
        self.ws.send(json.dumps({"id": self.seq, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.seq:
                assert "error" not in message, message
                return dict(message.get("result") or {})

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        """The page's rendered text, as a person reads it: the UI renders markdown (a workflow's summary, details
        and current details) in iframes of its own origin, whose text is added after the page's."""
        answer = self.call("Runtime.evaluate", expression=_TEXT)
        return str(answer.get("result", {}).get("value") or "")

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.profile.cleanup()


def test_a_run_page_shows_its_gangs_state_and_step(server, worker, cluster, artifacts, tmp_path: Path) -> None:
    binary = chromium_binary()
    assert binary is not None and server.ui, "the shared server serves the UI where Chromium is found"

    async def main() -> None:
        client = await make_client(server, artifacts)
        run_id = await client.start(rank_reports.reports, {"marker_dir": str(tmp_path)})
        gang_id = f"{run_id}.reporting-1"
        browser = Browser(binary)
        try:
            # the saved views' queries (README): runs only; a tenant's gangs
            async def listed(query: str) -> list[str]:
                return [wf.id async for wf in client.temporal.list_workflows(query)]

            async def gang_listed() -> bool:
                return gang_id in await listed('GangflowKind = "gang" AND GangflowTenant = "default"')

            await until("the gang listed by kind and tenant", gang_listed, 30)
            runs = await listed('GangflowKind = "run"')
            assert run_id in runs and gang_id not in runs, runs

            # the run's own page, its User Metadata tab: where the UI (2.5x) renders a workflow's current details
            temporal_run = (await client.temporal.get_workflow_handle(run_id).describe()).run_id
            page = f"{server.ui_url}/namespaces/default/workflows/{run_id}/{temporal_run}/user-metadata"
            browser.open(page)
            seen: dict[str, Any] = {"text": "", "polls": 0}

            async def shows_the_step() -> bool:
                seen["polls"] += 1
                if seen["polls"] % 15 == 0:  # the tab reads the details once: look again now and then
                    browser.open(page)
                seen["text"] = text = browser.text()
                return "reporting-1" in text and "ranks running on" in text and ": step " in text

            try:
                await until("the run's page shows its gang's state and step", shows_the_step, 60)
            except AssertionError:
                raise AssertionError(f"the run's page reads:\n{seen['text'][:4000]}") from None
            line = next(line for line in seen["text"].splitlines() if "ranks running on" in line)
            # the same words `gangflow status` prints for the call (engine.core.glance)
            assert line.startswith("reporting-1 · running · attempt 0: 2 ranks running on "), line
            assert ": step " in line and ", loss " in line and " UTC)" in line, line
            (record,) = [t for t in (await client.status(run_id)).tasks if t.kind == "gang"]
            assert record.detail and record.detail.startswith(line.split(" · ", 2)[2].split(": step ")[0]), record
            assert ": step " in record.detail, record
        finally:
            browser.close()
            (tmp_path / "stop").touch()
        await client.wait(run_id)
        status = await client.status(run_id)
        assert status.status == "COMPLETED"

    run(main())
