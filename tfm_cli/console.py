"""Rich consoles: stdout carries data only, stderr carries everything meant for people."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape


def stderr_console(quiet: bool = False) -> Console:
    """Return a Console writing to the current sys.stderr (looked up now, so CliRunner sees it)."""
    return Console(file=sys.stderr, quiet=quiet, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """Print one red line on stderr: the user-facing form of a TfmError."""
    stderr_console().print(f"[bold red]error:[/bold red] {escape(message)}", markup=True, highlight=False)


def print_warning(message: str) -> None:
    """Print one yellow warning line on stderr."""
    stderr_console().print(f"[yellow]warning:[/yellow] {escape(message)}", markup=True, highlight=False)


def print_info(message: str, quiet: bool = False) -> None:
    """Print one plain informational line on stderr unless quiet."""
    stderr_console(quiet=quiet).print(message, markup=False, highlight=False)
