"""`tfm train`: train a Transformer from a TOML recipe into a run directory, or resume one."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import List, NoReturn, Optional

import typer

from tfm_cli.commands.options import apply_threads, device_option, threads_option
from tfm_cli.console import print_info, print_warning, stderr_console

EPILOG = (
    "Examples:\n\n"
    "  tfm train recipes/multi30k/de-en.toml --run runs/de-en\n\n"
    "  tfm train recipes/tiny.toml --run runs/tiny --set train.max_steps=200 --set model.dropout=0.2\n\n"
    "  tfm train --run runs/de-en --resume --set train.max_steps=40000\n\n"
    "  tfm train big.toml --run runs/big --prepare-only --set data.cache_dir=~/tfm-cache\n\n"
    "  tfm train recipes/tiny.toml --init runs/base/checkpoint_best.safetensors --run runs/tuned "
    "--set data.train_src=in-domain.de --set data.train_tgt=in-domain.en"
)


class StopRequest:
    """Set by SIGINT/SIGTERM: the loop finishes its update, saves, and returns. A second signal aborts.

    Either way `tfm train` then exits as any command that signal stops: 130 (SIGINT) or 143 (SIGTERM).
    """

    def __init__(self, quiet: bool) -> None:
        self.signum: int | None = None  # the signal that asked for the stop
        self.aborted = False
        self.quiet = quiet
        self.previous: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, frame) -> None:
        """Signal handler: first signal asks for a clean stop, the second one interrupts at once."""
        if self.signum is not None:
            self.aborted = True
            self.interrupt(signum)
        self.signum = signum
        print_warning(f"{signal.Signals(signum).name}: saving a checkpoint after this update (again to abort)")

    def interrupt(self, signum: int) -> NoReturn:
        """Raise what `signum` raises outside training: its previous handler's exception (tfm's main
        installs one for SIGTERM, whose exception exits 143), else KeyboardInterrupt."""
        handler = self.previous.get(signum)
        if callable(handler):
            handler(signum, None)
        raise KeyboardInterrupt

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (only possible from the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self.handle)

    def restore(self) -> None:
        """Put the previous handlers back."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


