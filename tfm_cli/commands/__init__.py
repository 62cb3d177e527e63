"""One module per subcommand: options in, one library call, results out. No tensor math here.

This file holds the Typer command and group classes every subcommand is registered with.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup


def show_plainly(param: Any) -> None:
    """Give an on/off option an empty metavar, so Typer's rich --help lists it as a bare flag."""
    if getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""


class PlainFlags:
    """A mixin for Typer commands and groups: --help lists each on/off option (--help too) as a bare flag.

    Typer's rich help labels a bool option with its type, `--scores <bool>`, as if it took a value
    (Typer's plain-text help does not): people typed `--scores true` and got "unexpected extra argument".
    """

    def __init__(self, *args: Any, **attrs: Any) -> None:
        super().__init__(*args, **attrs)
        for param in self.params:
            show_plainly(param)

    def get_help_option(self, ctx: Any) -> Any:
        """Click's --help option (created on first use, so not among the params seen above), shown bare."""
        option = super().get_help_option(ctx)
        if option is not None:
            show_plainly(option)
        return option


class TfmCommand(PlainFlags, TyperCommand):
    """The class of every tfm subcommand (pass `cls=TfmCommand` when registering one)."""


class TfmCommandGroup(PlainFlags, TyperGroup):
    """The class of every tfm command group (`tfm` itself, `tfm tokenize`)."""
