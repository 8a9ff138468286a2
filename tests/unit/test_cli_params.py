"""Command-line parameters parsed against a workflow's signature."""

from __future__ import annotations

import argparse
import json

import pytest

from engine import InputError, workflow
from engine.cli.app import build_parser, run_options
from engine.cli.params import check_collisions, check_missing, parse_params, split_run_argv
from engine.core import definition_of


@workflow
async def train(
    total_steps: int, lr: float = 0.1, name: str = "run", layers: list[int] | None = None, verbose: bool = False
) -> int:
    return 0


IFACE = definition_of(train).interface


def test_dashes_and_underscores_and_types():
    got = parse_params(IFACE, ["--total-steps", "5", "--lr=0.5", "--name", "123", "--layers", "[1, 2]", "--verbose"])
    assert got == {"total_steps": 5, "lr": 0.5, "name": "123", "layers": [1, 2], "verbose": True}
    assert parse_params(IFACE, ["--total_steps", "-3", "--no-verbose"]) == {"total_steps": -3, "verbose": False}


def test_input_json_and_flags_combine():
    assert parse_params(IFACE, ["--lr", "1"], '{"total_steps": 2}') == {"total_steps": 2, "lr": 1}


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["--steps", "1"], "unknown parameter --steps; workflow 'train' takes: --total-steps \\(int\\)"),
        (["--total-steps"], "parameter --total-steps \\(int\\) needs a value"),
        (["5"], "unexpected argument '5'"),
    ],
)
def test_bad_tokens(tokens, message):
    with pytest.raises(InputError, match=message):
        parse_params(IFACE, tokens)


def test_bad_json():
    with pytest.raises(InputError, match="--input-json is not valid JSON"):
        parse_params(IFACE, [], "{nope")
    with pytest.raises(InputError, match="must be a JSON object"):
        parse_params(IFACE, [], "[1]")


# -- gangflow run's own options never swallow a workflow's parameters ----------------------------------

OPTIONS = run_options(build_parser())


@workflow
async def short_names(n: int = 0, a: int = 0, d: int = 0, j: int = 0) -> int:
    return 0


@workflow
async def clashing_names(
    json: int = 0, address: str = "", namespace: str = "", detach: bool = False, artifacts: str = ""
) -> int:
    return 0


@workflow
async def needs_json(json: int, n: int = 0) -> int:
    return 0


SHORT = definition_of(short_names).interface
CLASH = definition_of(clashing_names).interface
VALUES = {"n": "5", "a": "1", "d": "7", "j": "9", "json": "3", "address": "x", "namespace": "ns", "artifacts": "/a"}
PLAIN = ["n", "a", "d", "j"]  # prefixes of gangflow's options: argparse's abbreviations took them
CLASHING = ["json", "address", "namespace", "detach", "artifacts"]  # gangflow run's own options


def _run(tokens: list[str], interface, input_json=None):
    """What `gangflow run flow.py:wf TOKENS` gives the workflow (and what argparse sees)."""
    argv = split_run_argv(["flow.py:wf", *tokens], OPTIONS)
    check_collisions(interface, OPTIONS, argv, "flow.py:wf", input_json)
    inputs = parse_params(interface, argv.params, input_json)
    check_missing(interface, OPTIONS, inputs, "flow.py:wf")
    return build_parser().parse_args(["run", *argv.own]), inputs


def _expected(name: str):
    return True if name == "detach" else json.loads(VALUES[name]) if VALUES[name].isdigit() else VALUES[name]


@pytest.mark.parametrize("name", PLAIN)
def test_a_prefix_of_gangflows_options_is_the_workflows(name):
    args, inputs = _run([f"--{name}", VALUES[name]], SHORT)
    assert inputs == {name: _expected(name)}
    assert (args.address, args.namespace, args.artifacts, args.json, args.detach) == (None, None, None, False, False)
    args, inputs = _run([f"--{name}={VALUES[name]}", "--detach", "--json"], SHORT)
    assert inputs == {name: _expected(name)} and args.detach and args.json  # gangflow's own options still work


@pytest.mark.parametrize("name", CLASHING)
def test_a_clashing_parameter_is_reachable_after_the_separator(name):
    tail = [f"--{name}"] + ([] if name == "detach" else [VALUES[name]])
    args, inputs = _run(["--detach", "--json", "--", *tail], CLASH)
    assert inputs == {name: _expected(name)}
    assert args.detach and args.json and args.address is None and args.artifacts is None


@pytest.mark.parametrize("name", CLASHING)
def test_a_clashing_parameter_is_reachable_through_input_json(name):
    args, inputs = _run(["--run-id", "r1"], CLASH, input_json=f'{{"{name}": 1}}')
    assert inputs == {name: 1} and args.run_id == "r1"


@pytest.mark.parametrize("name", CLASHING)
def test_a_clashing_parameter_taken_by_gangflow_is_refused_with_both_ways(name):
    tail = [f"--{name}"] + ([] if name == "detach" else [VALUES[name]])
    with pytest.raises(InputError) as caught:
        _run(tail, CLASH)
    message = str(caught.value)
    assert f"--{name} is both gangflow run's own option and a parameter of workflow 'clashing_names'" in message
    assert f"gangflow run flow.py:wf -- --{name} VALUE" in message
    assert f"--input-json '{{\"{name}\": VALUE}}'" in message
    assert "end gangflow's options with '--'" in message


def test_a_flag_of_gangflows_given_a_value_is_the_workflows():
    assert _run(["--json=4", "--detach=true"], CLASH)[1] == {"json": 4, "detach": True}


def test_a_missing_clashing_parameter_says_why_and_both_ways():
    iface = definition_of(needs_json).interface
    with pytest.raises(InputError) as caught:
        _run(["--json", "--"], iface)  # gangflow's --json: the workflow's json is then missing
    message = str(caught.value)
    assert "missing required input 'json' (int)" in message
    assert "also gangflow run's own --json option" in message
    assert "gangflow run flow.py:wf -- --json VALUE" in message and "--input-json" in message
    with pytest.raises(InputError, match="--json is both gangflow run's own option"):
        _run(["--json", "1"], iface)  # the "1" would otherwise be an unexplained stray argument
    assert _run(["--", "--json", "1", "--n", "2"], iface)[1] == {"json": 1, "n": 2}
    args, inputs = _run(["--json"], iface, input_json='{"json": 1}')
    assert inputs == {"json": 1} and args.json  # given in --input-json, so --json can only be gangflow's


def test_split_keeps_order_and_the_target_wherever_it_is():
    got = split_run_argv(["--json", "f.py:wf", "--n", "-1", "--address", "h:1", "--lr", "--x=2"], OPTIONS)
    assert got.own == ("--json", "f.py:wf", "--address", "h:1")
    assert got.params == ("--n", "-1", "--lr", "--x=2")
    assert got.given == {"--json", "--address"} and not got.separated
    stray = split_run_argv(["f.py:wf", "5", "--n", "1"], OPTIONS)
    assert stray.own == ("f.py:wf",) and stray.params == ("5", "--n", "1")  # parse_params names the "5"
    with pytest.raises(InputError, match="unexpected argument '5'"):
        parse_params(SHORT, stray.params)


def test_abbreviations_are_off_on_every_command():
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert not parser.allow_abbrev and subcommands and all(not p.allow_abbrev for p in subcommands.values())
    for argv in (["list", "--lim", "5"], ["status", "r1", "--js"], ["release", "g", "--forc"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
