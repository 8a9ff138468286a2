"""Queue configuration: the YAML users write, every way it can be wrong, quantities, durations, round trip.

Plain Python: ``engine.scheduling.config`` is pure, so these call ``load_queue_config`` directly.
"""

from __future__ import annotations

import json
import pathlib
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.errors
from engine.scheduling.config import (
    DEFAULT_QUEUE_CONFIG,
    PolicyConfig,
    PriorityClass,
    QueueConfig,
    QueueConfigError,
    ResourceAmounts,
    TenantConfig,
    dump_queue_config,
    load_queue_config,
)
from engine.scheduling.units import parse_cpu, parse_duration, parse_gpu, parse_mem

ROOT = pathlib.Path(__file__).resolve().parents[2]
GI = 2**30

# ---------------------------------------------------------------- helpers


def refused(source: Any) -> str:
    """The message of the QueueConfigError that loading ``source`` raises (dedented when YAML text)."""
    with pytest.raises(QueueConfigError) as caught:
        load_queue_config(textwrap.dedent(source) if isinstance(source, str) else source)
    return str(caught.value)


def one_tenant(**fields: Any) -> dict[str, Any]:
    return {"tenants": [{"name": "team-a", **fields}]}


# ---------------------------------------------------------------- what users write


def test_example_file_loads() -> None:
    config = load_queue_config(ROOT / "examples" / "queues.yaml")
    assert [c.name for c in config.cohorts] == ["research"]
    assert [t.name for t in config.tenants] == ["team-a", "team-b"]
    for tenant in config.tenants:
        assert tenant.cohort == "research"
        assert tenant.weight == 1.0
        assert tenant.quota == ResourceAmounts(gpu=2, cpu="8", mem="32Gi")
        assert tenant.quota.cpu == 8000 and tenant.quota.mem == 32 * GI
        assert config.root_cohort(tenant.name) == "research"
    assert config.priority("low") == PriorityClass(name="low", value=10, preemptible=True)
    assert config.priority("high") == PriorityClass(name="high", value=100, preemptible=False)
    assert config.policy.min_runtime == 10.0
    assert config.policy.preemption_grace == 120.0


def test_issue_example_loads_with_every_documented_key() -> None:
    config = load_queue_config(
        """
        cohorts: [{name: research}]                  # optional `parent:` nests cohorts, as in Kueue
        tenants:
          - name: team-a
            cohort: research
            weight: 1                                # fair share
            quota: {gpu: 2, cpu: 16, mem: 64Gi}      # nominal
            borrowing_limit: {gpu: 2}                # absent = unlimited, 0 = none
            lending_limit: {gpu: 2}                  # absent = lend all idle
        priority_classes:
          - {name: low, value: 10, preemptible: true}
          - {name: high, value: 100, preemptible: false}
        policy: {reclaim_within_cohort: any, within_tenant: lower_priority, min_runtime: 60s, preemption_grace: 120s}
        """
    )
    team = config.tenant("team-a")
    assert team is not None
    assert team.quota == ResourceAmounts(gpu=2, cpu=16_000, mem=64 * GI) == ResourceAmounts(gpu=2, cpu="16", mem="64Gi")
    assert team.borrowing_limit == ResourceAmounts(gpu=2)
    assert team.lending_limit == ResourceAmounts(gpu=2)
    assert config.policy == PolicyConfig(min_runtime=60, preemption_grace=120)


def test_defaults_and_lookups() -> None:
    config = load_queue_config("tenants: [{name: solo}]")
    solo = config.tenant("solo")
    assert solo == TenantConfig(name="solo")
    assert solo.quota == ResourceAmounts() and solo.quota.limited() == ()
    assert solo.borrowing_limit is None and solo.lending_limit is None and solo.cohort is None
    assert config.tenant("nobody") is None
    assert config.root_cohort("solo") is None
    assert config.root_cohort("nobody") is None
    assert config.policy == PolicyConfig()
    assert config.policy.reclaim_within_cohort == "any" and config.policy.within_tenant == "lower_priority"
    assert (config.policy.min_runtime, config.policy.preemption_grace, config.policy.backfill) == (60.0, 120.0, True)
    # no class named: value 0, preemptible
    default = config.priority(None)
    assert (default.value, default.preemptible) == (0, True)
    with pytest.raises(KeyError, match="unknown priority class 'urgent'"):
        config.priority("urgent")


