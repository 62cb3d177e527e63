"""Frozen dataclass configs (model, decoding) and their validated construction from dicts/TOML.

Precedence everywhere: dataclass defaults < recipe file < command line. Unknown keys and wrong
types are errors that name the key, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from tfm_cli.errors import TfmError

ConfigT = TypeVar("ConfigT")

# Fixed when the tokenizer is trained (sentencepiece has no pad id by default, so we set all four).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and switches of the encoder-decoder Transformer (names follow the paper)."""

    src_vocab_size: int
    tgt_vocab_size: int
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
    activation: str = "relu"
    # Joint vocabulary: one embedding matrix for source, target and the output projection.
    share_embeddings: bool = False
    # Section 3.4: the target embedding and the pre-softmax projection share weights.
    tie_output: bool = True
    max_positions: int = 1024
    layer_norm_eps: float = 1e-5
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        positive = ["src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                    "n_enc_layers", "n_dec_layers", "max_positions"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise TfmError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise TfmError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TfmError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.activation not in ("relu", "gelu"):
            raise TfmError(f"model.activation must be 'relu' or 'gelu', got {self.activation!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise TfmError(
                "model.share_embeddings needs one joint vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        special = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        if len(set(special.values())) != 4:
            raise TfmError(f"special token ids must be distinct, got {special}")
        for name, value in special.items():
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise TfmError(f"model.{name}={value} is outside the vocabulary")

    @property
    def head_dim(self) -> int:
        """d_k = d_v = d_model / h (section 3.2.2)."""
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class DecodeConfig:
    """How translate searches: beam size, length penalty, output length limit, n-best."""

    beam_size: int = 5
    # GNMT length penalty ((5 + len) / 6) ** alpha; section 6.1 of the paper uses alpha = 0.6.
    length_penalty: float = 0.6
    # Maximum output length is max_len_a * src_len + max_len_b (in subword tokens, EOS excluded).
    max_len_a: float = 1.5
    max_len_b: int = 10
    nbest: int = 1

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise TfmError(f"beam size must be at least 1, got {self.beam_size}")
        if not 1 <= self.nbest <= self.beam_size:
            raise TfmError(f"nbest must be between 1 and the beam size ({self.beam_size}), got {self.nbest}")
        if self.length_penalty < 0:
            raise TfmError(f"length penalty alpha must be >= 0, got {self.length_penalty}")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise TfmError("max_len_a and max_len_b must be >= 0")


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
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is a subclass of int: `n_heads = true` must not pass as 1.
    if expected is int and isinstance(value, bool):
        raise TfmError(f"{key} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise TfmError(f"{key} must be of type {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """Return the dataclass `config` as a plain JSON-ready dict."""
    return dataclasses.asdict(config)
