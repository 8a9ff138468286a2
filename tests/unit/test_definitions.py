"""@task / @workflow: eager validation, plain-Python calls, options."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from engine import DefinitionError, Gang, GangPlugin, InputError, Resources, Retry, task, workflow
from engine.core import definition_of


@task(retries=2, timeout=30, resources=Resources(cpu=2, mem="4Gi", gpu=1))
def add(a: int, b: int = 1) -> int:
    return a + b


@task
async def async_double(x: int) -> int:
    return 2 * x


@workflow
async def pipeline(a: int) -> int:
    total = await add(a=a)
    return await async_double(x=total)


def test_task_is_still_a_plain_function():
    assert add(2, b=3) == 5
    assert asyncio.run(async_double(4)) == 8


def test_definition_captures_options():
    defn = definition_of(add)
    assert defn.name == "add" and defn.retry.attempts == 3 and defn.timeout == timedelta(seconds=30)
    assert defn.resources.mem == 4 * 2**30 and defn.resources.gpu == 1
    assert defn.interface.describe() == "(a: int, b: int = 1) -> int"


def test_workflow_runs_in_process_when_awaited():
    assert asyncio.run(pipeline(a=1)) == 4


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x) -> int: ...", "parameter 'x' has no type annotation"),
        ("def f(x: int): ...", "the return type is not annotated"),
        ("def f(*xs: int) -> int: ...", "parameter '*xs' is not supported"),
        ("def f(**kw: int) -> int: ...", "parameter '**kw' is not supported"),
        ("def f(x: object) -> int: ...", None),
        ("def f(x: Any) -> Nope: ...", "cannot resolve type hints"),
        ("def f(x: int = 'a') -> int: ...", "default of 'x': expected int"),
    ],
)
def test_bad_task_signatures_fail_at_decoration(source: str, message: str | None):
    scope: dict[str, Any] = {"Any": Any}
    exec(source, scope)
    if message is None:  # object is accepted by pydantic (anything goes): allowed
        task(scope["f"])
        return
    with pytest.raises(DefinitionError, match=message.replace("*", r"\*")):
        task(scope["f"])


class Opaque:
    pass


def test_unsupported_type_names_function_and_parameter():
    def train(model: Opaque) -> int:
        return 1

    with pytest.raises(DefinitionError, match=r"task 'train': parameter 'model' has an unsupported type Opaque"):
        task(train)


def test_workflow_must_be_async():
    def sync_wf(x: int) -> int:
        return x

    with pytest.raises(DefinitionError, match="must be an 'async def'"):
        workflow(sync_wf)


def test_bad_options_are_refused():
    def f(x: int) -> int:
        return x

    with pytest.raises(DefinitionError, match="retries must be a non-negative int"):
        task(retries=-1)(f)
    with pytest.raises(DefinitionError, match="timeout must be positive"):
        task(timeout=0)(f)
    with pytest.raises(DefinitionError, match="cannot be lightweight"):
        task(lightweight=True, plugin=object())(f)
    with pytest.raises(DefinitionError, match="name 'bad name'"):
        task(name="bad name")(f)
    with pytest.raises(ValueError, match="not a quantity"):
        Resources(mem="lots")
    with pytest.raises(ValueError, match="attempts"):
        Retry(attempts=0)


def test_retry_counts():
    assert Retry.coerce(0).attempts == 1 and Retry.coerce(3).attempts == 4
    retry = Retry(attempts=2, backoff=0.5, non_retryable=[KeyError, "ValueError"])
    assert retry.backoff == timedelta(seconds=0.5) and retry.non_retryable_names == ("KeyError", "ValueError")


def test_interface_reports_missing_and_unknown_inputs():
    iface = definition_of(add).interface
    with pytest.raises(InputError, match="missing required input 'a' \\(int\\)"):
        iface.validate_inputs({})
    with pytest.raises(InputError, match="unknown input 'c'; expected a, b"):
        iface.validate_inputs({"a": 1, "c": 2})
    assert iface.validate_inputs({"a": "5"}) == {"a": 5, "b": 1}


# -- the gang options: Gang(...), and the old keywords it replaces ---------------------------------
class Ranks(GangPlugin):
    nnodes, nproc_per_node = 2, 1


DEPRECATED = [
    ("max_restarts", 0, 0),
    ("hang_timeout", 20, timedelta(seconds=20)),
    ("lost_node_wait", timedelta(minutes=1), timedelta(minutes=1)),
    ("priority", "high", "high"),
    ("preemptible", False, False),
    ("preemption_grace", 30.0, timedelta(seconds=30)),
]


def test_a_distributed_task_takes_its_gang_options_as_one_value():
    @task(plugin=Ranks(), gang=Gang(max_restarts=1, hang_timeout=60, priority="high", preemptible=False))
    def train(n: int) -> int:
        return n

    defn = definition_of(train)
    assert (defn.max_restarts, defn.hang_timeout, defn.priority, defn.preemptible) == (
        1,
        timedelta(minutes=1),
        "high",
        False,
    )
    assert (defn.lost_node_wait, defn.preemption_grace) == (timedelta(minutes=10), None)  # the defaults
    assert Gang(hang_timeout=60) == Gang(hang_timeout=timedelta(minutes=1))  # durations kept as timedeltas
    assert definition_of(task(plugin=Ranks())(train.__wrapped__)).max_restarts == 3


@pytest.mark.parametrize(("keyword", "value", "stored"), DEPRECATED, ids=[d[0] for d in DEPRECATED])
def test_a_deprecated_gang_keyword_still_works_and_warns_at_the_decorator(keyword: str, value: Any, stored: Any):
    with pytest.warns(
        DeprecationWarning, match=rf"^@task\({keyword}=\.\.\.\) is deprecated: write @task\(gang=Gang"
    ) as w:

        @task(plugin=Ranks(), **{keyword: value})
        def train(n: int) -> int:
            return n

    # the user's decorator line, not gangflow's (a function's first line is its first decorator's)
    assert len(w) == 1 and (w[0].filename, w[0].lineno) == (__file__, train.__wrapped__.__code__.co_firstlineno)
    assert getattr(definition_of(train), keyword) == stored
    new = definition_of(task(plugin=Ranks(), gang=Gang(**{keyword: value}))(train.__wrapped__))
    assert [getattr(definition_of(train), k) for k, _, _ in DEPRECATED] == [getattr(new, k) for k, _, _ in DEPRECATED]


def test_deprecated_keywords_and_gang_together_are_refused():
    with (
        pytest.raises(DefinitionError, match=r"task 'train': max_restarts= and gang= both given"),
        pytest.warns(DeprecationWarning),
    ):

        @task(plugin=Ranks(), gang=Gang(), max_restarts=1)
        def train(n: int) -> int:
            return n


def test_max_restarts_on_a_plain_task_is_still_ignored_for_a_release():
    with pytest.warns(DeprecationWarning, match="has no effect on a task without plugin="):

        @task(max_restarts=5)
        def plain(n: int) -> int:
            return n

    assert definition_of(plain).max_restarts == 3 and definition_of(plain).gang is None


def test_unknown_options_and_a_gang_of_another_type_are_refused():
    def f(x: int) -> int:
        return x

    with pytest.raises(DefinitionError, match="unexpected keyword argument 'retires'"):
        task(retires=2)(f)  # type: ignore[call-overload]
    with pytest.raises(DefinitionError, match=r"task 'f': gang must be a Gang\(\.\.\.\), got \{'max_restarts': 1\}"):
        task(plugin=Ranks(), gang={"max_restarts": 1})(f)  # type: ignore[arg-type]
