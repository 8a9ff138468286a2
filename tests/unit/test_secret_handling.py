"""Secrets without a server: what a declaration accepts, how a value is resolved for a tenant, what the
redactor hides, the files a task's process gets, and ``gangflow secret``'s bad input."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import gangflow_main

from engine import DefinitionError, Secret, secret, task
from engine.core.definitions import definition_of
from engine.core.secrets import MOUNTS_ENV, VALUES_ENV, SecretError, SecretNotFoundError
from engine.runtime.secrets import (
    SECRETS_DIR_ENV,
    Redactor,
    configure,
    env_name,
    materialize,
    resolve,
    task_environment,
)

ROOT = Path(__file__).resolve().parents[2]


# -- declaration ---------------------------------------------------------------------------------
def test_a_task_declares_names_only():
    @task(secrets=[Secret("hf-token", env="HF_TOKEN"), Secret("db.pass_1", mount="db-pass")])
    def train() -> int:
        return 1

    defn = definition_of(train)
    assert defn is not None and defn.secrets == (
        Secret("hf-token", env="HF_TOKEN"),
        Secret("db.pass_1", mount="db-pass"),
    )
    assert train() == 1  # still a plain function outside a run


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Secret("HF"), "lower-case"),
        (lambda: Secret("-token"), "lower-case"),
        (lambda: Secret("a/b"), "lower-case"),
        (lambda: Secret("x" * 254), "at most 253"),
        (lambda: Secret("tok", env="1ABC"), "environment variable name"),
        (lambda: Secret("tok", env="GANGFLOW_TOKEN"), "GANGFLOW_"),
        (lambda: Secret("tok", env="A-B"), "environment variable name"),
        (lambda: Secret("tok", mount="a/b"), "without '/'"),
        (lambda: Secret("tok", mount=".."), "without '/'"),
        (lambda: Secret("tok", mount="/etc/../x"), "without '..'"),
        (lambda: Secret("tok", mount="/"), "absolute path"),
        (lambda: Secret("tok", mount=""), "file name"),
    ],
)
def test_bad_secret_declarations_are_refused(make, message):
    with pytest.raises(DefinitionError, match=message):
        make()


@pytest.mark.parametrize(
    ("secrets", "message"),
    [
        ([Secret("a"), Secret("a", env="A")], "two secrets declare name 'a'"),
        ([Secret("a", env="X"), Secret("b", env="X")], "two secrets declare env 'X'"),
        ([Secret("a", mount="f"), Secret("b", mount="f")], "two secrets declare mount 'f'"),
        (["hf-token"], "list of Secret"),
        (Secret("a"), "list of Secret"),
        ("hf-token", "list of Secret"),
    ],
)
def test_bad_secret_lists_are_refused_at_decoration(secrets, message):
    with pytest.raises(DefinitionError, match=message):

        @task(secrets=secrets)
        def t() -> None: ...


def test_a_lightweight_task_cannot_have_secrets():
    with pytest.raises(DefinitionError, match="lightweight"):

        @task(lightweight=True, secrets=[Secret("a")])
        def t() -> None: ...


def test_engine_secret_outside_a_task_with_secrets_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv(VALUES_ENV, raising=False)
    with pytest.raises(SecretError, match="declares no secrets"):
        secret("hf-token")
    (tmp_path / "hf-token").write_text("v4lue")
    monkeypatch.setenv(VALUES_ENV, str(tmp_path))
    assert secret("hf-token") == "v4lue"
    with pytest.raises(SecretError, match=r"'other' is not declared .*declares: hf-token"):
        secret("other")
    with pytest.raises(SecretError, match="not declared"):
        secret("../hf-token")


# -- resolution ------------------------------------------------------------------------------------
def _store(root: Path, tenant: str, name: str, value: str) -> None:
    (root / tenant).mkdir(parents=True, exist_ok=True)
    (root / tenant / name).write_text(value)


def test_resolve_reads_the_tenants_file_without_its_trailing_newline(tmp_path):
    _store(tmp_path, "team-a", "hf-token", "abc-123\n")
    _store(tmp_path, "team-a", "pem", "line one\nline two\n")
    values = resolve([Secret("hf-token"), Secret("pem")], "team-a", tmp_path)
    assert values == {"hf-token": "abc-123", "pem": "line one\nline two"}


def test_another_tenants_secret_is_not_found_and_not_named(tmp_path):
    _store(tmp_path, "team-b", "hf-token", "b-secret-value")
    with pytest.raises(SecretNotFoundError) as caught:
        resolve([Secret("hf-token")], "team-a", tmp_path)
    message = str(caught.value)
    assert "'hf-token'" in message and "'team-a'" in message
    assert "team-b" not in message and "b-secret-value" not in message
    assert caught.value.kind == "SecretNotFound"


def test_resolve_refuses_links_out_of_the_tenants_folder_and_bad_tenants(tmp_path):
    _store(tmp_path, "team-b", "hf-token", "b-secret-value")
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "hf-token").symlink_to(tmp_path / "team-b" / "hf-token")
    with pytest.raises(SecretNotFoundError, match="not set"):
        resolve([Secret("hf-token")], "team-a", tmp_path)
    for tenant in ("..", "team-b/../team-b", ""):
        with pytest.raises(SecretNotFoundError, match="not a tenant name"):
            resolve([Secret("hf-token")], tenant, tmp_path)


def test_resolve_follows_a_kubernetes_secret_volumes_links(tmp_path):
    # kubelet's layout: key -> ..data/key, ..data -> ..2024_01_01 (all inside the mount)
    mount = tmp_path / "team-a"
    (mount / "..2024_01_01").mkdir(parents=True)
    (mount / "..2024_01_01" / "hf-token").write_text("k8s-value")
    (mount / "..data").symlink_to("..2024_01_01")
    (mount / "hf-token").symlink_to("..data/hf-token")
    assert resolve([Secret("hf-token")], "team-a", tmp_path) == {"hf-token": "k8s-value"}


def test_resolve_without_a_secrets_dir_or_with_an_empty_value(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRETS_DIR_ENV, raising=False)
    with pytest.raises(SecretNotFoundError, match="no secrets directory"):
        resolve([Secret("hf-token")], "team-a")
    _store(tmp_path, "team-a", "hf-token", "\n")
    with pytest.raises(SecretNotFoundError, match="empty"):
        resolve([Secret("hf-token")], "team-a", tmp_path)
    assert resolve([], "team-a") == {}  # nothing declared: nothing to resolve, anywhere


def test_a_tenants_worker_also_reads_its_tenants_secrets_from_its_environment(tmp_path, monkeypatch):
    """``GANGFLOW_SECRET_HF_TOKEN`` on the worker of team-a (``gangflow worker --tenant team-a``): team-a's,
    never another tenant's, and never read by a process that serves no single tenant (a node agent)."""
    monkeypatch.setenv(env_name("hf-token"), "from-the-env")
    assert env_name("hf.token") == env_name("hf-token") == "GANGFLOW_SECRET_HF_TOKEN"
    try:
        configure(None, "team-a")
        assert resolve([Secret("hf-token")], "team-a", tmp_path) == {"hf-token": "from-the-env"}
        with pytest.raises(SecretNotFoundError):
            resolve([Secret("hf-token")], "team-b", tmp_path)
        configure(None)
        with pytest.raises(SecretNotFoundError):
            resolve([Secret("hf-token")], "team-a", tmp_path)
    finally:
        configure(None)
    # and a task's own process never inherits the worker's secret variables
    assert task_environment({"PATH": "/bin", env_name("hf-token"): "x"}, {}) == {"PATH": "/bin"}


