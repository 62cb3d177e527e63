"""Training: label-smoothed loss, the inverse-sqrt schedule, the train/validate loop, checkpoints, exact resume.

Library code: it never prints. Progress goes to an `on_event` callback and to metrics.jsonl in the
run directory; stopping early is asked for through a `should_stop` callback (the CLI's signal handler).
The training state is safetensors tensors plus JSON metadata: nothing is pickled.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from tfm_cli import __version__
from tfm_cli.checkpoint import Checkpoint, encode_checkpoint, model_weights
from tfm_cli.config import DecodeConfig, ModelConfig, Recipe, TrainConfig, config_to_dict
from tfm_cli import distributed
from tfm_cli.data import (
    Batch,
    FilterStats,
    ParallelText,
    TokenizedCorpus,
    batch_indices,
    collate,
    count_tokens,
    epoch_generator,
    load_or_tokenize,
    read_parallel,
)
from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer, count_parameters
from tfm_cli.model.kernels import packed_weights
from tfm_cli.translation import BatchingConfig, search_batches
from tfm_cli.textio import atomic_write_bytes, remove_stale_temp_files
from tfm_cli.tokenizer import Tokenizer, train_sentencepiece

STATE_FILE = "train_state.safetensors"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
# The files a run writes atomically, as regular expressions over their names (on resume, the temp
# files of a killed save are found by these).
RUN_FILES = "|".join([
    r"checkpoint_(?:\d+|last|best)\.safetensors",
    r"spm(?:\.src|\.tgt)?\.(?:model|vocab)",  # the run's tokenizers
    *map(re.escape, (STATE_FILE, CONFIG_FILE, METRICS_FILE)),
])
CACHE_FILES = r"[\w.-]+\.safetensors"  # the tokenized corpora in run_dir/cache
CACHE_DIR = "cache"
STATE_FORMAT = "tfm-train-state"
STATE_VERSION = 1
STOP_INTERRUPTED = "interrupted"
STOP_REASONS = ("max_steps", "max_epochs", "max_minutes", "patience", STOP_INTERRUPTED)


# ----------------------------------------------------------------------------------------------
# Schedule and loss


def learning_rate(step: int, d_model: int, warmup_steps: int, peak_lr: float) -> float:
    """The learning rate of update `step` (1-based): linear warmup, then inverse square root decay.

    Section 5.3: lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) when peak_lr = 0. With
    peak_lr > 0, the same shape scaled to reach peak_lr at step = warmup (warmup 0: pure decay from step 1).
    """
    step = max(step, 1)
    if peak_lr == 0:
        return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    if warmup_steps == 0:
        return peak_lr * step**-0.5
    return peak_lr * min(step / warmup_steps, (warmup_steps / step) ** 0.5)


def label_smoothed_loss(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy (section 5.4) over real target positions only.

    logits: (N, V), targets: (N,) int64. The smoothed target puts 1 - epsilon on the reference and
    epsilon spread uniformly over all V classes (torch's `label_smoothing` convention).
    Returns (smoothed loss sum, plain negative log-likelihood sum), both float32 scalars; only the
    first carries a gradient (LabelSmoothedCrossEntropy).
    """
    return LabelSmoothedCrossEntropy.apply(logits, targets, epsilon)


class LabelSmoothedCrossEntropy(torch.autograd.Function):
    """`label_smoothed_loss` with its gradient written out: softmax - smoothed target, in one pass.

    Left to autograd, the loss's backward walks the (N, V) logits' size six times (mean, gather,
    their sum, log_softmax); with an 8k vocabulary that is ~3% of a CPU training step.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        nll = -log_probs.gather(1, targets[:, None]).squeeze(1)  # (N,)
        uniform = -log_probs.mean(dim=-1)  # (N,)
        ctx.save_for_backward(log_probs, targets)
        ctx.epsilon = epsilon
        ctx.logits_dtype = logits.dtype
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return ((1.0 - epsilon) * nll + epsilon * uniform).sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        log_probs, targets = ctx.saved_tensors
        epsilon, vocab = ctx.epsilon, log_probs.size(1)
        # d loss / d logits = softmax - ((1 - epsilon) * onehot(target) + epsilon / V), row by row.
        grad = torch.exp(log_probs).sub_(epsilon / vocab).mul_(grad_loss)  # (N, V)
        grad.scatter_add_(1, targets[:, None], (-(1.0 - epsilon) * grad_loss).expand(targets.size(0), 1))
        return grad.to(ctx.logits_dtype), None, None


def batch_loss(model: Transformer, batch: Batch, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced loss of one batch: (smoothed loss sum, nll sum) over its real target tokens.

    The output projection and softmax, the costliest part with a large vocabulary, run only on the
    rows of real target tokens (padding rows are dropped before projecting).
    """
    return LossModule(model, epsilon)(batch.src, batch.tgt_in, batch.target_index, batch.targets)


