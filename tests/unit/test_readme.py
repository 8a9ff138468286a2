"""The README promises only what the repository holds: every ``gangflow <command> --flag`` it shows exists
on that command (and every workflow parameter it passes exists on that workflow), and it links nothing
outside the repository."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from engine.cli.app import build_parser, run_options
from engine.cli.params import split_run_argv
from engine.client import load_workflow_file

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
#: `gangflow <command>` where it is run (not `gangflow[torch]`, `gangflow.plugins` or prose)
_COMMAND = re.compile(r"(?<![\w.\[/-])(?:\.venv/bin/)?gangflow\s+([a-z][a-z-]*)(.*)")
#: where a command line ends: a comment, a pipe (a table cell), an inline-code end, another command
_END = re.compile(r"\s#|\||`|&&|;|\)")


def _snippets() -> list[str]:
    """Command lines from the fenced blocks (one per line, continuations joined) and the inline code."""
    snippets: list[str] = []
    for block in _FENCE.findall(README):
        snippets += block.replace("\\\n", " ").splitlines()
    prose = _FENCE.sub("", README)
    snippets += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return snippets


def _commands() -> list[tuple[str, list[str]]]:
    found = []
    for snippet in _snippets():
        for match in _COMMAND.finditer(snippet):
            tail = _END.split(match.group(2), maxsplit=1)[0]
            try:
                words = shlex.split(tail)
            except ValueError:  # a placeholder such as '{...} with an unbalanced quote
                words = tail.split()
            tokens = [t.strip("[]") for t in words if t.strip("[]") not in ("", "...")]
            found.append((match.group(1), tokens))
    return found


COMMANDS = _commands()


def test_the_readme_shows_the_commands():
    named = {name for name, _ in COMMANDS}
    assert {"dev", "run", "status", "logs", "cluster", "release", "node", "worker"} <= named, named


@pytest.mark.parametrize(("command", "tokens"), COMMANDS, ids=[" ".join([c, *t])[:60] for c, t in COMMANDS])
def test_every_flag_the_readme_names_exists(command, tokens):
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert command in subcommands, f"the README runs 'gangflow {command}', which does not exist"
    flags = [t.split("=", 1)[0] for t in tokens if t.startswith("-") and t != "--"]
    if command != "run":
        own = {o for a in subcommands[command]._actions for o in a.option_strings}
        assert [f for f in flags if f not in own] == [], f"gangflow {command} has no such option"
        return
    options = run_options(parser)
    argv = split_run_argv(tokens, options)
    target = next((t for t in argv.own if not t.startswith("-") and ":" in t), None)
    given = [t.split("=", 1)[0] for t in argv.params if t.startswith("--")]
    if target is None or not (ROOT / target.rpartition(":")[0]).is_file():
        # a made-up workflow: its parameters cannot be checked, but before a '--' a flag that is not
        # gangflow's would be a misspelt option of gangflow's (the placeholder --param aside)
        before = tokens[: tokens.index("--")] if "--" in tokens else tokens
        stray = [f for f in (t.split("=", 1)[0] for t in before if t.startswith("--")) if f not in options]
        assert set(stray) <= {"--param"}, f"gangflow run has no option {stray}"
        return
    params = {p.name for p in load_workflow_file(str(ROOT / target)).interface.params}
    unknown = [g for g in given if g[2:].replace("-", "_").removeprefix("no_") not in params]
    assert unknown == [], f"{target} has no parameter {unknown}"


def test_the_readme_links_nothing_outside_the_repository():
    assert "../" not in README and "shared/" not in README
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), f"the README links {target}, which is not in the repository"
