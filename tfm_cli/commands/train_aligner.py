"""`tfm train-aligner`: give a model a trained word aligner, learnt from a statistical aligner's links."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tfm_cli.commands import model_runs
from tfm_cli.commands.options import device_option, threads_option
from tfm_cli.console import print_info
from tfm_cli.errors import TfmError

if TYPE_CHECKING:
    from rich.progress import Progress

    from tfm_cli.checkpoints.format import Checkpoint, LoadedModel
    from tfm_cli.training.aligner_training import AlignerTrainingConfig, EpochResult, PreparedPairs, TrainedAligner

EPILOG = (
    "Examples:\n\n"
    "  eflomal-align -s corpus.en -t corpus.fr -f fwd.align -r rev.align && "
    "atools -i fwd.align -j rev.align -c grow-diag-final-and > corpus.align\n\n"
    "  tfm train-aligner -m en-fr.safetensors --src corpus.en --tgt corpus.fr --links corpus.align -o en-fr.aligned.safetensors\n\n"
    "  tfm align -m en-fr.aligned.safetensors --src corpus.en --tgt corpus.fr > tfm.align\n\n"
    "The links are Pharaoh lines ('src-tgt' word indices; 'src?tgt' counts as a link), one per pair of the "
    "whitespace-tokenized --src/--tgt lines. Train on the pairs you will align (as a statistical aligner "
    "does): the aligner learns them, and generalises from the rest. The written checkpoint is the model "
    "unchanged (it translates exactly as before) plus the aligner, which `tfm align`, `translate "
    "--alignment` and `inspect-attention --format pharaoh` then use; --align-layer/--align-head set it aside."
)


def read_training_pairs(src: str, tgt: str, links: str) -> tuple[list, list]:
    """The (source words, target words) pairs and their (src, tgt) links, one per line of three
    line-parallel files; TfmError naming the file and line for a bad link or different line counts."""
    from tfm_cli.inference.alignment import parse_pharaoh
    from tfm_cli.textio.streams import iter_lines
    from tfm_cli.tokenization.words import split_words

    texts = [list(iter_lines(path)) for path in (src, tgt, links)]
    counts = [len(lines) for lines in texts]
    if len(set(counts)) > 1:
        raise TfmError(
            f"line counts differ: {src} has {counts[0]:,} lines, {tgt} {counts[1]:,} and {links} {counts[2]:,}; "
            "--src, --tgt and --links must be line-parallel"
        )
    pairs, all_links = [], []
    for number, (src_line, tgt_line, links_line) in enumerate(zip(*texts), start=1):
        src_words, tgt_words = split_words(src_line), split_words(tgt_line)
        try:
            pair_links = parse_pharaoh(links_line)
        except ValueError as error:
            raise TfmError(f"{links}:{number}: {error}; --links takes Pharaoh lines such as '0-0 1-2'") from None
        for source, target in pair_links:
            if source >= len(src_words) or target >= len(tgt_words):
                raise TfmError(
                    f"{links}:{number}: link {source}-{target} is beyond the pair's words ({len(src_words)} source, "
                    f"{len(tgt_words)} target, 0-based); the links must be of the very --src/--tgt lines"
                )
        pairs.append((src_words, tgt_words))
        all_links.append(pair_links)
    if not pairs:
        raise TfmError(f"{src}, {tgt} and {links} have no lines; give the pairs to learn from and their links")
    if not any(all_links):
        raise TfmError(
            f"{links}: none of its {len(pairs):,} lines has a link; give the statistical aligner's links of the "
            "--src/--tgt pairs (a failed aligner run writes blank lines)"
        )
    return pairs, all_links


def train_aligner(
    ctx: typer.Context,
    model: str = typer.Option(..., "-m", "--model", help="The source->target tfm checkpoint the aligner reads (it is not changed)."),
    src: str = typer.Option(..., "--src", help="Source sentences, whitespace-tokenized, one per line."),
    tgt: str = typer.Option(..., "--tgt", help="Target sentences, line-parallel to --src."),
    links: str = typer.Option(..., "--links", help="Word links to learn (Pharaoh, one line per pair), e.g. eflomal's grow-diag-final-and."),
    output: Path = typer.Option(..., "-o", "--output", help="The checkpoint to write: the model plus its aligner (atomically)."),
    epochs: int = typer.Option(12, "--epochs", help="Passes over the pairs."),
    batch_size: int = typer.Option(64, "--batch-size", help="Sentence pairs per training batch."),
    hidden: int = typer.Option(512, "--hidden", help="Width of the aligner's hidden layers."),
    dim: int = typer.Option(256, "--dim", help="Width of the aligner's queries and keys."),
    context: bool = typer.Option(True, "--context/--no-context", help="A self-attention layer over the target positions, so a word's link sees the words after it."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate (Adam; warm-up over 10% of the steps, cosine decay)."),
    held_out: float = typer.Option(0.02, "--held-out", help="Share of the pairs given once to hold out and measure the loss on after each epoch (at most 2,000 pairs; 0: none, train on all and keep the last epoch)."),
    patience: int = typer.Option(2, "--patience", help="Stop after this many epochs without a lower held-out loss; the best epoch's aligner is written."),
    seed: int = typer.Option(1, "--seed", help="Random seed (initialisation, held-out pairs and batch order)."),
    max_memory: float = typer.Option(8.0, "--max-memory", help="GiB the model's states may take in memory before the command stops (says so before using more)."),
    device: str = device_option(),
    threads: int = threads_option(),
    progress: bool = model_runs.progress_option("progress bars"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr (warnings and errors still show)."),
) -> None:
    """Train a word aligner on top of a translation model, toward given word links.

    The model is frozen: its states for each pair are computed once and the aligner (two small
    networks and an attention over them) learns the links from them. Prints nothing on stdout.
    """
    from tfm_cli.checkpoints.format import loaded_model, read_checkpoint, write_checkpoint
    from tfm_cli.devices import resolve_device
    from tfm_cli.textio.paths import check_input_file
    from tfm_cli.training.aligner_training import AlignerTrainingConfig

    config = AlignerTrainingConfig(epochs=epochs, batch_size=batch_size, hidden=hidden, dim=dim, context=context, lr=lr,
                                   seed=seed, held_out=held_out, patience=patience)
    config.check()
    if not (math.isfinite(max_memory) and max_memory > 0):
        raise TfmError(f"--max-memory must be positive (GiB), got {max_memory}")
    for path in (model, src, tgt, links):
        check_input_file(path)
    check_output(output, model)
    model_runs.set_up_process(ctx, threads)
    started = time.perf_counter()
    pairs, pair_links = read_training_pairs(src, tgt, links)
    checkpoint = read_checkpoint(model)
    loaded = loaded_model(model, checkpoint, resolve_device(device))
    with model_runs.progress_bar(model_runs.shows_progress(progress, quiet)) as bar:
        prepared, held = prepare_states(loaded, pairs, pair_links, config, max_memory, bar, quiet)
        trained = learn_links(prepared, held, loaded, config, bar, quiet)
    write_checkpoint(output, with_aligner(checkpoint, trained, config, Path(links).name, prepared.used, held.used))
    best = trained.epochs[trained.best_epoch - 1]
    measured = f"held-out loss {best.held_out_loss:.4f}" if held.used else f"training loss {best.training_loss:.4f}"
    print_info(
        f"wrote {output}: the model and the aligner of epoch {trained.best_epoch} of {len(trained.epochs)} ({measured} "
        f"per target token), learnt from {prepared.used:,} pairs in {time.perf_counter() - started:.0f} s",
        quiet=quiet,
    )


def check_output(output: Path, model: str) -> None:
    """Raise TfmError unless `output` can be written, now rather than after the training, and is not the model."""
    from tfm_cli.textio.atomic_files import temp_file_beside
    from tfm_cli.textio.paths import check_output_path

    check_output_path(output)
    if not output.exists() or output.is_file():  # written through a temp file beside it (textio.atomic_file)
        fd, probe = temp_file_beside(output)  # so a folder it cannot write in is named now, not after the training
        os.close(fd)
        os.unlink(probe)
    if output.exists() and output.resolve() == Path(model).resolve():
        raise TfmError(f"{output}: the output is also the model; write the model with its aligner to another file")


def prepare_states(
    loaded: LoadedModel, pairs: list[tuple[list[str], list[str]]], pair_links: list[list[tuple[int, int]]],
    config: AlignerTrainingConfig, max_memory: float, bar: Progress, quiet: bool,
) -> tuple[PreparedPairs, PreparedPairs]:
    """The model's states of the pairs, batched: (the pairs to train on, the held-out pairs), a task of `bar`
    while they are computed; says on stderr how many pairs they hold and how much memory they take."""
    from tfm_cli.training.aligner_training import held_out_split, prepare_batches

    train_rows, held_rows = held_out_split(pairs, pair_links, config.held_out, config.seed)
    task = bar.add_task("the model's states", total=len(pairs))
    sides = []
    for rows in (train_rows, held_rows):
        budget = int(max_memory * 2**30) - sum(side.bytes for side in sides)
        sides.append(prepare_batches(loaded, [pairs[i] for i in rows], [pair_links[i] for i in rows], config.batch_size,
                                     lambda n: bar.advance(task, n), max_bytes=budget))
    bar.remove_task(task)
    prepared, held = sides
    print_info(
        f"{prepared.used:,} of {len(pairs):,} pairs to learn from and {held.used:,} held out ({prepared.empty + held.empty:,} "
        f"with an empty side, {prepared.too_long + held.too_long:,} too long, {prepared.resplit + held.resplit:,} split "
        f"into other words by the tokenizer); their states take {(prepared.bytes + held.bytes) / 2**30:.2f} GiB",
        quiet=quiet,
    )
    return prepared, held


def learn_links(
    prepared: PreparedPairs, held: PreparedPairs, loaded: LoadedModel, config: AlignerTrainingConfig, bar: Progress,
    quiet: bool,
) -> TrainedAligner:
    """The aligner trained on the prepared batches, on the model's device (a task of `bar`), stopped early
    on the held-out pairs' loss; a line on stderr for each epoch's losses."""
    from tfm_cli.training.aligner_training import train_aligner as train

    steps_per_epoch = sum(batch.repeat for batch in prepared.batches)
    steps = bar.add_task("training the aligner", total=config.epochs * steps_per_epoch)

    def on_step(epoch: int, loss: float) -> None:
        bar.update(steps, advance=1, description=f"training the aligner, epoch {epoch + 1}/{config.epochs}")

    def on_epoch(result: EpochResult) -> None:
        held_out = "" if result.held_out_loss is None else f", held-out {result.held_out_loss:.4f}"
        print_info(f"aligner epoch {result.epoch}: loss per target token: training {result.training_loss:.4f}{held_out}"
                   f"{' (best)' if result.best and held.used else ''}", quiet=quiet)

    device = next(loaded.model.parameters()).device
    trained = train(prepared.batches, loaded.config, config, on_step, held.batches if held.used else None, on_epoch, device)
    bar.update(steps, completed=config.epochs * steps_per_epoch)
    return trained


def with_aligner(
    checkpoint: Checkpoint, trained: TrainedAligner, config: AlignerTrainingConfig, links_name: str, pairs_used: int,
    held_out_pairs: int,
) -> Checkpoint:
    """`checkpoint` with the trained aligner's weights, its alignment settings (the aligner, shift and null
    on) and, in its provenance, how the aligner was trained (losses per target token, 4 decimals)."""
    from tfm_cli.model.aligner import ALIGNER_PREFIX

    alignment = dict(checkpoint.alignment)
    alignment.update(aligner=True, aligner_hidden=config.hidden, aligner_dim=config.dim, aligner_context=config.context,
                     shift=True, null=True)
    best = trained.epochs[trained.best_epoch - 1]
    provenance = dict(checkpoint.provenance)
    provenance["aligner"] = {
        "links": links_name, "pairs": pairs_used, "held_out_pairs": held_out_pairs, "epochs": len(trained.epochs),
        "best_epoch": trained.best_epoch, "seed": config.seed, "final_loss": round(best.training_loss, 4),
        "held_out_loss": None if best.held_out_loss is None else round(best.held_out_loss, 4),
    }
    weights = {ALIGNER_PREFIX + name: param.detach().cpu().contiguous() for name, param in trained.aligner.named_parameters()}
    return dataclasses.replace(checkpoint, alignment=alignment, aligner_weights=weights, provenance=provenance)
