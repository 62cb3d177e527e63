"""The training loop: Trainer (update, log, validate, save, stop) and run_training, its entry point."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tfm_cli import __version__, distributed
from tfm_cli.checkpoints.format import encode_checkpoint, make_checkpoint, model_weights
from tfm_cli.config import AlignmentConfig, config_to_dict
from tfm_cli.corpus.batching import Batch, EpochSampler, SpecialIds, collate
from tfm_cli.corpus.sentence_concatenation import SentenceConcatenation
from tfm_cli.corpus.subword_sampling import SamplingSettings, SegmentationSampler
from tfm_cli.corpus.tokenized import TokenizedCorpus
from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer, count_parameters
from tfm_cli.recipe import Recipe
from tfm_cli.textio.atomic_files import atomic_write_bytes
from tfm_cli.training.events import (
    Event,
    LogEvent,
    PhaseEvent,
    SaveEvent,
    StartEvent,
    StepEvent,
    ValidEvent,
)
from tfm_cli.training.guided_alignment import AlignmentGuide, PieceTable
from tfm_cli.training.initialization import InitModel
from tfm_cli.training.log_window import LogWindow
from tfm_cli.training.moving_average import WeightMovingAverage
from tfm_cli.training.lr_schedules import train_schedule
from tfm_cli.training.objective import LossModule
from tfm_cli.training.preparation import PreparedData, prepare_on_rank0_first
from tfm_cli.training.run_dir import (
    BEST_CHECKPOINT,
    CONFIG_FILE,
    EMA_CHECKPOINT,
    LAST_CHECKPOINT,
    METRICS_FILE,
    STATE_FILE,
    step_checkpoint_path,
    step_checkpoints,
    truncate_metrics,
    write_metrics,
)
from tfm_cli.training.state import (
    Counters,
    encode_state,
    gather_rank_rng,
    restore_state,
)
from tfm_cli.training.step import (
    StepSettings,
    compile_module,
    cpu_bf16_notice,
    resolve_precision,
    train_step,
)
from tfm_cli.training.validation import ValidResult, validate

STOP_INTERRUPTED = "interrupted"
STOP_REASONS = ("max_steps", "max_epochs", "max_minutes", "patience", STOP_INTERRUPTED)


@dataclass(frozen=True)
class TrainResult:
    """How a training session ended."""

    step: int
    epoch: int
    reason: str  # max_steps, max_epochs, max_minutes, patience, interrupted (or prepared: --prepare-only)
    best_value: float | None
    best_step: int
    last_valid: ValidResult | None
    run_dir: Path


class Trainer:
    """Owns the model, optimizer and counters of one run, and runs the train/validate/save loop."""

    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        data: PreparedData,
        device: torch.device,
        on_event: Callable[[Event], None],
        world: World = World(),
        init: InitModel | None = None,
    ) -> None:
        config = recipe.train
        self.recipe, self.config, self.run_dir, self.data, self.device = recipe, config, run_dir, data, device
        self.on_event = on_event
        self.world = world
        self.init = init
        self.model_config = data.model_config
        self.special_ids = SpecialIds.of(self.model_config)
        # The model's initial weights come from the run's seed, so a run is reproducible end to end.
        torch.manual_seed(config.seed)
        self.model = Transformer(self.model_config)
        if init is not None:
            # Fine-tuning (--init) starts from the checkpoint's weights; the optimizer state starts fresh.
            self.model.load_state_dict(init.state)
        self.model = self.model.to(device).train()
        # Guided alignment (data.train_alignment): the head it supervises; None in an unguided run.
        self.alignment = None
        self.guide = None
        if data.train_links is not None:
            self.alignment = AlignmentConfig(layer=config.alignment_layer, head=config.alignment_head,
                                             shift=config.alignment_shift, null=config.alignment_null,
                                             full_context=config.alignment_full_context)
            self.alignment.check(self.model_config.n_dec_layers, self.model_config.n_heads,
                                 ("train.alignment_layer", "train.alignment_head"))
            self.guide = AlignmentGuide(data.train_links, PieceTable.of(data.src_tokenizer),
                                        PieceTable.of(data.tgt_tokenizer), self.special_ids,
                                        config.alignment_shift, config.alignment_null)
        self.loss_module: torch.nn.Module = LossModule(self.model, config.label_smoothing, self.alignment)
        if world.distributed:
            # Every rank built the same initial weights from the seed; dropout must differ between ranks.
            torch.manual_seed(config.derived_seed("dropout", world.rank))
            self.loss_module = torch.nn.parallel.DistributedDataParallel(
                self.loss_module, device_ids=[device] if device.type == "cuda" else None,
                forward_sync_buffers=False,  # the only buffers are fixed sinusoids
            )
        if config.compile:
            # Compiled around DDP, so DDP's bucketing splits the graph (TorchDynamo's DDPOptimizer).
            self.loss_module = compile_module(self.loss_module, on_event)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=0.0, betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps, weight_decay=config.weight_decay,
            fused=True,  # one kernel over all parameters instead of ~10 small ops per tensor
        )
        precision = resolve_precision(config.precision, device)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.settings = StepSettings(config.label_smoothing, config.clip_norm, dtype, device.type, self.alignment,
                                     config.alignment_weight)
        self.counters = Counters(world_size=world.world_size)
        # train.ema_decay > 0: the moving average of the weights, saved as checkpoint_ema (None when off).
        self.moving_average = WeightMovingAverage(self.model, config.ema_decay) if config.ema_decay > 0 else None
        self.agreed_elapsed = 0.0  # set by agreed_stop_reason before every update
        self.last_valid: ValidResult | None = None
        self.metrics_path = run_dir / METRICS_FILE
        parts = [(first, rows, weight) for (first, rows), weight in zip(data.train.part_rows(), data.train_weights)]
        # Subword regularization (data.subword_nbest > 1): each epoch has its own segmentation of the corpus.
        self.segmentations = None
        epoch_lengths = None
        if recipe.data.subword_nbest > 1:
            settings = SamplingSettings(recipe.data.subword_nbest, recipe.data.subword_alpha, recipe.data.max_length)
            self.segmentations = SegmentationSampler(data.train, data.src_tokenizer, data.tgt_tokenizer, settings,
                                                     config.seed, self.special_ids.eos_id)
            epoch_lengths = self.epoch_lengths
            first = recipe.data.subword_sampling_from_epoch
            which_epochs = "every epoch" if first == 1 else f"from epoch {first} on, every epoch"
            on_event(PhaseEvent(f"subword regularization: {which_epochs} draws each training sentence's segmentation "
                                f"from its {settings.nbest} best, with probability proportional to P ** {settings.alpha:g}"))
        # Sentence concatenation (data.concatenation_share > 0): each epoch joins a share of the pairs.
        self.concatenation = None
        if recipe.data.concatenation_share > 0:
            self.concatenation = SentenceConcatenation(recipe.data.concatenation_share, recipe.data.max_length,
                                                       config.seed)
            epoch_lengths = self.epoch_lengths
            on_event(PhaseEvent(f"sentence concatenation: every epoch trains {recipe.data.concatenation_share:.0%} "
                                "of the pairs joined to another random pair"))
        self.sampler = EpochSampler(
            data.train.src_lengths, data.train.tgt_lengths, config.max_tokens, config.seed, config.update_freq, world,
            parts, epoch_lengths,
        )

    # -- data order ------------------------------------------------------------------------------

    def next_update(self) -> Iterator[list[Batch]]:
        """Yield this rank's batches of each update forever, advancing counters.epoch/batch_in_epoch."""
        counters = self.counters
        while True:
            epoch, position = self.sampler.position(counters.epoch, counters.batch_in_epoch)
            rows, counters.epoch, counters.batch_in_epoch = self.sampler.update(epoch, position)
            corpus = self.epoch_corpus(epoch)
            batches = [collate(corpus, indices, self.special_ids) for indices in rows]
            if self.guide is not None:
                batches = [self.guide.annotate(batch) for batch in batches]
            yield [batch.to(self.device) for batch in batches]

    def epoch_corpus(self, epoch: int) -> TokenizedCorpus:
        """The training corpus of epoch `epoch` (0-based): the prepared one, segmented anew where subwords are
        sampled in that epoch (data.subword_nbest > 1, from data.subword_sampling_from_epoch on), then with a
        share of its pairs joined (data.concatenation_share > 0)."""
        corpus = self.data.train
        if self.segmentations is not None and epoch + 1 >= self.recipe.data.subword_sampling_from_epoch:
            corpus = self.segmentations.epoch_corpus(epoch)
        if self.concatenation is not None:
            corpus = self.concatenation.epoch_corpus(corpus, epoch)
        return corpus

    def epoch_lengths(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(src, tgt) (N,) lengths of epoch `epoch`'s corpus, EOS included."""
        corpus = self.epoch_corpus(epoch)
        return corpus.src_lengths, corpus.tgt_lengths

    def updates_per_epoch(self) -> int:
        """Optimizer updates in one epoch (epoch 0's: later epochs differ by a few where corpus weights or
        subword sampling change what an epoch holds)."""
        return self.sampler.updates_per_epoch()

    def planned_steps(self) -> int | None:
        """The step at which max_steps or max_epochs ends training (the smaller), or None if neither is set."""
        limits = []
        if self.config.max_steps:
            limits.append(self.config.max_steps)
        if self.config.max_epochs:
            limits.append(self.config.max_epochs * self.updates_per_epoch())
        return min(limits) if limits else None

    # -- saving ----------------------------------------------------------------------------------

    def head_settings(self) -> dict[str, Any]:
        """The supervised head as checkpoint alignment settings (AlignmentConfig fields; a trained
        aligner's fields left out: a guided run has none)."""
        return {key: value for key, value in asdict(self.alignment).items() if not key.startswith("aligner")}

    def provenance(self) -> dict[str, Any]:
        """What every checkpoint records about how it was made (the weights' step, epoch, recipe and last
        validation)."""
        valid = None
        if self.last_valid is not None:
            valid = {"loss": self.last_valid.loss, "ppl": self.last_valid.ppl, "bleu": self.last_valid.bleu,
                     "bleu_signature": self.last_valid.bleu_signature}
        provenance = {
            "tfm_version": __version__,
            "step": self.counters.step,
            "epoch": self.counters.epoch,
            "recipe": self.recipe.to_dict(),
            "valid": valid,
        }
        if self.init is not None:
            provenance["init"] = self.init.record.to_dict()
        return provenance

    def checkpoint_bytes(self, weights: dict[str, torch.Tensor] | None = None,
                         extra_provenance: dict[str, Any] | None = None) -> bytes:
        """The current weights (or `weights`, by parameter name) as a self-contained checkpoint (see
        tfm_cli.checkpoints.format), its provenance extended by `extra_provenance`.

        Its decoding defaults are the recipe's [decode] settings, over those of the --init checkpoint
        (an imported model's generation settings): the model decodes as tuned unless flags say otherwise.
        A guided run records its supervised head as the checkpoint's alignment; an unguided one records
        none (fine-tuning without guidance moves the heads of an --init checkpoint that had one).
        """
        decode_defaults = {**(self.init.decode_defaults if self.init is not None else {}), **self.recipe.decode}
        checkpoint = make_checkpoint(
            self.model_config, model_weights(self.model) if weights is None else weights, self.data.src_tokenizer,
            self.data.tgt_tokenizer, self.provenance() | (extra_provenance or {}), decode_defaults,
            alignment=None if self.alignment is None else self.head_settings(),
        )
        return encode_checkpoint(checkpoint)

    def save(self) -> None:
        """Write checkpoint_STEP, checkpoint_last (and checkpoint_ema, with train.ema_decay) and then the
        training state, each atomically (rank 0 only).

        The state is written last and holds its own copy of the weights, so a kill at any moment
        leaves a state that resumes exactly (losing at most the updates since the previous save).
        Every rank must call it: the ranks' RNG states are gathered first, and no rank goes on before
        the files are written. Weights come from the unwrapped Transformer (no DDP `module.` prefix).
        """
        rank_rng = gather_rank_rng(self.world, self.device)
        if self.world.is_main:
            self.write_checkpoints(rank_rng)
        distributed.barrier(self.world)

    def write_checkpoints(self, rank_rng: dict[str, torch.Tensor]) -> None:
        """save()'s files, written by rank 0."""
        data = self.checkpoint_bytes()
        step_path = step_checkpoint_path(self.run_dir, self.counters.step)
        last_path = self.run_dir / LAST_CHECKPOINT
        atomic_write_bytes(step_path, data)
        atomic_write_bytes(last_path, data)
        written = [str(step_path), str(last_path)]
        if self.moving_average is not None:
            ema_path = self.run_dir / EMA_CHECKPOINT
            average = {"weights": "exponential moving average", "ema_decay": self.config.ema_decay}
            atomic_write_bytes(ema_path, self.checkpoint_bytes(self.moving_average.weights(), average))
            written.append(str(ema_path))
        state = encode_state(self.model, self.optimizer, self.scaler, self.counters, rank_rng, self.moving_average)
        atomic_write_bytes(self.run_dir / STATE_FILE, state)
        if self.config.keep_last:
            for old in step_checkpoints(self.run_dir)[: -self.config.keep_last]:
                old.unlink(missing_ok=True)
        self.on_event(SaveEvent(self.counters.step, written))

    def write_config(self) -> None:
        """Write the resolved recipe, model config and tokenizer origin to config.json in the run directory.

        A run started with --init records the checkpoint it started from under `init` (path, sha256).
        """
        record = {
            "tfm_version": __version__,
            "recipe": self.recipe.to_dict(),
            "model_config": config_to_dict(self.model_config),
        }
        if self.init is not None:
            record["init"] = self.init.record.to_dict()
        atomic_write_bytes(self.run_dir / CONFIG_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())

    # -- validation ------------------------------------------------------------------------------

    def validate_on_main(self) -> None:
        """Rank 0 validates (the whole validation set, as a single process would); the other ranks wait.

        Only rank 0's counters track the best value; stop decisions are rank 0's (see agreed_stop_reason).
        """
        if self.world.is_main:
            self.data.check_unchanged(wait=True)  # never validate on text that changed under its cache entry
            self.run_validation()
        distributed.barrier(self.world)

    def run_validation(self) -> None:
        """Validate, track the best value (writing checkpoint_best), count validations without improvement."""
        started = time.monotonic()
        result = validate(
            self.model, self.data.valid, self.data.valid_references, self.data.tgt_tokenizer,
            self.config, self.settings, self.device,
        )
        self.last_valid = result
        value = result.bleu if self.config.best_metric == "bleu" else result.loss
        best = self.counters.best_value
        improved = best is None or (value > best if self.config.best_metric == "bleu" else value < best)
        if improved:
            self.counters.best_value, self.counters.best_step, self.counters.bad_validations = value, self.counters.step, 0
            atomic_write_bytes(self.run_dir / BEST_CHECKPOINT, self.checkpoint_bytes())
        else:
            self.counters.bad_validations += 1
        event = ValidEvent(
            step=self.counters.step, epoch=self.counters.epoch + 1, loss=result.loss, nll_loss=result.nll_loss,
            ppl=result.ppl, bleu=result.bleu, bleu_signature=result.bleu_signature, best=improved,
            best_value=self.counters.best_value, best_step=self.counters.best_step,
            bad_validations=self.counters.bad_validations, seconds=time.monotonic() - started,
        )
        write_metrics(self.metrics_path, {"kind": "valid", **asdict(event)})
        self.on_event(event)

    # -- stopping --------------------------------------------------------------------------------

    def stop_reason(self, should_stop: Callable[[], bool]) -> str | None:
        """Why training should stop now, or None to go on."""
        config, counters = self.config, self.counters
        self.data.check_unchanged(wait=False)
        if should_stop():
            return STOP_INTERRUPTED
        if config.max_steps and counters.step >= config.max_steps:
            return "max_steps"
        if config.max_epochs and counters.epoch >= config.max_epochs:
            return "max_epochs"
        if config.max_minutes and counters.elapsed >= config.max_minutes * 60:
            return "max_minutes"
        if config.patience and counters.bad_validations >= config.patience:
            return "patience"
        return None

    def agreed_stop_reason(self, should_stop: Callable[[], bool]) -> str | None:
        """stop_reason as rank 0 sees it, or interrupted if any rank was asked to stop; the same on all ranks.

        Also sets agreed_elapsed, the training time the learning-rate schedule counts: the largest
        of the ranks' own clocks (in milliseconds), so that every rank uses the same learning rate.
        """
        reason = self.stop_reason(should_stop)
        if not self.world.distributed:
            self.agreed_elapsed = self.counters.elapsed
            return reason
        code = STOP_REASONS.index(reason) + 1 if reason is not None and self.world.is_main else 0
        votes = torch.tensor([code, int(reason == STOP_INTERRUPTED), round(self.counters.elapsed * 1000)],
                             device=self.device)
        code, interrupted, elapsed_ms = distributed.all_reduce_max(votes, self.world).tolist()
        self.agreed_elapsed = elapsed_ms / 1000
        if interrupted:
            return STOP_INTERRUPTED
        return STOP_REASONS[code - 1] if code else None

    def budget_used(self) -> float:
        """The fraction of the training budget spent: the largest of steps done / the step or epoch
        limit and agreed training time / max_minutes (0 with no such limit)."""
        fractions = []
        planned = self.planned_steps()
        if planned:
            fractions.append(self.counters.step / planned)
        if self.config.max_minutes:
            fractions.append(self.agreed_elapsed / (self.config.max_minutes * 60))
        return max(fractions, default=0.0)

    def eta(self, seconds_per_step: float) -> float | None:
        """Seconds until the nearest step, epoch or time limit, at the current speed."""
        estimates = []
        planned = self.planned_steps()
        if planned is not None:
            estimates.append(max(planned - self.counters.step, 0) * seconds_per_step)
        if self.config.max_minutes:
            estimates.append(max(self.config.max_minutes * 60 - self.counters.elapsed, 0.0))
        return min(estimates) if estimates else None

    # -- the loop --------------------------------------------------------------------------------

    def train(self, should_stop: Callable[[], bool]) -> TrainResult:
        """Train until a limit or `should_stop()`; validate, log and save on schedule and at the end."""
        config, counters = self.config, self.counters
        schedule = train_schedule(config, self.model_config.d_model)
        reason = self.agreed_stop_reason(should_stop)
        updates = self.next_update()
        window = LogWindow()
        clock = time.monotonic()
        while reason is None:
            distributed.check_fault_hook(self.world, counters.step + 1)
            batches = next(updates)
            lr = schedule.rate(counters.step + 1, self.budget_used())
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            stats = train_step(self.loss_module, self.optimizer, self.scaler, batches, self.settings, self.world)
            # A skipped update (inf/nan) leaves the weights, the step counter and so the learning-rate
            # schedule where they were (as fairseq does); its batch is consumed all the same.
            applied = not (stats.skipped or stats.nonfinite)
            counters.step += applied
            if applied and self.moving_average is not None:
                self.moving_average.update(self.model, counters.step)
            counters.overflow_steps += stats.skipped
            counters.nonfinite_steps += stats.nonfinite
            counters.nonfinite_in_a_row = counters.nonfinite_in_a_row + 1 if stats.nonfinite else 0
            window.add(stats, batches)
            now = time.monotonic()
            counters.elapsed += now - clock
            clock = now
            # Periodic work is due when the step counter reaches a multiple, not again while it stands.
            if applied and counters.step % config.log_every == 0:
                self.log(window, lr)
                window = LogWindow()
            if config.max_bad_steps and counters.nonfinite_in_a_row >= config.max_bad_steps:
                # Skipped updates left the weights untouched: they are the last good ones, so save them.
                if window.steps:
                    self.log(window, lr)
                self.save()
                raise TfmError(
                    f"training diverged: {counters.nonfinite_in_a_row} updates in a row had an inf/nan loss or "
                    f"gradient (after step {counters.step}); the last good weights are in "
                    f"{self.run_dir}/checkpoint_last.safetensors; lower train.lr or raise train.warmup_steps"
                )
            validated = saved = False
            if self.data.valid is not None and applied and counters.step % config.valid_every == 0:
                self.validate_on_main()
                validated = True
            reason = self.agreed_stop_reason(should_stop)
            if self.data.valid is not None and reason not in (None, STOP_INTERRUPTED) and not validated:
                self.validate_on_main()
                validated = True
            if (applied and counters.step % config.save_every == 0) or reason is not None:
                self.save()
                saved = True
            if validated or saved:
                # Validation and saving are not training time for tokens/s; they count towards max_minutes.
                now = time.monotonic()
                counters.elapsed += now - clock
                window.exclude(now - clock)
                clock = now
            self.on_event(StepEvent(counters.step, counters.epoch))
        return TrainResult(
            step=counters.step, epoch=counters.epoch, reason=reason, best_value=counters.best_value,
            best_step=counters.best_step, last_valid=self.last_valid, run_dir=self.run_dir,
        )

    def log(self, window: LogWindow, lr: float) -> None:
        """Emit (and append to metrics.jsonl) the figures of the last log interval, summed over all ranks.

        Every rank must call it (the sums are all-reduced); only rank 0 writes and emits.
        """
        window.reduce(self.world, self.device)
        if not self.world.is_main:
            return
        figures = window.figures()
        seconds_per_step = figures["seconds"] / max(window.steps, 1)
        event = LogEvent(
            step=self.counters.step,
            epoch=self.counters.epoch + (1 if self.counters.batch_in_epoch else 0),
            loss=figures["loss"], nll_loss=figures["nll_loss"],
            ppl=None if figures["nll_loss"] is None else math.exp(min(figures["nll_loss"], 100.0)),
            lr=lr, grad_norm=figures["grad_norm"],
            tgt_tokens_per_s=figures["tgt_tokens_per_s"], tokens_per_s=figures["tokens_per_s"],
            padding=figures["padding"], elapsed=self.counters.elapsed, eta=self.eta(seconds_per_step),
            overflow_steps=self.counters.overflow_steps, nonfinite_steps=self.counters.nonfinite_steps,
            alignment_loss=figures["alignment_loss"],
        )
        write_metrics(self.metrics_path, {"kind": "train", **asdict(event)})
        self.on_event(event)


def run_training(
    recipe: Recipe,
    run_dir: Path,
    resume: bool = False,
    device: str | torch.device = "cpu",
    on_event: Callable[[Event], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    world: World = World(),
    init: InitModel | None = None,
    prepare_only: bool = False,
) -> TrainResult:
    """Train `recipe` in `run_dir` (created if needed), or continue it with `resume`.

    With `prepare_only`, stop once the tokenizers and corpora are prepared (reason "prepared", step 0).

    A run started from a checkpoint (`tfm train --init`; initialization.load_run_recipe) passes its
    InitModel as `init`, on resume too: model config, tokenizers and first weights come from it.

    Trains or loads the tokenizers, prepares the tokenized corpora in the cache folder (data.cache_dir,
    or run_dir/cache), then trains until a limit or `should_stop()`. Returns how it ended.
    With a distributed `world` (torchrun), this process joins the process group (gloo on CPU, NCCL on
    cuda:LOCAL_RANK) and trains with DistributedDataParallel; only rank 0 prepares the run directory
    first, emits events and writes files. run_dir must be on storage all nodes share.
    """
    device = distributed.rank_device(world, torch.device(device))
    distributed.init_process_group(world, device, recipe.train.dist_timeout)
    try:
        return train_in_world(recipe, Path(run_dir), resume, device, on_event, should_stop, world, init, prepare_only)
    finally:
        distributed.destroy_process_group(world)


def train_in_world(
    recipe: Recipe,
    run_dir: Path,
    resume: bool,
    device: torch.device,
    on_event: Callable[[Event], None] | None,
    should_stop: Callable[[], bool] | None,
    world: World,
    init: InitModel | None = None,
    prepare_only: bool = False,
) -> TrainResult:
    """run_training once the process group (if any) is up."""
    on_event = (on_event if world.is_main else None) or (lambda event: None)
    should_stop = should_stop or (lambda: False)
    config = recipe.train
    if config.precision == "fp16" and device.type != "cuda":
        raise TfmError(f"train.precision=fp16 needs a CUDA device (--device cuda); use bf16 or fp32 on {device}")
    if (notice := cpu_bf16_notice(config.precision, device)) is not None:
        on_event(PhaseEvent(notice))
    data = prepare_on_rank0_first(recipe, run_dir, resume, device, world, on_event, init, should_stop)
    if prepare_only:
        data.check_unchanged(wait=True)
        return TrainResult(step=0, epoch=0, reason="prepared", best_value=None, best_step=0, last_valid=None,
                           run_dir=run_dir)
    trainer = Trainer(recipe, run_dir, data, device, on_event, world, init)
    if init is not None and not resume:
        on_event(PhaseEvent(
            f"initialised from {init.record.path} (sha256 {init.record.sha256[:12]}...); optimizer state and "
            "step counter start fresh"
        ))
    # Every rank counts the batches here, so fewer batches than ranks stops them all before training.
    updates_per_epoch = trainer.updates_per_epoch()
    if resume:
        trainer.counters = restore_state(run_dir / STATE_FILE, trainer.model, trainer.optimizer, trainer.scaler, world,
                                         trainer.moving_average)
        if world.is_main:
            damaged = truncate_metrics(trainer.metrics_path, trainer.counters.step)
            if damaged:
                on_event(PhaseEvent(f"dropped {damaged} damaged line(s) of {trainer.metrics_path.name} (not JSON records)"))
    if world.is_main:
        trainer.write_config()
    distributed.barrier(world)
    on_event(StartEvent(
        step=trainer.counters.step, epoch=trainer.counters.epoch, resumed=resume,
        planned_steps=trainer.planned_steps(), updates_per_epoch=updates_per_epoch,
        n_parameters=count_parameters(trainer.model), device=str(device), model_config=trainer.model_config,
    ))
    return trainer.train(should_stop)
