"""Ensembles: several models searched as one, through the same StepDecoder seam as a single model.

Each step's log-probs are the weighted mean of the members' log-softmax outputs (weights positive,
summing to 1), as Marian combines its scorers (it sums weight x log-prob); fairseq averages the
probabilities instead. Members must share both vocabularies (pieces and sentencepiece models) and
the special ids, so one source encoding and one target id space serve them all; `check_members`
refuses anything else. They may differ in shape and in max_positions (the smallest holds). The mean
is not a normalised distribution (its exps sum to at most 1): the searches rank and sum it, sampling
draws from its softmax, and `score -m` scores it the same way (model_scores.token_log_probs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from tfm_cli.config import ModelConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.decoding import StepDecoder, TransformerDecoder
from tfm_cli.inference.shortlist import ShortlistBatch
from tfm_cli.model import Transformer

if TYPE_CHECKING:
    from tfm_cli.checkpoints.format import LoadedModel
    from tfm_cli.tokenization.tokenizer import Tokenizer
    from tfm_cli.tokenization.vocabulary import MappedTokenizer

SPECIAL_IDS = ("pad_id", "unk_id", "bos_id", "eos_id")


class Ensemble(nn.Module):
    """Models that share their vocabularies and special ids, with one weight each (positive, sum 1).

    An nn.Module so that its members move, and report their device, together.
    """

    def __init__(self, models: Sequence[Transformer], weights: Sequence[float]) -> None:
        super().__init__()
        if len(models) < 2 or len(weights) != len(models):
            raise ValueError(f"an ensemble needs two or more models and one weight each, got {len(models)} and {len(weights)}")
        if not all(weight > 0 for weight in weights) or not math.isclose(math.fsum(weights), 1.0):
            raise ValueError(f"ensemble weights must be positive and sum to 1, got {list(weights)}")
        self.members = nn.ModuleList(models)
        self.weights = tuple(float(weight) for weight in weights)
        # The first member's config with the smallest max_positions of all: a source (and an output) must
        # fit every member. Vocabulary sizes and special ids are every member's (check_members).
        max_positions = min(model.config.max_positions for model in models)
        self.config: ModelConfig = dataclasses.replace(models[0].config, max_positions=max_positions)

    def log_probs(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: src (B, S), tgt_in (B, T) int64 -> (B, T, V) float32, the weighted mean of the
        members' log-softmax (what EnsembleDecoder.step gives one position at a time)."""
        return weighted_mean((torch.log_softmax(member(src, tgt_in).float(), dim=-1) for member in self.members), self.weights)