class LossModule(torch.nn.Module):
    """The model and its training loss as one module, so DistributedDataParallel sees the whole step.

    DDP syncs gradients only for computations that go through the wrapped module's forward; the
    Transformer's own forward returns logits of every position, while training projects real rows only.
    """

    def __init__(self, model: Transformer, epsilon: float) -> None:
        super().__init__()
        self.model = model
        self.epsilon = epsilon

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, target_index: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(smoothed loss sum, nll sum) of a batch: src (B, S), tgt_in (B, T), target_index and targets (N,)."""
        hidden = self.model.decode(tgt_in, self.model.encode(src)).hidden  # (B, T, D)
        rows = hidden.reshape(-1, hidden.size(-1)).index_select(0, target_index)  # (N, D)
        return label_smoothed_loss(self.model.project(rows), targets, self.epsilon)


# ----------------------------------------------------------------------------------------------
# One optimizer update


@dataclass
class StepSettings:
    """What a training step needs besides the model, optimizer and data."""

    label_smoothing: float
    clip_norm: float
    autocast_dtype: torch.dtype | None  # None: run in float32
    device_type: str


@dataclass
class StepStats:
    """Sums over one update (tensors stay on the device: no host sync per step)."""

    loss_sum: torch.Tensor
    nll_sum: torch.Tensor
    grad_norm: torch.Tensor | None
    skipped: bool = False  # fp16: the loss scaler found inf/nan gradients and skipped the update
    nonfinite: bool = False  # fp32/bf16: the loss or a gradient was inf/nan, so the update was skipped


def autocast(settings: StepSettings) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass, or a no-op in float32."""
    if settings.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(settings.device_type, dtype=settings.autocast_dtype)


def train_step(
    loss_module: Transformer | torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    batches: list[Batch],
    settings: StepSettings,
    world: World = World(),
) -> StepStats:
    """One optimizer update over `batches` (update_freq accumulation): gradients of the mean token loss.

    `loss_module` is a LossModule, one wrapped in DistributedDataParallel when world.distributed, or a
    bare Transformer (wrapped here in a LossModule with settings.label_smoothing).
    The loss of every batch is divided by the target tokens of the whole update on all ranks, so
    accumulating k batches, or k ranks, equals one batch k times larger. Returns this rank's loss sums
    and the gradient norm.
    """
    if isinstance(loss_module, Transformer):
        loss_module = LossModule(loss_module, settings.label_smoothing)
    device = batches[0].src.device
    local_tokens = torch.tensor([sum(batch.n_tgt_tokens for batch in batches)], device=device)
    n_tokens = int(distributed.all_reduce_sum(local_tokens, world).item()) if world.distributed else int(local_tokens)
    loss_total = torch.zeros((), device=device)
    nll_total = torch.zeros((), device=device)
    for index, batch in enumerate(batches):
        # Gradients are all-reduced once per update, after the last micro-batch (DDP no_sync before it).
        last = index == len(batches) - 1
        sync = contextlib.nullcontext() if last or not world.distributed else loss_module.no_sync()
        with sync:
            with autocast(settings):
                loss, nll = loss_module(batch.src, batch.tgt_in, batch.target_index, batch.targets)
            scaled = loss / n_tokens
            if world.distributed:
                # DDP averages gradients over ranks; times world_size makes it the sum over all tokens / n_tokens.
                scaled = scaled * world.world_size
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_total += loss.detach()
        nll_total += nll.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    # The norm is needed anyway to detect inf/nan; max_norm=inf computes it without clipping. After
    # DDP's all-reduce every rank holds the same gradients, so all ranks agree on skipping.
    grad_norm = torch.nn.utils.clip_grad_norm_(
        loss_module.parameters(), settings.clip_norm if settings.clip_norm > 0 else math.inf
    )
    skipped = nonfinite = False
    if scaler is not None:
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        # The dynamic scaler lowers its scale exactly when it skipped the step for inf/nan gradients.
        skipped = scaler.get_scale() < scale
    elif torch.isfinite(grad_norm):
        optimizer.step()
    else:
        nonfinite = True  # a NaN/inf loss gives non-finite gradients: leave weights and moments as they are
    optimizer.zero_grad(set_to_none=True)
    return StepStats(loss_total, nll_total, grad_norm, skipped, nonfinite)


# ----------------------------------------------------------------------------------------------
# Validation


@dataclass
class ValidResult:
    """Validation figures: per-token loss (nats), perplexity, BLEU of decoded output."""

    loss: float
    nll_loss: float
    ppl: float
    bleu: float | None
    bleu_signature: str | None
    hypotheses: list[str] = field(default_factory=list)


def decode_corpus(model: Transformer, corpus: TokenizedCorpus, tgt_tokenizer: Tokenizer, config: TrainConfig) -> list[str]:
    """Detokenized model output for every source sentence of `corpus`, in corpus order.

    Decoded exactly as `tfm translate -b N --max-len-a A --max-len-b B` decodes (the same batches,
    the same search): greedy, or beam search (length penalty 0.6, section 6.1) with
    config.valid_beam_size > 1.
    """
    decode = DecodeConfig(
        beam_size=config.valid_beam_size, max_len_a=config.valid_max_len_a, max_len_b=config.valid_max_len_b
    )
    offsets = corpus.src_offsets.tolist()
    tokens = corpus.src_tokens.tolist()
    sources = {row: tokens[offsets[row] : offsets[row + 1] - 1] for row in range(len(corpus))}  # EOS dropped
    outputs: list[str] = [""] * len(corpus)
    for batch, hypotheses in search_batches(model, sources, decode, BatchingConfig()):
        for row, nbest in zip(batch, hypotheses):
            outputs[row] = tgt_tokenizer.decode_ids(nbest[0].tokens) if nbest else ""
    return outputs


