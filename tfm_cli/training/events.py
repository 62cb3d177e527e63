"""What the training loop reports to its caller: one dataclass per kind of event (the CLI renders them)."""

from __future__ import annotations

from dataclasses import dataclass

from tfm_cli.config import ModelConfig
from tfm_cli.corpus.cache import PrepareProgress
from tfm_cli.corpus.filters import CorpusFilter
from tfm_cli.corpus.tokenized import FilterStats


@dataclass(frozen=True)
class PhaseEvent:
    """A preparation phase begins (reading data, training a tokenizer, ...)."""

    message: str


@dataclass(frozen=True)
class PrepareEvent:
    """Preparing a corpus got further (sent about twice a second while text is read)."""

    progress: PrepareProgress


@dataclass(frozen=True)
class DataEvent:
    """One data set was read, filtered and tokenized (or found prepared)."""

    name: str  # "train" or "valid"
    parts: tuple[tuple[str, FilterStats], ...]  # (files, what filtering did) of each corpus
    filters: tuple[CorpusFilter, ...]  # the filters that ran, in their order (they word the report)
    from_cache: bool
    src_tokens: int
    tgt_tokens: int
    changed: tuple[str, ...] = ()  # why an earlier preparation of the same files was not used


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
    alignment_loss: float | None = None  # guided alignment: cross-entropy per supervised decoder row


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


Event = PhaseEvent | PrepareEvent | DataEvent | StartEvent | StepEvent | LogEvent | ValidEvent | SaveEvent
