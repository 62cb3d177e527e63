"""What the commands that run a model share: the preamble (allocator, threads, device, precision, loading,
alignment settings) and the rules for what they show on stderr while they stream (progress bar, stdin hint).

Torch, rich.progress and the library modules are imported inside the functions: `tfm --help` imports
this module and must not import torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import typer

from tfm_cli.commands.options import apply_threads, parse_head, resolve_dtype
from tfm_cli.console import print_info

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress

    from tfm_cli.checkpoints.format import LoadedModel
    from tfm_cli.config import AlignmentConfig
    from tfm_cli.inference.ensemble import Ensemble
    from tfm_cli.inference.shortlist import Shortlist


def set_up_process(ctx: typer.Context, threads: int) -> None:
    """Set the process up for running a model: malloc keeps freed memory, torch uses `threads` threads.

    Returns nothing; raises TfmError for a bad --threads.
    """
    from tfm_cli.allocator import keep_freed_memory

    keep_freed_memory()  # inference frees and re-allocates megabytes per step (see allocator.py)
    apply_threads(ctx, threads)


class Placement(NamedTuple):
    """Where a model runs: the torch device and the precision of its linear layers."""

    device: torch.device
    dtype: str


def resolve_placement(device: str, dtype: str, quiet: bool) -> Placement:
    """The Placement the --device and --dtype values mean here (prints resolve_dtype's messages)."""
    from tfm_cli.devices import resolve_device

    target_device = resolve_device(device)
    return Placement(target_device, resolve_dtype(dtype, target_device, quiet))


def load_placed_model(path: str, placement: Placement) -> LoadedModel:
    """The checkpoint at `path`, read, validated and built on `placement`.

    What the build freed goes back to the kernel (allocator.return_freed_memory): the float32 weights an
    int8 or bf16 model replaced would otherwise stay in malloc's heap, which set_up_process never shrinks
    (~180 MiB at the OPUS-MT base shape in int8, more than its decoding reuses). The embeddings keep only
    the rows the run looks up (model/embedding_rows.py).
    """
    from tfm_cli.allocator import return_freed_memory
    from tfm_cli.checkpoints.format import load_model

    loaded = load_model(path, device=placement.device, dtype=placement.dtype, embedding_rows_on_demand=True)
    return_freed_memory()
    return loaded


def load_models(paths: list[str], weights: str | None, placement: Placement, quiet: bool) -> tuple[LoadedModel, Ensemble | None]:
    """The checkpoints of -m (`paths`, one or more) loaded on `placement`: the first (its tokenizers, decoding
    defaults and alignment settings serve the whole run) and, for several, their Ensemble weighted by
    --ensemble-weights (`weights`; None: equal), else None. TfmError for bad weights (before any model is
    loaded) or models that cannot join; says on stderr what an ensemble is made of."""
    from tfm_cli.inference.ensemble import ensemble_of, ensemble_weights

    member_weights = ensemble_weights(weights, len(paths))
    members = [load_placed_model(path, placement) for path in paths]
    if len(members) == 1:
        return members[0], None
    ensemble = ensemble_of(paths, members, member_weights)
    print_info(
        f"an ensemble of {len(paths)} models, weights {', '.join(f'{w:.4g}' for w in member_weights)}; tokenizers, "
        f"decoding defaults and alignments from the first ({paths[0]})",
        quiet=quiet,
    )
    return members[0], ensemble


def load_shortlist(path: str, loaded: LoadedModel, model_path: str) -> Shortlist:
    """The shortlist file at `path`, checked against the model of `loaded` (read from `model_path`): built
    with its tokenizers, and a model whose output layer can be restricted. TfmError otherwise."""
    from tfm_cli.inference.decoding import output_weights
    from tfm_cli.inference.shortlist import check_shortlist_fits
    from tfm_cli.inference.shortlist import load_shortlist as read_shortlist

    shortlist = read_shortlist(path)
    check_shortlist_fits(shortlist, path, loaded.src_tokenizer, loaded.tgt_tokenizer, model_path)
    output_weights(loaded.model)  # raises for a model whose output layer keeps no float32 weight
    return shortlist


@dataclass(frozen=True)
class AlignmentFlags:
    """The alignment options as given: None where not given; `head_given` tells a `mean` head from none."""

    layer: int | None
    head_given: bool
    head: int | None
    shift: bool | None
    null: bool | None

    def applied_to(self, alignment: AlignmentConfig) -> AlignmentConfig:
        """`alignment` (a model's settings) with every given flag in place of its own."""
        from tfm_cli.inference.settings import resolve_alignment

        return resolve_alignment(alignment, self.layer, self.head_given, self.head, self.shift, self.null)


def alignment_flags(
    layer: int | None, head: str | None, shift: bool | None, null: bool | None, head_option: str = "--align-head"
) -> AlignmentFlags:
    """The AlignmentFlags of the options' values; TfmError naming `head_option` for a head that is not one."""
    head_index = parse_head(head, head_option) if head is not None else None
    return AlignmentFlags(layer, head is not None, head_index, shift, null)


def checked_alignment(loaded: LoadedModel, flags: AlignmentFlags, name: str = "the model") -> AlignmentConfig:
    """The alignment settings to run `loaded` (called `name` in messages) with: its own under the --align-*
    flags. TfmError for a layer or head the model does not have, and for --no-align-shift with the trained
    aligner in use (it learnt shifted rows: its links would be one word off); --no-align-null with it is
    warned about on stderr (every target word then takes its best source word, where the aligner said none)."""
    from tfm_cli.console import print_warning
    from tfm_cli.errors import TfmError

    settings = flags.applied_to(loaded.alignment)
    settings.check(loaded.config.n_dec_layers, loaded.config.n_heads, ("--align-layer", "--align-head"))
    if settings.aligner and flags.shift is False:
        raise TfmError(
            f"--no-align-shift contradicts {name}'s trained aligner, which learnt shifted rows (its links would be "
            "one word off); drop the flag, or set the aligner aside with --align-layer/--align-head"
        )
    if settings.aligner and flags.null is False:
        print_warning(
            f"--no-align-null: {name}'s trained aligner learnt to leave words unaligned; every target word now "
            "takes its best source word instead"
        )
    return settings


def progress_option(bars: str = "a progress bar") -> Any:
    """The --progress option: show `bars` even when stderr is not a terminal (shows_progress's `forced`)."""
    return typer.Option(False, "--progress", help=f"Show {bars} even when stderr is not a terminal.")


def shows_progress(forced: bool, quiet: bool, reads_files: bool = True) -> bool:
    """Whether a command shows a progress bar: never with --quiet; always with --progress; else when it
    reads files (a pipe's length is unknown) and stderr is a terminal someone watches."""
    return not quiet and (forced or (reads_files and sys.stderr.isatty()))


def progress_bar(shown: bool = True) -> Progress:
    """A rich progress bar on stderr, gone when done: each task's description, bar, done/total, time left."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from tfm_cli.console import stderr_console

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, console=stderr_console(), transient=True, disable=not shown)


def write_with_progress(
    chunks: Iterable[list[Any]], write_chunk: Callable[[list[Any]], None], shown: bool, label: str, counted_path: str
) -> None:
    """Pass each chunk of output lines to `write_chunk`, under a progress bar labelled `label` whose total
    is the line count of `counted_path` when `shown` (only then is the file counted). Returns nothing."""
    if not shown:
        for chunk in chunks:
            write_chunk(chunk)
        return
    from tfm_cli.textio.streams import count_lines

    with progress_bar() as bar:
        task = bar.add_task(label, total=count_lines(counted_path))
        for chunk in chunks:
            write_chunk(chunk)
            bar.advance(task, len(chunk))


def hint_stdin(what: str, reads_stdin: bool, quiet: bool) -> None:
    """Say on stderr that `what` is read from stdin when stdin is a terminal. Returns nothing."""
    if reads_stdin and sys.stdin.isatty():
        # Without this a person who forgot `-i` or a pipe sees nothing happen.
        print_info(f"reading {what} from stdin (Ctrl-D to end)", quiet=quiet)
