"""`tfm align`: word alignments of given sentence pairs (as fast_align / eflomal), one Pharaoh line per pair."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Optional

import typer

from tfm_cli.commands import model_runs
from tfm_cli.commands.options import align_head_option, align_layer_option, align_null_option, align_shift_option
from tfm_cli.commands.options import device_option, dtype_option, threads_option
from tfm_cli.console import print_info, print_warning
from tfm_cli.errors import TfmError

if TYPE_CHECKING:
    from tfm_cli.inference.translation import BatchingConfig
    from tfm_cli.inference.word_alignment import AlignedPair, AlignStats, WordAligner, WordPair
    from tfm_cli.textio.streams import DecodeStats

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
    progress: bool = model_runs.progress_option(),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr (warnings and errors still show)."),
) -> None:
    """Word-align given sentence pairs with a model's cross-attention: one Pharaoh line per pair.

    Each whitespace word is encoded on its own, so word k owns known pieces; a target word links to
    the source word its pieces attend to most (source pieces summed, target pieces averaged).
    """
    from tfm_cli.inference.translation import BatchingConfig
    from tfm_cli.inference.word_alignment import AlignStats, PairAligner, align_stream
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.streams import DecodeStats

    symmetrize, input = check_pairing_options(src, tgt, input, reverse_model, symmetrize)
    check_inputs(src, tgt, input)
    flags = model_runs.alignment_flags(align_layer, align_head, align_shift, align_null)
    model_runs.set_up_process(ctx, threads)
    batching = BatchingConfig(buffer_size=buffer_size, max_tokens=max_tokens, batch_size=batch_size)
    placement = model_runs.resolve_placement(device, dtype, quiet)
    aligners = [word_aligner(path, placement, flags, batching) for path in (model, reverse_model) if path is not None]
    aligner = PairAligner(aligners[0], aligners[1] if len(aligners) > 1 else None, symmetrize, keep_matrices=as_json)

    # One DecodeStats per input, so a repaired line's warning names its file (--src and --tgt may both have one).
    inputs = [(path, DecodeStats()) for path in ((src, tgt) if src is not None else (input,))]
    items = sentence_pairs(inputs)
    uses_stdin = "-" in (src, tgt, input)
    model_runs.hint_stdin("sentence pairs", uses_stdin, quiet)
    shown = model_runs.shows_progress(progress, quiet, reads_files=not uses_stdin)
    stats = AlignStats()
    with open_output(output) as out:
        chunks = align_stream(aligner, items, batching, stats)
        write = functools.partial(write_aligned, out, as_json=as_json, symmetrize=symmetrize)
        model_runs.write_with_progress(chunks, write, shown, "aligning", inputs[0][0])
    report_alignment(inputs, stats, quiet)


def check_pairing_options(
    src: str | None, tgt: str | None, input: str | None, reverse_model: str | None, symmetrize: str | None
) -> tuple[str | None, str | None]:
    """The symmetrization (the default one with a reverse model) and the `-i` input (stdin when no
    input is named) the options ask for; TfmError for options that do not go together."""
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
    return symmetrize, "-" if input is None and src is None else input


def check_inputs(src: str | None, tgt: str | None, input: str | None) -> None:
    """Raise TfmError unless the input files can be read, --src and --tgt have as many lines, and stdin
    (if read) is open."""
    from tfm_cli.textio.paths import check_input_file
    from tfm_cli.textio.streams import check_parallel_line_counts, check_stdin_open

    for path in (src, tgt, input):
        if path not in (None, "-"):
            check_input_file(path)
    if src is not None:
        check_parallel_line_counts(src, tgt)
    if "-" in (src, tgt, input):
        check_stdin_open("give the input files with --src/--tgt or -i FILE")


def word_aligner(
    path: str, placement: model_runs.Placement, flags: model_runs.AlignmentFlags, batching: BatchingConfig
) -> WordAligner:
    """The WordAligner of the checkpoint at `path`, with its alignment settings under the --align-* flags."""
    from tfm_cli.inference.word_alignment import WordAligner

    loaded = model_runs.load_placed_model(path, placement)
    return WordAligner(loaded, model_runs.checked_alignment(loaded, flags, path), batching)


def sentence_pairs(inputs: list[tuple[str, DecodeStats]]) -> Iterator[WordPair | None]:
    """The (source words, target words) of each line, read lazily from the (path, DecodeStats) `inputs`:
    line-parallel --src and --tgt, or one input of 'source ||| target' lines."""
    from tfm_cli.inference.word_alignment import split_pair
    from tfm_cli.textio.streams import iter_lines, thread_stdin, zip_parallel
    from tfm_cli.tokenization.words import split_words

    def lines(path: str, decode_stats: DecodeStats) -> Iterator[str]:
        # Lines are read in a thread (textio.read_chunks), which must not touch sys.stdin.buffer.
        return iter_lines(path, strict_utf8=False, stats=decode_stats, stream=thread_stdin() if path == "-" else None)

    if len(inputs) == 1:
        return (split_pair(line) for line in lines(*inputs[0]))
    sources, targets = (lines(path, decode_stats) for path, decode_stats in inputs)
    return ((split_words(s), split_words(t)) for s, t in zip_parallel(sources, targets, *input_names(inputs)))


def input_names(inputs: list[tuple[str, DecodeStats]]) -> list[str]:
    """How messages name each (path, DecodeStats) input: `<stdin>` for `-`."""
    return ["<stdin>" if path == "-" else path for path, _ in inputs]


def write_aligned(out: IO[str], chunk: list[AlignedPair], as_json: bool, symmetrize: str | None) -> None:
    """Write a chunk's alignment lines and flush, warning first of each pair too long for the model."""
    from tfm_cli.inference.word_alignment import format_aligned

    for line in chunk:
        if line.too_long:
            long = line.too_long
            print_warning(
                f"line {line.index + 1}: {long.src_pieces} source and {long.tgt_pieces} target pieces, the model "
                f"takes at most {long.most} a side: its alignment line is empty"
            )
    out.write("".join(format_aligned(line, as_json, symmetrize) + "\n" for line in chunk))
    out.flush()


def report_alignment(inputs: list[tuple[str, DecodeStats]], stats: AlignStats, quiet: bool) -> None:
    """Say on stderr what the inputs held that could not be aligned (invalid UTF-8, malformed lines) and
    how many pairs were aligned, how fast."""
    for name, (_, decode_stats) in zip(input_names(inputs), inputs):
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