def validate(
    model: Transformer,
    corpus: TokenizedCorpus,
    references: list[str],
    tgt_tokenizer: Tokenizer,
    config: TrainConfig,
    settings: StepSettings,
    device: torch.device,
) -> ValidResult:
    """Loss and perplexity of the references, and (if config.valid_bleu) sacreBLEU of decoded output.

    `references` are the raw target lines of the corpus rows, in corpus order. Leaves the model in
    training mode.
    """
    import sacrebleu

    model.eval()
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    with packed_weights(model), torch.inference_mode(), autocast(settings):
        for indices in batch_indices(corpus.src_lengths, corpus.tgt_lengths, config.max_tokens, None):
            batch = collate(corpus, indices).to(device)
            loss, nll = batch_loss(model, batch, config.label_smoothing)
            loss_sum += float(loss)
            nll_sum += float(nll)
            n_tokens += batch.n_tgt_tokens
    bleu = signature = None
    hypotheses: list[str] = []
    if config.valid_bleu:
        with packed_weights(model), autocast(settings):
            hypotheses = decode_corpus(model, corpus, tgt_tokenizer, config)
        metric = sacrebleu.metrics.BLEU()
        bleu = metric.corpus_score(hypotheses, [references]).score
        signature = str(metric.get_signature())
    model.train()
    nll_loss = nll_sum / max(n_tokens, 1)
    return ValidResult(loss_sum / max(n_tokens, 1), nll_loss, math.exp(min(nll_loss, 100.0)), bleu, signature, hypotheses)


# ----------------------------------------------------------------------------------------------
# Events (what the CLI renders) and the resumable counters


@dataclass(frozen=True)
class PhaseEvent:
    """A preparation phase begins (reading data, training a tokenizer, ...)."""

    message: str


@dataclass(frozen=True)
class DataEvent:
    """One data set was read, filtered and tokenized."""

    name: str  # "train" or "valid"
    stats: FilterStats
    max_length: int
    from_cache: bool
    src_tokens: int
    tgt_tokens: int


@dataclass(frozen=True)
class StartEvent:
    """Training (re)starts at `step`."""

    step: int
    epoch: int
    resumed: bool
    planned_steps: int | None  # the step at which a step or epoch limit ends training, if any
    updates_per_epoch: int
    n_parameters: int
    device: str
    model_config: ModelConfig


@dataclass(frozen=True)
class LogEvent:
    """Training figures averaged over the last log interval."""

    step: int
    epoch: int  # 1-based epoch the last update belonged to
    loss: float | None  # label-smoothed loss per target token (nats); None if every update was skipped
    nll_loss: float | None
    ppl: float | None
    lr: float
    grad_norm: float | None
    tgt_tokens_per_s: float
    tokens_per_s: float  # source + target tokens
    padding: float  # share of padded positions in the batches (source + target)
    elapsed: float  # seconds of training so far, all sessions
    eta: float | None  # seconds until a step, epoch or time limit, if one is set
    overflow_steps: int = 0  # fp16 updates skipped so far for inf/nan gradients (all sessions)
    nonfinite_steps: int = 0  # fp32/bf16 updates skipped so far for an inf/nan loss or gradient


@dataclass(frozen=True)
class ValidEvent:
    """Validation figures at `step`."""

    step: int
    epoch: int
    loss: float
    nll_loss: float
    ppl: float
    bleu: float | None
    bleu_signature: str | None
    best: bool  # this validation is the new best by train.best_metric
    best_value: float
    best_step: int
    bad_validations: int
    seconds: float


@dataclass(frozen=True)
class StepEvent:
    """One optimizer update finished (for live progress displays)."""

    step: int
    epochs_done: int


@dataclass(frozen=True)
class SaveEvent:
    """Checkpoints and the training state were written at `step`."""

    step: int
    paths: list[str]


Event = PhaseEvent | DataEvent | StartEvent | StepEvent | LogEvent | ValidEvent | SaveEvent


@dataclass
class Counters:
    """Everything of the loop's position that resume needs, besides tensors (saved as JSON)."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    elapsed: float = 0.0  # training seconds, over all sessions
    best_value: float | None = None
    best_step: int = 0
    bad_validations: int = 0  # validations in a row without improvement
    world_size: int = 1  # ranks that trained the run; resume needs the same number (same effective batch)
    overflow_steps: int = 0  # fp16 updates skipped by the loss scaler (inf/nan gradients)
    nonfinite_steps: int = 0  # fp32/bf16 updates skipped for an inf/nan loss or gradient
    nonfinite_in_a_row: int = 0  # consecutive ones up to now; max_bad_steps of them stop the run


@dataclass(frozen=True)
class TrainResult:
    """How a training session ended."""

    step: int
    epoch: int
    reason: str  # max_steps, max_epochs, max_minutes, patience or interrupted
    best_value: float | None
    best_step: int
    last_valid: ValidResult | None
    run_dir: Path


# ----------------------------------------------------------------------------------------------
# Training state: safetensors tensors + JSON, never pickle


def state_tensors(
    model: Transformer, optimizer: torch.optim.Optimizer, rank_rng: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Model weights, Adam moments and RNG states as named CPU tensors (plus every rank's RNG, if given)."""
    tensors = {f"model.{name}": tensor for name, tensor in model_weights(model).items()}
    names = [name for name, _ in model.named_parameters()]
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer.{names[index]}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = rng
    tensors.update(rank_rng or {})
    return tensors


