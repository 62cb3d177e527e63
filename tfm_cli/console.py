"""Rich consoles: stdout carries data only, stderr carries everything meant for people."""

from __future__ import annotations

import sys
from typing import IO

from rich import box
from rich.color import Color
from rich.console import Console
from rich.markup import escape
from rich.style import Style
from rich.table import Table
from rich.text import Text


def stderr_console(quiet: bool = False) -> Console:
    """Return a Console writing to the current sys.stderr (looked up now, so CliRunner sees it)."""
    # emoji=False: rich would turn ":x:" in a file name into an emoji, even in escaped text.
    return Console(file=sys.stderr, quiet=quiet, highlight=False, soft_wrap=True, emoji=False)


def print_error(message: str) -> None:
    """Print one red line on stderr: the user-facing form of a TfmError."""
    stderr_console().print(f"[bold red]error:[/bold red] {escape(message)}", markup=True, highlight=False)


def print_warning(message: str) -> None:
    """Print one yellow warning line on stderr."""
    stderr_console().print(f"[yellow]warning:[/yellow] {escape(message)}", markup=True, highlight=False)


def print_hint(message: str) -> None:
    """Print one `hint:` line on stderr (what to do after an error)."""
    stderr_console().print(f"[dim]hint:[/dim] {escape(message)}", markup=True, highlight=False)


def print_info(message: str, quiet: bool = False) -> None:
    """Print one plain informational line on stderr unless quiet."""
    stderr_console(quiet=quiet).print(message, markup=False, highlight=False)


def stdout_console(width: int | None = None, file: IO[str] | None = None) -> Console:
    """A Console for results (tables, heatmaps) that ARE the command's data: on `file`, else the current sys.stdout.

    Colour and box drawing only when that is a terminal; `width` overrides the detected width
    (pass the table's natural width when piping so nothing is wrapped).
    """
    return Console(file=sys.stdout if file is None else file, highlight=False, width=width, emoji=False)


def data_table(headers: list[str], rows: list[list[str]], title: str | None = None) -> Table:
    """A plain rich Table: one header row and string cells (used for metric results)."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def heat_style(weight: float) -> Style:
    """The cell style for an attention weight in [0, 1]: white on black (0) to black on bright yellow (1)."""
    level = max(0.0, min(1.0, weight))
    red, green, blue = int(255 * level), int(215 * level), int(40 * level)
    return Style(color="black" if level > 0.5 else "white", bgcolor=Color.from_rgb(red, green, blue))


def heatmap_table(matrix: list[list[float]], row_labels: list[str], col_labels: list[str]) -> Table:
    """An attention heatmap: rows = query tokens, columns = key tokens, each cell the weight x 100.

    On a terminal the cell background shades from black (0) to yellow (1); piped, the numbers remain.
    """
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0))
    table.add_column("", justify="right", style="bold", no_wrap=True)
    for label in col_labels:
        table.add_column(escape(label), justify="right", no_wrap=True, min_width=3)
    for label, row in zip(row_labels, matrix):
        cells = [Text(f"{round(100 * value):3d}", style=heat_style(value)) for value in row]
        table.add_row(escape(label), *cells)
    return table


def matrix_table(matrix: list[list[float]], row_labels: list[str], col_labels: list[str], decimals: int = 3) -> Table:
    """A labelled numeric matrix (rows = tokens), each value printed with `decimals` decimals."""
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("", style="bold", no_wrap=True)
    for label in col_labels:
        table.add_column(escape(label), justify="right", no_wrap=True)
    for label, row in zip(row_labels, matrix):
        table.add_row(escape(label), *[format_number(value, decimals) for value in row])
    return table


def format_number(value: float, decimals: int) -> str:
    """`value` with `decimals` decimals; -inf as '-inf' (masked scores) and no '-0.000'."""
    if value == float("-inf"):
        return "-inf"
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text