def test_allowed_classes_and_pending_caps_default_to_everything_and_the_policys_cap() -> None:
    config = load_queue_config(
        """
        tenants:
          - {name: a}
          - {name: b, priority_classes: [low], max_pending: 5}
          - {name: c, priority_classes: []}
        priority_classes: [{name: low, value: 10}, {name: high, value: 100}]
        policy: {max_pending: 50}
        """
    )
    assert [config.allows("a", c) for c in ("low", "high", None)] == [True, True, True]  # absent: every class
    assert [config.allows("b", c) for c in ("low", "high", None)] == [True, False, True]  # None: the default
    assert [config.allows("c", c) for c in ("low", "high", None)] == [False, False, True]
    assert [config.max_pending(t) for t in ("a", "b", "c")] == [50, 5, 50]
    assert load_queue_config("tenants: [{name: a}]").max_pending("a") == 1000  # the documented default
    assert PolicyConfig().max_pending == 1000 and TenantConfig(name="a").priority_classes is None
    dumped = dump_queue_config(config)
    assert dumped["tenants"][1] == {
        "name": "b",
        "weight": 1.0,
        "quota": {},
        "priority_classes": ["low"],
        "max_pending": 5,
    }
    assert "priority_classes" not in dumped["tenants"][0] and dumped["tenants"][2]["priority_classes"] == []
    assert load_queue_config(dumped) == config


def test_default_queue_config_is_one_unlimited_tenant() -> None:
    assert [t.name for t in DEFAULT_QUEUE_CONFIG.tenants] == ["default"]
    default = DEFAULT_QUEUE_CONFIG.tenant("default")
    assert default is not None and default.quota.limited() == () and default.cohort is None
    assert DEFAULT_QUEUE_CONFIG.priority(None).value == 0
    assert load_queue_config(dump_queue_config(DEFAULT_QUEUE_CONFIG)) == DEFAULT_QUEUE_CONFIG


def test_default_priority_names_a_class() -> None:
    config = load_queue_config(
        """
        tenants: [{name: a}]
        priority_classes: [{name: batch, value: -5}, {name: prod, value: 1000, preemptible: false}]
        policy: {default_priority: batch}
        """
    )
    assert config.priority(None) == PriorityClass(name="batch", value=-5)
    assert config.priority("prod").preemptible is False


def test_nested_cohorts_find_their_root() -> None:
    config = load_queue_config(
        """
        cohorts:
          - {name: vision, parent: research}
          - {name: research, parent: org}
          - {name: org}
          - {name: other}
        tenants:
          - {name: team-a, cohort: vision}
          - {name: team-b, cohort: research}
          - {name: team-c, cohort: other}
          - {name: team-d}
        """
    )
    assert [config.root_cohort(t) for t in ("team-a", "team-b", "team-c", "team-d")] == ["org", "org", "other", None]


def test_mapping_and_path_sources(tmp_path: pathlib.Path) -> None:
    text = "tenants: [{name: a, quota: {gpu: 1}}]\n"
    file = tmp_path / "queues.yml"
    file.write_text(text)
    from_text = load_queue_config(text)
    assert load_queue_config(file) == from_text
    assert load_queue_config({"tenants": [{"name": "a", "quota": {"gpu": 1}}]}) == from_text


def test_weight_zero_and_limits_of_zero_are_allowed() -> None:
    config = load_queue_config(
        """
        cohorts: [{name: c}]
        tenants:
          - name: a
            cohort: c
            weight: 0
            quota: {gpu: 4, cpu: 2}
            borrowing_limit: {gpu: 0}
            lending_limit: {gpu: 0, cpu: 2}
        """
    )
    a = config.tenant("a")
    assert a is not None and a.weight == 0.0
    assert a.borrowing_limit == ResourceAmounts(gpu=0) and a.lending_limit == ResourceAmounts(gpu=0, cpu=2000)


# ---------------------------------------------------------------- quantities and durations


@pytest.mark.parametrize(
    ("written", "millicores"),
    [(16, 16_000), ("16", 16_000), (0.5, 500), ("0.5", 500), ("500m", 500), (0.3, 300), ("1.25", 1250), (0, 0)],
)
def test_cpu_quantities(written: Any, millicores: int) -> None:
    assert parse_cpu(written) == millicores
    assert load_queue_config(one_tenant(quota={"cpu": written})).tenants[0].quota.cpu == millicores


