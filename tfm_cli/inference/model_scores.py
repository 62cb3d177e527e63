"""A model's scores of given target sentences (forced decoding, as marian-scorer and fairseq's
score-reference compute them), read lazily and batched by length, written in input order.

Scores follow the one convention of inference/search.py: the sum of natural-log token log-probs of the
target, EOS included, normalised by the model's length penalty rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfm_cli.errors import TfmError
from tfm_cli.textio.streams import INPUT_PAUSE_S, read_chunks

if TYPE_CHECKING:
    import torch

    from tfm_cli.inference.ensemble import Ensemble
    from tfm_cli.length_penalty import LengthPenalty
    from tfm_cli.model import Transformer
    from tfm_cli.tokenization.tokenizer import Tokenizer

NORMALIZATIONS = ("none", "length", "per-token")


@dataclass(frozen=True)
class SentenceScore:
    """The model's score of one target given its source (see the module docstring's convention)."""

    raw: float  # sum of natural-log token log-probs, EOS included
    n_tokens: int  # target tokens scored, EOS included
    length_normalized: float  # raw normalised by the length penalty rule at n_tokens: translate's normalised score
    token_log_probs: tuple[float, ...]  # per target token, EOS last

    @property
    def per_token(self) -> float:
        """raw / n_tokens: the mean log-prob per token (EOS counted); exp(-per_token) is the perplexity."""
        return self.raw / self.n_tokens

    def value(self, normalize: str) -> float:
        """The score under `normalize`: none (raw), length (the length penalty rule's), or per-token."""
        if normalize == "none":
            return self.raw
        if normalize == "length":
            return self.length_normalized
        return self.per_token


def token_log_probs(
    model: Transformer | Ensemble, src: torch.Tensor, tgt_out: torch.Tensor, excluded_ids: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Teacher-forced log p(y_t | y_<t, x) of every target token (an ensemble's: the weighted mean of its
    members' log-probs, as its search scores them).

    src: (B, S) int64 (rows end in EOS, padded with pad_id); tgt_out: (B, T) int64, the target ids
    followed by EOS, padded with pad_id. Returns (B, T) float32 natural-log probabilities, 0 at padding.
    With `excluded_ids`, each position's distribution is renormalised over the other tokens (what a
    search with DecodeConfig.renormalize scores: the tokens it may generate).
    """
    import torch

    from tfm_cli.inference.ensemble import Ensemble

    config = model.config
    bos = torch.full_like(tgt_out[:, :1], config.bos_id)
    tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=1)  # (B, T): [BOS] + ids (padding past EOS is never read)
    if isinstance(model, Ensemble):
        # The weighted mean of the members' whole distributions; then, as the search's masks do, the bans
        # and a log_softmax over the tokens left.
        log_probs = model.log_probs(src, tgt_in)  # (B, T, V)
        if excluded_ids is not None:
            log_probs[:, :, list(excluded_ids)] = float("-inf")
            log_probs = torch.log_softmax(log_probs, dim=-1)
    else:
        logits = model(src, tgt_in).float()  # (B, T, V)
        if excluded_ids is not None:
            logits[:, :, list(excluded_ids)] = float("-inf")
        log_probs = torch.log_softmax(logits, dim=-1)
    chosen = log_probs.gather(2, tgt_out[:, :, None])[:, :, 0]  # (B, T)
    return chosen.masked_fill(tgt_out == config.pad_id, 0.0)


def pad_batch(sequences: list[list[int]], pad_id: int, device: torch.device | str) -> torch.Tensor:
    """Right-pad id lists into one (B, max_len) int64 tensor."""
    import torch

    width = max(len(seq) for seq in sequences)
    batch = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return batch.to(device)


def score_id_pairs(
    model: Transformer | Ensemble, pairs: list[tuple[list[int], list[int]]], length_penalty: LengthPenalty,
    excluded_ids: tuple[int, ...] | None = None,
) -> list[SentenceScore]:
    """Score one batch of (source ids, target ids) pairs, without EOS (it is appended here).

    Returns one SentenceScore per pair, in the order given, normalised by `length_penalty` (the rule
    translate uses). `excluded_ids`: see token_log_probs.
    """
    import torch

    if not pairs:
        return []
    config = model.config
    device = next(model.parameters()).device
    src = pad_batch([ids + [config.eos_id] for ids, _ in pairs], config.pad_id, device)  # (B, S)
    tgt_out = pad_batch([ids + [config.eos_id] for _, ids in pairs], config.pad_id, device)  # (B, T)
    with torch.inference_mode():
        log_probs = token_log_probs(model, src, tgt_out, excluded_ids).cpu()  # (B, T)
    scores = []
    for row, (_, tgt_ids) in enumerate(pairs):
        n_tokens = len(tgt_ids) + 1
        values = log_probs[row, :n_tokens].tolist()
        raw = float(log_probs[row, :n_tokens].double().sum())
        scores.append(SentenceScore(raw, n_tokens, length_penalty.normalise(raw, n_tokens), tuple(values)))
    return scores


@dataclass(frozen=True)
class TooLongPair:
    """A pair left unscored: its source (+EOS) or target (+BOS) has more tokens than the model's positions."""

    line: int  # 1-based input line
    src_tokens: int  # EOS included
    tgt_tokens: int  # BOS included
    max_positions: int

    def describe(self) -> str:
        """"line N: S source / T target tokens exceed the model's max_positions=M"."""
        return (f"line {self.line}: {self.src_tokens} source / {self.tgt_tokens} target tokens exceed the model's "
                f"max_positions={self.max_positions}")


def too_long_pair(src_ids: list[int], tgt_ids: list[int], max_positions: int, line: int) -> TooLongPair | None:
    """The TooLongPair of input `line` if its source (+EOS) or target (+BOS) exceeds the model's positions, else None."""
    if len(src_ids) + 1 > max_positions or len(tgt_ids) + 1 > max_positions:
        return TooLongPair(line, len(src_ids) + 1, len(tgt_ids) + 1, max_positions)
    return None


def score_text_pairs(
    model: Transformer | Ensemble,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    pairs: Iterable[tuple[str, str]],
    length_penalty: LengthPenalty,
    batch_size: int = 32,
    window_batches: int = 8,
    pause_s: float = INPUT_PAUSE_S,
    excluded_ids: tuple[int, ...] | None = None,
) -> Iterator[SentenceScore | TooLongPair]:
    """Score (source, target) text pairs lazily, yielding one SentenceScore per pair in input order, or a
    TooLongPair for a pair the model cannot take (the other pairs are scored all the same).

    Pairs are read in a thread (textio.read_chunks, as translate does) in windows of at most
    `batch_size * window_batches`; a window also ends when the input pauses `pause_s` seconds, so
    an interactive pipe gets its scores at once. Each window is sorted by length so batches carry
    little padding, scored in batches of `batch_size`, and yielded in input order: memory stays
    bounded and results stream. `length_penalty` gives SentenceScore.length_normalized;
    `excluded_ids`: see token_log_probs.
    """
    if batch_size < 1:
        raise TfmError(f"batch size must be at least 1, got {batch_size}")
    line = 0
    for chunk in read_chunks(pairs, batch_size * window_batches, pause_s):
        window = []  # the pairs to score
        answers: list[int | TooLongPair] = []  # per pair of the chunk: its index in window, or why not scored
        for src_text, tgt_text in chunk:
            line += 1
            src_ids, tgt_ids = src_tokenizer.encode_ids(src_text), tgt_tokenizer.encode_ids(tgt_text)
            too_long = too_long_pair(src_ids, tgt_ids, model.config.max_positions, line)
            answers.append(len(window) if too_long is None else too_long)
            if too_long is None:
                window.append((src_ids, tgt_ids))
        scores = score_window(model, window, length_penalty, batch_size, excluded_ids) if window else []
        yield from (scores[answer] if isinstance(answer, int) else answer for answer in answers)


def score_window(
    model: Transformer | Ensemble, window: list[tuple[list[int], list[int]]], length_penalty: LengthPenalty, batch_size: int,
    excluded_ids: tuple[int, ...] | None = None,
) -> list[SentenceScore]:
    """Score `window` in length-sorted batches; returns the scores in the window's original order."""
    order = sorted(range(len(window)), key=lambda i: (len(window[i][0]), len(window[i][1])))
    results: dict[int, SentenceScore] = {}
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        results.update(zip(indices, score_id_pairs(model, [window[i] for i in indices], length_penalty, excluded_ids)))
    return [results[i] for i in range(len(window))]
