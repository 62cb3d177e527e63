"""Frozen dataclass configs (model, tokenizer training, training, decoding), their limits, and typed
values read from dicts (config_from_dict). Recipes, which hold them, are read in recipe.py.

Precedence everywhere: dataclass defaults < recipe file < command line. Unknown keys and wrong
types are errors that name the key, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tfm_cli.errors import TfmError
from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ConfigT = TypeVar("ConfigT")



MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
SEED_LIMIT = 2**63  # torch generators take seeds in [0, 2**64); one below keeps seed + line number in range


INT_LIMIT = 1 << 63
MAX_DIST_TIMEOUT = 1e7  # seconds (~4 months); torch's timedelta overflows far above
# Search settings past these are mistakes, and past some of them arithmetic overflows: a beam of
# 10**20 does not fit a tensor size, ((5 + n) / 6) ** alpha overflows a float for alpha ~ 80.
MAX_BEAM_SIZE = 1024
MAX_LENGTH_PENALTY = 10.0


def check_search_limits(beam_size: int, max_len_a: float, max_len_b: int, names: tuple[str, str, str]) -> None:
    """Raise TfmError unless 1 <= beam_size <= MAX_BEAM_SIZE and the length limit a * len + b is finite,
    >= 0 and at most MAX_POSITIONS (the model caps it lower still). `names` names the three settings."""
    if not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise TfmError(f"{names[0]} must be between 1 and {MAX_BEAM_SIZE}, got {beam_size}")
    if not (math.isfinite(max_len_a) and 0 <= max_len_a <= MAX_POSITIONS):
        raise TfmError(f"{names[1]} must be between 0 and {MAX_POSITIONS}, got {max_len_a}")
    if not 0 <= max_len_b <= MAX_POSITIONS:
        raise TfmError(f"{names[2]} must be between 0 and {MAX_POSITIONS}, got {max_len_b}")


def check_length_penalty(alpha: float, key: str) -> None:
    """Raise TfmError unless `alpha` (GNMT's length penalty exponent) is in [0, MAX_LENGTH_PENALTY]."""
    if not (math.isfinite(alpha) and 0.0 <= alpha <= MAX_LENGTH_PENALTY):
        raise TfmError(f"{key} must be between 0 and {MAX_LENGTH_PENALTY}, got {alpha}")


def check_seed(seed: int, key: str) -> None:
    """Raise TfmError unless 0 <= seed < SEED_LIMIT (what a torch.Generator accepts, with room to add to it)."""
    if not 0 <= seed < SEED_LIMIT:
        raise TfmError(f"{key} must be between 0 and 2**63 - 1, got {seed}")


def derive_seed(seed: int, purpose: str, index: int) -> int:
    """The seed in [0, SEED_LIMIT) of one random stream of a run: `purpose` number `index` (an epoch, a rank).

    The one rule for seeds derived from a run's `seed`. A hash, not arithmetic: every seed check_seed
    accepts works (seed * 1_000_003 + epoch overflowed torch's 64 bits from seed ~1.8e13), and streams
    do not meet as sums do (seed 0 epoch 1_000_003 was seed 1 epoch 0). Deterministic, so a resumed run
    rebuilds the same streams.
    """
    digest = hashlib.blake2b(f"{seed}/{purpose}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: itself a seed check_seed accepts


# The sinusoidal position table is max_positions x d_model floats, built whole when a model is made:
# this bound keeps a config (a crafted checkpoint's, say) from asking for terabytes.
MAX_POSITIONS = 1 << 16
TARGET_CONTEXT_HEADS = 4  # heads of a trained aligner's self-attention over the target (model/aligner.py)
ACTIVATIONS = ("relu", "gelu", "swish")
SINUSOID_LAYOUTS = ("interleaved", "halves")


@dataclass(frozen=True)
class ModelShape:
    """The Transformer's sizes and switches (names follow the paper): what a recipe's [model] sets.

    The vocabulary sizes and special ids come from the tokenizer; ModelConfig adds them.
    """

    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_enc_layers: int = 6
    n_dec_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # Post-norm LayerNorm(x + f(x)) as in the paper; pre-norm x + f(LayerNorm(x)) adds final norms.
    norm_first: bool = False
    # The FFN's nonlinearity: relu (section 3.3), gelu, or swish (x * sigmoid(x), OPUS-MT's Marian models).
    activation: str = "relu"
    # Joint vocabulary: one embedding matrix for source, target and the output projection.
    share_embeddings: bool = False
    # Section 3.4: the target embedding and the pre-softmax projection share weights.
    tie_output: bool = True
    max_positions: int = 1024
    layer_norm_eps: float = 1e-5
    # Section 3.5's sinusoids: "interleaved" puts sin at even and cos at odd dimensions (the paper's
    # formula); "halves" puts all sines first, then all cosines (tensor2tensor and Marian, so OPUS-MT).
    sinusoid_layout: str = "interleaved"
    # A learned bias added to the output logits (Marian's final_logits_bias); tensor output_proj.bias.
    output_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "n_enc_layers", "n_dec_layers", "max_positions"):
            if getattr(self, name) <= 0:
                raise TfmError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise TfmError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TfmError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.activation not in ACTIVATIONS:
            names = f"{', '.join(map(repr, ACTIVATIONS[:-1]))} or {ACTIVATIONS[-1]!r}"
            raise TfmError(f"model.activation must be {names}, got {self.activation!r}")
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            raise TfmError(f"model.sinusoid_layout must be 'interleaved' or 'halves', got {self.sinusoid_layout!r}")
        if self.max_positions > MAX_POSITIONS:
            raise TfmError(f"model.max_positions must be at most {MAX_POSITIONS:,}, got {self.max_positions:,}")
        if not 0.0 < self.layer_norm_eps < 1.0:
            raise TfmError(f"model.layer_norm_eps must be in (0, 1), got {self.layer_norm_eps}")

    @property
    def head_dim(self) -> int:
        """d_k = d_v = d_model / h (section 3.2.2)."""
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class ModelConfig(ModelShape):
    """A whole model's config: its ModelShape plus the vocabulary sizes and special ids of its tokenizers.

    bos_id is the token the decoder starts from. tfm's tokenizers have a BOS of their own; Marian
    models (OPUS-MT) start from padding, so bos_id may equal pad_id (the other ids are distinct).
    """

    src_vocab_size: int = field(kw_only=True)
    tgt_vocab_size: int = field(kw_only=True)
    pad_id: int = field(default=PAD_ID, kw_only=True)
    unk_id: int = field(default=UNK_ID, kw_only=True)
    bos_id: int = field(default=BOS_ID, kw_only=True)
    eos_id: int = field(default=EOS_ID, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if getattr(self, name) <= 0:
                raise TfmError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise TfmError(
                "model.share_embeddings needs one joint vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        special = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        distinct = {"pad_id", "unk_id", "eos_id"} if self.bos_id == self.pad_id else set(special)
        if len({special[name] for name in distinct}) != len(distinct):
            raise TfmError(f"special token ids must be distinct (bos_id may equal pad_id), got {special}")
        for name, value in special.items():
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise TfmError(f"model.{name}={value} is outside the vocabulary")


@dataclass(frozen=True)
class DecodeConfig:
    """How translate searches: beam size, length penalty, output length limit, n-best, sampling."""

    beam_size: int = 5
    # GNMT length penalty ((5 + len) / 6) ** alpha; section 6.1 of the paper uses alpha = 0.6.
    length_penalty: float = 0.6
    # How alpha is applied (tfm_cli/length_penalty.py owns the kinds): gnmt (tfm's), hf (n ** alpha
    # and generate's beam stop, as imported models' source decodes) or none.
    length_penalty_kind: str = "gnmt"
    # Maximum output length is max_len_a * src_len + max_len_b (in subword tokens, EOS excluded).
    max_len_a: float = 1.5
    max_len_b: int = 10
    nbest: int = 1
    # Sampling instead of beam search: nbest independent samples per sentence.
    sample: bool = False
    sample_top_k: int = 0  # keep only the k most likely tokens (0 = all)
    sample_top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches p (1 = all)
    temperature: float = 1.0
    seed: int = 0
    no_unk: bool = False  # never generate the unknown-word token (padding and BOS never are)
    # Further target ids never generated (an imported model's bad_words_ids), besides padding and BOS.
    banned_ids: tuple[int, ...] = ()
    # Scores renormalised over the tokens that may be generated (log_softmax again after the bans, as
    # an imported model's renormalize_logits asks); else the model's log-probs over the whole vocabulary.
    renormalize: bool = False
    # At the length limit EOS scores 0 (forced with probability 1, as generate's forced_eos_token_id);
    # else EOS keeps the model's log-prob there.
    forced_eos: bool = False
    # No EOS before this many output tokens (EOS excluded). 1 = a non-empty line never gets an empty
    # translation (fairseq's and CTranslate2's default); imported models keep generate's 0.
    min_len: int = 1

    def __post_init__(self) -> None:
        check_search_limits(self.beam_size, self.max_len_a, self.max_len_b, ("beam size", "max_len_a", "max_len_b"))
        if self.nbest < 1 or (not self.sample and self.nbest > self.beam_size):
            raise TfmError(f"nbest must be between 1 and the beam size ({self.beam_size}), got {self.nbest}")
        if self.sample and self.nbest > MAX_BEAM_SIZE:
            raise TfmError(f"nbest must be between 1 and {MAX_BEAM_SIZE}, got {self.nbest}")
        check_length_penalty(self.length_penalty, "length penalty alpha")
        if self.sample_top_k < 0:
            raise TfmError(f"sampling top-k must be >= 0 (0 = no limit), got {self.sample_top_k}")
        if not 0.0 < self.sample_top_p <= 1.0:
            raise TfmError(f"sampling top-p must be in (0, 1], got {self.sample_top_p}")
        # Logits divided by a temperature near 0 overflow to inf (and the softmax to NaN).
        if not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            raise TfmError(
                f"sampling temperature must be between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}, got {self.temperature}"
            )
        check_seed(self.seed, "seed")
        if self.min_len < 0:
            raise TfmError(f"min_len must be >= 0, got {self.min_len}")
        if any(token < 0 for token in self.banned_ids):
            raise TfmError(f"banned token ids must be >= 0, got {list(self.banned_ids)}")


# The DecodeConfig fields a checkpoint may carry as its own decoding defaults (tfm translate uses them
# unless a flag says otherwise: checkpoints/metadata.read_decode_defaults), and the ones a recipe's
# [decode] section sets among them (the settings a model was tuned with, recorded in every checkpoint
# of the run: recipe.check_decode_section).
CHECKPOINT_DECODE_KEYS = (
    "beam_size", "length_penalty", "length_penalty_kind", "max_len_a", "max_len_b", "banned_ids", "renormalize",
    "forced_eos", "min_len",
)
RECIPE_DECODE_KEYS = ("beam_size", "length_penalty", "max_len_a", "max_len_b")


def config_from_dict(cls: type[ConfigT], values: dict[str, Any], section: str) -> ConfigT:
    """Build the dataclass `cls` from `values`, checking every key and type.

    Returns an instance of `cls`. Raises TfmError naming `section.key` for an unknown key (listing
    the valid ones), a wrong type, or a missing required field.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise TfmError(
            f"unknown key {section}.{unknown[0]}; valid keys in [{section}]: {', '.join(sorted(fields))}"
        )
    checked = {key: check_type(f"{section}.{key}", value, hints[key]) for key, value in values.items()}
    missing = [
        name for name, f in fields.items()
        if name not in checked and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise TfmError(f"missing required key {section}.{missing[0]}")
    return cls(**checked)


def check_type(key: str, value: Any, expected: Any) -> Any:
    """Return `value` (an int widened to float where a float is expected) if it fits `expected`.

    Handles plain types, `X | None`, and `list[X]`; raises TfmError naming `key` otherwise.
    """
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return check_type(key, value, inner[0])
    if origin is list:
        if not isinstance(value, list):
            raise TfmError(f"{key} must be a list, got {type(value).__name__} {value!r}")
        return [check_type(f"{key}[{i}]", item, args[0]) for i, item in enumerate(value)]
    if origin is tuple:
        # `tuple[X, ...]` fields are written as TOML arrays.
        if not isinstance(value, (list, tuple)):
            raise TfmError(f"{key} must be a list, got {type(value).__name__} {value!r}")
        return tuple(check_type(f"{key}[{i}]", item, args[0]) for i, item in enumerate(value))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is a subclass of int: `n_heads = true` must not pass as 1.
    if expected is int and isinstance(value, bool):
        raise TfmError(f"{key} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise TfmError(f"{key} must be of type {expected.__name__}, got {type(value).__name__} {value!r}")
    # No setting of tfm's means anything at infinity or NaN, or past what a 64-bit integer holds.
    if isinstance(value, float) and not math.isfinite(value):
        raise TfmError(f"{key} must be a finite number, got {value!r}")
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        raise TfmError(f"{key} must be between -2**63 and 2**63 - 1, got {value}")
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """Return the dataclass `config` as a plain JSON-ready dict."""
    return dataclasses.asdict(config)


@dataclass(frozen=True)
class TrainConfig:
    """How `tfm train` optimises: batching, Adam and its schedule, loss, stopping, validation, saving."""

    seed: int = 1
    # Token-budget batches: batch size * longest sentence (padding included) stays within this, per side.
    max_tokens: int = 4096
    # Gradient accumulation: one optimizer update per `update_freq` batches.
    update_freq: int = 1
    # Section 5.3: lr = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) when lr = 0;
    # with lr > 0, the same warmup-then-inverse-sqrt shape scaled to peak at `lr` after warmup.
    lr: float = 0.0
    warmup_steps: int = 4000
    # After warmup: "inverse_sqrt" (section 5.3, never reaches zero), or "linear" / "cosine" decay to
    # zero at the end of the budget (the first of max_steps, max_epochs, max_minutes to run out, by the
    # fraction used): a fixed budget ends annealed (Li et al., "Budgeted Training", ICLR 2020). Needs lr > 0.
    lr_schedule: str = "inverse_sqrt"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    # Section 5.4: label smoothing eps_ls = 0.1; padding positions never count.
    label_smoothing: float = 0.1
    # Clip the global gradient norm to this value (0 = no clipping).
    clip_norm: float = 0.0
    # Stopping: the first limit reached ends training (0 = no such limit); at least one must be set.
    max_steps: int = 0
    max_epochs: int = 0
    max_minutes: float = 0.0
    # Stop after this many validations in a row without a better best_metric (0 = never).
    patience: int = 0
    # Validate every this many updates (and at the end); needs data.valid_src/valid_tgt.
    valid_every: int = 1000
    # Decode the validation set for BLEU (greedy, or beam search with valid_beam_size > 1).
    valid_bleu: bool = True
    valid_beam_size: int = 1
    valid_max_len_a: float = 1.5
    valid_max_len_b: int = 10
    # Which validation figure picks checkpoint_best and drives patience: "bleu" or "loss".
    best_metric: str = "bleu"
    # Write checkpoint_STEP every this many updates (and at the end); keep the last `keep_last` (0 = all).
    save_every: int = 1000
    keep_last: int = 5
    # Log training loss, lr, tokens/s and padding every this many updates (also to metrics.jsonl).
    log_every: int = 100
    # auto: bf16 autocast on a CUDA device that supports it, else fp32 (on a CPU too: see
    # training.step.resolve_precision); or fp32 everywhere; or bf16 autocast on CUDA or the CPU; or
    # fp16 autocast on CUDA (with a dynamic loss scaler: updates with inf/nan gradients are skipped and counted).
    precision: str = "auto"
    # Multi-process runs (torchrun): seconds a collective may wait for the other ranks before the run
    # fails; it must exceed rank 0's validation time, during which the other ranks wait.
    dist_timeout: float = 1800.0
    # An update whose loss or gradient is inf/nan is skipped (weights untouched) and counted; this
    # many in a row stop the run with an error after saving the last good weights (0 = never stop).
    max_bad_steps: int = 10
    # Compile the training step with torch.compile (`tfm train --compile`); falls back to eager where
    # torch.compile is not supported, with a message. Costs a compile at the start of every session.
    compile: bool = False
    # Guided alignment (with data.train_alignment; Garg et al. 2019): this weight times the cross-entropy
    # between the reference word alignment and the cross-attention of one head of one decoder layer is
    # added to the token loss. 0 = off; Marian's default weight is 0.1. The layer is a python-style
    # index (-1 = the last, Marian's choice); checkpoints record the layer and head for `tfm align`.
    alignment_weight: float = 0.0
    alignment_layer: int = -1
    alignment_head: int = 0
    # Which decoder row learns target word t's link: True, the row that reads t as its input (it has
    # seen the word it aligns); False, the row that predicts t (Marian's). Recorded as the checkpoint's
    # alignment shift.
    alignment_shift: bool = True
    # Target words without a link learn to attend to the source's EOS (a NULL word, as in the IBM
    # models), and the checkpoint's alignment leaves a word unaligned when EOS outweighs every source
    # word; False: such words have no reference and every word gets a link.
    alignment_null: bool = True
    # The supervised head reads a second decoder pass in which every target position sees the whole
    # target (Garg et al.'s full-context alignment); the token loss keeps the causal pass. Costs that
    # extra pass per guided update; recorded as the checkpoint's alignment full_context.
    alignment_full_context: bool = False
    # An exponential moving average of the weights (Marian's --exponential-smoothing), written as
    # checkpoint_ema.safetensors at every save: after each update average = d * average + (1 - d) *
    # weights with d = min(ema_decay, (1 + step) / (10 + step)) (training.moving_average). 0 = off.
    ema_decay: float = 0.0

    def __post_init__(self) -> None:
        check_seed(self.seed, "train.seed")
        positive = ["max_tokens", "update_freq", "valid_every", "save_every", "log_every", "valid_beam_size"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise TfmError(f"train.{name} must be a positive integer, got {getattr(self, name)}")
        non_negative = ["lr", "warmup_steps", "weight_decay", "clip_norm", "max_steps", "max_epochs",
                        "max_minutes", "patience", "keep_last", "valid_max_len_a", "valid_max_len_b",
                        "alignment_weight"]
        for name in non_negative:
            if getattr(self, name) < 0:
                raise TfmError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise TfmError(f"train.ema_decay must be in [0, 1) (0 = no moving average), got {self.ema_decay}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise TfmError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TfmError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.adam_eps <= 0:
            raise TfmError(f"train.adam_eps must be > 0, got {self.adam_eps}")
        if self.max_bad_steps < 0:
            raise TfmError(f"train.max_bad_steps must be >= 0, got {self.max_bad_steps}")
        if not 0 < self.dist_timeout <= MAX_DIST_TIMEOUT:
            raise TfmError(f"train.dist_timeout must be between 0 and {MAX_DIST_TIMEOUT:.0f} seconds, got {self.dist_timeout}")
        check_search_limits(
            self.valid_beam_size, self.valid_max_len_a, self.valid_max_len_b,
            ("train.valid_beam_size", "train.valid_max_len_a", "train.valid_max_len_b"),
        )
        if self.best_metric not in ("bleu", "loss"):
            raise TfmError(f"train.best_metric must be 'bleu' or 'loss', got {self.best_metric!r}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise TfmError(f"train.precision must be 'auto', 'fp32', 'bf16' or 'fp16', got {self.precision!r}")
        if not (self.max_steps or self.max_epochs or self.max_minutes or self.patience):
            raise TfmError(
                "nothing stops training: set train.max_steps, train.max_epochs, train.max_minutes or train.patience"
            )
        if self.lr == 0 and self.warmup_steps == 0:
            raise TfmError("train.warmup_steps must be > 0 with the paper's schedule (train.lr = 0)")
        if self.lr_schedule not in LR_SCHEDULES:
            raise TfmError(f"train.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if self.lr_schedule != "inverse_sqrt":
            if self.lr == 0:
                raise TfmError(f"train.lr_schedule = {self.lr_schedule!r} needs the peak learning rate train.lr > 0")
            if not (self.max_steps or self.max_epochs or self.max_minutes):
                raise TfmError(
                    f"train.lr_schedule = {self.lr_schedule!r} decays to zero at the end of the budget: set "
                    "train.max_steps, train.max_epochs or train.max_minutes"
                )

    def derived_seed(self, purpose: str, index: int) -> int:
        """derive_seed(self.seed, purpose, index): the seed of one random stream of the run."""
        return derive_seed(self.seed, purpose, index)


LR_SCHEDULES = ("inverse_sqrt", "linear", "cosine")


# Far above any real subword vocabulary; sentencepiece itself takes a 32-bit size.
MAX_VOCAB_SIZE = 1_000_000


@dataclass(frozen=True)
class TokenizerTrainConfig:
    """Settings for training one sentencepiece model."""

    vocab_size: int = 8000
    model_type: str = "unigram"
    character_coverage: float = 1.0
    user_defined_symbols: tuple[str, ...] = ()
    byte_fallback: bool = False
    # Train on a seeded uniform sample of at most this many sentences (0 = all): sentencepiece needs
    # about 3 GB per million sentences of ~150 characters, and half a million is plenty to choose
    # pieces from; with it a whole `tfm train --prepare-only` stays under 2 GiB.
    input_sentence_size: int = 500_000
    # "identity" keeps text byte-exact (decode inverts encode, double spaces and NBSP included);
    # "nmt_nfkc" is sentencepiece's default, which folds Unicode variants and collapses spaces.
    normalization: str = "identity"

    def __post_init__(self) -> None:
        if self.model_type not in ("unigram", "bpe"):
            raise TfmError(f"tokenizer model type must be 'unigram' or 'bpe', got {self.model_type!r}")
        if self.normalization not in ("identity", "nmt_nfkc"):
            raise TfmError(f"normalization must be 'identity' or 'nmt_nfkc', got {self.normalization!r}")
        if not 8 <= self.vocab_size <= MAX_VOCAB_SIZE:
            raise TfmError(f"vocab size must be between 8 and {MAX_VOCAB_SIZE:,}, got {self.vocab_size:,}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise TfmError(f"character coverage must be in (0, 1], got {self.character_coverage}")
        if self.input_sentence_size < 0:
            raise TfmError(
                f"the sentences to sample (--max-sentences, tokenizer.input_sentence_size) must be 0 (all) "
                f"or more, got {self.input_sentence_size}"
            )


@dataclass(frozen=True)
class AlignmentConfig:
    """Which attention becomes the word alignment: a trained aligner, or a decoder layer's cross-attention
    (one head or their mean), and the row.

    A checkpoint stores the one that aligns best for its model (its trained aligner, a guided-alignment
    run's trained head, or a measured choice); `translate --alignment`, `inspect-attention --format pharaoh` and
    `tfm align` use it unless flags say otherwise.
    """

    layer: int = -1  # python-style index into the decoder layers; -1 = the last
    head: int | None = None  # python-style index into the heads; None = mean over heads
    # False: target token t's link is read from the step that predicts t (its attention row).
    # True: from the step that reads t as input and predicts t + 1 ("shift", Garg et al. 2019,
    # Chen et al. 2020): that step has seen t, which often makes its attention a better aligner.
    shift: bool = False
    # True: a target word whose attention gives the source's EOS more weight than any source word is
    # left unaligned (a guided head learns this for words without a counterpart); False: every target
    # word is linked to its best source word.
    null: bool = False
    # True: the attention comes from a pass in which every target position sees the whole target
    # (Garg et al. 2019's full context; a guided run with train.alignment_full_context learns it);
    # False: from the causal pass that translation runs.
    full_context: bool = False
    # True: the checkpoint's trained aligner (model/aligner.py, `tfm train-aligner`) gives the attention
    # instead of a cross-attention of the decoder (layer, head and full_context then do not apply);
    # aligner_hidden and aligner_dim are its sizes, aligner_context whether it has a self-attention
    # layer over the target positions (model/aligner.TargetContext).
    aligner: bool = False
    aligner_hidden: int = 512
    aligner_dim: int = 256
    aligner_context: bool = False

    def check(self, n_layers: int, n_heads: int, names: tuple[str, str] = ("alignment layer", "alignment head")) -> None:
        """Raise TfmError if the layer or head does not exist in a model of this size (`names`: how to call them)."""
        if not -n_layers <= self.layer < n_layers:
            raise TfmError(f"{names[0]} {self.layer} does not exist: the decoder has {n_layers} layers")
        if self.head is not None and not -n_heads <= self.head < n_heads:
            raise TfmError(
                f"{names[1]} {self.head} does not exist: layers have {n_heads} heads (0-{n_heads - 1}, or -1 for the last)"
            )
        if self.aligner_hidden < 1 or self.aligner_dim < 1:
            raise TfmError(f"aligner sizes must be positive, got hidden {self.aligner_hidden} and dim {self.aligner_dim}")
        if self.aligner_context and self.aligner_dim % TARGET_CONTEXT_HEADS:
            raise TfmError(f"an aligner with a target context needs a dim divisible by {TARGET_CONTEXT_HEADS}, got {self.aligner_dim}")


# The [data] and [tokenizer] sections of a training recipe (recipe.py reads the file).


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel text is, which pairs training keeps, and where the prepared corpus is kept."""

    train_src: str
    train_tgt: str
    valid_src: str = ""
    valid_tgt: str = ""
    # Pairs with more subword tokens than this on either side (EOS included) are skipped and counted.
    max_length: int = 256
    # Pairs whose longer side has more than this many times the tokens of the shorter are skipped
    # (misaligned lines in crawled data); 0 keeps every ratio.
    max_length_ratio: float = 0.0
    # Skip pairs whose two sides are the same text (untranslated copies in crawled data).
    skip_identical: bool = False
    # A line that is not valid UTF-8: "fail" stops with its file and line; "skip" drops the pair and counts it.
    invalid_utf8: str = "fail"
    # How often an epoch takes each training pair of train_src/train_tgt: 2.0 twice, 0.5 a seeded half.
    train_weight: float = 1.0
    # More training corpora, each {src, tgt, weight}: e.g. a small in-domain corpus with weight 3.
    more_train: tuple[TrainCorpus, ...] = ()
    # Where prepared (tokenized) corpora and trained tokenizers are kept; empty: RUN/cache. A folder
    # shared by several runs prepares each corpus once.
    cache_dir: str = ""
    # Guided alignment (Garg et al. 2019; Marian's --guided-alignment): word alignments of
    # train_src/train_tgt in Pharaoh format, one line per pair ("0-0 1-2 ...", 0-based indices of the
    # space-separated words, source first; "s?t" links count as links). Needs train.alignment_weight > 0.
    train_alignment: str = ""
    # Subword regularization (Kudo 2018): every epoch draws each training sentence's segmentation from
    # the unigram model's subword_nbest best ones, with probability proportional to P ** subword_alpha
    # (a function of seed, epoch and line, so resume is exact). 1 is off: always the best segmentation,
    # which validation and inference use in any case. Needs a unigram sentencepiece model.
    subword_nbest: int = 1
    subword_alpha: float = 0.1
    # The first epoch (counting from 1, as the log does) whose segmentations are drawn; the epochs
    # before it train on the best segmentation (sampling slows the first epochs' progress; what a
    # later start gave on Multi30k: recipes/multi30k/RESULTS.md). Used when subword_nbest > 1.
    subword_sampling_from_epoch: int = 1
    # Sentence concatenation (corpus/sentence_concatenation.py): every epoch this share of the training pairs is
    # trained joined to another random pair (source after source, target after target), so that the
    # model translates a line holding several sentences whole. 0 is off.
    concatenation_share: float = 0.0

    def __post_init__(self) -> None:
        for name in ("train_src", "train_tgt"):
            if not getattr(self, name):
                raise TfmError(f"data.{name} is empty; give the training text file")
        if bool(self.valid_src) != bool(self.valid_tgt):
            raise TfmError("data.valid_src and data.valid_tgt must be given together")
        if self.max_length < 2:
            raise TfmError(f"data.max_length must be at least 2, got {self.max_length}")
        if not (self.max_length_ratio == 0 or self.max_length_ratio >= 1):
            raise TfmError(f"data.max_length_ratio must be 0 (off) or at least 1, got {self.max_length_ratio}")
        if self.invalid_utf8 not in INVALID_UTF8_POLICIES:
            raise TfmError(f"data.invalid_utf8 must be one of {', '.join(INVALID_UTF8_POLICIES)}, got {self.invalid_utf8!r}")
        check_corpus_weight(self.train_weight, "data.train_weight")
        if not 1 <= self.subword_nbest <= MAX_SUBWORD_NBEST:
            raise TfmError(f"data.subword_nbest must be 1 (off) to {MAX_SUBWORD_NBEST}, got {self.subword_nbest}")
        if not 0 <= self.subword_alpha <= MAX_SUBWORD_ALPHA:
            raise TfmError(f"data.subword_alpha must be in [0, {MAX_SUBWORD_ALPHA:g}], got {self.subword_alpha}")
        if self.subword_sampling_from_epoch < 1:
            raise TfmError(
                f"data.subword_sampling_from_epoch counts epochs from 1, got {self.subword_sampling_from_epoch}"
            )
        if not 0 <= self.concatenation_share <= 1:
            raise TfmError(f"data.concatenation_share must be in [0, 1] (0 is off), got {self.concatenation_share}")
        if self.train_alignment and self.concatenation_share > 0:
            raise TfmError(
                "data.train_alignment's word links belong to single pairs, but data.concatenation_share > 0 "
                "joins pairs; use one of the two"
            )
        if self.train_alignment and self.subword_nbest > 1:
            raise TfmError(
                "data.train_alignment's word links are placed on the best segmentation of each pair, but "
                "data.subword_nbest > 1 draws other segmentations; use one of the two"
            )
        if self.train_alignment and self.more_train:
            raise TfmError(
                "data.train_alignment aligns train_src/train_tgt only, but data.more_train adds corpora without "
                "alignments; train with one corpus (merge them, with their alignment files, into one)"
            )

    @property
    def train_corpora(self) -> tuple[TrainCorpus, ...]:
        """Every training corpus, train_src/train_tgt first."""
        return (TrainCorpus(self.train_src, self.train_tgt, self.train_weight), *self.more_train)


INVALID_UTF8_POLICIES = ("fail", "skip")
MAX_SUBWORD_NBEST = 1000  # sentencepiece's n-best search grows with it; Kudo (2018) used 64
MAX_SUBWORD_ALPHA = 100.0
MAX_CORPUS_WEIGHT = 1000.0


def check_corpus_weight(weight: float, key: str) -> None:
    """Raise TfmError unless 0 < weight <= MAX_CORPUS_WEIGHT."""
    if not 0 < weight <= MAX_CORPUS_WEIGHT:
        raise TfmError(f"{key} must be above 0 and at most {MAX_CORPUS_WEIGHT:.0f}, got {weight}")


@dataclass(frozen=True)
class TrainCorpus:
    """One training corpus: its source and target files, and how often an epoch takes each of its pairs."""

    src: str
    tgt: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_corpus_weight(self.weight, "weight")


def train_corpora_from_list(values: Any, key: str) -> tuple[TrainCorpus, ...]:
    """data.more_train as TrainCorpus entries: a list of {src, tgt, weight} tables; TfmError naming the entry."""
    if not isinstance(values, (list, tuple)):
        raise TfmError(f"{key} must be a list of {{src, tgt, weight}} tables, got {values!r}")
    corpora = []
    for index, table in enumerate(values):
        where = f"{key}[{index}]"
        if not isinstance(table, dict):
            raise TfmError(f"{where} must be a table {{src, tgt, weight}}, got {table!r}")
        try:
            corpus = config_from_dict(TrainCorpus, table, where)
        except TfmError as error:
            message = str(error)
            raise TfmError(message if where in message else f"{where}.{message}") from None
        if not corpus.src or not corpus.tgt:
            raise TfmError(f"{where} needs both src and tgt files")
        corpora.append(corpus)
    return tuple(corpora)


@dataclass(frozen=True)
class TokenizerConfig:
    """Existing sentencepiece models (src_model, optional tgt_model), or settings to train them first."""

    # An existing model from `tfm tokenize train`; when given, the training settings below are unused.
    src_model: str = ""
    # Empty: the source model serves both sides (a joint vocabulary).
    tgt_model: str = ""
    # When training: one model on source + target text (True) or one per side (False).
    joint: bool = True
    train: TokenizerTrainConfig | None = None

    def train_settings(self) -> TokenizerTrainConfig:
        """The sentencepiece training settings (defaults where the recipe gives none)."""
        return self.train if self.train is not None else TokenizerTrainConfig()
