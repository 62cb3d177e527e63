"""Decoding searches over a step function (greedy, beam), and the one definition of a sequence score.

Score convention, shared by `translate`, `score -m` and the tests:
  raw score   = sum of log p(y_t | y_<t, x) over the output tokens, EOS included (natural log);
  normalised  = raw / length_penalty(len), len = number of output tokens including EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfm_cli.model import Transformer


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016; the paper's section 6.1).

    `length` counts output tokens including EOS. alpha = 0 gives 1.0 (no normalisation).
    """
    return ((5.0 + length) / 6.0) ** alpha


@dataclass
class Hypothesis:
    """One decoded output for one source sentence."""

    tokens: list[int]  # output ids, EOS excluded
    score: float  # raw score: sum of token log-probs, EOS included when the output ended with it
    finished: bool  # True if the model chose EOS; False if EOS was forced at the length limit


def max_output_lengths(src_lengths: torch.Tensor, max_len_a: float, max_len_b: int, limit: int) -> torch.Tensor:
    """Per sentence, the most output tokens (EOS excluded) allowed: a * src_len + b, capped at `limit`.

    src_lengths: (B,) int64, counting the source EOS. Returns (B,) int64.
    """
    lengths = (src_lengths.to(torch.float64) * max_len_a).floor().to(torch.int64) + max_len_b
    return lengths.clamp(min=1, max=limit)


@torch.inference_mode()
def greedy_search(model: Transformer, src: torch.Tensor, max_len_a: float = 1.5, max_len_b: int = 10) -> list[Hypothesis]:
    """Greedy decoding with the incremental cache; finished sentences leave the batch.

    src: (B, S) int64 padded with pad_id (each row ending in EOS). Returns B hypotheses in input order.
    """
    config = model.config
    encoded = model.encode(src)
    state = model.start_decoding(encoded)
    # One position is needed for BOS, so at most max_positions - 1 outputs including EOS.
    max_lengths = max_output_lengths(encoded.src_mask.sum(1), max_len_a, max_len_b, config.max_positions - 2)
    active = torch.arange(src.size(0), device=src.device)  # original row of each live hypothesis
    tokens = torch.full((src.size(0),), config.bos_id, dtype=torch.long, device=src.device)
    outputs: list[list[int]] = [[] for _ in range(src.size(0))]
    scores = [0.0] * src.size(0)
    finished = [False] * src.size(0)
    for step in range(int(max_lengths.max()) + 1):
        log_probs = torch.log_softmax(model.decode_step(tokens, state).logits.float(), dim=-1)  # (b, V)
        at_limit = max_lengths[active] <= step
        # At the length limit only EOS may follow, so the output always ends cleanly.
        best = torch.where(at_limit, torch.full_like(tokens, config.eos_id), log_probs.argmax(-1))
        best_scores = log_probs.gather(1, best[:, None])[:, 0]
        keep = []
        rows = zip(active.tolist(), best.tolist(), best_scores.tolist(), at_limit.tolist())
        for i, (row, token, score, forced) in enumerate(rows):
            scores[row] += score
            if token == config.eos_id:
                finished[row] = not forced
            else:
                outputs[row].append(token)
                keep.append(i)
        if not keep:
            break
        if len(keep) < len(active):
            keep_index = torch.tensor(keep, device=src.device)
            state.select(keep_index)
            active, best = active[keep_index], best[keep_index]
        tokens = best
    return [Hypothesis(tokens=out, score=s, finished=f) for out, s, f in zip(outputs, scores, finished)]
