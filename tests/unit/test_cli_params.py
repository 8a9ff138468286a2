"""Command-line parameters parsed against a workflow's signature."""

from __future__ import annotations

import pytest

from engine import InputError, workflow
from engine.cli.params import parse_params
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
