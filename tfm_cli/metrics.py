"""Metrics of translations against references: sacrebleu's BLEU, chrF, chrF++ and TER with their signatures.

Metric numbers come from sacrebleu's Python API unchanged. No torch here: `tfm score -r` starts without
it. A model's own scores of given targets (forced decoding) are in inference/model_scores.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfm_cli.errors import TfmError

METRIC_NAMES = ("bleu", "chrf", "chrf++", "ter")


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
