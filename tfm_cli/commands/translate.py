"""`tfm translate` (not built yet)."""

from __future__ import annotations

from typing import List, Optional

import typer

from tfm_cli.commands.not_built import refuse

EPILOG = "Not built yet."


def translate(args: Optional[List[str]] = typer.Argument(None, hidden=True)) -> None:
    """Not built yet: prints one line and exits 2."""
    refuse("translate")
