"""`tfm average`: the mean of several checkpoints' weights, written as one self-contained checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tfm_cli.console import print_info
from tfm_cli.errors import TfmError

EPILOG = (
    "Examples:\n\n"
    "  tfm average runs/base/checkpoint_00095000.safetensors runs/base/checkpoint_00100000.safetensors -o avg.safetensors\n\n"
    "  tfm average --run runs/base --last 5 -o runs/base/avg5.safetensors\n\n"
    "  tfm translate -m runs/base/avg5.safetensors < test.de > hyp.en"
)


def average(
    inputs: Optional[List[Path]] = typer.Argument(None, help="Checkpoints to average (same config and tokenizer)."),
    output: Path = typer.Option(..., "-o", "--output", help="The averaged checkpoint to write (atomically)."),
    run: Optional[Path] = typer.Option(None, "--run", help="A `tfm train` run folder: average its step checkpoints."),
    last: int = typer.Option(5, "--last", help="With --run: how many of the latest step checkpoints."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Average checkpoints' weights (float64 sum, one file in memory at a time), like fairseq's script.

    The output keeps the config and tokenizer and lists the averaged files (name, step, sha256) in
    its provenance. Checkpoints with a different config or tokenizer are refused.
    """
    from tfm_cli.checkpoints.averaging import average_to_file, run_checkpoints

    if run is not None and inputs:
        raise TfmError("give checkpoint files or --run DIR, not both")
    paths = run_checkpoints(run, last) if run is not None else list(inputs or [])
    if not paths:
        raise TfmError("no checkpoint to average; give files or --run DIR --last N")
    averaged = average_to_file(paths, output, on_read=lambda path: print_info(f"read {path}", quiet=quiet))
    steps = [item["step"] for item in averaged.provenance["averaged"]]
    print_info(
        f"wrote {output}: the mean of {len(paths)} checkpoints (steps {', '.join(str(s) for s in steps)})",
        quiet=quiet,
    )
