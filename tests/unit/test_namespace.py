"""A rank's mount namespace (engine.executor.namespace): what is covered, what is bound back and which device nodes
its private /dev holds; and, as root, a real namespace: an unprivileged process reaches exactly its own paths and
sees its own "GPU" only (character devices with /dev/null's number stand in for GPUs)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.executor.namespace import DEV_NODES, Bind, MountPlan, blocked_folders, plan_mounts, supported
from engine.executor.sandbox import enter, gang_user


@pytest.fixture
def tree() -> Iterator[Path]:
    """/tmp/x (0755) / home (0700, like /root) / {python, cache (stores, nodes/<attempt>), secret}."""
    top = Path(tempfile.mkdtemp(prefix="gangflow-ns-"))
    os.chmod(top, 0o755)
    home = top / "home"
    for sub in ("python/lib", "cache/stores/k1", "cache/stores/k2", "cache/nodes/n0/attempt", "secret"):
        (home / sub).mkdir(parents=True)
    (home / "python" / "lib" / "os.py").write_text("stdlib")
    (home / "cache" / "stores" / "k1" / "input").write_text("mine")
    (home / "cache" / "stores" / "k2" / "input").write_text("another tenant's")
    (home / "secret" / "token").write_text("the agent's token")
    for path in [home, *home.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    os.chmod(home, 0o700)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_the_topmost_folder_others_cannot_pass_is_covered(tree: Path) -> None:
    home = tree / "home"
    os.chmod(home / "cache", 0o700)  # inside a covered folder: covering the outer one hides it already
    assert blocked_folders([home / "python" / "lib", home / "cache" / "nodes"]) == [str(home)]
    assert blocked_folders([tree, "/usr/lib"]) == []  # a path itself is not checked, only the way to it


def test_only_the_needed_paths_below_a_cover_are_bound_back_read_only_or_writable(tree: Path) -> None:
    home = tree / "home"
    plan = plan_mounts([home / "python", home / "cache" / "stores" / "k1", "/usr"], [home / "cache" / "nodes"])
    assert plan.covers == (str(home),)
    assert plan.binds == (
        Bind(str(home / "python"), False),
        Bind(str(home / "cache" / "nodes"), True),
        Bind(str(home / "cache" / "stores" / "k1"), False),
    )  # /usr is reachable as it is: not bound; k2 and secret: not there at all
    assert not plan.private_dev and plan.dev_paths == ()
    assert MountPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan  # what a standby is sent


def test_a_hidden_folder_is_covered_even_where_others_may_pass_it(tree: Path) -> None:
    cache = tree / "open-cache"
    (cache / "stores" / "k1").mkdir(parents=True)
    (cache / "stores" / "k2").mkdir(parents=True)
    os.chmod(cache, 0o755)
    plan = plan_mounts([cache / "stores" / "k1"], [], hide=[cache])
    assert plan.covers == (str(cache),) and plan.binds == (Bind(str(cache / "stores" / "k1"), False),)


def test_the_private_dev_holds_the_standard_nodes_and_the_gangs_own_gpus_only() -> None:
    plan = plan_mounts([], [], ["/dev/null-as-gpu0-absent"])  # an absent node is skipped
    assert plan.private_dev
    assert set(plan.dev_paths) >= {p for p in DEV_NODES if os.path.exists(p)}
    assert "/dev/null-as-gpu0-absent" not in plan.dev_paths
    assert plan_mounts([], [], None).private_dev is False  # None: the node's /dev as it is


@pytest.fixture
def fake_gpus() -> Iterator[list[str]]:
    """Two "GPUs" in the real /dev, character devices with /dev/null's number (harmless to open)."""
    null = os.stat("/dev/null").st_rdev
    paths = [f"/dev/gangflow-test-gpu{i}-{os.getpid()}" for i in range(2)]
    for path in paths:
        os.mknod(path, 0o666 | stat.S_IFCHR, null)
        os.chmod(path, 0o666)
    yield paths
    for path in paths:
        Path(path).unlink(missing_ok=True)


PROBE = """
import json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            seen[path] = "read:" + handle.read(20).decode(errors="replace")
    except OSError as exc:
        seen[path] = f"errno:{exc.errno}"
try:
    open(sys.argv[1] + ".planted", "w")
    seen["planted"] = "yes"
except OSError as exc:
    seen["planted"] = f"errno:{exc.errno}"
print(json.dumps({"uid": os.getuid(), "seen": seen, "dev": sorted(os.listdir("/dev"))}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not supported(), reason="a mount namespace needs root (CAP_SYS_ADMIN)")
def test_in_its_namespace_an_unprivileged_rank_reaches_its_paths_and_its_own_gpu_only(
    tree: Path, fake_gpus: list[str]
) -> None:
    home = tree / "home"
    workdir = home / "cache" / "nodes" / "n0" / "attempt"
    user = gang_user("team-a", "gang-1")
    os.chown(workdir, user.uid, user.gid)
    os.chmod(workdir, 0o700)
    (workdir / "spec").write_text("my spec")
    os.chown(workdir / "spec", user.uid, user.gid)
    python = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    plan = plan_mounts([*python, home / "cache" / "stores" / "k1"], [workdir], [fake_gpus[0]], hide=[])
    targets = [
        str(home / "cache" / "stores" / "k1" / "input"),
        str(workdir / "spec"),
        str(home / "cache" / "stores" / "k2" / "input"),
        str(home / "secret" / "token"),
        *fake_gpus,
    ]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *targets],
        preexec_fn=lambda: enter([], user, None, plan),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["uid"] == user.uid
    seen = got["seen"]
    assert seen[targets[0]] == "read:mine" and seen[targets[1]] == "read:my spec"
    assert seen[targets[2]] == "errno:2" and seen[targets[3]] == "errno:2"  # not there at all
    assert seen["planted"] == "errno:30"  # the cache is read-only to it (EROFS)
    assert seen[fake_gpus[0]] == "read:" and seen[fake_gpus[1]] == "errno:2"  # its own GPU only
    assert os.path.basename(fake_gpus[1]) not in got["dev"] and "null" in got["dev"]
    assert os.path.exists(fake_gpus[1])  # the node's own /dev is untouched


def test_a_private_tmp_binds_back_the_paths_below_tmp_and_covers_nothing_there(tree: Path) -> None:
    home = tree / "home"  # below /tmp, behind a folder others cannot pass
    workdir = home / "cache" / "nodes" / "n0" / "attempt"
    (workdir / "tmp").mkdir()
    plan = plan_mounts([home / "python"], [workdir], None, hide=[home / "cache"], tmp=workdir / "tmp")
    assert plan.tmp == str(workdir / "tmp") and plan.covers == ()  # the whole of /tmp is replaced
    assert plan.binds == (Bind(str(home / "python"), False), Bind(str(workdir), True))
    assert MountPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert plan_mounts([home / "python"], [workdir]).tmp is None  # without: the node's /tmp


TMP_PROBE = """
import json, os, sys
seen = {"listing": sorted(os.listdir("/tmp"))}
with open("/tmp/x", "w") as handle:
    handle.write("the rank's")
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            seen[path] = "read:" + handle.read(20).decode(errors="replace")
    except OSError as exc:
        seen[path] = f"errno:{exc.errno}"