class TrainDisplay:
    """Renders training events on stderr: a live progress bar on a terminal, plain lines otherwise."""

    def __init__(self, quiet: bool, run_dir: Path) -> None:
        self.console = stderr_console(quiet=quiet)
        self.quiet = quiet
        self.run_dir = run_dir
        self.progress = None
        self.task = None
        self.last_stats = ""
        self.preparation = None
        self.preparation_task = None
        self.last_plain_progress = 0.0

    def __call__(self, event) -> None:
        from tfm_cli.training import events

        if self.quiet:
            return
        handler = {
            events.PhaseEvent: self.phase,
            events.PrepareEvent: self.preparing,
            events.DataEvent: self.data,
            events.StartEvent: self.start,
            events.StepEvent: self.step,
            events.LogEvent: self.log,
            events.ValidEvent: self.valid,
            events.SaveEvent: self.saved,
        }[type(event)]
        handler(event)

    def print(self, text: str, style: str | None = None) -> None:
        """One line on stderr (above the progress bar, if there is one)."""
        self.console.print(text, style=style, markup=False, highlight=False)

    def phase(self, event) -> None:
        self.stop_preparing()
        self.print(event.message, style="dim")

    def preparing(self, event) -> None:
        """A progress bar while a corpus is read and tokenized (a line every PLAIN_PROGRESS_SECONDS off a terminal)."""
        progress = event.progress
        rate = progress.pairs / progress.seconds if progress.seconds > 0 else 0.0
        done = progress.bytes_done / max(progress.bytes_total, 1)
        eta = progress.seconds * (1 - done) / done if done > 0 else None
        stats = f"{progress.pairs:,} pairs, {rate:,.0f} pairs/s" + (f", ETA {format_seconds(eta)}" if eta else "")
        if not self.console.is_terminal:
            if progress.seconds - self.last_plain_progress >= PLAIN_PROGRESS_SECONDS:
                self.last_plain_progress = progress.seconds
                self.print(f"preparing the {progress.name} data: {done:.0%} ({stats})", style="dim")
            return
        if self.preparation is None:
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
            )

            self.preparation = Progress(
                TextColumn(f"{progress.name} data"), BarColumn(bar_width=24), TaskProgressColumn(),
                TextColumn("{task.fields[stats]}"), console=self.console, transient=True,
            )
            self.preparation_task = self.preparation.add_task("prepare", total=progress.bytes_total, stats="")
            self.preparation.start()
        self.preparation.update(self.preparation_task, completed=progress.bytes_done, stats=stats)

    def stop_preparing(self) -> None:
        """Remove the preparation progress bar, if one is shown."""
        if self.preparation is not None:
            self.preparation.stop()
            self.preparation = None
        self.last_plain_progress = 0.0

    def data(self, event) -> None:
        self.stop_preparing()
        cached = " (prepared before)" if event.from_cache else ""
        if event.changed:
            print_warning(f"{event.name} data changed since it was prepared ({'; '.join(event.changed)}): prepared again")
        read = sum(stats.read for _, stats in event.parts)
        kept = sum(stats.kept for _, stats in event.parts)
        self.print(
            f"{event.name} data: {read:,} pairs read, {kept:,} kept; {event.src_tokens:,} source / "
            f"{event.tgt_tokens:,} target tokens{cached}"
        )
        for files, stats in event.parts:
            where = f"{event.name} data ({files})" if len(event.parts) > 1 else f"{event.name} data"
            if len(event.parts) > 1:
                self.print(f"  {files}: {stats.read:,} pairs read, {stats.kept:,} kept")
            skipped = skip_reasons(stats, event.filters)
            if skipped:
                print_warning(f"{where}: skipped {', '.join(skipped)}")

    def start(self, event) -> None:
        self.stop_preparing()
        config = event.model_config
        shared = ", shared embeddings" if config.share_embeddings else ""
        self.print(
            f"model: {event.n_parameters / 1e6:.2f}M parameters, d_model {config.d_model}, "
            f"{config.n_enc_layers}+{config.n_dec_layers} layers, vocab {config.src_vocab_size}/"
            f"{config.tgt_vocab_size}{shared}; device {event.device}; {event.updates_per_epoch:,} updates per epoch"
        )
        if event.resumed:
            self.print(f"resumed at step {event.step:,} (epoch {event.epoch + 1})")
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
            )

            self.progress = Progress(
                BarColumn(bar_width=16), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
                console=self.console, transient=True,
            )
            self.task = self.progress.add_task("train", total=event.planned_steps, completed=event.step, stats="")
            self.progress.start()

    def step(self, event) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=event.step)

    def log(self, event) -> None:
        if event.loss is None:
            skipped = event.overflow_steps + event.nonfinite_steps
            self.print(f"step {event.step:,} | every update of this interval was skipped ({skipped} in all so far)")
            return
        eta = f" | ETA {format_seconds(event.eta)}" if event.eta is not None else ""
        norm = f" | gnorm {event.grad_norm:.2f}" if event.grad_norm is not None else ""
        if event.overflow_steps:
            norm += f" | {plural(event.overflow_steps, 'fp16 overflow')} skipped"
        alignment = f" | align {event.alignment_loss:.3f}" if event.alignment_loss is not None else ""
        stats = (
            f"epoch {event.epoch} | loss {event.loss:.3f}{alignment} | ppl {event.ppl:.1f} | lr {event.lr:.2e}{norm} | "
            f"{event.tgt_tokens_per_s:,.0f} tgt tok/s | pad {event.padding:.1%}{eta}"
        )
        if self.progress is not None:
            # The bar line is short enough for an 80-column terminal; ppl and gnorm are in metrics.jsonl.
            short = (
                f"ep {event.epoch} | loss {event.loss:.3f} | lr {event.lr:.1e} | "
                f"{event.tgt_tokens_per_s / 1000:.1f}k tok/s | pad {event.padding:.0%}{eta}"
            )
            self.progress.update(self.task, stats=short)
        else:
            self.print(f"step {event.step:,} | {stats}")

    def valid(self, event) -> None:
        bleu = f" | BLEU {event.bleu:.2f}" if event.bleu is not None else ""
        best = " (new best)" if event.best else f" (best {event.best_value:.2f} at step {event.best_step:,})"
        self.print(
            f"valid step {event.step:,} | epoch {event.epoch} | loss {event.loss:.3f} | ppl {event.ppl:.2f}{bleu}"
            f"{best} | {event.seconds:.0f}s",
            style="bold",
        )

    def saved(self, event) -> None:
        self.print(f"saved {Path(event.paths[0]).name}", style="dim")

    def close(self) -> None:
        self.stop_preparing()
        if self.progress is not None:
            self.progress.stop()


PLAIN_PROGRESS_SECONDS = 30.0