@pytest.mark.parametrize(
    ("written", "size"),
    [
        (68719476736, 64 * GI),
        ("64Gi", 64 * GI),
        ("64G", 64 * 10**9),
        ("512Mi", 512 * 2**20),
        ("1.5Gi", 3 * GI // 2),
        ("2Ti", 2 * 2**40),
        ("100", 100),
        ("8GiB", 8 * GI),
    ],
)
def test_memory_quantities(written: Any, size: int) -> None:
    assert parse_mem(written) == size
    assert load_queue_config(one_tenant(quota={"mem": written})).tenants[0].quota.mem == size


@pytest.mark.parametrize(("written", "gpus"), [(2, 2), ("2", 2), (0, 0), (8.0, 8)])
def test_gpu_quantities(written: Any, gpus: int) -> None:
    assert parse_gpu(written) == gpus


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        *[(60, 60.0), (1.5, 1.5), ("60", 60.0), ("60s", 60.0), ("2m", 120.0), ("1h", 3600.0), ("1m30s", 90.0)],
        *[("500ms", 0.5), ("1h2m3s", 3723.0), ("1d", 86400.0), ("0", 0.0), ("2.5m", 150.0)],
    ],
)
def test_durations(written: Any, seconds: float) -> None:
    assert parse_duration(written) == seconds
    policy = load_queue_config({**one_tenant(), "policy": {"min_runtime": written}}).policy
    assert policy.min_runtime == seconds


@pytest.mark.parametrize(
    ("field", "written", "fragment"),
    [
        ("gpu", "1.5", "whole number of GPUs"),
        ("gpu", 1.5, "whole number of GPUs"),
        ("gpu", "-1", "must be >= 0"),
        ("gpu", -1, "must be >= 0, got -1"),
        ("gpu", "two", "whole number of GPUs"),
        ("gpu", True, "got True"),
        ("gpu", [2], "got [2]"),
        ("cpu", "500x", "unknown unit 'x'"),
        ("cpu", "0.0005", "whole number of millicores"),
        ("cpu", "1.5m", "whole number of millicores"),
        ("cpu", -2, "must be >= 0"),
        ("cpu", "", "CPU quantity"),
        ("mem", "64Gx", "unknown unit 'gx'"),
        ("mem", "-1", "must be >= 0"),
        ("mem", "-64Gi", "must be >= 0"),
        ("mem", "Gi", "memory quantity"),
        ("mem", 1.5, "whole number of bytes"),
        ("mem", "1.2.3Gi", "memory quantity"),
        ("mem", {"size": 1}, "memory quantity"),
    ],
)
def test_bad_quantities_are_refused_naming_the_field(field: str, written: Any, fragment: str) -> None:
    message = refused({"tenants": [{"name": "ok"}, {"name": "team-b", "quota": {field: written}}]})
    assert message.startswith(f"tenants[1].quota.{field}: "), message
    assert fragment in message


@pytest.mark.parametrize("written", ["10x", "1m30", "s", "", "-5s", "1.5.2s", "m1", "ten seconds", True, None, [60]])
def test_bad_durations_are_refused_naming_the_field(written: Any) -> None:
    for field in ("min_runtime", "preemption_grace"):
        message = refused({**one_tenant(), "policy": {field: written}})
        assert message.startswith(f"policy.{field}: "), message


def test_negative_and_infinite_numbers_are_refused() -> None:
    assert refused({**one_tenant(), "policy": {"min_runtime": -1}}).startswith("policy.min_runtime: must be >= 0")
    assert refused({**one_tenant(), "policy": {"preemption_grace": float("inf")}}).startswith(
        "policy.preemption_grace: must be a finite number"
    )
    assert refused(one_tenant(weight=-1)).startswith("tenants[0].weight: must be >= 0")
    assert refused(one_tenant(weight=float("nan"))).startswith("tenants[0].weight: ")
    assert refused(one_tenant(weight=True)).startswith("tenants[0].weight: ")
    assert refused(one_tenant(quota={"cpu": float("inf")})).startswith("tenants[0].quota.cpu: must be a finite")


# ---------------------------------------------------------------- everything else that can be wrong


