"""The sandbox's pieces without a node agent: cgroup files written (v1 and v2, on a fake root), the gang's user,
the device rules, memory kills told apart, and the failure a memory kill turns into."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from engine.executor.cgroups import (
    CgroupV1,
    CgroupV2,
    DeviceRule,
    DeviceRules,
    Limits,
    device_rules,
    gpu_devices,
    weigh_node,
)
from engine.executor.launcher import RankFailure
from engine.executor.sandbox import (
    PIDS_PER_PROCESS,
    UID_BASE,
    UID_SPAN,
    GangSandbox,
    gang_user,
    memory_text,
    unreachable,
)


def _fake_v1(root: Path) -> CgroupV1:
    for controller in ("memory", "cpu", "pids", "devices"):
        (root / controller).mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")
    return CgroupV1(root)


def _read(path: Path) -> str:
    return path.read_text().strip()


def test_v1_writes_each_controller(tmp_path: Path) -> None:
    driver = _fake_v1(tmp_path)
    rules = DeviceRules((DeviceRule("c", 195, 0, allow=True), DeviceRule("c", 195, 1, allow=False)))
    driver.create("gangflow/n0/g.a1.n0", Limits(mem=2 << 30, cpus=1.5, pids=2048, devices=rules))
    top = "gangflow/n0/g.a1.n0"
    assert _read(tmp_path / "memory" / top / "memory.limit_in_bytes") == str(2 << 30)
    assert _read(tmp_path / "cpu" / top / "cpu.cfs_period_us") == "100000"
    assert _read(tmp_path / "cpu" / top / "cpu.cfs_quota_us") == "150000"
    assert _read(tmp_path / "cpu" / top / "cpu.shares") == "1536"
    assert _read(tmp_path / "pids" / top / "pids.max") == "2048"
    assert _read(tmp_path / "devices" / top / "devices.deny") == "c 195:1 rwm"  # only the other GPU
    assert not (tmp_path / "devices" / top / "devices.allow").exists()
    assert driver.procs_files(top) == [
        tmp_path / c / top / "cgroup.procs" for c in ("memory", "cpu", "pids", "devices")
    ]


def test_v1_swap_is_limited_too_and_missing_controllers_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "cgroup.procs").write_text("")
    driver = CgroupV1(tmp_path)
    (tmp_path / "memory" / "g").mkdir()
    (tmp_path / "memory" / "g" / "memory.memsw.limit_in_bytes").write_text("")
    driver.create("g", Limits(mem=1000, cpus=1, pids=10))
    assert _read(tmp_path / "memory" / "g" / "memory.memsw.limit_in_bytes") == "1000"
    assert not (tmp_path / "cpu").exists()
    assert driver.dirs("g") == [tmp_path / "memory" / "g"]


def test_v1_oom_kill_counter(tmp_path: Path) -> None:
    driver = _fake_v1(tmp_path)
    driver.create("g/p0", Limits(mem=1 << 20))
    assert driver.oom_kills("g/p0") == 0
    (tmp_path / "memory" / "g" / "p0" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
    )
    assert driver.oom_kills("g/p0") == 1
    assert driver.oom_kills("absent") == 0


def test_v2_writes_the_unified_files(tmp_path: Path) -> None:
    driver = CgroupV2(tmp_path)
    rules = device_rules([], [])
    driver.create("gangflow/n0/g", Limits(mem=512 << 20, cpus=2, pids=4096, devices=rules))
    top = tmp_path / "gangflow" / "n0" / "g"
    assert _read(top / "memory.max") == str(512 << 20)
    assert _read(top / "memory.swap.max") == "0"
    assert _read(top / "cpu.max") == "200000 100000"
    assert _read(top / "cpu.weight") == "200"
    assert _read(top / "pids.max") == "4096"
    for parent in (tmp_path, tmp_path / "gangflow", tmp_path / "gangflow" / "n0"):  # controllers handed down
        assert _read(parent / "cgroup.subtree_control") == "+memory +cpu +pids"
    assert driver.procs_files("gangflow/n0/g") == [top / "cgroup.procs"]
    (top / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert driver.oom_kills("gangflow/n0/g") == 2


def test_v2_device_rules_are_the_program_to_attach(tmp_path: Path) -> None:
    driver = CgroupV2(tmp_path)
    rules = DeviceRules((DeviceRule("c", 195, 0), DeviceRule("c", 195, 1, allow=False)))
    driver.create("g", Limits(devices=rules))
    assert driver.pending_devices == {"g": rules}
    assert not any(p.name.startswith("devices") for p in (tmp_path / "g").iterdir())


def test_remove_takes_children_first(tmp_path: Path) -> None:
    driver = CgroupV2(tmp_path)
    driver.create("gangflow/n0/g/p0", Limits())
    driver.create("gangflow/n0/g/p1", Limits())
    # a fake root's folders hold the files we wrote; a real cgroupfs has only kernel files, which rmdir ignores
    for path in (tmp_path / "gangflow").rglob("*"):
        if path.is_file():
            path.unlink()
    assert driver.children("gangflow/n0") == ["gangflow/n0/g"]
    assert driver.remove("gangflow/n0/g", timeout=0.5)
    assert not (tmp_path / "gangflow" / "n0" / "g").exists()
    assert (tmp_path / "gangflow" / "n0").exists()


def test_gang_user_is_stable_short_and_in_range() -> None:
    tenant = "t" * 60
    user = gang_user(tenant, "gang-1")
    assert user == gang_user(tenant, "gang-1")  # every node and attempt: the same user
    assert user.name.startswith("gf-") and len(user.name) <= 32
    assert UID_BASE <= user.uid < UID_BASE + UID_SPAN and user.gid == user.uid
    assert gang_user(tenant, "gang-2").uid != user.uid  # per gang
    assert gang_user("other", "gang-1").uid != user.uid  # and per tenant


def _char_device(tmp_path: Path, name: str, major: int, minor: int) -> str:
    path = tmp_path / name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod needs root")
    return str(path)


def test_device_rules_deny_only_other_gpus(tmp_path: Path) -> None:
    devices = [_char_device(tmp_path, f"nvidia{i}", 195, i) for i in range(3)]
    rules = device_rules([*devices, str(tmp_path / "absent")], own=[1])
    assert [r.line() for r in rules.denied] == ["c 195:0 rwm", "c 195:2 rwm"]
    assert rules.allows("c", 195, 1) and not rules.allows("c", 195, 0) and not rules.allows("c", 195, 2, "r")
    assert rules.allows("c", 195, 255)  # nvidiactl and nvidia-uvm are no slot's: allowed
    assert rules.allows("c", 1, 3)  # /dev/null


def test_gpu_devices_default_and_override() -> None:
    assert gpu_devices(2, {}) == ["/dev/nvidia0", "/dev/nvidia1"]
    assert gpu_devices(1, {"GANGFLOW_GPU_DEVICES": "/dev/fuse, /dev/kvm"}) == ["/dev/fuse"]


def test_memory_text() -> None:
    assert memory_text(2 << 30) == "2Gi"
    assert memory_text(512 << 20) == "512Mi"
    assert memory_text(3 << 29) == "1.5Gi"
    assert memory_text(100) == "100"


def test_unreachable_names_the_closed_folder() -> None:
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # not pytest's tmp_path: its parent is 0700
    try:
        closed = top / "closed"
        (closed / "inner").mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(closed, 0o700)
        assert unreachable([closed / "inner"]) == str(closed)
        os.chmod(closed, 0o711)  # passable without being listable is enough
        assert unreachable([closed / "inner", top]) is None
    finally:
        shutil.rmtree(top)


def test_sandbox_environment_and_leaves(tmp_path: Path) -> None:
    driver = CgroupV2(tmp_path / "cg")
    (tmp_path / "cg").mkdir()
    sandbox = GangSandbox(driver, "gangflow/n/g", gang_user("t", "g"), 1 << 30, 2.0, 2, DeviceRules(()))
    sandbox.create()
    # the gang: both ranks and one rank's worth for a coordinator or launcher
    assert _read(tmp_path / "cg" / "gangflow/n/g" / "memory.max") == str(3 << 30)
    assert _read(tmp_path / "cg" / "gangflow/n/g" / "pids.max") == str(4 * PIDS_PER_PROCESS)
    assert sandbox.prepare(0, rank=True) == [str(tmp_path / "cg" / "gangflow/n/g/p0" / "cgroup.procs")]
    assert _read(tmp_path / "cg" / "gangflow/n/g/p0" / "memory.max") == str(1 << 30)  # a rank: its own request
    sandbox.prepare(1, rank=False)
    assert not (tmp_path / "cg" / "gangflow/n/g/p1" / "memory.max").exists()  # a launcher: the gang's limit
    env = sandbox.environment(tmp_path / "w")
    assert env["TMPDIR"] == str(tmp_path / "w" / "tmp") and env["USER"] == env["LOGNAME"] == sandbox.user.name  # type: ignore[union-attr]
    assert not sandbox.oom_killed(0)
    (tmp_path / "cg" / "gangflow/n/g/p0" / "memory.events").write_text("oom_kill 1\n")
    assert sandbox.oom_killed(0) and not sandbox.oom_killed(5)


def test_a_memory_kill_is_a_user_error_naming_the_limit() -> None:
    failure = RankFailure(1, 1, "n0", -9, None, "", memory_limit=2 << 30)
    assert failure.kind == "user" and failure.priority == 0
    assert failure.describe().startswith("rank 1 (node n0, local rank 1) exceeded its memory request of 2Gi")
    assert RankFailure(1, 1, "n0", -9, None, "").kind == "killed"  # any other SIGKILL stays a kill


def test_an_agent_that_is_not_root_keeps_its_ranks_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from engine.runtime.node import _sandbox_driver

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level("WARNING", logger="gangflow.node"):
        assert _sandbox_driver("laptop") is None
    assert "node laptop: ranks are NOT sandboxed (the node agent is not running as root)" in caplog.text


def test_gangflow_cluster_shows_which_nodes_sandbox(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli.render_queues import show_queue
    from engine.scheduling import NodeRegistered, NodeSpec, Policy, load_queue_config

    monkeypatch.setenv("COLUMNS", "250")
    assert NodeSpec(node_id="n", address="a", gpus=0, cpus=1).sandboxed is False  # older agents: not sandboxed
    policy = Policy(load_queue_config("tenants: [{name: default}]\n"), node_ttl_s=1e12)
    for node_id, sandboxed in (("root-node", True), ("laptop", False)):
        spec = NodeSpec(node_id=node_id, address="a", gpus=1, cpus=1, sandboxed=sandboxed)
        policy.step(NodeRegistered(spec=spec), 0.0)
    view = policy.describe()
    assert {n["node_id"]: n["sandboxed"] for n in view["nodes"]} == {"root-node": True, "laptop": False}
    show_queue(view, now=0.0)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "sandbox" in lines["node"]
    assert " yes " in lines["root-node"] and " no " in lines["laptop"]


def test_a_nodes_cgroup_weighs_its_cpus_and_the_machines_the_sum_of_its_nodes(tmp_path: Path) -> None:
    # with the default share (one process's) above the gangs, every rank of the machine together would get one
    # busy process's CPU against the processes outside gangflow (a restarted gang started many times slower)
    driver = _fake_v1(tmp_path)
    weigh_node(driver, "gangflow/n0", 4, machine_cpus=64)
    assert _read(tmp_path / "cpu" / "gangflow" / "n0" / "cpu.shares") == "4096"
    assert _read(tmp_path / "cpu" / "gangflow" / "cpu.shares") == "4096"
    weigh_node(driver, "gangflow/n1", 0.5, machine_cpus=64)  # a second agent on the machine adds itself
    assert _read(tmp_path / "cpu" / "gangflow" / "n1" / "cpu.shares") == "512"
    assert _read(tmp_path / "cpu" / "gangflow" / "cpu.shares") == "4608"
    assert not (tmp_path / "cpu" / "gangflow" / "n0" / "cpu.cfs_quota_us").exists()  # a share, no quota
    assert driver.weighed("gangflow/absent") == 1.0
    weigh_node(driver, "gangflow/n2", 1e6)  # v1's largest share
    assert _read(tmp_path / "cpu" / "gangflow" / "n2" / "cpu.shares") == "262144"


def test_the_machines_gangflow_cgroup_weighs_at_most_its_cores(tmp_path: Path) -> None:
    # node cgroups of agents long gone stay counted: without the cap, forty agents that ran on a 2-core machine
    # made its sandboxed ranks weigh as 130 busy processes against everything else on it
    driver = _fake_v1(tmp_path)
    for i in range(40):
        weigh_node(driver, f"gangflow/n{i}", 4, machine_cpus=2)
    assert _read(tmp_path / "cpu" / "gangflow" / "cpu.shares") == "2048"
    assert _read(tmp_path / "cpu" / "gangflow" / "n39" / "cpu.shares") == "4096"  # among its siblings: as offered


def test_v2_weighs_a_node_with_cpu_weight(tmp_path: Path) -> None:
    driver = CgroupV2(tmp_path)
    weigh_node(driver, "gangflow/n0", 2, machine_cpus=64)
    weigh_node(driver, "gangflow/n1", 3, machine_cpus=64)
    assert _read(tmp_path / "gangflow" / "n0" / "cpu.weight") == "200"
    assert _read(tmp_path / "gangflow" / "cpu.weight") == "500"
    assert _read(tmp_path / "cgroup.subtree_control") == "+memory +cpu +pids"


def test_a_ranks_outbox_is_published_only_where_each_file_has_the_sha256_it_is_named_by(tmp_path: Path) -> None:
    import hashlib

    from engine.artifacts.store import ArtifactStore

    store = ArtifactStore(str(tmp_path / "store"))
    outbox = tmp_path / "outbox"
    rank = ArtifactStore(str(tmp_path / "store"))
    rank.outbox = outbox  # what a sandboxed rank's uploads do: nothing reaches the store itself
    uri, sha = rank.put_bytes(b"rank 0's output")
    assert uri == store.object_uri(sha) and not Path(uri).exists() and (outbox / sha).read_bytes() == b"rank 0's output"
    forged = hashlib.sha256(b"something else").hexdigest()
    (outbox / forged).write_bytes(b"not what its name says")
    (tmp_path / "secret").write_bytes(b"the agent's own file")
    (outbox / hashlib.sha256(b"the agent's own file").hexdigest()).symlink_to(tmp_path / "secret")
    assert store.publish_outbox(outbox) == 1
    assert Path(uri).read_bytes() == b"rank 0's output"
    assert not Path(store.object_uri(forged)).exists()
    assert not Path(store.object_uri(hashlib.sha256(b"the agent's own file").hexdigest())).exists()
