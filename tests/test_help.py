"""`--help` of every command: on/off options are listed as bare flags, never as `--flag <bool>`."""

from __future__ import annotations

import re

import pytest
import typer

from conftest import run_cli
from tfm_cli.cli import app


def command_paths(command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """(argv prefix, click command) for `command` and every command below it: (), ("tokenize",), ("tokenize", "train"), ..."""
    found = [(path, command)]
    for name, subcommand in sorted(getattr(command, "commands", {}).items()):
        found.extend(command_paths(subcommand, path + (name,)))
    return found


COMMANDS = command_paths(typer.main.get_command(app))


def long_name(param) -> str:
    """The first --long name of an option (the one its help row starts with)."""
    return next(name for name in param.opts if name.startswith("--"))


def value_column(help_text: str, option: str) -> str:
    """What the help row of `option` shows after its names (long, short): the type column, or the help text."""
    # A row: `│ *  --model,--alias  -m  <str>  help...`: the box and the required mark, the long names,
    # at most one short name, then the rest.
    pattern = rf"^[^\w<-]*{re.escape(option)}(?:,--[\w-]+)*\s+(?:-\w+\s+)?(\S+)"
    match = re.search(pattern, help_text, flags=re.MULTILINE)
    assert match, f"{option} is not listed:\n{help_text}"
    return match.group(1)


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) or "tfm" for p, _ in COMMANDS])
def test_flags_are_listed_bare_and_valued_options_with_their_type(path, command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one row per option: nothing wraps
    result = run_cli([*path, "--help"])
    assert result.exit_code == 0, result.stderr
    assert "<bool>" not in result.stdout
    options = [param for param in command.params if param.param_type_name == "option"]
    for param in options:
        shown = value_column(result.stdout, long_name(param))
        if param.is_flag:
            assert not shown.startswith("<"), f"{long_name(param)} is listed as taking a value: {shown}"
        else:  # the same parse still sees the types of options that do take a value
            assert shown.startswith("<"), f"{long_name(param)} shows no type: {shown}"
    assert not value_column(result.stdout, "--help").startswith("<")


def test_every_command_was_found():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"tokenize train", "tokenize encode", "tokenize decode", "train", "average", "translate", "score",
            "inspect-attention"} <= names