BAD_CONFIGS = [
    # unknown keys, with the allowed ones listed and typos caught
    pytest.param(
        "tenants: [{name: a, qouta: {gpu: 1}}]",
        "tenants[0].qouta: unknown key 'qouta'",
        "did you mean 'quota'?",
        id="typo-quota",
    ),
    pytest.param("tenants: [{name: a, quota: {gpus: 1}}]", "tenants[0].quota.gpus: ", "did you mean 'gpu'?", id="gpus"),
    pytest.param(
        "tenants: [{name: a}]\npolicy: {min_runtme: 10s}", "policy.min_runtme: ", "'min_runtime'", id="policy-typo"
    ),
    pytest.param("tenants: [{name: a}]\ntenant: []", "tenant: unknown key", "did you mean 'tenants'?", id="top-typo"),
    pytest.param(
        "cohorts: [{name: c, parnet: d}]\ntenants: [{name: a}]",
        "cohorts[0].parnet: unknown key",
        "allowed: name, parent",
        id="cohort-typo",
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: p, value: 1, preemtible: no}]",
        "priority_classes[0].preemtible: ",
        "did you mean 'preemptible'?",
        id="class-typo",
    ),
    pytest.param(
        "cohorts: [{name: c}]\ntenants: [{name: a, cohort: c, quota: {gpu: 2}, borrowing_limit: {gpu: 1, cpus: 2}}]",
        "tenants[0].borrowing_limit.cpus: unknown key",
        "allowed: gpu, cpu, mem",
        id="limit-typo",
    ),
    pytest.param("tenants: [{name: a}]\n1: x", "1: unknown key 1", "allowed: cohorts, tenants", id="non-str-key"),
    pytest.param("tenants: [{name: a, quota: {2: 1}}]", "tenants[0].quota.2: unknown key", "gpu", id="quota-int-key"),
    # wrong types
    pytest.param("tenants: {team-a: {quota: {gpu: 1}}}", "tenants: must be a list, got a mapping", "- name:", id="map"),
    pytest.param("tenants: team-a", "tenants: must be a list", "str 'team-a'", id="str-tenants"),
    pytest.param("tenants: [team-a]", "tenants[0]: must be a mapping", "str 'team-a'", id="str-tenant"),
    pytest.param("tenants: [{name: a, quota: 4}]", "tenants[0].quota: must be a mapping", "int 4", id="quota-int"),
    pytest.param("tenants: [{name: 5}]", "tenants[0].name: must be a string", "int 5", id="name-int"),
    pytest.param("tenants: [{name: no}]", "tenants[0].name: must be a string", "quote it", id="name-bool"),
    pytest.param("tenants: [{name: a, weight: heavy}]", "tenants[0].weight: must be a finite number", "", id="weight"),
    pytest.param("tenants: [{name: a, cohort: [c]}]", "tenants[0].cohort: must be a string", "a list", id="cohort"),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: p, value: high}]",
        "priority_classes[0].value: must be an integer",
        "'high'",
        id="value-str",
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: p, value: 1.5}]",
        "priority_classes[0].value: must be an integer",
        "1.5",
        id="value-float",
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: p, value: 1, preemptible: maybe}]",
        "priority_classes[0].preemptible: must be true or false",
        "'maybe'",
        id="preemptible",
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{value: 1}]", "priority_classes[0].name: required", "", id="no-name"
    ),
    pytest.param("tenants: [{name: a}]\npolicy: [any]", "policy: must be a mapping", "a list", id="policy-list"),
    pytest.param(
        "tenants: [{name: a}]\npolicy: {reclaim_within_cohort: sometimes}",
        "policy.reclaim_within_cohort: must be one of 'never', 'lower_priority' or 'any'",
        "'sometimes'",
        id="reclaim",
    ),
    pytest.param(
        "tenants: [{name: a}]\npolicy: {within_tenant: any}",
        "policy.within_tenant: must be one of 'never' or 'lower_priority'",
        "'any'",
        id="within-tenant",
    ),
    pytest.param(
        "tenants: [{name: a}]\npolicy: {backfill: often}", "policy.backfill: must be true or false", "", id="bf"
    ),
    # no tenants
    pytest.param("cohorts: []", "tenants: required", "at least one tenant", id="missing-tenants"),
    pytest.param("tenants: []", "tenants: at least one tenant is required", "", id="empty-tenants"),
    pytest.param("tenants:", "tenants: must be a list", "NoneType", id="null-tenants"),
    # names
    pytest.param("tenants: [{name: Team_A}]", "tenants[0].name: tenant name 'Team_A' is not a DNS-1123", "", id="dns"),
    pytest.param("tenants: [{name: -a}]", "tenants[0].name: ", "DNS-1123", id="dns-dash"),
    pytest.param("tenants: [{name: ''}]", "tenants[0].name: ", "DNS-1123", id="dns-empty"),
    pytest.param(f"tenants: [{{name: {'a' * 61}}}]", "tenants[0].name: ", "at most 60", id="dns-long"),
    pytest.param(
        "cohorts: [{name: My Cohort}]\ntenants: [{name: a}]", "cohorts[0].name: ", "DNS-1123", id="cohort-dns"
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: 'very high', value: 1}]",
        "priority_classes[0].name: ",
        "no spaces",
        id="class-name",
    ),
    # duplicates
    pytest.param(
        "tenants: [{name: a}, {name: b}, {name: a}]",
        "tenants[2].name: duplicate tenant 'a' (already tenants[0])",
        "",
        id="dup-tenant",
    ),
    pytest.param(
        "cohorts: [{name: c}, {name: c}]\ntenants: [{name: a}]",
        "cohorts[1].name: duplicate cohort 'c'",
        "",
        id="dup-cohort",
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: p, value: 1}, {name: p, value: 2}]",
        "priority_classes[1].name: duplicate priority class 'p'",
        "",
        id="dup-class",
    ),
    # references
    pytest.param(
        "cohorts: [{name: research}]\ntenants: [{name: a, cohort: reserch}]",
        "tenants[0].cohort: unknown cohort 'reserch'",
        "'research'",
        id="unknown-cohort",
    ),
    pytest.param(
        "tenants: [{name: a, cohort: research}]",
        "tenants[0].cohort: unknown cohort 'research'",
        "no cohorts are defined",
        id="no-cohorts",
    ),
    pytest.param(
        "cohorts: [{name: c, parent: org}]\ntenants: [{name: a}]",
        "cohorts[0].parent: unknown cohort 'org'",
        "",
        id="unknown-parent",
    ),
    pytest.param(
        "cohorts: [{name: c, parent: c}]\ntenants: [{name: a}]",
        "cohorts[0].parent: cohort parents form a cycle: c -> c",
        "",
        id="self-parent",
    ),
    pytest.param(
        "cohorts: [{name: top, parent: x}, {name: x, parent: y}, {name: y, parent: x}]\ntenants: [{name: a}]",
        "cohorts[1].parent: cohort parents form a cycle: x -> y -> x",
        "",
        id="cycle-above",
    ),
    pytest.param(
        "tenants: [{name: a}]\npriority_classes: [{name: low, value: 1}]\npolicy: {default_priority: lo}",
        "policy.default_priority: unknown priority class 'lo'",
        "'low'",
        id="default-priority",
    ),
    pytest.param(
        "tenants: [{name: a}]\npolicy: {default_priority: low}",
        "policy.default_priority: unknown priority class 'low'",
        "none are defined",
        id="default-priority-none",
    ),
    # limits
    pytest.param(
        "cohorts: [{name: c}]\ntenants: [{name: a, cohort: c, quota: {gpu: 2}, borrowing_limit: {gpu: 1, cpu: 4}}]",
        "tenants[0].borrowing_limit.cpu: the quota of tenant 'a' does not limit cpu",
        "add `quota.cpu`",
        id="borrow-unlimited",
    ),
    pytest.param(
        "cohorts: [{name: c}]\ntenants: [{name: a, cohort: c, lending_limit: {mem: 1Gi}}]",
        "tenants[0].lending_limit.mem: the quota of tenant 'a' does not limit mem",
        "",
        id="lend-unlimited",
    ),
    pytest.param(
        "cohorts: [{name: c}]\ntenants: [{name: a, cohort: c, quota: {gpu: 2}, lending_limit: {gpu: 3}}]",
        "tenants[0].lending_limit.gpu: 3 GPUs is above the nominal quota of 2 GPUs",
        "",
        id="lend-above",
    ),
    pytest.param(
        "cohorts: [{name: c}]\ntenants: [{name: a, cohort: c, quota: {cpu: 2}, lending_limit: {cpu: 2500m}}]",
        "tenants[0].lending_limit.cpu: 2.5 CPUs is above the nominal quota of 2 CPUs",
        "",
        id="lend-above-cpu",
    ),
    pytest.param(
        "tenants: [{name: a, quota: {gpu: 2}, borrowing_limit: {gpu: 1}}]",
        "tenants[0].borrowing_limit: tenant 'a' is in no cohort",
        "set `cohort:`",
        id="borrow-no-cohort",
    ),
    pytest.param(
        "tenants: [{name: ok}, {name: a, quota: {gpu: 2}, lending_limit: {gpu: 1}}]",
        "tenants[1].lending_limit: tenant 'a' is in no cohort",
        "nobody to lend to",
        id="lend-no-cohort",
    ),
    # the priority classes a tenant may name, its cap on pending gangs
    pytest.param(
        "tenants: [{name: a, priority_classes: [low]}]\npriority_classes: [{name: high, value: 1}]",
        "tenants[0].priority_classes[0]: unknown priority class 'low' (priority classes: 'high')",
        "",
        id="allowed-unknown",
    ),
    pytest.param(
        "tenants: [{name: a, priority_classes: [low]}]",
        "tenants[0].priority_classes[0]: unknown priority class 'low' (priority classes: none are defined)",
        "",
        id="allowed-none-defined",
    ),
    pytest.param(
        "tenants: [{name: a, priority_classes: [low, low]}]\npriority_classes: [{name: low, value: 1}]",
        "tenants[0].priority_classes[1]: priority class 'low' is listed twice",
        "",
        id="allowed-twice",
    ),
    pytest.param(
        "tenants: [{name: a, priority_classes: low}]",
        "tenants[0].priority_classes: must be a list",
        "",
        id="allowed-str",
    ),
    pytest.param(
        "tenants: [{name: a, max_pending: -1}]", "tenants[0].max_pending: must be >= 0, got -1", "", id="cap-neg"
    ),
    pytest.param(
        "tenants: [{name: a, max_pending: true}]", "tenants[0].max_pending: must be an integer", "", id="cap-bool"
    ),
    pytest.param(
        "tenants: [{name: a, max_pending: 1.5}]", "tenants[0].max_pending: must be an integer", "", id="cap-float"
    ),
    pytest.param(
        "tenants: [{name: a}]\npolicy: {max_pending: -3}", "policy.max_pending: must be >= 0", "", id="cap-policy"
    ),
    # top level
    pytest.param("- tenants: []", "the queue configuration must be a mapping", "a list", id="top-list"),
    pytest.param("just words", "the queue configuration must be a mapping", "str 'just words'", id="top-str"),
    pytest.param("", "the queue configuration is empty", "tenants", id="empty"),
    pytest.param("# only a comment\n", "the queue configuration is empty", "", id="comment-only"),
    pytest.param("examples/queues.yaml", "the queue configuration must be a mapping", "pathlib.Path", id="path-str"),
]