print(json.dumps(seen))
"""


def _tmp_gang(tree: Path) -> tuple[Path, MountPlan, Any]:
    from engine.executor.namespace import scaffold

    home = tree / "home"
    workdir = home / "cache" / "nodes" / "n0" / "attempt"
    user = gang_user("team-a", "gang-tmp")
    (workdir / "tmp").mkdir()
    for path in (workdir, workdir / "tmp"):
        os.chown(path, user.uid, user.gid)
        os.chmod(path, 0o700)
    python = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    plan = plan_mounts([*python, home / "cache" / "stores" / "k1"], [workdir], None, tmp=workdir / "tmp")
    scaffold(plan)
    return workdir, plan, user


@pytest.mark.skipif(os.geteuid() != 0 or not supported(), reason="a mount namespace needs root (CAP_SYS_ADMIN)")
def test_a_ranks_tmp_is_its_working_folders_tmp_and_the_nodes_tmp_is_not_there(tree: Path) -> None:
    workdir, plan, user = _tmp_gang(tree)
    host = Path(tempfile.mkdtemp(prefix="gangflow-host-tmp-"))  # the node's /tmp, open to all
    os.chmod(host, 0o755)
    (host / "note").write_text("the node's")
    os.chmod(host / "note", 0o644)
    mine = str(tree / "home" / "cache" / "stores" / "k1" / "input")
    try:
        done = subprocess.run(
            [sys.executable, "-c", TMP_PROBE, str(host / "note"), mine],
            preexec_fn=lambda: enter([], user, None, plan),
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen[str(host / "note")] == "errno:2" and host.name not in seen["listing"]  # not there at all
        assert seen[mine] == "read:mine"  # its own paths below /tmp are bound back
        assert (workdir / "tmp" / "x").read_text() == "the rank's"  # on disk, in its working folder
        assert not Path("/tmp/x").is_file() or Path("/tmp/x").read_text() != "the rank's"
    finally:
        shutil.rmtree(host, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not supported(), reason="a mount namespace needs root (CAP_SYS_ADMIN)")
def test_a_symlink_planted_in_the_scaffold_stops_the_rank_and_creates_nothing_where_it_points(tree: Path) -> None:
    workdir, plan, user = _tmp_gang(tree)
    elsewhere = tree / "elsewhere"  # where a rank of the gang would have root create its folders
    elsewhere.mkdir()
    top = workdir / "tmp" / os.path.relpath(tree, "/tmp").split("/")[0]
    shutil.rmtree(top)  # the gang owns <workdir>/tmp: it may rearrange it between two of its processes' starts
    top.symlink_to(elsewhere)
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):  # the spawn fails: its own gang's loss
        subprocess.run(
            [sys.executable, "-c", "print('started')"],
            preexec_fn=lambda: enter([], user, None, plan),
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
    assert list(elsewhere.iterdir()) == []  # nothing was created (or mounted) through the symlink


CWD_PROBE = """
import json, os
said = {}
try:
    open("planted", "w")
    said["cwd"] = "written"
except OSError as exc:
    said["cwd"] = f"errno:{exc.errno}"
said["sibling"] = os.path.exists("../k2/input")
print(json.dumps(said))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not supported(), reason="a mount namespace needs root (CAP_SYS_ADMIN)")
def test_a_rank_started_in_its_code_folder_works_in_the_read_only_bind_not_the_nodes_folder(tree: Path) -> None:
    """subprocess changes a child's directory before the preexec hook makes its namespace: the rank must end up
    in the bind (read-only: EROFS), not in the node's folder below it, from which ``..`` showed the hidden rest."""
    home = tree / "home"
    code = home / "cache" / "stores" / "k1"
    user = gang_user("team-a", "gang-cwd")
    python = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    plan = plan_mounts([*python, code], [], None, hide=[home / "cache"])
    done = subprocess.run(
        [sys.executable, "-c", CWD_PROBE],
        cwd=code,
        preexec_fn=lambda: enter([], user, None, plan),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["cwd"] == "errno:30", said  # EROFS: the bind, not the node's own folder (EACCES)
    assert said["sibling"] is False, said  # k2, another store's copy, is not there
