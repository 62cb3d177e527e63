"""The contract between beam search and a policy that keeps state per hypothesis row.

Lexical constraints (constraints.ConstraintTracker) are such a policy: what may follow depends on what
each output holds so far. search.search_beams calls the state at fixed points and knows nothing else of
it; whoever knows the policy's data builds the state for a batch (translation.Translator for the
phrases of its lines) and hands it to the search. A search without one keeps plain beams (PlainBeams).

Per search, in order:
  start(width)                       once: rows i*width .. i*width+width-1 belong to sentence i
  apply(log_probs, step, ...)        every step, after the stateless step masks (step_masks.mask_step)
  candidates(log_probs, scores, beam)  every step: the 2 * beam candidates of each sentence
  unmet_tokens()                     when hypotheses finish: what each row still lacks (0 = all met);
                                     finished outputs that lack more rank after the others
  select(rows, tokens)               every step: the rows kept, each extended by its chosen token
A new kind of policy is one class implementing these, and its test over a scripted decoder.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class SearchState(ABC):
    """State per hypothesis row of a beam search, kept in step with the search's rows."""

    @abstractmethod
    def start(self, rows_per_sentence: int) -> None:
        """Begin: `rows_per_sentence` rows per sentence, sentence-major, with nothing produced yet."""

    @abstractmethod
    def apply(self, log_probs: torch.Tensor, step: int, row_limits: torch.Tensor, closing: torch.Tensor) -> None:
        """Mask log_probs: (R, V) in place at `step`; row_limits: (R,) int64 each row's length limit,
        closing: (R,) bool the rows the length limit closes now."""

    @abstractmethod
    def candidates(
        self, log_probs: torch.Tensor, scores: torch.Tensor, beam: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The continuations each sentence may keep, best first: (scores, row within the sentence, tokens),
        each (n, 2 * beam); log_probs: (R, V) masked, scores: (n, width) raw scores of the rows."""

    @abstractmethod
    def unmet_tokens(self) -> torch.Tensor:
        """(R,) int64: how much each row's output still lacks (0: the policy is satisfied)."""

    @abstractmethod
    def select(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Keep `rows` (R',) int64 of the state, in order, each extended by its token (R',) int64."""


class PlainBeams(SearchState):
    """No policy: every row is satisfied, and the candidates are the best 2 * beam continuations."""

    def __init__(self) -> None:
        self.rows = 0  # rows of the current step (what unmet_tokens answers for)

    def start(self, rows_per_sentence: int) -> None:
        pass

    def apply(self, log_probs: torch.Tensor, step: int, row_limits: torch.Tensor, closing: torch.Tensor) -> None:
        self.rows = log_probs.size(0)

    def candidates(
        self, log_probs: torch.Tensor, scores: torch.Tensor, beam: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return best_candidates(log_probs, scores, beam)

    def unmet_tokens(self) -> torch.Tensor:
        return torch.zeros(self.rows, dtype=torch.long)

    def select(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        pass


def best_candidates(log_probs: torch.Tensor, scores: torch.Tensor, beam: int) -> tuple[torch.Tensor, ...]:
    """The 2 * beam best continuations of each sentence, best first.

    log_probs: (R, V) masked; scores: (n, width) raw scores of the rows (R = n * width). Returns
    (scores, row within the sentence, tokens), each (n, 2 * beam) (fewer with a tiny vocabulary).
    """
    n_sentences, width = scores.shape
    # The best 2k of a sentence's width * V candidates are among the best 2k of each of its rows,
    # so each row is cut to its best 2k first and only those get the row's score added.
    row_best, row_tokens = log_probs.topk(min(2 * beam, log_probs.size(1)), dim=1)  # (R, c) each
    row_best, row_tokens = row_best.cpu(), row_tokens.cpu()
    per_row = row_best.size(1)
    candidates = (scores.view(-1, 1) + row_best).view(n_sentences, width * per_row)
    top_scores, top_ids = candidates.topk(min(2 * beam, width * per_row), dim=1)  # (n, 2k), best first
    return top_scores, top_ids // per_row, row_tokens.view(n_sentences, width * per_row).gather(1, top_ids)