def encode_state(
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    counters: Counters,
    rank_rng: dict[str, torch.Tensor] | None = None,
) -> bytes:
    """The whole training state as safetensors bytes (tensors + JSON metadata)."""
    metadata = {
        "format": STATE_FORMAT,
        "format_version": str(STATE_VERSION),
        "counters": json.dumps(asdict(counters)),
        "scaler": json.dumps(scaler.state_dict() if scaler is not None else None),
    }
    return save(state_tensors(model, optimizer, rank_rng), metadata=metadata)


def read_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a training-state file; raises TfmError if it is not one."""
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            metadata = json.loads(f.read(header_size)).get("__metadata__", {})
    except (SafetensorError, OSError, ValueError) as error:
        raise TfmError(f"{path}: unreadable training state ({error}); resume from a checkpoint instead") from None
    if metadata.get("format") != STATE_FORMAT or metadata.get("format_version") != str(STATE_VERSION):
        raise TfmError(f"{path}: not a tfm training state of version {STATE_VERSION}")
    return tensors, metadata


def gather_rank_rng(world: World, device: torch.device) -> dict[str, torch.Tensor]:
    """Every rank's RNG states, named rng.cpu.rankR (and rng.cuda.rankR on CUDA); empty for one process.

    A collective: every rank must call it. Ranks draw different dropout masks, so each has its own state.
    """
    if not world.distributed:
        return {}
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    named = {}
    for kind, state in states.items():
        for rank, gathered in enumerate(distributed.all_gather(state, world, device)):
            named[f"rng.{kind}.rank{rank}"] = gathered
    return named


def restore_state(
    path: Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    world: World = World(),
) -> Counters:
    """Load weights, optimizer moments, RNG states and counters from `path` into the live objects.

    Raises TfmError if the run was trained by a different number of ranks than `world` has.
    """
    tensors, metadata = read_state(path)
    counters = Counters(**json.loads(metadata["counters"]))
    if counters.world_size != world.world_size:
        raise TfmError(
            f"{path}: the run was trained with {counters.world_size} process(es) but this resume has "
            f"{world.world_size}; resume with `torchrun --nproc-per-node ...` giving {counters.world_size} processes "
            "in all (the effective batch and data order depend on it)"
        )
    names = [name for name, _ in model.named_parameters()]
    with torch.no_grad():
        for name, param in model.named_parameters():
            saved = tensors.get(f"model.{name}")
            if saved is None or saved.shape != param.shape:
                raise TfmError(f"{path}: the training state does not match the model ({name}); start a new --run")
            param.copy_(saved)
    template = optimizer.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    for index, name in enumerate(names):
        prefix = f"optimizer.{name}."
        entries = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
        if entries:
            state[index] = entries
    optimizer.load_state_dict({"state": state, "param_groups": template["param_groups"]})
    torch.set_rng_state(tensors["rng.cpu"])
    cuda_states = [tensors[f"rng.cuda.{i}"] for i in range(len(tensors)) if f"rng.cuda.{i}" in tensors]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    if world.distributed:
        torch.set_rng_state(tensors[f"rng.cpu.rank{world.rank}"])
        cuda_state = tensors.get(f"rng.cuda.rank{world.rank}")
        if cuda_state is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda_state, torch.cuda.current_device())
    scaler_state = json.loads(metadata.get("scaler", "null"))
    if scaler is not None and scaler_state:
        scaler.load_state_dict(scaler_state)
    return counters


# ----------------------------------------------------------------------------------------------
# Preparation: data, tokenizers, run directory


@dataclass
class PreparedData:
    """Everything the loop needs from the data side."""

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    train: TokenizedCorpus
    valid: TokenizedCorpus | None
    valid_references: list[str]


def prepare_tokenizers(
    recipe: Recipe, run_dir: Path, resume: bool, text: ParallelText, on_event: Callable[[Event], None]
) -> tuple[Tokenizer, Tokenizer]:
    """Load the recipe's sentencepiece models, or train them into the run directory (reused on resume)."""
    settings = recipe.tokenizer
    if settings.src_model:
        src = Tokenizer.from_file(Path(settings.src_model))
        tgt = Tokenizer.from_file(Path(settings.tgt_model)) if settings.tgt_model else src
        return src, tgt
    train_settings = settings.train_settings()
    if settings.joint:
        prefixes = {"joint": (run_dir / "spm", [text.src.path, text.tgt.path])}
    else:
        prefixes = {"src": (run_dir / "spm.src", [text.src.path]), "tgt": (run_dir / "spm.tgt", [text.tgt.path])}
    loaded = {}
    for side, (prefix, inputs) in prefixes.items():
        model_path = Path(f"{prefix}.model")
        if not (resume and model_path.is_file()):
            on_event(PhaseEvent(f"training a {train_settings.vocab_size}-piece {train_settings.model_type} "
                                f"sentencepiece model ({side}) -> {model_path}"))
            train_sentencepiece(inputs, prefix, train_settings)
        loaded[side] = Tokenizer.from_file(model_path)
    if settings.joint:
        return loaded["joint"], loaded["joint"]
    return loaded["src"], loaded["tgt"]


