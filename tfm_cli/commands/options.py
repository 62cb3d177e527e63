"""Options several commands share, defined once: --device, --threads (and how it is applied), head choices."""

from __future__ import annotations

from typing import Any

import typer

from tfm_cli.errors import TfmError

MAX_THREADS = 1024  # far above any machine's cores; a huge count would overflow torch's int

def device_option(scope: str = "") -> Any:
    """The --device option (`scope` prefixes its help, e.g. "With -m: ")."""
    return typer.Option("auto", "--device", help=f"{scope}Torch device: auto (CUDA if available), cpu, cuda or cuda:N.")


def dtype_option(scope: str = "") -> Any:
    """The --dtype option: the precision of the model's linear layers at inference (model/precision.py)."""
    return typer.Option(
        "float32", "--dtype",
        help=f"{scope}Precision of the linear layers: float32 (the reference), bf16, int8 (weights and activations "
        "quantised; CPU only), or auto (bf16 on a CPU with native bfloat16, else float32).",
    )


def resolve_dtype(requested: str, device: Any, quiet: bool = False) -> str:
    """The precision a --dtype value means on `device` (a torch.device): "float32", "bf16" or "int8".

    Prints the choice's warning (a slow bf16) on stderr, and what `auto` chose unless `quiet`;
    raises TfmError for a value the device or the torch build cannot run.
    """
    from tfm_cli.console import print_info, print_warning
    from tfm_cli.model.precision import choose_dtype

    choice = choose_dtype(requested, device)
    if choice.warning:
        print_warning(choice.warning)
    if requested == "auto":
        print_info(f"--dtype auto: running in {choice.dtype} on {device}", quiet=quiet)
    return choice.dtype


def ensemble_weights_option(scope: str = "") -> Any:
    """The --ensemble-weights option: one relative weight per -m model (ensemble.ensemble_weights)."""
    return typer.Option(
        None, "--ensemble-weights",
        help=f"{scope}Weights of the -m models' log-probs, comma-separated, one per model (e.g. 0.6,0.4 or 3,1; "
        "scaled to sum to 1); default: equal.",
    )


def threads_option(scope: str = "") -> Any:
    """The --threads option (`scope` prefixes its help)."""
    return typer.Option(0, "--threads", help=f"{scope}CPU threads for torch (0 = torch's default).")


def align_layer_option(whose: str = "the model's") -> Any:
    """The --align-layer option (translate, align): None = the checkpoint's alignment layer."""
    return typer.Option(None, "--align-layer", help=f"Decoder layer whose cross-attention aligns (0-based; -1 = last); default: {whose} alignment settings (else -1).")


def align_head_option(whose: str = "the model's") -> Any:
    """The --align-head option (translate, align): a head number or 'mean'; None = the checkpoint's."""
    return typer.Option(None, "--align-head", help=f"Attention head that aligns: a number (0-based; negative counts from the end), or 'mean' over heads; default: {whose} (else mean).")


def align_shift_option(whose: str = "the model's") -> Any:
    """The --align-shift/--no-align-shift option (translate, align): None = the checkpoint's."""
    return typer.Option(None, "--align-shift/--no-align-shift", help=f"Read target word t's link from the step that reads t (shift) instead of the one that predicts it; default: {whose} (else no shift).")


def align_null_option(whose: str = "the model's") -> Any:
    """The --align-null/--no-align-null option (translate, align): None = the checkpoint's."""
    return typer.Option(None, "--align-null/--no-align-null", help=f"Leave a target word unaligned when the source's EOS takes more of its attention than any source word; default: {whose} (else off).")


def apply_threads(ctx: typer.Context, threads: int) -> None:
    """Run the current command with `threads` torch CPU threads (0 = leave torch's setting).

    The previous setting comes back when the command's context `ctx` closes (when the command
    ends), so in-process callers (tests, notebooks) keep theirs. Raises TfmError for a negative count.
    """
    import torch

    if not 0 <= threads <= MAX_THREADS:
        raise TfmError(f"--threads must be between 0 (the default) and {MAX_THREADS}, got {threads}")
    if threads == 0:
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    ctx.call_on_close(lambda: torch.set_num_threads(previous))


def parse_head(value: str, option: str) -> int | None:
    """An attention-head option's value: `mean` -> None (the mean over heads), else the head index.

    Raises TfmError naming `option` for anything else (int() accepts only ASCII or Unicode decimal
    digits with an optional sign, unlike str.isdigit, which also passes superscripts such as ²).
    """
    if value == "mean":
        return None
    try:
        return int(value)
    except ValueError:
        raise TfmError(f"{option} must be a head number or 'mean', got {value!r}") from None