def skip_reasons(stats, filters) -> list[str]:
    """What filtering skipped, in words ("2 pairs with an empty side", ...), each filter's in its own words,
    then the reader's invalid UTF-8; empty if nothing."""
    reasons = [(stats.skipped.get(item.reason, 0), item.description) for item in filters] + [
        (stats.invalid_utf8, "with invalid UTF-8 (data.invalid_utf8 = \"skip\"; first at "
                             + ", ".join(stats.invalid_examples) + ")"),
    ]
    return [f"{plural(count, 'pair')} {why}" for count, why in reasons if count]


def plural(count: int, noun: str) -> str:
    """'1 pair', '2 pairs'."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def format_seconds(seconds: float) -> str:
    """H:MM:SS."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def train(
    ctx: typer.Context,
    recipe: Optional[str] = typer.Argument(
        None, help="A TOML recipe (tables data, tokenizer, model, train); optional with --resume."
    ),
    run: str = typer.Option(
        ..., "--run", "--run-dir",
        help="Run directory: checkpoints, metrics.jsonl, config.json, caches. (Under torchrun write --run-dir: "
        "torchrun's own parser takes --run for its --run-path.)",
    ),
    overrides: List[str] = typer.Option(
        [], "--set", help="Override a recipe setting: section.key=value (TOML value), e.g. train.max_tokens=2048."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --run from its last saved state."),
    init: Optional[str] = typer.Option(
        None, "--init",
        help="Fine-tune: start a new run from this checkpoint's weights, model config and tokenizers (the "
        "optimizer and step counter start fresh). The recipe may change dropout rates, not the architecture.",
    ),
    device: str = device_option(),
    threads: int = threads_option(),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress or messages on stderr (errors still)."),
    compile_model: bool = typer.Option(
        False, "--compile", help="torch.compile the training step (same as --set train.compile=true)."
    ),
    prepare_only: bool = typer.Option(
        False, "--prepare-only",
        help="Train the tokenizers and prepare the corpora into the cache folder (data.cache_dir), then stop: "
        "a later `tfm train` with the same data starts from them in seconds.",
    ),
) -> None:
    """Train a Transformer from a recipe, with checkpoints, validation BLEU and exact resume."""

    from tfm_cli.allocator import keep_all_freed_memory
    from tfm_cli.distributed import world_from_env
    from tfm_cli.training.initialization import load_run_recipe
    from tfm_cli.training.trainer import run_training

    keep_all_freed_memory()  # every update frees and re-allocates the same large blocks (see allocator.py)
    apply_threads(ctx, threads)
    run_dir = Path(run)
    if compile_model:
        overrides = [*overrides, "train.compile=true"]
    resolved, init_model = load_run_recipe(
        Path(recipe) if recipe is not None else None, overrides, run_dir, resume,
        init_path=Path(init) if init is not None else None,
    )
    from tfm_cli.devices import resolve_device

    target_device = resolve_device(device)
    world = world_from_env()
    # Under torchrun only rank 0 talks to the user; the other ranks report errors only.
    quiet = quiet or not world.is_main
    stop = StopRequest(quiet)
    display = TrainDisplay(quiet, run_dir)
    stop.install()
    try:
        result = run_training(resolved, run_dir, resume=resume, device=target_device,
                              on_event=display, should_stop=stop, world=world, init=init_model,
                              prepare_only=prepare_only)
    except KeyboardInterrupt:
        if stop.signum is None or stop.aborted:
            raise
        stop.interrupt(stop.signum)  # a stop asked for while preparing the data ends there (no update to save)
    finally:
        display.close()
        stop.restore()
    # A stopped run exits as any command the signal stops (128 + its number), after its clean save.
    exit_code = 0 if stop.signum is None else 128 + stop.signum
    best = ""
    if result.best_value is not None:
        metric = "BLEU" if resolved.train.best_metric == "bleu" else "loss"
        best = f"; best {metric} {result.best_value:.2f} at step {result.best_step:,}"
    if result.reason == "prepared":
        print_info(f"prepared the data for {run_dir}; train with the same recipe and --run", quiet=quiet)
    elif result.reason == "interrupted" and result.step == 0:
        print_info("interrupted before the first update; nothing to save", quiet=quiet)
    elif result.reason == "interrupted":
        print_info(
            f"interrupted: saved step {result.step:,} in {run_dir}{best}; continue with "
            f"`tfm train --run {run_dir} --resume`",
            quiet=quiet,
        )
    else:
        print_info(
            f"done ({result.reason}) at step {result.step:,} after {plural(result.epoch, 'full epoch')}{best}; "
            f"checkpoints in {run_dir}",
            quiet=quiet,
        )
    if exit_code:
        raise typer.Exit(exit_code)