@pytest.mark.parametrize(("source", "prefix", "fragment"), BAD_CONFIGS)
def test_bad_config_is_refused_naming_the_field(source: str, prefix: str, fragment: str) -> None:
    message = refused(source)
    assert message.startswith(prefix), message
    assert fragment in message, message


def test_every_field_error_is_listed_one_per_line() -> None:
    message = refused(
        """
        tenants:
          - {name: a, quota: {gpu: -1}}
          - {name: b, weight: heavy, qouta: {}}
        policy: {min_runtime: soon}
        """
    )
    lines = message.splitlines()
    assert lines[0].startswith("tenants[0].quota.gpu: must be >= 0, got -1")
    assert {line.split(":")[0] for line in lines} == {
        "tenants[0].quota.gpu",
        "tenants[1].weight",
        "tenants[1].qouta",
        "policy.min_runtime",
    }


def test_the_error_is_a_gangflow_error_and_still_a_value_error() -> None:
    assert QueueConfigError is engine.errors.QueueConfigError
    assert issubclass(QueueConfigError, engine.errors.GangflowError) and issubclass(QueueConfigError, ValueError)
    assert QueueConfigError.kind == "QueueConfigError"  # the failure type the Scheduler answers apply_queues with


def test_yaml_syntax_errors_say_the_line(tmp_path: pathlib.Path) -> None:
    text = "tenants:\n  - name: a\n    quota: {gpu: 2\n"
    message = refused(text)
    assert message.startswith("line 4, column 1: invalid YAML: "), message
    file = tmp_path / "queues.yaml"
    file.write_text("tenants:\n  - name: a\n  quota: {gpu: 2}\n")
    message = refused(file)
    assert message.startswith(f"{file}: line 3, column 3: invalid YAML: "), message


