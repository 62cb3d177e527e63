"""`tfm align`: word alignments of given sentence pairs (as fast_align / eflomal), one Pharaoh line per pair."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from tfm_cli.commands.options import (
    align_head_option,
    align_layer_option,
    align_null_option,
    align_shift_option,
    apply_threads,
    device_option,
    dtype_option,
    parse_head,
    resolve_dtype,
    threads_option,
)
from tfm_cli.console import print_info, print_warning, stderr_console
from tfm_cli.errors import TfmError

EPILOG = (
    "Examples:\n\n"
    "  tfm align -m de-en.safetensors --src corpus.de --tgt corpus.en > corpus.align\n\n"
    "  tfm align -m de-en.safetensors -i corpus.de-en -o corpus.align    (fast_align's 'source ||| target' lines)\n\n"
    "  tfm align -m de-en.safetensors --reverse-model en-de.safetensors --symmetrize intersection "
    "--src test.de --tgt test.en --json\n\n"
    "Words are the whitespace tokens of each line as given (tokenize beforehand as the gold standard "
    "does); links are 'src-tgt' word indices, sorted by target then source. A line with an empty side, "
    "a `|||` line without exactly one separator, or a pair longer than the model's positions (a warning "
    "names it) gives an empty output line, so output lines always match input lines."
)

SYMMETRIZE_CHOICES = ("intersection", "union", "grow-diag-final-and")


def align(
    ctx: typer.Context,
    model: str = typer.Option(..., "-m", "--model", help="A source->target tfm checkpoint (.safetensors)."),
    src: Optional[str] = typer.Option(None, "--src", help="Source sentences, pre-tokenized, one per line (with --tgt); `-` = stdin."),
    tgt: Optional[str] = typer.Option(None, "--tgt", help="Target sentences, line-parallel to --src; `-` = stdin."),
    input: Optional[str] = typer.Option(None, "-i", "--input", help="fast_align input: 'source ||| target' lines (default when no --src/--tgt: stdin)."),
    output: str = typer.Option("-", "-o", "--output", help="Where to write; `-` = stdout."),
    reverse_model: Optional[str] = typer.Option(None, "--reverse-model", help="A target->source checkpoint: align both directions and symmetrize."),
    symmetrize: Optional[str] = typer.Option(None, "--symmetrize", help="With --reverse-model: intersection, union or grow-diag-final-and (the default)."),
    align_layer: Optional[int] = align_layer_option("each model's"),
    align_head: Optional[str] = align_head_option("each model's"),
    align_shift: Optional[bool] = align_shift_option("each model's"),
    align_null: Optional[bool] = align_null_option("each model's"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line: words, links and the word-level attention rows (schema tfm-align/1, see README)."),
    buffer_size: int = typer.Option(2000, "--buffer-size", help="Pairs read and aligned at a time (an input pause also answers)."),
    max_tokens: int = typer.Option(8000, "--max-tokens", help="Source tokens per batch."),
    batch_size: int = typer.Option(128, "--batch-size", help="Sentence pairs per batch."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    threads: int = threads_option(),
    progress: bool = typer.Option(False, "--progress", help="Show a progress bar even when stderr is not a terminal."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr (warnings and errors still show)."),
) -> None:
    """Word-align given sentence pairs with a model's cross-attention: one Pharaoh line per pair.

    Each whitespace word is encoded on its own, so word k owns known pieces; a target word links to
    the source word its pieces attend to most (source pieces summed, target pieces averaged).
    """
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.paths import check_input_file
    from tfm_cli.textio.streams import (
        DecodeStats,
        check_parallel_line_counts,
        check_stdin_open,
        count_lines,
        iter_lines,
        thread_stdin,
        zip_parallel,
    )

    if symmetrize is not None and reverse_model is None:
        raise TfmError("--symmetrize combines two directions: give the target->source model with --reverse-model")
    if reverse_model is not None:
        symmetrize = "grow-diag-final-and" if symmetrize is None else symmetrize  # `--symmetrize ''` is refused below
        if symmetrize not in SYMMETRIZE_CHOICES:
            raise TfmError(f"--symmetrize must be one of {', '.join(SYMMETRIZE_CHOICES)}, got {symmetrize!r}")
    if (src is None) != (tgt is None):
        raise TfmError("--src and --tgt go together (or give 'source ||| target' lines with -i / stdin)")
    if src is not None and input is not None:
        raise TfmError("give either --src/--tgt or -i 'source ||| target' lines, not both")
    if src is not None and src == tgt == "-":
        raise TfmError("--src and --tgt cannot both be stdin")
    input = "-" if input is None and src is None else input
    for path in (src, tgt, input):
        if path not in (None, "-"):
            check_input_file(path)
    if src is not None:
        check_parallel_line_counts(src, tgt)
    uses_stdin = "-" in (src, tgt, input)
    if uses_stdin:
        check_stdin_open("give the input files with --src/--tgt or -i FILE")
    head_index = parse_head(align_head, "--align-head") if align_head is not None else None

    from tfm_cli.allocator import keep_freed_memory
    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.devices import resolve_device
    from tfm_cli.inference.settings import resolve_alignment
    from tfm_cli.inference.translation import BatchingConfig
    from tfm_cli.inference.word_alignment import (
        AlignStats,
        PairAligner,
        WordAligner,
        align_stream,
        format_aligned,
        split_pair,
    )

    keep_freed_memory()
    apply_threads(ctx, threads)
    batching = BatchingConfig(buffer_size=buffer_size, max_tokens=max_tokens, batch_size=batch_size)
    target_device = resolve_device(device)
    inference_dtype = resolve_dtype(dtype, target_device, quiet)
    aligners = []
    for path in (model, reverse_model):
        if path is None:
            continue
        loaded = load_model(path, device=target_device, dtype=inference_dtype)
        settings = resolve_alignment(loaded.alignment, align_layer, align_head is not None, head_index, align_shift, align_null)
        settings.check(loaded.config.n_dec_layers, loaded.config.n_heads, ("--align-layer", "--align-head"))
        aligners.append(WordAligner(loaded, settings, batching))
    aligner = PairAligner(aligners[0], aligners[1] if len(aligners) > 1 else None, symmetrize, keep_matrices=as_json)

    # One DecodeStats per input, so a repaired line's warning names its file (--src and --tgt may both have one).
    inputs = [(path, DecodeStats()) for path in ((src, tgt) if src is not None else (input,))]
    names = ["<stdin>" if path == "-" else path for path, _ in inputs]
    stats = AlignStats()

    def lines(path: str, decode_stats: DecodeStats):
        # Lines are read in a thread (textio.read_chunks), which must not touch sys.stdin.buffer.
        return iter_lines(path, strict_utf8=False, stats=decode_stats, stream=thread_stdin() if path == "-" else None)

    if src is not None:
        items = ((s.split(), t.split()) for s, t in zip_parallel(lines(*inputs[0]), lines(*inputs[1]), *names))
    else:
        items = (split_pair(line) for line in lines(*inputs[0]))
    if uses_stdin and sys.stdin.isatty():
        print_info("reading sentence pairs from stdin (Ctrl-D to end)", quiet=quiet)
    show_progress = not quiet and (progress or (not uses_stdin and sys.stderr.isatty()))

    def write(out, chunk) -> None:
        for line in chunk:
            if line.too_long:
                long = line.too_long
                print_warning(
                    f"line {line.index + 1}: {long.src_pieces} source and {long.tgt_pieces} target pieces, the model "
                    f"takes at most {long.most} a side: its alignment line is empty"
                )
        out.write("".join(format_aligned(line, as_json, symmetrize) + "\n" for line in chunk))
        out.flush()

    with open_output(output) as out:
        chunks = align_stream(aligner, items, batching, stats)
        if not show_progress:
            for chunk in chunks:
                write(out, chunk)
        else:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            columns = (TextColumn("aligning"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            with Progress(*columns, console=stderr_console(), transient=True) as bar:
                task = bar.add_task("align", total=count_lines(src if src is not None else input))
                for chunk in chunks:
                    write(out, chunk)
                    bar.advance(task, len(chunk))
    for name, (_, decode_stats) in zip(names, inputs):
        if decode_stats.invalid_utf8_lines:
            print_warning(f"{name}: {decode_stats.invalid_utf8_warning()}")
    if stats.malformed_lines:
        print_warning(
            f"{stats.malformed_lines} line(s) did not have exactly one ' ||| ' separator (the first: line "
            f"{stats.first_malformed}); their output lines are empty"
        )
    rate = stats.lines / stats.seconds if stats.seconds > 0 else 0.0
    print_info(
        f"aligned {stats.lines} pairs ({stats.empty_lines} with an empty side, {stats.too_long_lines} too long) "
        f"in {stats.seconds:.1f} s: {rate:.1f} pairs/s",
        quiet=quiet,
    )