# -- redaction --------------------------------------------------------------------------------------
def test_the_redactor_replaces_every_value_of_four_characters_or_more():
    redact = Redactor({"hf-token": "s3cr3t-value", "short": "abc", "outer": "xx-s3cr3t-value-yy", "pem": "AAAA\nBBBB"})
    text = "token=s3cr3t-value again s3cr3t-value; xx-s3cr3t-value-yy; abc stays; AAAA then BBBB"
    assert redact(text) == (
        "token=[secret:hf-token] again [secret:hf-token]; [secret:outer]; abc stays; [secret:pem] then [secret:pem]"
    )
    assert not Redactor({"short": "abc"}) and Redactor({"hf-token": "abcd"})


# -- a task process's files and environment --------------------------------------------------------
def test_materialize_writes_private_files_and_removes_them(tmp_path):
    absolute = tmp_path / "abs-token"
    declared = [Secret("hf-token", env="HF_TOKEN", mount="token.txt"), Secret("db", mount=str(absolute))]
    with materialize(declared, {"hf-token": "v1-value", "db": "v2-value"}) as env:
        assert env["HF_TOKEN"] == "v1-value"
        values, mounts = Path(env[VALUES_ENV]), Path(env[MOUNTS_ENV])
        assert (values / "hf-token").read_text() == "v1-value" and (values / "db").read_text() == "v2-value"
        assert (mounts / "token.txt").read_text() == "v1-value" and absolute.read_text() == "v2-value"
        for path in (values / "hf-token", mounts / "token.txt", absolute):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(values.parent.stat().st_mode) == 0o700
        assert "v1-value" not in os.environ.values()  # never this process's environment
    assert not values.parent.exists() and not absolute.exists()


