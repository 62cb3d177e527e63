"""Step masks: the constraints on the next token, applied by `mask_step`, which every search calls.

A mask sets the log-probs of the tokens that may not follow to -inf, in place, with tensor ops only
(no per-row Python). Bans apply before the optional renormalisation (log_softmax again, so the
scores are over what may be generated); a beam search's state (search_state.SearchState, e.g. the
lexical constraints' tracker) and the length limit after it (they only steer and close beams, and leave
the scores the model's). Adding a token ban is one class here, listed in `step_masks`, plus its test; a
policy that needs state per hypothesis is a SearchState instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.decoding import StepDecoder
from tfm_cli.inference.search_state import SearchState


class StepMask(ABC):
    """One constraint on the next token."""

    @abstractmethod
    def apply(self, log_probs: torch.Tensor, step: int, closing: torch.Tensor) -> None:
        """Mask log_probs: (R, V) in place at `step` (the output tokens each row holds so far);
        closing: (R,) bool on the CPU, the rows at their length limit (LengthLimit closes them)."""


class BannedTokens(StepMask):
    """Tokens never generated: padding and BOS (a model still gives them some probability: their
    pieces would vanish from the text but count in the score), UNK with --no-unk (as Marian's and
    fairseq's --no-unk / --unkpen), and an imported model's bad_words_ids."""

    def __init__(self, decoder: StepDecoder, no_unk: bool = False, banned_ids: tuple[int, ...] = ()) -> None:
        outside = [token for token in banned_ids if token >= decoder.vocab_size]
        if outside:
            raise TfmError(f"banned token id {outside[0]} is outside the target vocabulary ({decoder.vocab_size} ids)")
        banned = torch.zeros(decoder.vocab_size, dtype=torch.bool)
        banned[[decoder.pad_id, decoder.bos_id]] = True
        if no_unk:
            banned[decoder.unk_id] = True
        banned[list(banned_ids)] = True
        self.ids = banned.nonzero().view(-1)  # (n_banned,)

    def apply(self, log_probs: torch.Tensor, step: int, closing: torch.Tensor) -> None:
        log_probs.index_fill_(1, self.ids.to(log_probs.device), float("-inf"))


class MinLength(StepMask):
    """No EOS before `min_len` output tokens (EOS excluded), but on a row at its length limit: there
    the limit wins (EOS keeps its log-prob), as generate's max_length wins over its min_length."""

    def __init__(self, eos: int, min_len: int) -> None:
        self.eos, self.min_len = eos, min_len

    def apply(self, log_probs: torch.Tensor, step: int, closing: torch.Tensor) -> None:
        if step < self.min_len:
            log_probs[:, self.eos].masked_fill_(~closing.to(log_probs.device), float("-inf"))


class LengthLimit:
    """At a row's limit only EOS may follow, so every output ends cleanly (finished=False).

    forced_eos: EOS then scores 0 (probability 1, as generate's forced_eos_token_id); else it keeps
    the model's log-prob.
    """

    def __init__(self, eos: int, forced_eos: bool = False) -> None:
        self.eos, self.forced_eos = eos, forced_eos

    def closing(self, step: int, row_limits: torch.Tensor) -> torch.Tensor:
        """(R,) bool: the rows that must end with EOS now; row_limits: (R,) int64, each row's most
        output tokens (EOS excluded)."""
        return row_limits <= step

    def apply(self, log_probs: torch.Tensor, closing: torch.Tensor) -> None:
        closing = closing.to(log_probs.device)[:, None]  # (R, 1)
        not_eos = torch.ones(log_probs.size(1), dtype=torch.bool, device=log_probs.device)
        not_eos[self.eos] = False
        log_probs.masked_fill_(closing & not_eos, float("-inf"))
        if self.forced_eos:
            log_probs[:, self.eos].masked_fill_(closing[:, 0], 0.0)


@dataclass
class StepMasks:
    """The masks of one search: bans, renormalisation, then constraints and the length limit."""

    bans: list[StepMask]
    renormalize: bool
    limit: LengthLimit
    state: SearchState | None = None  # a beam search's policy with state per row (search_state.py)


def step_masks(decoder: StepDecoder, config: DecodeConfig, state: SearchState | None = None) -> StepMasks:
    """The masks `config` asks for, plus a beam search's `state` (its mask comes after the stateless ones)."""
    bans: list[StepMask] = [BannedTokens(decoder, config.no_unk, config.banned_ids)]
    if config.min_len > 0:
        bans.append(MinLength(decoder.eos_id, config.min_len))
    return StepMasks(bans, config.renormalize, LengthLimit(decoder.eos_id, config.forced_eos), state)


def mask_step(log_probs: torch.Tensor, masks: StepMasks, step: int, row_limits: torch.Tensor) -> torch.Tensor:
    """Apply every mask to log_probs: (R, V) in place at `step` (output tokens so far).

    row_limits: (R,) int64 on the CPU, each row's length limit (EOS excluded). Returns (R,) bool on
    the CPU: the rows closed at their limit.
    """
    closing = masks.limit.closing(step, row_limits)
    for mask in masks.bans:
        mask.apply(log_probs, step, closing)
    if masks.renormalize:  # over what may follow; the length limit then only closes beams
        torch.log_softmax(log_probs, dim=-1, out=log_probs)
    if masks.state is not None:
        masks.state.apply(log_probs, step, row_limits, closing)
    if bool(closing.any()):
        masks.limit.apply(log_probs, closing)
    return closing
