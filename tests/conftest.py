"""Shared fixtures: a real Temporal dev server and real gangflow worker processes.

The temporalio core can abort the interpreter at exit (sdk-python#300, exit code 134) after every test
passed; ``pytest_unconfigure`` below ends the process with the test run's own exit status instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# Every node agent the suite starts (through a Stack, `gangflow dev`, the demos, deploy/ scripts) keeps its ranks
# root in their cgroups: the suite's ranks write markers into pytest's folders, which a gang's own user cannot
# reach. tests/security asks for the whole sandbox (GANGFLOW_SANDBOX=1) where it attacks it.
os.environ.setdefault("GANGFLOW_SANDBOX", "cgroups")
sys.path.insert(0, str(FIXTURES))

from engine.executor.process import spawn, stop_processes  # noqa: E402
from engine.runtime.devserver import DevServer  # noqa: E402


def gangflow_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | str | None = ROOT, timeout: float = 120, **more: str
) -> subprocess.CompletedProcess[str]:
    """``gangflow ARGS`` as a user runs it: a real process, output captured; ``more`` adds environment."""
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env={**(os.environ if env is None else env), **more},
        cwd=cwd,
        timeout=timeout,
    )


class _Exited(BaseException):
    """``os._exit`` of an in-process CLI: the code it would have ended the process with."""


def gangflow_main(
    *args: str, cwd: Path | str | None = None, stdin: str = "", **more: str
) -> subprocess.CompletedProcess[str]:
    """``gangflow ARGS`` run in this process (``engine.cli.app.main``, its exit caught, output captured, ``more``
    added to the environment for the call): for checks of what the CLI refuses before it loads a workflow file,
    connects or starts anything, where a process start (about 1.7 s of CPU) is most of the test's time.
    :func:`gangflow_cli` (a real process) for anything else; each module using this keeps one real-process
    check of the same refusal, the entry point included."""
    import io

    from engine.cli import app

    def _exit(code: int) -> None:
        raise _Exited(code)

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_exit, saved_stdin = dict(os.environ), os.getcwd(), os._exit, sys.stdin
    code: Any = 0
    try:
        os.environ.update(more)
        if cwd is not None:
            os.chdir(cwd)
        os._exit = _exit  # type: ignore[assignment]
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app.main(list(args))
            except _Exited as exited:
                code = exited.args[0]
            except SystemExit as exited:  # argparse's exit 2
                code = exited.code
    finally:
        os._exit, sys.stdin = saved_exit, saved_stdin  # type: ignore[assignment]
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["gangflow", *args], code, out.getvalue(), err.getvalue())


def status_json(address: str, run_id: str) -> dict[str, Any]:
    """``gangflow status RUN --json`` as a user runs it (a real process), parsed."""
    done = gangflow_cli("status", run_id, "--json", GANGFLOW_ADDRESS=address)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def gang_task(status: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """A distributed task call of ``status_json``'s answer: the first (or the first named ``name``)."""
    return next(t for t in status["tasks"] if t["kind"] == "gang" and name in (None, t["name"]))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


async def until(what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 90) -> T:
    """Poll ``probe`` until it returns something other than None (or False); returns that. A workflow not
    started yet (RPCError from a query) counts as not yet."""
    from temporalio.service import RPCError

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await probe()
        except RPCError:
            value = None
        if value is not None and value is not False:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        await asyncio.sleep(0.2)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def failure_of(client: Any, wf: Any, inputs: dict[str, Any]) -> str:
    """Start a run that must fail; returns its failure text (the error chain with tracebacks)."""
    from temporalio.client import WorkflowFailureError

    run_id = await client.start(wf, inputs)
    with pytest.raises(WorkflowFailureError):
        await client.wait(run_id)
    return str((await client.status(run_id)).error)


async def make_client(server: DevServer, artifacts: str, queue: str = "gangflow") -> Any:
    """A gangflow client on a test server, storing artifacts under ``artifacts``."""
    from engine.client import Client
    from engine.runtime import Endpoint, connect

    client = Client(await connect(Endpoint.resolve(server.address)), artifacts)
    client.task_queue = queue
    return client