def test_an_absolute_mount_that_exists_is_refused(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("someone else's")
    with (
        pytest.raises(SecretError, match="cannot create its mount"),
        materialize([Secret("a", mount=str(taken))], {"a": "mine-value"}),
    ):
        pass
    assert taken.read_text() == "someone else's"


def test_a_task_environment_drops_where_secrets_come_from():
    env = task_environment({"PATH": "/bin", SECRETS_DIR_ENV: "/srv/secrets", VALUES_ENV: "/tmp/x"}, {"HF": "v"})
    assert env == {"PATH": "/bin", "HF": "v"}


# -- the CLI's bad input ----------------------------------------------------------------------------
def _cli(*args: str, stdin: str = "", cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "secret", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )


def _main(*args: str, stdin: str = "", cwd: Path) -> subprocess.CompletedProcess[str]:
    """``_cli`` in this process: for what is refused before anything is written (no process start)."""
    return gangflow_main("secret", *args, stdin=stdin, cwd=cwd)


def test_secret_set_and_list_on_the_dev_state_dir(tmp_path):
    done = _cli("set", "team-a", "hf-token", "--state-dir", "st", stdin="the-value\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the-value" not in done.stdout + done.stderr
    path = tmp_path / "st" / "secrets" / "team-a" / "hf-token"
    assert path.read_text() == "the-value\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    listed = _cli("list", "team-a", "--state-dir", "st", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.split() == ["hf-token"]
    assert _cli("list", "team-b", "--state-dir", "st", cwd=tmp_path).stdout == ""


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("set", "team-a", "hf-token"), "", "empty"),
        (("set", "team-a", "hf-token"), "\n", "empty"),
        (("set", "team-a", "HF_TOKEN"), "v", "lower-case"),
        (("set", "team-a", "../x"), "v", "lower-case"),
        (("set", "Team-A", "tok"), "v", "tenant 'Team-A'"),
        (("set", "../etc", "tok"), "v", "tenant '../etc'"),
        (("set", "team-a"), "v", "needs TENANT and NAME"),
        (("list", "team-a", "extra"), "", "TENANT only"),
    ],
)
def test_secret_cli_refuses_bad_input_with_exit_2(tmp_path, args, stdin, message):
    done = _main(*args, "--state-dir", "st", stdin=stdin, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert not (tmp_path / "st" / "secrets").exists() or not any((tmp_path / "st" / "secrets").rglob("*tok*"))


def test_worker_and_node_refuse_a_secrets_dir_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    for command in (["worker"], ["node", "--node-id", "n0"]):
        # in this process (refused before anything starts); test_tenant_secrets_... runs the real processes
        done = gangflow_main(
            *command, "--secrets-dir", str(tmp_path / "file"), cwd=tmp_path, GANGFLOW_ADDRESS="127.0.0.1:1"
        )
        assert done.returncode == 2 and "is not a directory" in done.stderr, done.stderr


def test_a_tenants_worker_given_its_own_folder_reads_that_folder_only(tmp_path):
    """``worker --tenant team-a --tenant-secrets DIR``: team-a's secrets are DIR/<name>; no other tenant's
    secret resolves, even with a directory of every tenant's in reach."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "hf-token").write_text("a-value\n")
    _store(tmp_path / "all", "team-b", "hf-token", "b-value")
    try:
        configure(None, "team-a", str(own))
        assert resolve([Secret("hf-token")], "team-a") == {"hf-token": "a-value"}
        with pytest.raises(SecretNotFoundError, match="no secrets directory"):
            resolve([Secret("hf-token")], "team-b")
    finally:
        configure(None)


def test_tenant_secrets_goes_with_a_tenants_worker_only(tmp_path):
    for command in (["worker"], ["node", "--node-id", "n0"]):
        done = subprocess.run(
            [sys.executable, "-m", "engine.cli", *command, "--tenant-secrets", str(tmp_path)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), "GANGFLOW_ADDRESS": "127.0.0.1:1"},
            timeout=60,
        )
        assert done.returncode == 2 and "--tenant-secrets goes with worker --tenant" in done.stderr, done.stderr


def test_secret_set_on_an_auth_stack_needs_the_tenants_token(tmp_path, monkeypatch):
    """A state dir of ``dev --auth`` (it has a JWKS): no token, another tenant's, or one of another key is
    refused with exit 2 before anything is written; the tenant's own token sets it; list needs a read role."""
    from engine.runtime.tokens import DevKeys

    monkeypatch.delenv("GANGFLOW_API_KEY", raising=False)
    keys = DevKeys.load_or_create(tmp_path / "st")
    foreign = DevKeys.load_or_create(tmp_path / "other").tenant_token("team-a")
    for token, message in (
        (None, "needs team-a's token"),
        (keys.tenant_token("team-b"), "no write role on gf-team-a"),
        (keys.tenant_token("team-a", "read"), "no write role on gf-team-a"),
        (foreign, "the token was refused"),
    ):
        extra = () if token is None else ("--api-key", token)
        done = _main("set", "team-a", "hf-token", "--state-dir", "st", *extra, stdin="v4lue", cwd=tmp_path)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "st" / "secrets").exists()
    done = _cli(
        "set",
        "team-a",
        "hf-token",
        "--state-dir",
        "st",
        "--api-key",
        keys.tenant_token("team-a"),
        stdin="v4lue",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert _main("list", "team-a", "--state-dir", "st", cwd=tmp_path).returncode == 2
    listed = _cli("list", "team-a", "--state-dir", "st", "--api-key", keys.tenant_token("team-a", "read"), cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.split() == ["hf-token"]