def prepare_data(recipe: Recipe, run_dir: Path, resume: bool, on_event: Callable[[Event], None]) -> PreparedData:
    """Read and check all text first (line counts, UTF-8), then tokenizers, then the tokenized corpora."""
    data = recipe.data
    on_event(PhaseEvent("reading the parallel text"))
    train_text = read_parallel(data.train_src, data.train_tgt, "training")
    valid_text = read_parallel(data.valid_src, data.valid_tgt, "validation") if data.valid_src else None
    src_tokenizer, tgt_tokenizer = prepare_tokenizers(recipe, run_dir, resume, train_text, on_event)
    if recipe.model.get("share_embeddings", False) and src_tokenizer.model_bytes != tgt_tokenizer.model_bytes:
        raise TfmError(
            "model.share_embeddings needs one joint sentencepiece model for both sides "
            "(tokenizer.joint = true, or no tokenizer.tgt_model)"
        )
    corpora = {}
    for name, text in (("train", train_text), ("valid", valid_text)):
        if text is None:
            continue
        on_event(PhaseEvent(f"tokenizing the {name} data"))
        corpus, cached = load_or_tokenize(
            text, src_tokenizer, tgt_tokenizer, data.max_length, run_dir / CACHE_DIR, name
        )
        src_tokens, tgt_tokens = count_tokens(corpus)
        on_event(DataEvent(name, corpus.stats, data.max_length, cached, src_tokens, tgt_tokens))
        corpora[name] = corpus
    if len(corpora["train"]) == 0:
        raise TfmError(f"no training pairs left after filtering {data.train_src} / {data.train_tgt}")
    valid = corpora.get("valid")
    if valid is not None and len(valid) == 0:
        raise TfmError(f"no validation pairs left after filtering {data.valid_src} / {data.valid_tgt}")
    references = [valid_text.tgt.lines[i] for i in valid.line_numbers.tolist()] if valid is not None else []
    return PreparedData(src_tokenizer, tgt_tokenizer, corpora["train"], valid, references)


def saved_recipe(run_dir: Path) -> dict[str, Any] | None:
    """The resolved recipe data stored in a run directory's config.json, or None if there is none."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))["recipe"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
        raise TfmError(f"{path}: damaged run config; start a new --run") from None


def check_resumable(recipe: Recipe, run_dir: Path) -> None:
    """Raise TfmError if the recipe's data, tokenizer or model settings differ from the run's own."""
    saved = saved_recipe(run_dir)
    if saved is None:
        raise TfmError(f"{run_dir}: no {CONFIG_FILE}; this is not a tfm run directory")
    current = recipe.to_dict()
    for section in ("data", "tokenizer", "model"):
        old, new = saved.get(section, {}), current[section]
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                raise TfmError(
                    f"--resume: {section}.{key} is {new.get(key)!r} but the run in {run_dir} used {old.get(key)!r}; "
                    "only [train] settings may change on resume"
                )


def check_run_dir(recipe: Recipe, run_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run without --resume, or to resume one that does not exist or differs."""
    if resume:
        if not (run_dir / STATE_FILE).is_file():
            raise TfmError(f"{run_dir}: no {STATE_FILE} to resume from; drop --resume to start a new run")
        check_resumable(recipe, run_dir)
    elif (run_dir / STATE_FILE).is_file():
        raise TfmError(f"{run_dir} already holds a training run; add --resume to continue it, or choose another --run")


