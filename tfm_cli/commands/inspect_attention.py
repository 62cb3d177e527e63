"""`tfm inspect-attention`: which source words each target word attends to (heatmaps, alignments, walkthrough)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Optional

import typer

from tfm_cli.commands import model_runs
from tfm_cli.commands.options import device_option, dtype_option, threads_option
from tfm_cli.config import AlignmentConfig
from tfm_cli.console import heatmap_table, matrix_table, print_info, print_warning, stdout_console
from tfm_cli.errors import TfmError
from tfm_cli.inference.settings import model_default_note
from tfm_cli.textio.atomic_files import atomic_write_bytes, open_output, temp_file_beside
from tfm_cli.textio.output_lines import json_line

if TYPE_CHECKING:
    from tfm_cli.checkpoints.format import LoadedModel
    from tfm_cli.config import DecodeConfig
    from tfm_cli.inference.inspection import AttentionView, Example

EPILOG = (
    "Examples:\n\n"
    "  tfm inspect-attention -m model.safetensors \"Ein Mann fährt Fahrrad .\"              # heatmap, last layer, mean of heads\n\n"
    "  tfm inspect-attention -m model.safetensors --words --format pharaoh -i test.de -o test.align\n\n"
    "  tfm inspect-attention --walkthrough --seed-example                                # the design document's worked example\n\n"
    "Rows are output tokens (row t is the step that generated token t), columns are source tokens; "
    "</s> is EOS. --words merges pieces into the words of the text: a source word's weight is the sum "
    "over its pieces, a target word's row the mean over its pieces. Alignments drop </s> and take, for "
    "each target word, the source word with the largest weight (Pharaoh src-tgt pairs, 0-based)."
)
FORMATS = ("heatmap", "pharaoh", "json", "csv")


def inspect_attention(
    ctx: typer.Context,
    sentence: Optional[str] = typer.Argument(None, help="The source sentence; omitted: every line of --input."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="The checkpoint (.safetensors)."),
    input: str = typer.Option("-", "-i", "--input", help="Source sentences, one per line, when no SENTENCE is given; `-` = stdin."),
    output: str = typer.Option("-", "-o", "--output", help="Where to write; `-` = stdout."),
    target: Optional[str] = typer.Option(None, "--target", help="Force this translation of SENTENCE instead of translating it."),
    target_file: Optional[str] = typer.Option(None, "--target-file", help="Forced translations, line-parallel to --input."),
    kind: str = typer.Option("cross", "--kind", help="cross (target x source), encoder (source self-attention) or decoder (target self-attention)."),
    layer: Optional[int] = typer.Option(None, "--layer", help="Layer index, 0-based; negative counts from the end (-1 = last). Default: cross-attention the model's alignment layer, else -1."),
    head: Optional[str] = typer.Option(None, "--head", help="A head index (0-based; negative counts from the end) or `mean` (the average over heads). Default: cross-attention the model's alignment head, else mean."),
    shift: Optional[bool] = typer.Option(None, "--shift/--no-shift", help="Cross-attention alignments: read target word t's link from the step that reads t (shift) instead of the one that predicts it. Default: the model's alignment setting."),
    null: Optional[bool] = typer.Option(None, "--null/--no-null", help="Cross-attention alignments: leave a target word unaligned when </s> takes more of its attention than any source word. Default: the model's alignment setting."),
    words: bool = typer.Option(False, "--words", help="Merge pieces into words (sum over source pieces, mean over target pieces)."),
    output_format: str = typer.Option("heatmap", "--format", help="heatmap (terminal), pharaoh (alignment lines), json (one object per line) or csv (long format)."),
    reverse_model: Optional[str] = typer.Option(None, "--reverse-model", help="A target->source checkpoint: --format pharaoh then prints the intersection of both directions (word level)."),
    png: Optional[str] = typer.Option(None, "--png", help="Also save the heatmap of one sentence as a labelled image FILE.png (needs the `plot` extra: pip install 'tfm-cli\\[plot]')."),
    walkthrough: bool = typer.Option(False, "--walkthrough", help="Print one head's computation step by step: X, Q, K, V, Q K^T, scaled, softmax rows, output rows."),
    seed_example: bool = typer.Option(False, "--seed-example", help="With --walkthrough: the design document's 'I love your dog' example (no model needed)."),
    dims: int = typer.Option(8, "--dims", help="With --walkthrough: show at most this many columns of X, Q, K, V and the output (JSON has all)."),
    beam: Optional[int] = typer.Option(None, "--beam", help=f"Beam size when the model translates the sentence first (1 = greedy), with the model's other decoding settings, as tfm translate; {model_default_note('beam_size')}."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    threads: int = threads_option(),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Show the attention of a translation: heatmaps, word alignments, and one head step by step."""
    output_format = "json" if as_json else output_format
    if output_format not in FORMATS:
        raise TfmError(f"--format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    flags = model_runs.alignment_flags(layer, head, shift, null, head_option="--head")
    check_sentence_options(sentence, dims, png, walkthrough)
    if seed_example:
        show_seed_example(model, sentence, walkthrough, output, output_format, dims)
        return
    if model is None:
        raise TfmError("-m/--model is required (or use --walkthrough --seed-example)")

    from tfm_cli.inference.inspection import example_view
    from tfm_cli.inference.settings import resolve_decode

    model_runs.set_up_process(ctx, threads)
    pairs = read_pairs(sentence, input, target, target_file, one=png is not None)
    placement = model_runs.resolve_placement(device, dtype, quiet)
    loaded = model_runs.load_placed_model(model, placement)
    decode = resolve_decode({"beam_size": beam}, loaded.decode_defaults)  # what translate decodes with
    if beam is None and "beam_size" in loaded.decode_defaults and target is None and target_file is None:
        print_info(f"translating with beam_size {decode.beam_size} (the model's default; --beam overrides)", quiet=quiet)
    reverse = model_runs.load_placed_model(reverse_model, placement) if reverse_model else None
    if reverse is not None and (output_format != "pharaoh" or kind != "cross" or not words):
        raise TfmError("--reverse-model intersects two word alignments: use it with --format pharaoh --words")
    if output_format == "pharaoh" and kind != "cross":
        raise TfmError("--format pharaoh needs --kind cross: alignments come from the cross-attention")
    # Cross-attention shows what aligns: the model's alignment settings unless flags say otherwise.
    chosen = flags.applied_to(loaded.alignment if kind == "cross" else AlignmentConfig())
    if chosen.aligner and (shift is False or null is False):  # shown as asked, but not as the aligner learnt
        print_warning("--no-shift/--no-null: the model's trained aligner learnt shifted rows with a NULL word; "
                      "its links read otherwise are not the ones align and translate give")
    reverse_alignment = flags.applied_to(reverse.alignment) if reverse else None
    examples = make_examples(loaded, pairs, decode, quiet)
    with open_output(output) as out:
        if walkthrough:
            if chosen.head is None:
                print_info("--walkthrough shows one head: using head 0 (choose with --head N)", quiet=quiet)
            for example in examples:
                render_model_walkthrough(loaded, example, kind, chosen.layer, chosen.head or 0, output_format, dims, out)
                out.flush()  # each sentence is answered before the next is read (see read_pairs)
            return
        for number, example in enumerate(examples):
            view = example_view(loaded, example, kind, chosen.layer, chosen.head, words, chosen.shift, chosen.null,
                                chosen.full_context, chosen.aligner)
            if png is not None:  # before printing: a failed image write leaves no printed result
                save_png(png, view, kind)
                print_info(f"wrote {png}", quiet=quiet)
            write_view(view, example, number, kind, chosen, words, output_format, reverse, reverse_alignment, out)
            out.flush()  # each sentence is answered before the next is read (see read_pairs)


def check_sentence_options(sentence: str | None, dims: int, png: str | None, walkthrough: bool) -> None:
    """Raise TfmError for a --dims below 1, an empty SENTENCE, or a --png that cannot be saved."""
    if dims < 1:
        raise TfmError(f"--dims must be at least 1, got {dims}")
    if sentence is not None and not sentence.strip():
        raise TfmError("the SENTENCE is empty; give the source sentence to inspect")
    if png is not None:
        check_png(png, walkthrough)  # before any work: a missing matplotlib must not cost a translation


def show_seed_example(model: str | None, sentence: str | None, walkthrough: bool, output: str, output_format: str, dims: int) -> None:
    """Write the walkthrough of the design document's example (no model); TfmError without --walkthrough
    or with a model or SENTENCE."""
    from tfm_cli.inference.inspection import seed_walkthrough

    if not walkthrough:
        raise TfmError("--seed-example goes with --walkthrough")
    if model is not None or sentence is not None:
        raise TfmError("--seed-example shows the design document's example: it takes no -m model or SENTENCE")
    with open_output(output) as out:
        render_walkthrough(seed_walkthrough(), "seed example, self-attention, head 0", output_format, dims, out)


def write_view(
    view: AttentionView, example: Example, number: int, kind: str, chosen: AlignmentConfig, words: bool, output_format: str,
    reverse: LoadedModel | None, reverse_alignment: AlignmentConfig | None, out: IO[str],
) -> None:
    """Write the view of the `number`-th example (0-based) in `output_format`."""
    head = "aligner" if chosen.aligner else "mean" if chosen.head is None else str(chosen.head)
    if output_format == "pharaoh":
        write_alignment(view, reverse, example, reverse_alignment, out)
    elif output_format == "json":
        write_json(example, view, kind, chosen.layer, head, words, out)
    elif output_format == "csv":
        write_csv(view, number, out, header=number == 0)
    else:
        source = "the trained aligner" if chosen.aligner else f"layer {chosen.layer}, head {head}"
        title = f"{kind}-attention, {source}" + (", words" if words else "") + " (weights x 100)"
        print_tables([(title, heatmap_table(view.matrix.tolist(), view.rows, view.columns))], out)


def check_png(path: str, walkthrough: bool) -> None:
    """Raise TfmError unless an image can be saved at `path`: a .png name, a writable folder, matplotlib."""
    if walkthrough:
        raise TfmError("--png saves the heatmap; it does not go with --walkthrough")
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise TfmError(f"--png {path}: the image is a PNG; give a file name ending in .png")
    if target.is_dir():
        raise TfmError(f"--png {path}: is a directory, expected an image file path")
    folder = target.parent
    if not folder.is_dir():
        raise TfmError(f"--png {path}: folder {folder} does not exist")
    try:
        # The honest test of a folder (os.access says yes to root and to read-only mounts alike).
        fd, probe = temp_file_beside(target)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise TfmError(f"--png {path}: cannot write in folder {folder} ({error.strerror or error})") from None
    import_pyplot()


def import_pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend; TfmError naming the `plot` extra without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TfmError("--png needs matplotlib, which is not installed: pip install 'tfm-cli[plot]'") from None
    return plt


def read_pairs(
    sentence: str | None, input: str, target: str | None, target_file: str | None, one: bool
) -> Iterator[tuple[str, str | None]]:
    """(source, forced target or None) per sentence, read as the lines arrive.

    The lines are read through textio.read_chunks, as translate reads them: each sentence is
    answered before the next read blocks, so the input may be an interactive pipe. Regular files
    are checked first (check_files), so that their invalid UTF-8 or a --target-file of another
    length is an error before any result is printed; from a pipe such a problem is an error where
    it is found (an -o FILE is then not written). `one` (for --png) requires exactly one sentence.
    """
    from tfm_cli.textio.streams import zip_parallel
    from tfm_cli.textio.paths import check_input_file
    from tfm_cli.textio.streams import STDIO, iter_lines, read_chunks, read_lines

    if target is not None and sentence is None:
        raise TfmError("--target forces the translation of one SENTENCE; for many lines use --target-file")
    if target is not None and target_file is not None:
        raise TfmError("give --target or --target-file, not both")
    if sentence is not None:
        if input != STDIO:
            raise TfmError("give a SENTENCE or --input FILE, not both")
        return iter([(sentence, target)])
    if input == STDIO and target_file == STDIO:
        raise TfmError("the input and --target-file cannot both be stdin")
    for path, what in ((input, "input"), (target_file, "--target-file")):
        if path is not None and path != STDIO:
            check_input_file(path, what)  # before the model is loaded
    check_files(input, target_file)
    if one:
        sources = read_lines(input)
        if len(sources) != 1:
            raise TfmError(f"--png saves one image: give one sentence (SENTENCE or a one-line input), not {len(sources)}")
        targets = [None] if target_file is None else read_lines(target_file)
        if len(targets) != 1:
            raise TfmError(f"--target-file has {len(targets)} lines but the input has 1; they must be line-parallel")
        return iter(zip(sources, targets))
    if target_file is None:
        pairs = ((source, None) for source in iter_lines(input))
    else:
        pairs = zip_parallel(iter_lines(input), iter_lines(target_file), stdin_name(input), stdin_name(target_file))
    return (pair for chunk in read_chunks(pairs, PAIRS_PER_READ) for pair in chunk)


# Sentences per read (textio.read_chunks): the reader keeps at most a few reads ahead of the inspection.
PAIRS_PER_READ = 64


def check_files(input: str, target_file: str | None) -> None:
    """Read the inputs that are regular files once: TfmError for invalid UTF-8 or unequal line counts.

    A pipe cannot be read twice, and its lines are answered as they come (read_pairs).
    """
    from tfm_cli.textio.streams import STDIO, iter_lines

    def lines_in(path: str | None) -> int | None:
        if path is None or path == STDIO or not Path(path).is_file():
            return None
        return sum(1 for _ in iter_lines(path))

    sources, targets = lines_in(input), lines_in(target_file)
    if sources is not None and targets is not None and sources != targets:
        raise TfmError(f"--target-file has {targets} lines but the input has {sources}; they must be line-parallel")


def stdin_name(path: str) -> str:
    """How messages name an input path: `<stdin>` for `-`."""
    return "<stdin>" if path == "-" else path


def make_examples(
    loaded: LoadedModel, pairs: Iterator[tuple[str, str | None]], decode: DecodeConfig, quiet: bool
) -> Iterator[Example]:
    """Yield an Example per (source, forced target) pair: the forced target if given, else the model's translation."""
    from tfm_cli.inference.inspection import make_example

    for number, (source, forced) in enumerate(pairs, start=1):
        try:
            example = make_example(loaded, source, forced, decode)
        except TfmError as error:  # a sentence longer than the model's positions: say which
            raise TfmError(f"line {number}: {error}") from None
        if example.translated:
            print_info(f"translation: {example.target}", quiet=quiet)
        yield example


def write_alignment(view, reverse: LoadedModel | None, example: Example, reverse_alignment, out: IO[str]) -> None:
    """Print one Pharaoh line: the view's argmax pairs, intersected with the reverse model's if given."""
    from tfm_cli.inference.alignment import pharaoh
    from tfm_cli.inference.inspection import intersected_alignment

    pairs = view.alignment if reverse is None else intersected_alignment(view, reverse, example, reverse_alignment)
    out.write(pharaoh(pairs) + "\n")


def write_json(example: Example, view, kind: str, layer: int, head: str, words: bool, out: IO[str]) -> None:
    """One JSON object per sentence: texts, labels, the matrix, and (cross) the Pharaoh alignment."""
    from tfm_cli.inference.alignment import pharaoh

    record = {
        "source": example.source, "target": example.target, "kind": kind, "layer": layer, "head": head,
        "level": "words" if words else "pieces", "rows": view.rows, "columns": view.columns,
        "matrix": view.matrix.tolist(),
    }
    if view.alignment is not None:
        record["alignment"] = pharaoh(view.alignment)
    out.write(json_line(record) + "\n")


def write_csv(view, sentence: int, out: IO[str], header: bool) -> None:
    """Long-format CSV: sentence,row,column,row_token,column_token,weight (one line per cell)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(["sentence", "row", "column", "row_token", "column_token", "weight"])
    for i, (label, values) in enumerate(zip(view.rows, view.matrix.tolist())):
        for j, (column, value) in enumerate(zip(view.columns, values)):
            writer.writerow([sentence, i, j, label, column, f"{value:.6g}"])
    out.write(buffer.getvalue())


def print_tables(items: list[tuple[str, Any]], out: IO[str]) -> None:
    """Print (heading, rich table) pairs on `out`; piped or to a file, at their natural width so nothing wraps."""
    console = stdout_console(file=out)
    if not console.is_terminal:
        # Measure on an unbounded console: a measurement never exceeds the console it is taken on.
        wide = stdout_console(width=100_000, file=out)
        width = max(max(wide.measure(table).maximum, len(heading)) for heading, table in items)
        console = stdout_console(width=max(width, 20), file=out)
    for heading, table in items:
        console.print(heading, style="bold", markup=False)
        console.print(table)


def render_model_walkthrough(
    loaded: LoadedModel, example: Example, kind: str, layer: int, head: int, output_format: str, dims: int, out: IO[str]
) -> None:
    """The walkthrough of one head of a model on one sentence pair."""
    from tfm_cli.inference.inspection import EOS_LABEL, model_walkthrough

    src_labels = example.src_pieces + [EOS_LABEL]
    tgt_labels = example.tgt_pieces + [EOS_LABEL]
    steps = model_walkthrough(loaded.model, example.src_ids, example.tgt_ids, kind, layer, head, src_labels, tgt_labels)
    render_walkthrough(steps, f"{kind}-attention, layer {layer}, head {head}", output_format, dims, out, kind == "cross")


def render_walkthrough(steps, title: str, output_format: str, dims: int, out: IO[str], cross: bool = False) -> None:
    """Print the walkthrough's matrices: tables (values 3 decimals, weights 4), or all numbers as JSON."""
    if output_format == "json":
        record = {"title": title, "d_k": steps.d_k, "query_tokens": steps.query_labels, "key_tokens": steps.key_labels}
        for name in ("x", "q", "k", "v", "scores", "scaled", "weights", "output"):
            values = getattr(steps, name).tolist()
            record[name] = [[None if v == float("-inf") else v for v in row] for row in values]
        out.write(json_line(record) + "\n")
        return
    if output_format != "heatmap":
        raise TfmError("--walkthrough prints tables, or --format json")

    def columns(matrix):
        shown = min(dims, matrix.size(1))
        note = "" if shown == matrix.size(1) else f", first {shown} of {matrix.size(1)} columns"
        return matrix[:, :shown].tolist(), [str(i) for i in range(shown)], note

    queries, keys = steps.query_labels, steps.key_labels
    source = "Z" if cross else "X"  # cross-attention: keys and values come from the encoder memory Z
    print_info(f"{title}: d_k = {steps.d_k}")
    items = []
    for matrix, labels, heading in (
        (steps.x, queries, "X: the attention's input rows"),
        (steps.q, queries, "Q = X W^Q"),
        (steps.k, keys, f"K = {source} W^K" + (" (Z: the encoder memory)" if cross else "")),
        (steps.v, keys, f"V = {source} W^V"),
    ):
        values, column_labels, note = columns(matrix)
        items.append((heading + note, matrix_table(values, labels, column_labels)))
    items.append(("Q K^T (row: query token, column: key token)", matrix_table(steps.scores.tolist(), queries, keys)))
    items.append((f"Q K^T / sqrt(d_k), d_k = {steps.d_k}", matrix_table(steps.scaled.tolist(), queries, keys)))
    items.append(("softmax rows: the attention weights (each row sums to 1)",
                  matrix_table(steps.weights.tolist(), queries, keys, decimals=4)))
    values, column_labels, note = columns(steps.output)
    items.append(("output rows = softmax rows @ V" + note, matrix_table(values, queries, column_labels)))
    print_tables(items, out)


def save_png(path: str, view, kind: str) -> None:
    """Save the heatmap as a labelled PNG image with matplotlib (the optional `plot` extra), atomically."""
    plt = import_pyplot()
    rows, columns = view.rows, view.columns
    figure, axes = plt.subplots(figsize=(max(4, 0.5 * len(columns) + 2), max(3, 0.4 * len(rows) + 1.5)))
    image = axes.imshow(view.matrix.tolist(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(len(columns)), labels=columns, rotation=60, ha="right")
    axes.set_yticks(range(len(rows)), labels=rows)
    axes.set_xlabel("source" if kind == "cross" else "key")
    axes.set_ylabel("target" if kind != "encoder" else "query")
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    encoded = io.BytesIO()
    try:
        figure.savefig(encoded, format="png", dpi=120)
    finally:
        plt.close(figure)
    try:
        atomic_write_bytes(Path(path), encoded.getvalue())
    except OSError as error:
        raise TfmError(f"{path}: cannot write the image ({error.strerror or error})") from None
