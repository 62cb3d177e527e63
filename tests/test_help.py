"""`--help` of every command: on/off options are listed as bare flags, never as `--flag <bool>`; brackets
survive rich's markup; every extra users are told to install exists."""

from __future__ import annotations

import re
import tomllib

import pytest
import typer

from conftest import REPO_ROOT, run_cli
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


# What rich (which renders --help) takes for a markup tag, as rich.markup does: a `[` then a letter,
# `#`, `/` or `@`, up to the next `]`. A bare tag is dropped from the output ('tfm-cli[bench]' became
# 'tfm-cli'); written `\[` it shows as text.
MARKUP_TAG = re.compile(r"\\*\[[A-Za-z#/@][^\[\]]*\]")


def help_sources(command) -> list[str]:
    """The texts `command --help` renders as written: its help, its epilog and its parameters' help."""
    texts = [command.help, command.epilog, *(getattr(param, "help", None) for param in command.params)]
    return [text for text in texts if text]


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) or "tfm" for p, _ in COMMANDS])
def test_bracketed_words_survive_the_rendering(path, command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = run_cli([*path, "--help"])
    assert result.exit_code == 0, result.stderr
    shown = " ".join(result.stdout.replace("│", " ").split())  # the words, whatever the wrapping and boxes
    for text in help_sources(command):
        for word in text.split():
            if MARKUP_TAG.search(word):
                assert word.replace("\\[", "[") in shown, f"{word!r} is not shown as written"


EXTRA = re.compile(r"pip install[^\n`]*?'(?:tfm-cli|\.)\\*\[([\w,-]+)\]'")


def test_every_extra_users_are_told_to_install_exists():
    # Messages, help texts, the README and CI name extras by hand: each must be one pyproject.toml declares.
    extras = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    files = [*sorted((REPO_ROOT / "tfm_cli").rglob("*.py")), REPO_ROOT / "README.md", REPO_ROOT / ".ci" / "run"]
    named = {(path.name, name) for path in files for group in EXTRA.findall(path.read_text()) for name in group.split(",")}
    assert {name for _, name in named} >= {"ctranslate2", "plot", "hub", "test", "bench"}  # the pattern finds them
    assert not [(file, name) for file, name in named if name not in extras]


def test_ctranslate2_export_needs_only_the_ctranslate2_extra():
    # Named after what users get: `--to ctranslate2` does not pull in transformers (the `bench` extra).
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [requirement.split(">=")[0] for requirement in extras["ctranslate2"]] == ["ctranslate2"]
    result = run_cli(["export", "--help"])
    assert "pip install 'tfm-cli[ctranslate2]'" in " ".join(result.stdout.replace("│", " ").split())
