"""The length penalty as a scoring rule: a hypothesis' normalised score, and when a beam search may stop.

One class per kind (`gnmt`, `hf`, `none`); the searches, `translate --scores`/--json, `score -m` and
the exporters ask the rule and never write a formula of their own. Adding a kind is one class here
(registered in KINDS) plus its test. Lengths n count output tokens including EOS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError


class LengthPenalty(ABC):
    """raw score / divisor(n); `sentence_is_done` says when a beam search may stop a sentence."""

    kind: ClassVar[str]

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    @abstractmethod
    def divisor(self, length: int) -> float:
        """The penalty of an output of `length` tokens (EOS included)."""

    @abstractmethod
    def formula(self) -> str:
        """The divisor as text (for --json's score_normalisation), in terms of n."""

    def normalise(self, raw: float, length: int) -> float:
        """raw / divisor(length): the score translate prints and ranks by."""
        return raw / self.divisor(length)

    def generate_length_penalty(self) -> float:
        """The `length_penalty` Hugging Face's generate should get for this rule (exporters write it)."""
        return self.alpha

    @abstractmethod
    def sentence_is_done(
        self, finished: list[float], beam: int, nbest: int, best_live: float, step: int, max_length: int
    ) -> bool:
        """Whether a beam search may stop a sentence after `step` (0-based; the live beams hold step + 1 tokens).

        finished: the normalised scores of its finished hypotheses (any order); best_live: the raw
        score of its best live beam; max_length: its output limit (EOS excluded).
        """

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.alpha == self.alpha

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.alpha})"


class MonotonePenalty(LengthPenalty):
    """A penalty monotone in n, with fairseq's stop: `beam` finished hypotheses, or no live beam can
    still enter the `nbest` best (an exact bound: stopping then changes no output)."""

    def sentence_is_done(
        self, finished: list[float], beam: int, nbest: int, best_live: float, step: int, max_length: int
    ) -> bool:
        if len(finished) >= beam:
            return True
        if len(finished) < nbest:
            return False
        # A later hypothesis with an equal score ranks after the earlier ones (the final sort is
        # stable), so ties count as decided.
        nth_best = sorted(finished, reverse=True)[nbest - 1]
        return nth_best >= self.best_possible_score(best_live, step + 2, max_length + 1)

    def best_possible_score(self, raw_score: float, shortest: int, longest: int) -> float:
        """The highest normalised score any extension of a live hypothesis can still reach.

        raw_score: its raw score now (<= 0; extending only adds log-probs <= 0); shortest/longest:
        the fewest and most output tokens (EOS included) it can end with. The divisor is monotone,
        so the best is at one of the two ends.
        """
        return max(raw_score / self.divisor(shortest), raw_score / self.divisor(longest))


class GnmtPenalty(MonotonePenalty):
    """GNMT's ((5 + n) / 6) ** alpha (Wu et al. 2016; the paper's section 6.1 uses alpha 0.6): tfm's own."""

    kind = "gnmt"

    def divisor(self, length: int) -> float:
        return ((5.0 + length) / 6.0) ** self.alpha

    def formula(self) -> str:
        return f"((5 + n) / 6) ** {self.alpha}"


class NoPenalty(MonotonePenalty):
    """No normalisation: the raw sum of log-probs (alpha is kept but unused)."""

    kind = "none"

    def divisor(self, length: int) -> float:
        return 1.0

    def formula(self) -> str:
        return "1"

    def generate_length_penalty(self) -> float:
        return 0.0


class HfPenalty(LengthPenalty):
    """n ** alpha, with the stop of Hugging Face's beam search (`_beam_search`, early_stopping=False).

    generate divides by (cur_len + 1 - decoder_prompt_len) ** alpha: the generated tokens, EOS
    included, which is n. Its stop is a heuristic, not a bound: a sentence stops once it has `beam`
    finished hypotheses and its best live beam's raw score over (tokens so far) ** alpha is no better
    than the worst of them; until then better finished ones keep replacing worse ones.
    """

    kind = "hf"

    def divisor(self, length: int) -> float:
        return float(length) ** self.alpha

    def formula(self) -> str:
        return f"n ** {self.alpha}"

    def sentence_is_done(
        self, finished: list[float], beam: int, nbest: int, best_live: float, step: int, max_length: int
    ) -> bool:
        if len(finished) < beam:
            return False
        return best_live / self.divisor(step + 1) <= sorted(finished, reverse=True)[beam - 1]


KINDS: dict[str, type[LengthPenalty]] = {rule.kind: rule for rule in (GnmtPenalty, HfPenalty, NoPenalty)}


def length_penalty_of(kind: str, alpha: float) -> LengthPenalty:
    """The rule of `kind` with exponent `alpha`. Raises TfmError for an unknown kind."""
    if kind not in KINDS:
        raise TfmError(f"length penalty kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return KINDS[kind](alpha)


def decode_length_penalty(config: DecodeConfig) -> LengthPenalty:
    """The rule a DecodeConfig asks for (its length_penalty_kind and length_penalty alpha)."""
    return length_penalty_of(config.length_penalty_kind, config.length_penalty)