def test_a_key_given_twice_is_refused_not_silently_dropped() -> None:
    message = refused("tenants: [{name: a}]\npolicy: {}\ntenants: [{name: b}]\n")
    assert message.startswith("line 3, column 1: invalid YAML: duplicate key 'tenants' (first at line 1)"), message
    message = refused("tenants:\n  - name: a\n    quota: {gpu: 1, gpu: 2}\n")
    assert "duplicate key 'gpu'" in message and message.startswith("line 3, "), message


def test_yaml_merge_keys_still_work() -> None:
    config = load_queue_config(
        """
        tenants:
          - &base {name: a, quota: {gpu: 2}}
          - {<<: *base, name: b}
        """
    )
    assert [(t.name, t.quota.gpu) for t in config.tenants] == [("a", 2), ("b", 2)]


def test_missing_or_unreadable_file_names_the_path(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert refused(missing) == f"{missing}: no such file"
    assert refused(tmp_path).startswith(f"{tmp_path}: cannot read the queue configuration")
    binary = tmp_path / "queues.bin"
    binary.write_bytes(b"\xff\xfe\x00tenants")
    assert refused(binary).startswith(f"{binary}: ")


def test_a_source_of_the_wrong_kind_is_refused() -> None:
    assert refused(42).startswith("the queue configuration must be YAML text, a pathlib.Path or a mapping")
    assert refused(b"tenants: []").startswith("the queue configuration must be YAML text")


def test_a_valid_mapping_is_not_changed_by_loading() -> None:
    data = {"tenants": [{"name": "a", "quota": {"gpu": 1}}]}
    snapshot = json.dumps(data)
    load_queue_config(data)
    assert json.dumps(data) == snapshot


# ---------------------------------------------------------------- round trip


def test_round_trip_of_the_example_is_exact_and_plain() -> None:
    config = load_queue_config(ROOT / "examples" / "queues.yaml")
    dumped = dump_queue_config(config)
    assert json.loads(json.dumps(dumped)) == dumped  # JSON-able
    quota = dumped["tenants"][0]["quota"]
    # mem in plain bytes; cpu as a quantity string, the one form code and files read the same way
    assert quota == {"gpu": 2, "cpu": "8", "mem": 32 * GI}
    assert dumped["policy"]["min_runtime"] == 10.0
    assert load_queue_config(dumped) == config
    assert load_queue_config(json.dumps(dumped)) == config  # JSON is YAML too
    # the path a config takes through Temporal (pydantic's JSON) is exact as well
    assert QueueConfig.model_validate_json(config.model_dump_json()) == config
    assert QueueConfig.model_validate(config.model_dump()) == config


def test_fractional_cpus_survive_the_round_trip() -> None:
    config = load_queue_config(one_tenant(quota={"cpu": "1500m", "mem": "1.5Gi", "gpu": 0}))
    dumped = dump_queue_config(config)
    assert dumped["tenants"][0]["quota"] == {"gpu": 0, "cpu": "1500m", "mem": 3 * GI // 2}
    again = load_queue_config(dumped)
    assert again == config and again.tenants[0].quota.cpu == 1500
    assert QueueConfig.model_validate(dumped) == config


def test_cpu_numbers_mean_cpus_in_files_and_millicores_in_code() -> None:
    written = {"tenants": [{"name": "a", "quota": {"cpu": 2}, "cohort": None}]}
    from_file = load_queue_config(written)
    assert from_file.tenants[0].quota.cpu == 2000
    assert load_queue_config("tenants: [{name: a, quota: {cpu: 2}}]") == from_file
    # in code the stored value goes back in unchanged, so copies and pydantic round trips are exact
    quota = from_file.tenants[0].quota
    assert ResourceAmounts(cpu=quota.cpu) == quota == ResourceAmounts(cpu="2") == ResourceAmounts(cpu="2000m")
    assert ResourceAmounts.model_validate(quota.model_dump()) == quota
    assert ResourceAmounts(cpu=2000.0) == quota
    with pytest.raises(ValueError, match="whole millicores here"):
        ResourceAmounts(cpu=0.5)
    with pytest.raises(ValueError, match="must be >= 0"):
        ResourceAmounts(cpu=-1)
    for infinite in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="must be a finite number"):
            ResourceAmounts(cpu=infinite)
    # the file's limits use the same reading as its quota
    config = load_queue_config(
        "cohorts: [{name: c}]\ntenants: [{name: a, cohort: c, quota: {cpu: 4}, lending_limit: {cpu: 0.5}}]"
    )
    assert config.tenants[0].lending_limit == ResourceAmounts(cpu=500)


names = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)
amounts = st.builds(
    ResourceAmounts,
    gpu=st.none() | st.integers(0, 64),
    cpu=st.none() | st.integers(0, 10**7).map(lambda m: f"{m}m"),
    mem=st.none() | st.integers(0, 2**50),
)


