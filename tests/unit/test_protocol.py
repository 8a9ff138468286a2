"""engine.core.protocol is the one home of the names the workflows, the client, the runtime and the node
agents share, and the client side loads no workflow code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core import protocol
from engine.core.protocol import (
    TENANT_MAX_LENGTH,
    TENANT_UID_BASE,
    TENANT_UID_SPAN,
    check_tenant,
    tenant_namespace,
    tenant_user,
)
from engine.scheduling.config import QueueConfigError, load_queue_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_loads_no_workflow_module_and_no_worker():
    """`import engine.client` (and the CLI's run preparation) must not pay for, or depend on, the workflows."""
    code = (
        "import sys, engine.client, engine.client._prepare, engine.runtime.connection\n"
        "print(sorted(m for m in sys.modules if m == 'workflows' or m.startswith(('workflows.', 'temporalio.worker'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _imports_of_shared_names() -> list[str]:
    """Every `from X import NAME` in the tree where NAME is a protocol name but X is not the protocol."""
    shared = set(protocol.__all__)
    wrong = []
    for top in ("engine", "workflows", "plugins", "tests", "examples"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module != "engine.core.protocol":
                    names = {alias.name for alias in node.names} & shared
                    if names and node.module.startswith(("engine", "workflows", "plugins")):
                        wrong.append(f"{path.relative_to(ROOT)}: {node.module} {sorted(names)}")
    return wrong


def test_shared_names_are_imported_from_the_protocol_only():
    """No synonym homes: a constant read from workflows/ or the runtime facade is one that can drift."""
    assert _imports_of_shared_names() == []


def test_one_tenant_rule_for_namespaces_and_queue_configurations():
    longest = "a" * TENANT_MAX_LENGTH
    assert tenant_namespace(longest) == f"gf-{longest}" and len(tenant_namespace(longest)) == 63
    load_queue_config(f"tenants: [{{name: {longest}}}]")  # what the namespace takes, the queue file takes
    too_long = longest + "a"
    with pytest.raises(ValueError, match="at most 60 characters"):
        check_tenant(too_long)
    with pytest.raises(QueueConfigError, match="at most 60 characters"):
        load_queue_config(f"tenants: [{{name: {too_long}}}]")
    for bad in ("Team_A", "-a", "a-", ""):
        with pytest.raises(ValueError, match="DNS-1123"):
            tenant_namespace(bad)


def test_each_tenant_has_one_stable_unprivileged_user():
    """The tenant workers and the rank sandbox derive a tenant's OS user by one rule: stable (pinned values,
    so a change of rule is seen), a valid Linux user name for the longest tenant, in the reserved uid range."""
    assert tenant_user("team-a") == tenant_user("team-a")
    assert tenant_user("team-a") != tenant_user("team-b")
    assert tenant_user("team-a") == ("gf-96c2886c51d1", 1263491613)  # a (name, uid) tuple
    for tenant in ("a", "team-a", "a" * TENANT_MAX_LENGTH):
        name, uid = tenant_user(tenant)
        assert len(name) <= 32 and name.startswith("gf-") and name[3:].isalnum()
        assert TENANT_UID_BASE <= uid < TENANT_UID_BASE + TENANT_UID_SPAN < 2**31
    # a tenant worker's uid is never a gang's (engine.executor.sandbox): a rank could read that worker's token
    from engine.executor import sandbox

    assert TENANT_UID_BASE + TENANT_UID_SPAN <= sandbox.UID_BASE
    with pytest.raises(ValueError, match="DNS-1123"):
        tenant_user("Team_A")
