"""Scoring: sacrebleu metrics (BLEU, chrF, chrF++, TER) with their signatures, and forced-decoding model scores.

Metric numbers come from sacrebleu's Python API unchanged. Model scores follow the one score
convention of tfm_cli/inference/search.py: the sum of natural-log token log-probs of the target, EOS included.
torch is imported inside the model-scoring functions, so `tfm score -r` (metrics) starts without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfm_cli.errors import TfmError
from tfm_cli.textio import INPUT_PAUSE_S, read_chunks

if TYPE_CHECKING:
    import torch

    from tfm_cli.length_penalty import LengthPenalty
    from tfm_cli.model import Transformer
    from tfm_cli.tokenizer import Tokenizer

METRIC_NAMES = ("bleu", "chrf", "chrf++", "ter")
NORMALIZATIONS = ("none", "length", "per-token")


@dataclass(frozen=True)
class MetricOptions:
    """What `tfm score` passes through to sacrebleu (the same switches as sacrebleu's own CLI).

    `tokenize` and `lowercase` apply to BLEU; `lowercase` also to chrF/chrF++; TER is
    case-insensitive unless `ter_case_sensitive` (sacrebleu's default). None = sacrebleu's default.
    """

    metrics: tuple[str, ...] = ("bleu", "chrf", "ter")
    tokenize: str | None = None
    lowercase: bool = False
    ter_case_sensitive: bool = False

    def __post_init__(self) -> None:
        if not self.metrics:
            raise TfmError(f"no metric given; choose from {', '.join(METRIC_NAMES)}")
        unknown = [name for name in self.metrics if name not in METRIC_NAMES]
        if unknown:
            raise TfmError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRIC_NAMES)}")
        if len(set(self.metrics)) != len(self.metrics):
            raise TfmError(f"metric listed twice in {','.join(self.metrics)}")
        if self.tokenize is not None:
            from sacrebleu.metrics import BLEU

            if self.tokenize not in BLEU.TOKENIZERS:
                raise TfmError(f"unknown BLEU tokenizer {self.tokenize!r}; choose from {', '.join(BLEU.TOKENIZERS)}")


@dataclass(frozen=True)
class MetricResult:
    """One corpus-level metric: its score, sacrebleu's one-line summary, and its signature."""

    name: str  # "BLEU", "chrF2", "chrF2++", "TER" (sacrebleu's own names)
    score: float
    summary: str  # e.g. "BLEU = 30.12 61.0/36.2/23.1/15.0 (BP = 1.000 ...)"
    signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    details: dict[str, Any] = field(default_factory=dict)  # metric-specific numbers (BLEU counts, ...)


def build_metrics(options: MetricOptions, sentence_level: bool = False) -> list[Any]:
    """sacrebleu metric objects for `options`, in the order given.

    For sentence-level BLEU, effective order is switched on, as sacrebleu's CLI does, so short
    sentences without 4-gram matches do not all score 0.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    built = []
    for name in options.metrics:
        if name == "bleu":
            try:
                built.append(BLEU(lowercase=options.lowercase, tokenize=options.tokenize, effective_order=sentence_level))
            except (ImportError, RuntimeError, OSError) as error:
                raise bleu_tokenizer_error(options.tokenize, error) from None
        elif name in ("chrf", "chrf++"):
            built.append(CHRF(word_order=2 if name == "chrf++" else 0, lowercase=options.lowercase))
        else:
            built.append(TER(case_sensitive=options.ter_case_sensitive))
    return built


def check_line_counts(hypotheses: list[str], references: list[list[str]], hyp_name: str, ref_names: list[str]) -> None:
    """Raise TfmError for no hypotheses, or naming both files and counts if a reference stream differs in length."""
    if not references:
        raise TfmError("no reference given; pass at least one -r/--reference file")
    if not hypotheses:
        raise TfmError(f"{hyp_name} is empty: there are no hypotheses to score")
    for name, stream in zip(ref_names, references):
        if len(stream) != len(hypotheses):
            raise TfmError(
                f"line counts differ: {hyp_name} has {len(hypotheses)} lines but reference {name} has "
                f"{len(stream)}; hypotheses and references must be line-parallel"
            )


def metric_details(score: Any) -> dict[str, Any]:
    """The numbers behind a sacrebleu score object, JSON-ready (BLEU counts, chrF/TER statistics)."""
    details: dict[str, Any] = {}
    for key in ("bp", "ratio", "sys_len", "ref_len", "counts", "totals", "precisions", "num_edits", "ref_length"):
        value = getattr(score, key, None)
        if value is not None:
            details[key] = list(value) if isinstance(value, (list, tuple)) else value
    return details


def bleu_tokenizer_error(name: str | None, error: Exception) -> TfmError:
    """The one-line error for a sacrebleu BLEU tokenizer that cannot be set up here.

    ja-mecab, ko-mecab, ... need packages of their own (sacrebleu's message ends with the pip command
    that installs them); flores101/200 download a sentencepiece model on first use.
    """
    if isinstance(error, OSError):
        return TfmError(
            f"--tokenize {name} downloads its sentencepiece model on first use, which failed ({error}); "
            "run it once where the network is reachable, or choose another tokenizer"
        )
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    advice = lines[-1] if lines else type(error).__name__
    return TfmError(f"--tokenize {name} needs a package that is not installed: {advice}")


def run_with_sacrebleu_errors(action: Callable[[], Any], tokenize: str | None = None) -> Any:
    """Run a sacrebleu call, turning a tokenizer's missing extra or failed download into a TfmError."""
    try:
        return action()
    except (ImportError, OSError) as error:
        raise bleu_tokenizer_error(tokenize, error) from None


def corpus_scores(
    hypotheses: list[str], references: list[list[str]], options: MetricOptions
) -> list[MetricResult]:
    """Corpus-level scores of `hypotheses` (N lines) against reference streams (R lists of N lines).

    Returns one MetricResult per metric in `options.metrics`, computed by sacrebleu's corpus_score.
    """
    results = []
    for metric in build_metrics(options):
        score = run_with_sacrebleu_errors(lambda: metric.corpus_score(hypotheses, references), options.tokenize)
        results.append(
            MetricResult(
                name=score.name,
                score=float(score.score),
                summary=str(score),
                signature=str(metric.get_signature()),
                details=metric_details(score),
            )
        )
    return results


def sentence_scores(
    hypotheses: list[str], references: list[list[str]], options: MetricOptions
) -> tuple[list[str], list[str], list[list[float]]]:
    """Sentence-level scores: (metric names, signatures, one row of scores per hypothesis).

    Row i holds sacrebleu's sentence_score of hypothesis i against reference i of every stream,
    one value per metric in `options.metrics` order.
    """
    metrics = build_metrics(options, sentence_level=True)
    names, rows = [], [[] for _ in hypotheses]
    for metric in metrics:
        for index, hypothesis in enumerate(hypotheses):
            refs = [stream[index] for stream in references]
            score = run_with_sacrebleu_errors(lambda: metric.sentence_score(hypothesis, refs), options.tokenize)
            rows[index].append(float(score.score))
        names.append(metric_name(metric))
    return names, [str(metric.get_signature()) for metric in metrics], rows


def metric_name(metric: Any) -> str:
    """sacrebleu's display name of a metric object: BLEU, chrF2, chrF2++ or TER."""
    from sacrebleu.metrics import CHRF

    if isinstance(metric, CHRF):
        return f"chrF{metric.beta}" + "+" * metric.word_order
    return type(metric).__name__


# ---- forced-decoding model scores ----------------------------------------------------------------


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
    model: Transformer, src: torch.Tensor, tgt_out: torch.Tensor, excluded_ids: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Teacher-forced log p(y_t | y_<t, x) of every target token.

    src: (B, S) int64 (rows end in EOS, padded with pad_id); tgt_out: (B, T) int64, the target ids
    followed by EOS, padded with pad_id. Returns (B, T) float32 natural-log probabilities, 0 at padding.
    With `excluded_ids`, each position's distribution is renormalised over the other tokens (what a
    search with DecodeConfig.renormalize scores: the tokens it may generate).
    """
    import torch

    config = model.config
    bos = torch.full_like(tgt_out[:, :1], config.bos_id)
    tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=1)  # (B, T): [BOS] + ids (padding past EOS is never read)
    logits = model(src, tgt_in).float()  # (B, T, V)
    if excluded_ids is not None:
        logits[:, :, list(excluded_ids)] = float("-inf")
    log_probs = torch.log_softmax(logits, dim=-1).gather(2, tgt_out[:, :, None])[:, :, 0]  # (B, T)
    return log_probs.masked_fill(tgt_out == config.pad_id, 0.0)


def pad_batch(sequences: list[list[int]], pad_id: int, device: torch.device | str) -> torch.Tensor:
    """Right-pad id lists into one (B, max_len) int64 tensor."""
    import torch

    width = max(len(seq) for seq in sequences)
    batch = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return batch.to(device)


def score_id_pairs(
    model: Transformer, pairs: list[tuple[list[int], list[int]]], length_penalty: LengthPenalty,
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


def check_lengths(src_ids: list[int], tgt_ids: list[int], max_positions: int, line: int) -> None:
    """Raise TfmError naming `line` if the source (+EOS) or target (+BOS) exceeds the model's positions."""
    if len(src_ids) + 1 > max_positions or len(tgt_ids) + 1 > max_positions:
        raise TfmError(
            f"line {line}: {len(src_ids) + 1} source / {len(tgt_ids) + 1} target tokens exceed the model's "
            f"max_positions={max_positions}; shorten or drop that line"
        )


def score_text_pairs(
    model: Transformer,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    pairs: Iterable[tuple[str, str]],
    length_penalty: LengthPenalty,
    batch_size: int = 32,
    window_batches: int = 8,
    pause_s: float = INPUT_PAUSE_S,
    excluded_ids: tuple[int, ...] | None = None,
) -> Iterator[SentenceScore]:
    """Score (source, target) text pairs lazily, yielding one SentenceScore per pair in input order.

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
        window = []
        for src_text, tgt_text in chunk:
            line += 1
            src_ids, tgt_ids = src_tokenizer.encode_ids(src_text), tgt_tokenizer.encode_ids(tgt_text)
            check_lengths(src_ids, tgt_ids, model.config.max_positions, line)
            window.append((src_ids, tgt_ids))
        yield from score_window(model, window, length_penalty, batch_size, excluded_ids)


def score_window(
    model: Transformer, window: list[tuple[list[int], list[int]]], length_penalty: LengthPenalty, batch_size: int,
    excluded_ids: tuple[int, ...] | None = None,
) -> list[SentenceScore]:
    """Score `window` in length-sorted batches; returns the scores in the window's original order."""
    order = sorted(range(len(window)), key=lambda i: (len(window[i][0]), len(window[i][1])))
    results: dict[int, SentenceScore] = {}
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        results.update(zip(indices, score_id_pairs(model, [window[i] for i in indices], length_penalty, excluded_ids)))
    return [results[i] for i in range(len(window))]


def zip_parallel(src_lines: Iterable[str], tgt_lines: Iterable[str], src_name: str, tgt_name: str) -> Iterator[tuple[str, str]]:
    """Pair two line streams, raising TfmError with both counts if one ends before the other."""
    src_iter, tgt_iter = iter(src_lines), iter(tgt_lines)
    count = 0
    while True:
        src_line = next(src_iter, None)
        tgt_line = next(tgt_iter, None)
        if src_line is None and tgt_line is None:
            return
        if src_line is None or tgt_line is None:
            longer, rest = (tgt_name, tgt_iter) if src_line is None else (src_name, src_iter)
            shorter = src_name if src_line is None else tgt_name
            total = count + 1 + sum(1 for _ in rest)
            raise TfmError(
                f"line counts differ: {shorter} has {count} lines but {longer} has {total}; "
                "source and target must be line-parallel"
            )
        count += 1
        yield src_line, tgt_line
