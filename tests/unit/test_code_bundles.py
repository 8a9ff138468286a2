"""Code bundles without Temporal: what gets packed, the caps, and how a bundle's modules find each other.

Every project here is a real folder packed by ``pack_code``, stored in a real local artifact store and
loaded by a real ``CodeLoader`` into this process, the way a worker loads it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine.artifacts import ArtifactStore, pack_code
from engine.artifacts.bundle import MAX_BUNDLE_FILES
from engine.artifacts.loader import BUNDLE_PREFIX, CodeLoader, CodeNotFoundError
from engine.core.definitions import TaskDefinition
from engine.core.wire import CodeRef
from engine.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

FLOW = """\
import importlib
import json
from pathlib import Path

import helpers
import lib.sub
import lib.sub as aliased
from helpers import VERSION as IMPORTED_VERSION
from lib import sub

from engine import task, workflow


@task
def report(n: int = 1) -> dict:
    import helpers as inner  # an import inside a function body resolves in the bundle too

    relative = importlib.import_module(".helpers", __package__)
    return {
        "n": n,
        "helpers": helpers.VERSION,
        "from_import": IMPORTED_VERSION,
        "inner": inner.VERSION,
        "relative": relative.VERSION,
        "lib_sub": lib.sub.describe(),
        "from_lib": sub.describe(),
        "aliased": aliased.describe(),
        "config": json.loads((Path(__file__).parent / "config.json").read_text()),
        "json_is_stdlib": helpers.json is json,
    }


@workflow
async def flow(n: int = 1) -> dict:
    return await report(n=n)
