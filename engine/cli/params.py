"""Workflow parameters from the command line: ``--total-steps 5`` / ``--total_steps=5`` / ``--input-json``.

Values are parsed against the declared type: strings stay strings, everything else is read as JSON
when it parses (``3``, ``[1, 2]``, ``{"lr": 0.1}``, ``true``) and validated by the type's codec, so
``--rows abc`` for an ``int`` fails with the parameter name, the expected type and the value given.

``gangflow run`` mixes its own options with the workflow's parameters on one command line.
``split_run_argv`` separates them by exact option name (never by prefix, so ``--n`` is never taken for
``--namespace``), and ``check_collisions`` refuses a line where a parameter shares its name with one of
gangflow's options, telling the user the two ways to give it: after a ``--`` separator, or in
``--input-json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.interface import Interface, Param, is_type, parse_text
from engine.errors import InputError

__all__ = ["RunArgv", "check_collisions", "check_missing", "parse_params", "split_run_argv"]


def _is_flag(token: str) -> bool:
    """``--name`` or ``--name=value``; ``--5`` and ``--`` are not (the same rule as ``parse_params``)."""
    return token.startswith("--") and len(token) > 2 and not token[2].isdigit()


def _usage(interface: Interface) -> str:
    return ", ".join(f"--{p.name.replace('_', '-')} ({p.codec.name})" for p in interface.params) or "none"


def parse_params(interface: Interface, tokens: Sequence[str], input_json: str | None = None) -> dict[str, Any]:
    """CLI tokens (and an optional JSON object) → raw inputs by name; validation happens when they are
    encoded for the run."""
    inputs: dict[str, Any] = {}
    if input_json:
        try:
            loaded = json.loads(input_json)
        except ValueError as exc:
            raise InputError(f"--input-json is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise InputError("--input-json must be a JSON object of parameter names to values")
        inputs.update(loaded)
    by_name = {p.name: p for p in interface.params}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise InputError(f"unexpected argument {token!r}; parameters are given as --name value")
        key, eq, value = token[2:].partition("=")
        name = key.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in by_name and is_type(by_name[name[3:]].annotation, bool)
        if negated:
            inputs[name[3:]] = False
            i += 1
            continue
        if name not in by_name:
            raise InputError(f"unknown parameter --{key}; {interface.owner} takes: {_usage(interface)}")
        param = by_name[name]
        if not eq:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or _is_flag(nxt):
                if is_type(param.annotation, bool):
                    inputs[name] = True
                    i += 1
                    continue
                raise InputError(f"parameter --{key} ({param.codec.name}) needs a value")
            value = nxt
            i += 1
        inputs[name] = parse_text(param.annotation, value)
        i += 1
    return inputs


@dataclass(frozen=True)
class RunArgv:
    """The tokens after ``gangflow run``, split between gangflow and the workflow."""

    #: the target and gangflow's own options with their values, for argparse
    own: tuple[str, ...]
    #: the workflow's parameters, for ``parse_params``
    params: tuple[str, ...]
    #: gangflow's options that were given (``--json``, ``--address`` ...), to spot collisions
    given: frozenset[str]
    #: a ``--`` ended gangflow's options: nothing before it is the workflow's
    separated: bool


def split_run_argv(tokens: Sequence[str], options: Mapping[str, bool]) -> RunArgv:
    """Split ``gangflow run``'s tokens. ``options`` maps each of gangflow's own ``run`` options
    (``--json``, ``-h`` ...) to whether it takes a value.

    A token is gangflow's only when it *is* one of those options (exact match, never a prefix); the first
    bare token is the target; every other token, and everything after ``--``, is the workflow's. A flag of
    gangflow's that cannot take a value but was given one (``--json=1``) can only mean the workflow's
    parameter, so it goes to the workflow.
    """
    own: list[str] = []
    params: list[str] = []
    given: set[str] = set()
    target_seen = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if token == "--":
            params += tokens[i + 1 :]
            return RunArgv(tuple(own), tuple(params), frozenset(given), True)
        key, eq, _ = token.partition("=")
        if key in options and not (eq and not options[key]):
            own.append(token)
            given.add(key)
            if options[key] and not eq and nxt is not None and nxt != "--":
                own.append(nxt)  # its value, whatever it looks like; argparse judges it
                i += 1
        elif _is_flag(token):
            params.append(token)
            if not eq and nxt is not None and nxt != "--" and not _is_flag(nxt):
                params.append(nxt)  # its value (or a stray token that parse_params will name)
                i += 1
        elif not target_seen and not token.startswith("-"):
            own.append(token)
            target_seen = True
        else:
            params.append(token)  # parse_params says what is wrong with it
        i += 1
    return RunArgv(tuple(own), tuple(params), frozenset(given), False)


def _clashes(param: Param, options: Mapping[str, bool]) -> list[str]:
    return sorted({f"--{param.name}", f"--{param.name.replace('_', '-')}"} & options.keys())


def _both_ways(target: str, param: Param, option: str) -> str:
    return (
        f"give it after a '--' separator (gangflow run {target} -- {option} VALUE) "
        f"or in --input-json '{{\"{param.name}\": VALUE}}'"
    )


def check_collisions(
    interface: Interface, options: Mapping[str, bool], argv: RunArgv, target: str, input_json: str | None = None
) -> None:
    """Refuse a command line where gangflow took an option that is also one of the workflow's parameters,
    unless a ``--`` or the parameter's presence in ``--input-json`` says the option was meant for gangflow:
    otherwise the user may have meant either."""
    if argv.separated:
        return
    try:
        in_json = json.loads(input_json) if input_json else {}
    except ValueError:
        in_json = {}  # parse_params reports it
    for param in interface.params:
        taken = [option for option in _clashes(param, options) if option in argv.given]
        if taken and not (isinstance(in_json, dict) and param.name in in_json):
            own = f"{taken[0]} VALUE" if options[taken[0]] else taken[0]
            raise InputError(
                f"{taken[0]} is both gangflow run's own option and a parameter of {interface.owner}, and "
                f"gangflow took it: to pass the parameter, {_both_ways(target, param, taken[0])}; to mean "
                f"gangflow's {taken[0]}, end gangflow's options with '--' (gangflow run {target} {own} --)"
            )


def check_missing(interface: Interface, options: Mapping[str, bool], inputs: Mapping[str, Any], target: str) -> None:
    """A required parameter named like one of gangflow's options is missing: say why, and both ways to
    give it (the plain "missing required input" would not tell the user that ``--json 1`` cannot work)."""
    for param in interface.params:
        clashes = _clashes(param, options)
        if clashes and param.required and param.name not in inputs:
            raise InputError(
                f"{interface.owner}: missing required input {param.name!r} ({param.codec.name}); its name is "
                f"also gangflow run's own {clashes[0]} option, so {_both_ways(target, param, clashes[0])}"
            )