def write_metrics(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON object as a line to metrics.jsonl; a non-finite number is written as null.

    (NaN and Infinity are not JSON: strict readers, jq among them, reject the whole line.)
    """
    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(finite, sort_keys=True, allow_nan=False) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metrics.jsonl records after `step` (written by a session that died after its last save)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            if json.loads(line).get("step", 0) <= step:
                kept.append(line + "\n")
    atomic_write_bytes(path, "".join(kept).encode("utf-8"))


def step_checkpoints(run_dir: Path) -> list[Path]:
    """checkpoint_NNNNNNNN.safetensors files in step order (8 digits: lexical order is numeric order)."""
    return sorted(p for p in run_dir.glob("checkpoint_*.safetensors") if p.stem.split("_")[-1].isdigit())


# ----------------------------------------------------------------------------------------------
# The loop


def resolve_precision(precision: str, device: torch.device) -> str:
    """train.precision with `auto` made concrete: bf16 on a CUDA device that supports it, else fp32."""
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def compile_module(module: torch.nn.Module, on_event: Callable[[Event], None]) -> torch.nn.Module:
    """torch.compile(module), or `module` itself (with a PhaseEvent saying why) where it is not supported."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        on_event(PhaseEvent("torch.compile is not supported on this Python/platform; training without it"))
        return module
    try:
        return torch.compile(module)
    except RuntimeError as error:
        on_event(PhaseEvent(f"torch.compile failed ({error}); training without it"))
        return module


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
    ) -> None:
        config = recipe.train
        self.recipe, self.config, self.run_dir, self.data, self.device = recipe, config, run_dir, data, device
        self.on_event = on_event
        self.world = world
        self.model_config = recipe.model_config(data.src_tokenizer.vocab_size, data.tgt_tokenizer.vocab_size)
        # The model's initial weights come from the run's seed, so a run is reproducible end to end.
        torch.manual_seed(config.seed)
        self.model = Transformer(self.model_config).to(device).train()
        self.loss_module: torch.nn.Module = LossModule(self.model, config.label_smoothing)
        if world.distributed:
            # Every rank built the same initial weights from the seed; dropout must differ between ranks.
            torch.manual_seed(config.seed * 1000 + world.rank)
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
        self.settings = StepSettings(config.label_smoothing, config.clip_norm, dtype, device.type)
        self.counters = Counters(world_size=world.world_size)
        self.last_valid: ValidResult | None = None
        self.metrics_path = run_dir / METRICS_FILE
        self.epoch_cache: tuple[int, list[torch.Tensor]] | None = None

    # -- data order ------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> list[torch.Tensor]:
        """The batches (index tensors) of epoch `epoch`, in training order; a function of (seed, epoch) only.

        The same list on every rank. With W ranks it is cut to a multiple of W (dropping fewer than W
        batches, which the next epoch's shuffle puts elsewhere) so that every rank does the same updates.
        Raises TfmError (on every rank alike) if there are fewer batches than ranks: a rank would have none.
        """
        if self.epoch_cache is None or self.epoch_cache[0] != epoch:
            corpus = self.data.train
            batches = batch_indices(
                corpus.src_lengths, corpus.tgt_lengths, self.config.max_tokens, epoch_generator(self.config.seed, epoch)
            )
            world_size = self.world.world_size
            if len(batches) < world_size:
                raise TfmError(
                    f"the training data makes {len(batches)} batch(es) (train.max_tokens={self.config.max_tokens}) "
                    f"but there are {world_size} processes and each needs at least one; lower train.max_tokens "
                    "or use fewer processes"
                )
            self.epoch_cache = (epoch, batches[: len(batches) // world_size * world_size])
        return self.epoch_cache[1]

    def next_update(self) -> Iterator[list[Batch]]:
        """Yield this rank's batches of each update forever, advancing counters.epoch/batch_in_epoch as it goes.

        An update takes the next update_freq * W batches of the epoch; rank r trains on every W-th of
        them from the r-th (disjoint shares; with W = 1, all of them). batch_in_epoch counts all ranks'.
        """
        world = self.world
        while True:
            batches = self.epoch_batches(self.counters.epoch)
            start = self.counters.batch_in_epoch
            group = batches[start : start + self.config.update_freq * world.world_size]
            self.counters.batch_in_epoch += len(group)
            if self.counters.batch_in_epoch >= len(batches):
                self.counters.epoch += 1
                self.counters.batch_in_epoch = 0
            yield [collate(self.data.train, indices).to(self.device) for indices in group[world.rank :: world.world_size]]

    def updates_per_epoch(self) -> int:
        """Optimizer updates in one epoch (batch counts vary by a few between epochs; epoch 0's is used)."""
        return math.ceil(len(self.epoch_batches(0)) / (self.config.update_freq * self.world.world_size))

    def planned_steps(self) -> int | None:
        """The step at which max_steps or max_epochs ends training (the smaller), or None if neither is set."""
        limits = []
        if self.config.max_steps:
            limits.append(self.config.max_steps)
        if self.config.max_epochs:
            limits.append(self.config.max_epochs * self.updates_per_epoch())
        return min(limits) if limits else None

    # -- saving ----------------------------------------------------------------------------------

    def provenance(self) -> dict[str, Any]:
        """What every checkpoint records about how it was made."""
        valid = None
        if self.last_valid is not None:
            valid = {"loss": self.last_valid.loss, "ppl": self.last_valid.ppl, "bleu": self.last_valid.bleu,
                     "bleu_signature": self.last_valid.bleu_signature}
        return {
            "tfm_version": __version__,
            "step": self.counters.step,
            "epoch": self.counters.epoch,
            "recipe": self.recipe.to_dict(),
            "valid": valid,
        }

    def checkpoint_bytes(self) -> bytes:
        """The current weights as a self-contained checkpoint (see tfm_cli.checkpoint)."""
        checkpoint = Checkpoint(
            config=self.model_config,
            weights=model_weights(self.model),
            src_tokenizer_bytes=self.data.src_tokenizer.model_bytes,
            tgt_tokenizer_bytes=self.data.tgt_tokenizer.model_bytes,
            provenance=self.provenance(),
        )
        return encode_checkpoint(checkpoint)

    def save(self) -> None:
        """Write checkpoint_STEP, checkpoint_last and then the training state, each atomically (rank 0 only).

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
        step_path = self.run_dir / f"checkpoint_{self.counters.step:08d}.safetensors"
        last_path = self.run_dir / "checkpoint_last.safetensors"
        atomic_write_bytes(step_path, data)
        atomic_write_bytes(last_path, data)
        atomic_write_bytes(self.run_dir / STATE_FILE, encode_state(self.model, self.optimizer, self.scaler, self.counters, rank_rng))
        if self.config.keep_last:
            for old in step_checkpoints(self.run_dir)[: -self.config.keep_last]:
                old.unlink(missing_ok=True)
        self.on_event(SaveEvent(self.counters.step, [str(step_path), str(last_path)]))

    def write_config(self) -> None:
        """Write the resolved recipe, model config and tokenizer origin to config.json in the run directory."""
        record = {
            "tfm_version": __version__,
            "recipe": self.recipe.to_dict(),
            "model_config": config_to_dict(self.model_config),
        }
        atomic_write_bytes(self.run_dir / CONFIG_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())

    # -- validation ------------------------------------------------------------------------------

    def validate_on_main(self) -> None:
        """Rank 0 validates (the whole validation set, as a single process would); the other ranks wait.

        Only rank 0's counters track the best value; stop decisions are rank 0's (see agreed_stop_reason).
        """
        if self.world.is_main:
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
            atomic_write_bytes(self.run_dir / "checkpoint_best.safetensors", self.checkpoint_bytes())
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
        """stop_reason as rank 0 sees it, or interrupted if any rank was asked to stop; the same on all ranks."""
        reason = self.stop_reason(should_stop)
        if not self.world.distributed:
            return reason
        code = STOP_REASONS.index(reason) + 1 if reason is not None and self.world.is_main else 0
        votes = torch.tensor([code, int(reason == STOP_INTERRUPTED)], device=self.device)
        code, interrupted = distributed.all_reduce_max(votes, self.world).tolist()
        if interrupted:
            return STOP_INTERRUPTED
        return STOP_REASONS[code - 1] if code else None

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
        d_model = self.model_config.d_model
        reason = self.agreed_stop_reason(should_stop)
        updates = self.next_update()
        window = LogWindow()
        clock = time.monotonic()
        while reason is None:
            distributed.check_fault_hook(self.world, counters.step + 1)
            batches = next(updates)
            lr = learning_rate(counters.step + 1, d_model, config.warmup_steps, config.lr)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            stats = train_step(self.loss_module, self.optimizer, self.scaler, batches, self.settings, self.world)
            # A skipped update (inf/nan) leaves the weights, the step counter and so the learning-rate
            # schedule where they were (as fairseq does); its batch is consumed all the same.
            applied = not (stats.skipped or stats.nonfinite)
            counters.step += applied
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
        )
        write_metrics(self.metrics_path, {"kind": "train", **asdict(event)})
        self.on_event(event)


class LogWindow:
    """Running sums over one log interval; converted to host numbers only when logged."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.excluded = 0.0
        self.steps = 0
        self.applied_steps = 0  # updates not skipped for inf/nan: only their losses are averaged
        self.loss_sum: torch.Tensor | float = 0.0
        self.nll_sum: torch.Tensor | float = 0.0
        self.loss_tokens = 0  # target tokens of the applied updates
        self.grad_norm_sum: torch.Tensor | float | None = None
        self.tgt_tokens = self.src_tokens = self.padded = 0

    def add(self, stats: StepStats, batches: list[Batch]) -> None:
        """Add one update's token counts, and its losses and gradient norm unless it was skipped."""
        self.steps += 1
        tgt_tokens = sum(batch.n_tgt_tokens for batch in batches)
        if not (stats.skipped or stats.nonfinite):
            self.applied_steps += 1
            self.loss_sum = self.loss_sum + stats.loss_sum
            self.nll_sum = self.nll_sum + stats.nll_sum
            self.loss_tokens += tgt_tokens
            if stats.grad_norm is not None:
                self.grad_norm_sum = (self.grad_norm_sum or 0.0) + stats.grad_norm
        self.tgt_tokens += tgt_tokens
        for batch in batches:
            self.src_tokens += batch.n_src_tokens
            self.padded += batch.n_padded_tokens

    def reduce(self, world: World, device: torch.device) -> None:
        """Sum the losses and token counts over all ranks (tokens/s becomes the whole run's throughput)."""
        if not world.distributed:
            return
        sums = torch.tensor(
            [float(self.loss_sum), float(self.nll_sum), self.loss_tokens, self.tgt_tokens, self.src_tokens, self.padded],
            dtype=torch.float64, device=device,
        )
        loss_sum, nll_sum, loss_tokens, tgt_tokens, src_tokens, padded = distributed.all_reduce_sum(sums, world).tolist()
        self.loss_sum, self.nll_sum, self.loss_tokens = loss_sum, nll_sum, int(loss_tokens)
        self.tgt_tokens, self.src_tokens, self.padded = int(tgt_tokens), int(src_tokens), int(padded)

    def exclude(self, seconds: float) -> None:
        """Do not count `seconds` (validation, saving) as training time."""
        self.excluded += seconds

    def figures(self) -> dict[str, Any]:
        """Per-token losses and mean gradient norm of the applied updates (None if every update was
        skipped), throughput and padding share of the interval."""
        seconds = max(time.monotonic() - self.started - self.excluded, 1e-9)
        applied = self.loss_tokens > 0
        grad_norm = None if self.grad_norm_sum is None else float(self.grad_norm_sum) / self.applied_steps
        return {
            "loss": float(self.loss_sum) / self.loss_tokens if applied else None,
            "nll_loss": float(self.nll_sum) / self.loss_tokens if applied else None,
            "grad_norm": grad_norm,
            "tgt_tokens_per_s": self.tgt_tokens / seconds,
            "tokens_per_s": (self.tgt_tokens + self.src_tokens) / seconds,
            "padding": 1.0 - (self.tgt_tokens + self.src_tokens) / max(self.padded, 1),
            "seconds": seconds,
        }


def run_training(
    recipe: Recipe,
    run_dir: Path,
    resume: bool = False,
    device: str | torch.device = "cpu",
    on_event: Callable[[Event], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    world: World = World(),
) -> TrainResult:
    """Train `recipe` in `run_dir` (created if needed), or continue it with `resume`.

    Reads and checks the data first, trains or loads the tokenizers, caches the tokenized data in
    run_dir/cache, then trains until a limit or `should_stop()`. Returns how it ended.
    With a distributed `world` (torchrun), this process joins the process group (gloo on CPU, NCCL on
    cuda:LOCAL_RANK) and trains with DistributedDataParallel; only rank 0 prepares the run directory
    first, emits events and writes files. run_dir must be on storage all nodes share.
    """
    device = distributed.rank_device(world, torch.device(device))
    distributed.init_process_group(world, device, recipe.train.dist_timeout)
    try:
        return train_in_world(recipe, Path(run_dir), resume, device, on_event, should_stop, world)
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
) -> TrainResult:
    """run_training once the process group (if any) is up."""
    on_event = (on_event if world.is_main else None) or (lambda event: None)
    should_stop = should_stop or (lambda: False)
    config = recipe.train
    if config.precision in ("bf16", "fp16") and device.type != "cuda":
        raise TfmError(f"train.precision={config.precision} needs a CUDA device (--device cuda); use fp32 on {device}")
    if recipe.data.max_length > config.max_tokens:
        raise TfmError(
            f"data.max_length ({recipe.data.max_length}) is larger than train.max_tokens ({config.max_tokens}); "
            "a batch must hold at least one sentence"
        )
    if config.best_metric == "bleu" and not config.valid_bleu and recipe.data.valid_src:
        raise TfmError("train.best_metric = 'bleu' needs train.valid_bleu = true (or use best_metric = 'loss')")
    if config.patience and not recipe.data.valid_src:
        raise TfmError("train.patience needs validation data (data.valid_src and data.valid_tgt)")
    if run_dir.exists() and not run_dir.is_dir():
        raise TfmError(f"{run_dir}: exists and is not a directory")
    max_positions = recipe.model.get("max_positions", ModelConfig.max_positions)
    if max_positions < recipe.data.max_length:
        raise TfmError(f"model.max_positions ({max_positions}) must be at least data.max_length ({recipe.data.max_length})")
    data = prepare_on_rank0_first(recipe, run_dir, resume, device, world, on_event)
    trainer = Trainer(recipe, run_dir, data, device, on_event, world)
    # Every rank counts the batches here, so fewer batches than ranks stops them all before training.
    updates_per_epoch = trainer.updates_per_epoch()
    if resume:
        trainer.counters = restore_state(run_dir / STATE_FILE, trainer.model, trainer.optimizer, trainer.scaler, world)
        if world.is_main:
            truncate_metrics(trainer.metrics_path, trainer.counters.step)
    if world.is_main:
        trainer.write_config()
    distributed.barrier(world)
    on_event(StartEvent(
        step=trainer.counters.step, epoch=trainer.counters.epoch, resumed=resume,
        planned_steps=trainer.planned_steps(), updates_per_epoch=updates_per_epoch,
        n_parameters=count_parameters(trainer.model), device=str(device), model_config=trainer.model_config,
    ))
    return trainer.train(should_stop)


def prepare_on_rank0_first(
    recipe: Recipe, run_dir: Path, resume: bool, device: torch.device, world: World, on_event: Callable[[Event], None]
) -> PreparedData:
    """prepare_run on rank 0, which then tells the other ranks whether it worked; they prepare after it.

    Rank 0 trains the tokenizers and fills the cache; the others then read them. If rank 0 fails, the
    others raise TfmError at once with its message instead of waiting out train.dist_timeout.
    """
    if world.is_main:
        try:
            data = prepare_run(recipe, run_dir, resume, world, on_event)
        except BaseException as error:
            message = str(error) if isinstance(error, TfmError) else f"{type(error).__name__}: {error}"
            with contextlib.suppress(Exception):  # rank 0's own error is the one to report
                distributed.broadcast_text(message, world, device)
            raise
        distributed.broadcast_text(None, world, device)
        return data
    failure = distributed.broadcast_text(None, world, device)
    if failure is not None:
        raise TfmError(f"rank 0 failed while preparing the data: {failure}")
    return prepare_run(recipe, run_dir, resume, world, on_event)


def prepare_run(
    recipe: Recipe, run_dir: Path, resume: bool, world: World, on_event: Callable[[Event], None]
) -> PreparedData:
    """Check the run directory, then prepare_data; ranks other than 0 reuse rank 0's tokenizers and cache."""
    check_run_dir(recipe, run_dir, resume)
    if resume and world.is_main:
        # Saves killed mid-write (SIGKILL) leave hidden temp files; the other ranks wait for rank 0.
        stale = remove_stale_temp_files(run_dir, RUN_FILES) + remove_stale_temp_files(run_dir / CACHE_DIR, CACHE_FILES)
        if stale:
            names = ", ".join(path.name for path in stale)
            on_event(PhaseEvent(f"removed {len(stale)} temp file(s) left by an interrupted save: {names}"))
    run_dir.mkdir(parents=True, exist_ok=True)
    return prepare_data(recipe, run_dir, resume or not world.is_main, on_event)