# -- where the suite's time goes ---------------------------------------------------------------
#: seconds per test file: its tests' setup, call and teardown (a shared stack's start counts for the first
#: file that uses it). The suite has a 30-minute budget: the summary names the files that spend it.
_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    ranked = sorted(_file_seconds.items(), key=lambda kv: -kv[1])
    if len(ranked) > 1:
        terminalreporter.section("slowest test files (setup + call + teardown)")
        for path, seconds in ranked[:20]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
        terminalreporter.write_line(f"{sum(_file_seconds.values()):8.1f} s  in all {len(ranked)} files")


# -- exit status (see module docstring) --------------------------------------------------------
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status and os.environ.get("GANGFLOW_PYTEST_NO_OS_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])


# -- servers and workers -----------------------------------------------------------------------
@pytest.fixture(scope="session")
def state_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gangflow")
    os.environ["GANGFLOW_CACHE"] = str(root / "client-cache")
    return root


def chromium_binary() -> str | None:
    """A Chromium to drive headless (tests/test_web_ui.py), if one is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def server(state_root: Path) -> Iterator[DevServer]:
    # the Web UI only where a browser can look at it (tests/test_web_ui.py): the shared stack serves it then
    srv = DevServer(state_root / "temporal", ui=chromium_binary() is not None).start()
    yield srv
    srv.stop()


class WorkerProcess:
    """``gangflow worker`` as a real child process (its own code cache, so it loads bundles itself)."""

    def __init__(
        self, address: str, queue: str, home: Path, env: dict[str, str] | None = None, args: Sequence[str] = ()
    ) -> None:
        self.address, self.queue, self.home = address, queue, home
        self.env = dict(env or {})  # more environment, e.g. GANGFLOW_ENCRYPTION_KEYS
        self.args = list(args)  # more options, e.g. --tenant team-a
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / f"worker-{queue}.log"

    def start(self) -> WorkerProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GANGFLOW_CACHE=str(self.home / "cache"), PYTHONUNBUFFERED="1", TMPDIR=str(self.home))
        env.update(self.env)
        cmd = [sys.executable, "-m", "engine.cli", "worker", "--address", self.address, "--task-queue", self.queue]
        cmd += self.args
        self.proc = spawn(cmd, log=self.log, env=env, cwd=self.home, new_session=True, parent_death=None)
        deadline = time.monotonic() + 30
        while b"gangflow worker on" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:  # a reaped leader's pid may be a new group's by now
            stop_processes([self.proc], 15, sig=sig, group=True)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture(scope="session")
def worker(server: DevServer, state_root: Path) -> Iterator[WorkerProcess]:
    proc = WorkerProcess(server.address, "gangflow", state_root / "worker").start()
    yield proc
    proc.stop()


@pytest.fixture
def spawn_worker(server: DevServer, tmp_path: Path) -> Iterator[Callable[[str], WorkerProcess]]:
    started: list[WorkerProcess] = []

    def spawn(queue: str) -> WorkerProcess:
        started.append(WorkerProcess(server.address, queue, tmp_path / f"w{len(started)}").start())
        return started[-1]

    yield spawn
    for proc in started:
        proc.stop()


class NodeAgent:
    """``gangflow node`` as a real child process standing in for one GPU server."""

    def __init__(self, address: str, node_id: str, gpus: int, home: Path, env: dict[str, str] | None = None) -> None:
        self.address, self.node_id, self.gpus, self.home = address, node_id, gpus, home
        self.env = dict(env or {})  # more environment, e.g. GANGFLOW_SCHEDULER_EVENTS_PER_RUN
        self.args: list[str] = []  # more options, e.g. --labels gpu=h100 (taken at the next start)
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / f"{node_id}.log"
        self.start()

    def start(self) -> None:
        # ranks stay root in their cgroups (GANGFLOW_SANDBOX=cgroups): the suite's ranks write markers into
        # pytest's folders, which a gang's own user cannot reach; tests/security asks for the whole sandbox
        env = dict(os.environ, GANGFLOW_CACHE=str(self.home / "cache"), PYTHONUNBUFFERED="1")
        env.setdefault("GANGFLOW_SANDBOX", "cgroups")
        env.update(self.env)
        cmd = ["node", "--node-id", self.node_id, "--cpus", "4"]
        cmd += ["--gpus", str(self.gpus)] if self.gpus >= 0 else []  # negative: detect with nvidia-smi
        cmd += ["--address", self.address, "--advertise-addr", "127.0.0.1", *self.args]
        self.proc = spawn(
            [sys.executable, "-m", "engine.cli", *cmd], log=self.log, env=env, new_session=True, parent_death=None
        )

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """``sig`` to the agent alone (its ranks die with it: their parent-death signal), SIGKILL after 30 s."""
        stop_processes([self.proc], 30, sig=sig)


#: a Stack's ``env`` for modules whose gangs never import torch: their agents' standby rank processes import
#: nothing ahead (GANGFLOW_WARM, engine.executor.standby), not torch. Each torch import costs a core for 2 s or
#: more, and an agent starts one per standby taken, after every gang start: most of a 2-core machine's CPU in
#: such a module. The standbys are still there and still taken by every rank.
NO_WARM_IMPORTS = {"GANGFLOW_WARM": ""}


class Stack:
    """A whole stack of its own, for tests that kill or restart its parts: a dev server, a worker and
    ``count`` node agents named ``<prefix>0..`` with ``gpus`` GPU slots each. ``scheduler_events``: the
    Scheduler the agents start continues as new after that many events (tests cross continue-as-new often);
    ``env``: more environment for the worker and the agents (e.g. encryption keys)."""

    def __init__(
        self,
        root: Path,
        prefix: str,
        count: int = 3,
        gpus: int = 0,
        scheduler_events: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        env = dict(env or {})  # for the worker and the node agents alike
        if scheduler_events is not None:  # the worker starts the Scheduler (engine.runtime.keeper): it needs it
            env["GANGFLOW_SCHEDULER_EVENTS_PER_RUN"] = str(scheduler_events)
        self.server = DevServer(root / "server", ui=False).start()
        try:
            self.worker = WorkerProcess(self.server.address, "gangflow", root / "worker", env).start()
        except BaseException:  # leave no server behind
            self.server.stop()
            raise
        self.nodes = {
            f"{prefix}{i}": NodeAgent(self.server.address, f"{prefix}{i}", gpus, root / "nodes", env)
            for i in range(count)
        }
        self.artifacts = str(root / "artifacts")

    async def client(self) -> Any:
        from engine.client import Client
        from engine.runtime import Endpoint, connect

        return Client(await connect(Endpoint.resolve(self.server.address)), self.artifacts)

    async def queue(self) -> dict[str, Any]:
        return dict(await (await self.client()).queue())

    async def wait_for(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60) -> float:
        """Poll ``check(gangflow cluster)`` until it is true; returns the seconds it took."""
        from temporalio.service import RPCError

        started = time.monotonic()
        while True:
            try:
                if check(await self.queue()):
                    return time.monotonic() - started
            except RPCError:  # no Scheduler yet
                pass
            assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
            await asyncio.sleep(0.2)

    async def wait_nodes(self, count: int | None = None) -> None:
        want = len(self.nodes) if count is None else count
        await self.wait_for("node agents registered", lambda q: q["totals"]["alive_nodes"] >= want)

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.worker.stop()
        self.server.stop()


def stack_fixture(
    prefix: str,
    count: int = 3,
    gpus: int = 0,
    *,
    scheduler_events: int | None = None,
    env: dict[str, str] | None = None,
    kind: type[Stack] = Stack,
    ready: Callable[[Any], Coroutine[Any, Any, object]] | None = Stack.wait_nodes,
) -> Any:
    """A module-scoped ``stack`` fixture: a :class:`Stack` of the module's own (``kind``: a subclass with more
    helpers), started with these arguments, ``ready`` awaited on it before the first test (the default: every
    node agent registered; None: no wait), and closed after the module's last test, even if ``ready`` failed.
    For the modules whose tests kill, restart or reconfigure the stack's parts; ``stack = stack_fixture(...)``
    at module level."""

    @pytest.fixture(scope="module", name="stack")
    def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
        built = kind(tmp_path_factory.mktemp(f"stack-{prefix}"), prefix, count, gpus, scheduler_events, env)
        try:
            if ready is not None:
                run(ready(built))
            yield built
        finally:
            built.close()

    return stack


@pytest.fixture(scope="session")
def cluster(server: DevServer, worker: WorkerProcess, state_root: Path) -> Iterator[list[NodeAgent]]:
    """Two node agents with two GPU slots each, registered with the Scheduler."""
    import asyncio

    from engine.client import Client
    from engine.runtime import Endpoint, connect

    nodes = [NodeAgent(server.address, f"node-{i}", 2, state_root / "nodes") for i in range(2)]

    async def registered() -> int:
        client = Client(await connect(Endpoint.resolve(server.address)))
        try:
            return int((await client.queue())["totals"]["alive_nodes"])
        except Exception:
            return 0

    deadline = time.monotonic() + 180  # minutes on a loaded machine
    while asyncio.run(registered()) < 2:
        assert time.monotonic() < deadline, "node agents did not register"
        time.sleep(0.3)
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
def artifacts(state_root: Path) -> str:
    return str(state_root / "artifacts")


class AuthStack:
    """``gangflow dev --auth`` run as a user runs it (the isolated layout: tenants' workers in their namespaces
    behind the gateway, the platform and its node agents in gangflow-system)."""

    def __init__(self, state: Path, port: int, proc: subprocess.Popen[str], log: Path) -> None:
        self.state, self.port, self.proc, self.log = state, port, proc, log

    @classmethod
    @contextlib.contextmanager
    def start(cls, state: Path, queues: str, *extra: str) -> Iterator[AuthStack]:
        from engine.runtime import free_port

        port, log = free_port(), state.parent / "dev.log"
        cmd = [sys.executable, "-m", "engine.cli", "dev", "--auth", "--queues", queues, *extra]
        cmd += ["--headless", "--port", str(port), "--ui-port", str(free_port()), "--state-dir", str(state)]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        deadline = time.monotonic() + 180  # the ready line waits for the node agents: minutes on a loaded machine
        while "gangflow run" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        try:
            yield cls(state, port, proc, log)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def upstream(self) -> str:
        """Temporal itself (the platform's way in), from the banner."""
        line = next(x for x in self.log.read_text().splitlines() if "gangflow dev" in x and "Temporal on" in x)
        return line.split("Temporal on ")[1].split(",")[0].strip()

    def token(self, tenant: str) -> str:
        return (self.state / "auth" / "tokens" / f"{tenant}.jwt").read_text().strip()

    def env(self, tenant: str) -> dict[str, str]:
        """What the banner tells a tenant to export."""
        return {
            **os.environ,
            "GANGFLOW_ADDRESS": self.address,
            "GANGFLOW_NAMESPACE": "gf-{tenant}",
            "GANGFLOW_TENANT": tenant,
            "GANGFLOW_ARTIFACTS": str(self.state / "artifacts" / tenant),
            "GANGFLOW_API_KEY": self.token(tenant),
        }

    async def client(self, namespace: str, token: str | None) -> Any:
        from temporalio.client import Client

        return await Client.connect(self.address, namespace=namespace, api_key=token, tls=False)


# -- the shared `gangflow dev --auth` stack ---------------------------------------------------------
#: What the modules that share it need: the example queues (team-a and team-b) and two node agents with two
#: GPU slots each (the isolation tests' gangs; the gateway tests need no node and mind none).
AUTH_QUEUES = ROOT / "examples" / "queues.yaml"
AUTH_OPTIONS = ("--nodes", "2", "--gpus-per-node", "2")
#: the stack once started; closed after the last test that uses it (pytest_runtest_teardown below)
_auth_stack = contextlib.ExitStack()
_last_auth_user: list[pytest.Item] = []


@pytest.fixture(scope="session")
def auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthStack]:
    """One ``gangflow dev --auth`` stack for every module that only uses one (none stops or breaks it): its
    start is paid once. The modules that use it run one after the other (pytest_collection_modifyitems)
    and it is closed after their last test, not kept idle through the rest of the session."""
    state = tmp_path_factory.mktemp("auth") / "state"
    yield _auth_stack.enter_context(AuthStack.start(state, str(AUTH_QUEUES), *AUTH_OPTIONS))
    _auth_stack.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that use ``auth_stack`` move up, each whole and in its order, to where the first of them
    is: the shared stack then lives for their tests only."""
    shared = {item.path for item in items if "auth_stack" in getattr(item, "fixturenames", ())}
    if len(shared) > 1:
        first = next(i for i, item in enumerate(items) if item.path in shared)
        together = [item for item in items if item.path in shared]
        items[:] = items[:first] + together + [item for item in items[first:] if item.path not in shared]


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [item for item in session.items if "auth_stack" in getattr(item, "fixturenames", ())]
    _last_auth_user[:] = users[-1:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the item's own teardown first: its module's fixtures over the shared stack are gone by now
    if _last_auth_user and item is _last_auth_user[0]:
        _auth_stack.close()