"""


def write_project(folder: Path, version: str) -> Path:
    """A multi-module project: a workflow file, a sibling module, a package with a relative import, a config."""
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    (folder / "flow.py").write_text(FLOW)
    # the folder name makes every test's bundle distinct (bundles are cached per process by content)
    (folder / "helpers.py").write_text(f"import json\n\nVERSION = {version!r}\nPROJECT = {str(folder)!r}\n")
    (folder / "lib" / "__init__.py").write_text("")
    (folder / "lib" / "consts.py").write_text(f"LIB_VERSION = 'lib-{version}'\n")
    (folder / "lib" / "sub.py").write_text(
        "import helpers\nfrom .consts import LIB_VERSION\n\n\n"
        "def describe() -> str:\n    return f'{LIB_VERSION}/{helpers.VERSION}'\n"
    )
    (folder / "config.json").write_text(f'{{"version": "{version}"}}')
    return folder / "flow.py"


def store_bundle(file: Path, store: ArtifactStore, qualname: str = "report") -> CodeRef:
    packed = pack_code(file)
    uri, sha = store.put_bytes(packed.data)
    return CodeRef(packed.module, qualname, uri, sha)


def names(file: Path) -> list[str]:
    return sorted(zipfile.ZipFile(io.BytesIO(pack_code(file).data)).namelist())


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    monkeypatch.setenv("GANGFLOW_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(str(tmp_path / "artifacts"))


# -- resolving a bundle's modules ---------------------------------------------------------------------
def test_two_versions_of_a_project_each_import_their_own_modules(tmp_path, store):
    path_before, modules_before = list(sys.path), set(sys.modules)
    refs = {}
    for version in ("v1", "v2"):  # the same project, edited between two runs
        refs[version] = store_bundle(write_project(tmp_path / "project", version), store)
        time.sleep(0.01)  # a new mtime, whatever the filesystem's timestamp granularity
    assert refs["v1"].bundle_sha != refs["v2"].bundle_sha
    loader = CodeLoader()
    for version in ("v2", "v1", "v2"):  # loading v2 first must not leak into v1, nor back
        defn = loader.load(refs[version])
        assert isinstance(defn, TaskDefinition)
        out = defn.fn(n=3)
        assert out == {
            "n": 3,
            "helpers": version,
            "from_import": version,
            "inner": version,
            "relative": version,
            "lib_sub": f"lib-{version}/{version}",
            "from_lib": f"lib-{version}/{version}",
            "aliased": f"lib-{version}/{version}",
            "config": {"version": version},
            "json_is_stdlib": True,
        }
        assert loader.ref_for(defn) == refs[version]  # a task call from the workflow points at the same bundle
    assert sys.path == path_before
    leaked = {m for m in set(sys.modules) - modules_before if not m.startswith(BUNDLE_PREFIX)}
    assert not leaked & {"flow", "helpers", "lib", "lib.sub", "lib.consts"}
    package = BUNDLE_PREFIX + refs["v1"].bundle_sha[:16]
    assert sys.modules[f"{package}.helpers"].VERSION == "v1"
    assert Path(sys.modules[f"{package}.lib.sub"].__file__).parent == loader.folder_for(refs["v1"]) / "lib"


def test_an_executable_file_stays_executable_and_the_zip_is_the_same_whatever_the_other_mode_bits(tmp_path, store):
    flow = write_project(tmp_path / "project", "v1")
    script = flow.parent / "run.sh"
    script.write_text("#!/bin/sh\necho ran $1\n")
    script.chmod(0o750)  # a rank's command: MPI(command=["./run.sh"])
    (flow.parent / "config.json").chmod(0o600)
    first = pack_code(flow).data
    script.chmod(0o700)
    (flow.parent / "config.json").chmod(0o644)
    os.utime(script)  # a new stat, so the bundle is packed again rather than reused
    assert pack_code(flow).data == first  # only "executable or not" is recorded
    folder = CodeLoader().folder_for(store_bundle(flow, store))
    assert folder is not None
    assert subprocess.run(["./run.sh", "x"], cwd=folder, capture_output=True, text=True).stdout == "ran x\n"
    assert not os.access(folder / "config.json", os.X_OK)


def test_concurrent_loads_from_threads_each_get_their_own_version(tmp_path, store):
    refs = [store_bundle(write_project(tmp_path / f"p{i}", f"v{i}"), store) for i in range(3)]
    loader = CodeLoader()
    barrier = threading.Barrier(9)

    def load(i: int) -> str:
        barrier.wait()  # every thread imports at the same moment
        defn = loader.load(refs[i % 3])
        assert isinstance(defn, TaskDefinition)
        return str(defn.fn()["lib_sub"])

    with ThreadPoolExecutor(9) as pool:
        got = list(pool.map(load, range(9)))
    assert got == [f"lib-v{i % 3}/v{i % 3}" for i in range(9)]


def test_a_bundle_module_named_like_stdlib_shadows_it_only_inside_the_bundle(tmp_path, store):
    project = tmp_path / "shadow"
    project.mkdir()
    (project / "colorsys.py").write_text(f"MARK = 'the bundle copy in {project}'\n")
    (project / "flow.py").write_text(
        "import colorsys\nfrom engine import task\n\n\n@task\ndef mark() -> str:\n    return colorsys.MARK\n"
    )
    defn = CodeLoader().load(store_bundle(project / "flow.py", store, "mark"))
    assert isinstance(defn, TaskDefinition) and defn.fn() == f"the bundle copy in {project}"
    import colorsys  # the standard library's, untouched

    assert not hasattr(colorsys, "MARK") and colorsys.__file__ and "shadow" not in colorsys.__file__


def test_gangflow_itself_always_comes_from_the_worker(tmp_path, store):
    project = tmp_path / "withcopy"
    (project / "engine").mkdir(parents=True)
    (project / "engine" / "__init__.py").write_text("raise RuntimeError('a stale copy of gangflow was imported')\n")
    (project / "flow.py").write_text("from engine import task\n\n\n@task\ndef one() -> int:\n    return 1\n")
    defn = CodeLoader().load(store_bundle(project / "flow.py", store, "one"))
    import engine

    assert isinstance(defn, TaskDefinition) and defn.fn() == 1
    assert sys.modules[defn.module].task is engine.task


def test_code_errors_name_the_problem(tmp_path, store):
    project = tmp_path / "broken"
    project.mkdir()
    (project / "flow.py").write_text("import helpers\n")
    (project / "helpers.py").write_text("import lib.missing\n")
    (project / "lib").mkdir()
    (project / "lib" / "__init__.py").write_text("")
    ref = store_bundle(project / "flow.py", store)
    with pytest.raises(CodeNotFoundError, match=r"cannot import 'flow': No module named .*lib\.missing"):
        CodeLoader().load(ref)
    tampered = CodeRef(ref.module, ref.qualname, ref.bundle, "0" * 64)
    with pytest.raises(CodeNotFoundError, match="does not match its sha256"):
        CodeLoader().load(tampered)


# -- what a bundle holds ------------------------------------------------------------------------------
def test_every_file_is_packed_except_hidden_venvs_dev_state_caches_builds_and_ignored(tmp_path):
    project = tmp_path / "full"
    files = {
        "flow.py": "",
        "config.json": "{}",
        "data/rows.csv": "a,b\n",
        "data/cache.tmp": "",
        "data/keep.ckpt": "",
        "lib/__init__.py": "",
        "lib/weights.ckpt": "",
        "lib/secret.txt": "nested, ignored by name",
        "scripts/train.py": "",
        "secret.txt": "",
        "logs/run.log": "",
        "notes/logs": "a file named like an ignored folder",
        "runs/a/outputs/x.bin": "",
        "outputs/top.bin": "",
        ".env": "TOKEN=x",
        ".git/config": "",
        ".hidden/x.py": "",
        "myenv/pyvenv.cfg": "",
        "myenv/lib/site.py": "",
        "venv/x.py": "",
        "__pycache__/flow.cpython-311.pyc": "",
        "lib/__pycache__/x.pyc": "",
        "stale.pyc": "",
        "build/out.py": "",
        "dist/pkg.whl": "",
        "pkg.egg-info/PKG-INFO": "",
        "node_modules/x.js": "",
        # gangflow dev --state-dir state inside the project: Temporal's database, logs, the artifact store
        "state/temporal.sqlite": "",
        "state/node-0.log": "",
        "state/artifacts/cas/ab/abcd": "",
    }
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / ".gangflowignore").write_text(
        "# gitignore-like\n\nsecret.txt\nlogs/\n/data/*.tmp\n*.ckpt\n!keep.ckpt\n**/outputs/*.bin\n"
    )
    os.mkfifo(project / "pipe")  # reading it would block forever
    os.symlink(project / "nowhere", project / "dangling")
    assert names(project / "flow.py") == [
        "config.json",
        "data/keep.ckpt",
        "data/rows.csv",
        "flow.py",
        "lib/__init__.py",
        "notes/logs",
        "scripts/train.py",
    ]


def test_a_package_bundle_holds_the_packages_data_files(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/flow.py", "pkg/sub/defaults.yaml", "other.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / ".gangflowignore").write_text("pkg/sub/*.yaml\n")  # at the bundle root, beside the package
    assert names(tmp_path / "pkg" / "sub" / "flow.py") == ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/flow.py"]
    (tmp_path / ".gangflowignore").unlink()
    assert "pkg/sub/defaults.yaml" in names(tmp_path / "pkg" / "sub" / "flow.py")


def test_an_unchanged_project_reuses_the_last_zip_and_an_edit_repacks(tmp_path):
    file = write_project(tmp_path / "reuse", "v1")
    first = pack_code(file)
    assert pack_code(file) is first
    time.sleep(0.01)
    (tmp_path / "reuse" / "config.json").write_text('{"version": "v2"}')
    assert pack_code(file).data != first.data


def test_an_oversized_bundle_is_refused_naming_the_biggest_files(tmp_path):
    file = write_project(tmp_path / "big", "v1")
    (tmp_path / "big" / "data").mkdir()
    with open(tmp_path / "big" / "data" / "huge.bin", "wb") as handle:
        handle.truncate(21 * 1024 * 1024)  # sparse: the cap counts sizes before anything is read
    with pytest.raises(InputError) as info:
        pack_code(file)
    message = str(info.value)
    assert "data/huge.bin (21.0 MB)" in message and "more than the 20 MB cap" in message
    assert str(tmp_path / "big" / ".gangflowignore") in message
    (tmp_path / "big" / ".gangflowignore").write_text("data/\n")
    assert "data/huge.bin" not in names(file)


def test_a_folder_with_too_many_files_fails_fast(tmp_path):
    file = write_project(tmp_path / "home", "v1")
    crowd = tmp_path / "home" / "photos"
    crowd.mkdir()
    for i in range(MAX_BUNDLE_FILES + 1):
        (crowd / f"{i}.jpg").touch()
    started = time.monotonic()
    with pytest.raises(InputError, match=rf"more than {MAX_BUNDLE_FILES} files .*\.gangflowignore"):
        pack_code(file)
    assert time.monotonic() - started < 10
    (tmp_path / "home" / ".gangflowignore").write_text("photos/\n")  # an ignored folder is not even walked
    assert "flow.py" in names(file)


def test_a_workflow_file_left_out_of_its_own_bundle_is_refused(tmp_path):
    file = write_project(tmp_path / "self", "v1")
    (tmp_path / "self" / ".gangflowignore").write_text("flow.py\n")
    with pytest.raises(InputError, match="left out of its own code bundle"):
        pack_code(file)


def test_cli_run_refuses_an_oversized_bundle_with_exit_2_before_connecting(tmp_path):
    write_project(tmp_path / "cli", "v1")
    with open(tmp_path / "cli" / "weights.bin", "wb") as handle:
        handle.truncate(25 * 1024 * 1024)
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", "flow.py:flow"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "cli",
        # nothing listens there: the refusal must come before any connection attempt
        env=dict(os.environ, GANGFLOW_ADDRESS="127.0.0.1:9", GANGFLOW_CACHE=str(tmp_path / "cache"), COLUMNS="10000"),
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    error = " ".join(done.stderr.split())
    assert "weights.bin (25.0 MB)" in error and ".gangflowignore" in error
    assert "Traceback" not in error


def test_two_projects_with_the_same_module_names_load_their_own_code(tmp_path: Path) -> None:
    """One process (a notebook, a test session) loads two projects, each with its own flows.py and tasks.py:
    the second load gets the second project's workflow and tasks, and its run ships the second project's
    code, not the first one's again."""
    code = (
        "import sys\n"
        "from engine.client import load_workflow_file, prepare_run\n"
        "from engine.core import definition_of\n"
        "loaded = []\n"
        "for folder in sys.argv[1:]:\n"
        "    wf = load_workflow_file(folder + '/flows.py:wf')\n"
        "    _, envelope = prepare_run(wf, {'n': 1}, artifacts=folder + '-artifacts')\n"
        "    add = definition_of(sys.modules['tasks'].add)\n"
        "    params = [p.name for p in add.interface.params]\n"
        "    print(sys.modules['tasks'].__file__, params, envelope.code.bundle_sha[:12])\n"
        "    loaded.append((folder, wf))\n"
        "# the first project's workflow, started after the second was loaded, still ships the first one's code\n"
        "folder, wf = loaded[0]\n"
        "print('again', prepare_run(wf, {'n': 1}, artifacts=folder + '-artifacts')[1].code.bundle_sha[:12])\n"
    )
    for name, params in (("a", "n: int"), ("b", "n: int, x: int = 5")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "flows.py").write_text(
            "from engine import workflow\nfrom tasks import add\n\n\n@workflow\nasync def wf(n: int) -> int:\n"
            "    return await add(n=n)\n"
        )
        tasks = f"from engine import task\n\n\n@task\ndef add({params}) -> int:\n    return 0\n"
        (folder / "tasks.py").write_text(tasks)
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, second, again = done.stdout.splitlines()
    assert first.startswith(f"{tmp_path / 'a' / 'tasks.py'} ['n'] ")
    assert second.startswith(f"{tmp_path / 'b' / 'tasks.py'} ['n', 'x'] ")
    shas = {first.split()[-1], second.split()[-1]}
    assert len(shas) == 2  # each run is pinned to its own project's bundle
    assert again == f"again {first.split()[-1]}"


def test_a_project_module_named_like_the_standard_librarys_does_not_displace_it(tmp_path: Path) -> None:
    (tmp_path / "logging.py").write_text("SHADOW = True\n")
    (tmp_path / "flows.py").write_text(
        "from engine import workflow\n\n\n@workflow\nasync def wf(n: int) -> int:\n    return n\n"
    )
    code = (
        "import logging, sys\n"
        "from engine.client import load_workflow_file\n"
        f"load_workflow_file({str(tmp_path / 'flows.py')!r} + ':wf')\n"
        "print(sys.modules['logging'].__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and str(tmp_path) not in done.stdout, (done.stdout, done.stderr)