def weighted_mean(log_probs: Iterable[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum_i weights[i] * log_probs[i], elementwise, member by member in order; the tensors are fresh
    ones nobody else holds, and are changed in place (the largest of a step are not allocated twice).

    A multiply then an add, each rounded on its own, so an element's value does not depend on where it
    lies in the tensor (a fused multiply-add in the vectorised part only would break batch invariance).
    """
    total = None
    for weight, values in zip(weights, log_probs):
        values = values.mul_(weight)
        total = values if total is None else total.add_(values)
    return total


class EnsembleDecoder:
    """A StepDecoder over one TransformerDecoder per member of an Ensemble, for one source batch.

    start and select go to every member; step gives the weighted mean of their log-probs. Each member
    is batch-invariant and the mean is elementwise, so the ensemble is batch-invariant too. A shortlist
    restricts every member to the same target ids.
    """

    def __init__(self, ensemble: Ensemble, src: torch.Tensor, shortlist: ShortlistBatch | None = None) -> None:
        self.members = [TransformerDecoder(model, src, shortlist=shortlist) for model in ensemble.members]
        self.weights = ensemble.weights
        first = self.members[0]
        self.n_sentences, self.vocab_size = first.n_sentences, first.vocab_size
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = first.pad_id, first.unk_id, first.bos_id, first.eos_id

    def max_lengths(self, max_len_a: float, max_len_b: int) -> list[int]:
        """Per sentence, the smallest of the members' limits (they differ only by max_positions)."""
        return [min(limits) for limits in zip(*(member.max_lengths(max_len_a, max_len_b) for member in self.members))]

    def start(self, rows_per_sentence: int, grouped: bool) -> None:
        """Start every member (each encodes the sources)."""
        for member in self.members:
            member.start(rows_per_sentence, grouped)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (R,) int64 -> (R, V) float32, the weighted mean of the members' log-probs (a new tensor)."""
        return weighted_mean((member.step(tokens) for member in self.members), self.weights)

    def select(self, rows: torch.Tensor, group_width: int = 1) -> None:
        """Keep `rows` (R',) int64 in every member's state."""
        for member in self.members:
            member.select(rows, group_width)


def step_decoder(model: Transformer | Ensemble, src: torch.Tensor, shortlist: ShortlistBatch | None = None) -> StepDecoder:
    """The StepDecoder that searches `model` (a Transformer or an Ensemble) for src: (N, S) int64, on the
    batch's `shortlist` of target ids when one is given."""
    if isinstance(model, Ensemble):
        return EnsembleDecoder(model, src, shortlist)
    return TransformerDecoder(model, src, shortlist=shortlist)


def ensemble_weights(text: str | None, count: int, option: str = "--ensemble-weights") -> tuple[float, ...]:
    """The weights of `count` models: equal without `text`, else its comma-separated positive numbers,
    one per model, scaled to sum to 1. Raises TfmError naming `option` for anything else."""
    if text is None:
        return (1.0 / count,) * count
    fields = [field.strip() for field in text.split(",")]
    if len(fields) != count:
        raise TfmError(f"{option} gives {len(fields)} weight(s) for {count} model(s) (-m): give one per model, e.g. 0.6,0.4")
    weights = []
    for field in fields:
        try:
            weight = float(field)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise TfmError(f"{option} must be positive numbers, got {field!r}")
        weights.append(weight)
    largest = max(weights)
    relative = [weight / largest for weight in weights]  # so that huge weights cannot overflow their sum
    total = math.fsum(relative)
    return tuple(weight / total for weight in relative)


def vocabulary_difference(first: Tokenizer | MappedTokenizer, other: Tokenizer | MappedTokenizer) -> str | None:
    """How two tokenizers' vocabularies differ, in a few words, or None when they are the same (the same
    pieces in the same order, and the same sentencepiece model, which decides how text is cut)."""
    if first.vocab_size != other.vocab_size:
        return f"{first.vocab_size} vs {other.vocab_size} pieces"
    for piece_id in range(first.vocab_size):
        if first.id_to_piece(piece_id) != other.id_to_piece(piece_id):
            return f"piece {piece_id} is {first.id_to_piece(piece_id)!r} vs {other.id_to_piece(piece_id)!r}"
    if first.model_bytes != other.model_bytes:
        return "the same pieces, but other sentencepiece models: they may cut the same text differently"
    return None


def member_difference(first: LoadedModel, other: LoadedModel) -> str | None:
    """What keeps `other` from joining `first` in an ensemble (vocabularies, special ids), or None."""
    for side in ("source", "target"):
        attribute = "src_tokenizer" if side == "source" else "tgt_tokenizer"
        difference = vocabulary_difference(getattr(first, attribute), getattr(other, attribute))
        if difference is not None:
            return f"their {side} vocabularies differ ({difference})"
    for name in SPECIAL_IDS:
        if getattr(first.config, name) != getattr(other.config, name):
            return f"their special ids differ ({name} {getattr(first.config, name)} vs {getattr(other.config, name)})"
    return None


def check_members(paths: Sequence[str], members: Sequence[LoadedModel]) -> None:
    """Raise TfmError naming two of `paths` and what differs unless every member can join the first."""
    for path, member in zip(paths[1:], members[1:]):
        difference = member_difference(members[0], member)
        if difference is not None:
            raise TfmError(
                f"{paths[0]} and {path} cannot be ensembled: {difference}; the models of an ensemble (-m ... -m ...) "
                "must share both vocabularies and the special ids"
            )


def ensemble_of(paths: Sequence[str], members: Sequence[LoadedModel], weights: Sequence[float]) -> Ensemble:
    """The Ensemble of loaded `members` (read from `paths`) with `weights`; TfmError if they cannot join."""
    check_members(paths, members)
    return Ensemble([member.model for member in members], weights)
