"""The answer of a subcommand whose issue is still open: one line, exit code 2, no fake output."""

from __future__ import annotations

import typer

from tfm_cli.console import print_error

EXIT_NOT_BUILT = 2


def refuse(command: str) -> None:
    """Print that `command` is not built yet and exit 2."""
    print_error(f"`tfm {command}` is not built yet in this version of tfm")
    raise typer.Exit(EXIT_NOT_BUILT)
