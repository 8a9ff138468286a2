"""A structured input refuses a key none of its fields takes: ``--cfg '{"stpes": 5}'`` once ran the whole gang
with the default ``steps`` and exit 0. Refused with exit 2, naming the key and the field it probably meant,
from the command line, ``--input-json``, ``gangflow schedule create`` and the client alike."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import gangflow_cli, gangflow_main
from pydantic import BaseModel, ConfigDict

from engine import TypeMismatchError, workflow
from engine.core.definitions import definition_of


@dataclass
class Cfg:
    steps: int = 3
    lr: float = 0.1


class Job(BaseModel):
    cfg: Cfg = Cfg()
    name: str = "job"


class Open(BaseModel):
    """Its author keeps unknown keys on purpose: they are not refused."""

    model_config = ConfigDict(extra="allow")
    size: int = 1


@workflow
async def train(cfg: Cfg, job: Job | None = None, sweep: list[Cfg] | None = None, extra: Open | None = None) -> int:
    return 0


INTERFACE = definition_of(train).interface


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"cfg": {"stpes": 5}}, "input 'cfg': unknown field 'stpes' (did you mean 'steps'?)"),
        ({"cfg": {}, "job": {"cfg": {"lrr": 1}}}, "input 'job': unknown field 'lrr' (at cfg) (did you mean 'lr'?)"),
        ({"cfg": {}, "sweep": [{"steps": 1}, {"zzz": 2}]}, "input 'sweep': unknown field 'zzz' (at 1)"),
        ({"cfg": {"steps": 1}, "job": {"nmae": "x"}}, "unknown field 'nmae' (did you mean 'name'?)"),
    ],
)
def test_unknown_fields_are_refused_naming_the_key(inputs, message):
    with pytest.raises(TypeMismatchError) as refused:
        INTERFACE.inputs_to_wire(inputs)
    assert message in str(refused.value)


def test_known_fields_and_a_model_that_allows_extra_keys_pass():
    wire = INTERFACE.inputs_to_wire({"cfg": {"steps": 7}, "extra": {"size": 2, "note": "kept"}})
    assert wire["cfg"] == {"steps": 7, "lr": 0.1} and wire["extra"] == {"size": 2, "note": "kept"}
    # what comes back from the wire is read as before: leniently (a value recorded by older code)
    assert INTERFACE.inputs_from_wire({"cfg": {"steps": 7, "gone": 1}})["cfg"] == Cfg(steps=7)


FLOW = """
from dataclasses import dataclass
from engine import workflow

@dataclass
class Cfg:
    steps: int = 3

@workflow
async def flow(cfg: Cfg) -> int:
    return cfg.steps
"""


@pytest.mark.parametrize(
    "args",
    [
        ["run", "flow.py:flow", "--cfg", '{"stpes": 5}'],
        ["run", "flow.py:flow", "--input-json", json.dumps({"cfg": {"stpes": 5}})],
        ["schedule", "create", "nightly", "flow.py:flow", "--cron", "@daily", "--cfg", '{"stpes": 5}'],
    ],
    ids=["option", "input-json", "schedule"],
)
def test_the_cli_refuses_an_unknown_field_with_exit_2_before_connecting(tmp_path: Path, args: list[str]):
    (tmp_path / "flow.py").write_text(textwrap.dedent(FLOW))
    # nothing listens there: the refusal must come before any connection attempt (that would be exit 1)
    env = {"GANGFLOW_ADDRESS": "127.0.0.1:9", "GANGFLOW_CACHE": str(tmp_path / "cache"), "COLUMNS": "10000"}
    # the option as a user runs it (a real process), the others in this process (no process start)
    runner = gangflow_cli if "--cfg" in args and args[0] == "run" else gangflow_main
    done = runner(*args, cwd=tmp_path, **env)
    assert done.returncode == 2, done.stdout + done.stderr
    error = " ".join(done.stderr.split())
    assert "unknown field 'stpes' (did you mean 'steps'?)" in error and "Traceback" not in error