@st.composite
def configs(draw: st.DrawFn) -> QueueConfig:
    cohort_names = draw(st.lists(names, max_size=4, unique=True))
    cohorts = [
        {"name": name, "parent": cohort_names[index - 1] if index and draw(st.booleans()) else None}
        for index, name in enumerate(cohort_names)
    ]
    tenants = []
    for name in draw(st.lists(names, min_size=1, max_size=5, unique=True)):
        quota = draw(amounts)
        cohort = draw(st.sampled_from([None, *cohort_names]))
        tenant: dict[str, Any] = {"name": name, "cohort": cohort, "quota": quota, "weight": draw(st.floats(0, 10))}
        if cohort is not None and draw(st.booleans()):
            tenant["borrowing_limit"] = {r: draw(st.integers(0, 5)) for r in quota.limited() if r != "cpu"}
        if cohort is not None and draw(st.booleans()):
            tenant["lending_limit"] = {r: getattr(quota, r) for r in quota.limited() if draw(st.booleans())}
        if draw(st.booleans()):
            tenant["max_pending"] = draw(st.integers(0, 10**6))
        tenants.append(tenant)
    classes = [
        {"name": name, "value": draw(st.integers(-1000, 1000)), "preemptible": draw(st.booleans())}
        for name in draw(st.lists(names, max_size=3, unique=True))
    ]
    allowed = st.lists(st.sampled_from([c["name"] for c in classes]), unique=True) if classes else st.just([])
    for tenant in tenants:
        if draw(st.booleans()):
            tenant["priority_classes"] = draw(allowed)
    policy = {
        "reclaim_within_cohort": draw(st.sampled_from(["never", "lower_priority", "any"])),
        "within_tenant": draw(st.sampled_from(["never", "lower_priority"])),
        "min_runtime": draw(st.floats(0, 1e6)),
        "preemption_grace": draw(st.integers(0, 3600)),
        "backfill": draw(st.booleans()),
        "default_priority": draw(st.sampled_from([None, *(c["name"] for c in classes)])),
        "max_pending": draw(st.integers(0, 10**6)),
    }
    return QueueConfig.model_validate(
        {"cohorts": cohorts, "tenants": tenants, "priority_classes": classes, "policy": policy}
    )


@settings(max_examples=150, deadline=None)
@given(configs())
def test_dump_then_load_is_the_identity(config: QueueConfig) -> None:
    dumped = dump_queue_config(config)
    assert load_queue_config(json.loads(json.dumps(dumped))) == config
    assert QueueConfig.model_validate_json(config.model_dump_json()) == config


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats() | st.sampled_from(["", "a", "1Gi", "500m", "2m"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["name", "tenants", "cohorts", "quota", "gpu", "cpu", "mem", "policy", "weight", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["tenants", "cohorts", "priority_classes", "policy", "x"]), json_values))
def test_no_raw_pydantic_error_escapes(data: dict[str, Any]) -> None:
    try:
        config = load_queue_config(data)
    except QueueConfigError as error:
        assert str(error) and not str(error).startswith(("Input should", "Value error")), error
        assert "pydantic" not in str(error).lower(), error
    else:
        assert isinstance(config, QueueConfig)
