"""`tfm score`: sacrebleu metrics against references, or a model's forced-decoding log-probabilities."""

from __future__ import annotations

import json
import math
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, List, Optional

import typer

from tfm_cli.commands import model_runs
from tfm_cli.commands.options import device_option, dtype_option, ensemble_weights_option, threads_option
from tfm_cli.console import data_table, print_info, print_warning, stdout_console
from tfm_cli.errors import TfmError
from tfm_cli.inference.settings import model_default_note
from tfm_cli.textio.output_lines import json_line

if TYPE_CHECKING:
    from tfm_cli.checkpoints.format import LoadedModel
    from tfm_cli.inference.model_scores import SentenceScore, TooLongPair
    from tfm_cli.length_penalty import LengthPenalty
    from tfm_cli.tokenization.tokenizer import Tokenizer
    from tfm_cli.tokenization.vocabulary import MappedTokenizer

EPILOG = (
    "Examples:\n\n"
    "  tfm score -r ref.en -i hyp.en                              # BLEU, chrF2, TER with signatures\n\n"
    "  tfm translate -m model.safetensors < test.de | tfm score -r test.en --metrics bleu,chrf++ --json\n\n"
    "  tfm score -m model.safetensors --src test.de --tgt test.en --normalize per-token\n\n"
    "Model scores use natural logs and count EOS: with n = target tokens + 1, raw = sum of the n "
    "log-probs; the default --normalize length prints raw / the model's length penalty (GNMT's ((5 + n) / 6) "
    "** alpha, n ** alpha for imported models), which equals "
    "`tfm translate --scores` with the same --length-penalty."
)


def score(
    ctx: typer.Context,
    references: List[str] = typer.Option([], "-r", "--reference", help="Reference file (repeat for several references)."),
    input: str = typer.Option("-", "-i", "--input", help="Hypotheses, one per line; `-` = stdin."),
    metrics: str = typer.Option("bleu,chrf,ter", "--metrics", help="Comma-separated: bleu, chrf, chrf++, ter."),
    tokenize: Optional[str] = typer.Option(None, "--tokenize", help="BLEU tokenizer passed to sacrebleu (13a, intl, zh, char, none, ...); default sacrebleu's."),
    lowercase: bool = typer.Option(False, "--lowercase", "-lc", help="Case-insensitive BLEU and chrF (as sacrebleu -lc)."),
    ter_case_sensitive: bool = typer.Option(False, "--ter-case-sensitive", help="Case-sensitive TER (sacrebleu's TER ignores case by default)."),
    sentence: bool = typer.Option(False, "--sentence", help="One line of scores per hypothesis (sentence BLEU uses effective order)."),
    model: List[str] = typer.Option([], "-m", "--model", help="Score --tgt given --src with this checkpoint (forced decoding) instead of metrics; repeat for an ensemble (the weighted mean of the models' token log-probs, as `translate -m A -m B` scores; tokenizers and defaults from the first)."),
    ensemble_weights: Optional[str] = ensemble_weights_option("With -m: "),
    src: Optional[str] = typer.Option(None, "--src", help="With -m: source sentences; `-` = stdin."),
    tgt: Optional[str] = typer.Option(None, "--tgt", help="With -m: target sentences to score, line-parallel to --src; `-` = stdin."),
    normalize: str = typer.Option("length", "--normalize", help="With -m: length (raw / the model's length penalty: what translate --scores prints), none (raw: the sum of the n token log-probs, EOS included) or per-token (raw / n)."),
    alpha: Optional[float] = typer.Option(None, "--length-penalty", "--alpha", help=f"With -m: length-penalty alpha for --normalize length (as translate's --length-penalty); {model_default_note('length_penalty')}."),
    batch_size: int = typer.Option(32, "--batch-size", help="With -m: sentences per batch."),
    device: str = device_option('With -m: '),
    dtype: str = dtype_option('With -m: '),
    threads: int = threads_option('With -m: '),
    output: str = typer.Option("-", "-o", "--output", help="Where to write; `-` = stdout."),
    as_json: bool = typer.Option(False, "--json", help="JSON for pipelines: a list of metrics, one object per line with --sentence, or with -m one object per pair (schema tfm-score/1, see README)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Score hypotheses with BLEU/chrF/TER (sacrebleu), or target sentences with a model."""
    if model:
        if references:
            raise TfmError("-m/--model scores --src/--tgt with a model; -r/--reference is for metrics, not both")
        if src is None or tgt is None:
            raise TfmError("-m/--model needs both --src and --tgt (line-parallel files)")
        score_with_model(ctx, model, ensemble_weights, src, tgt, normalize, alpha, batch_size, device, dtype, threads, output,
                         as_json, quiet)
        return
    if src is not None or tgt is not None:
        raise TfmError("--src/--tgt are for model scoring; add -m/--model, or use -r/-i for metrics")
    if ensemble_weights is not None:
        raise TfmError("--ensemble-weights weighs the models of -m/--model; metrics (-r) use none")
    if not references:
        raise TfmError("no reference given; pass -r/--reference REF (or -m/--model with --src/--tgt)")
    score_with_metrics(
        references, input, metrics, tokenize, lowercase, ter_case_sensitive, sentence, output, as_json, quiet
    )


def score_with_metrics(
    reference_paths: list[str],
    input: str,
    metrics: str,
    tokenize: str | None,
    lowercase: bool,
    ter_case_sensitive: bool,
    sentence: bool,
    output: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Read hypotheses and references, compute the metrics, and render them."""
    from tfm_cli.metrics import (
        MetricOptions,
        check_line_counts,
        corpus_scores,
        sentence_scores,
    )
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.streams import read_lines

    names = tuple(name.strip().lower() for name in metrics.split(",") if name.strip())
    options = MetricOptions(names, tokenize, lowercase, ter_case_sensitive)
    if input == "-" and "-" in reference_paths:
        raise TfmError("hypotheses and a reference cannot both come from stdin")
    hypotheses = read_lines(input)
    references = [read_lines(path) for path in reference_paths]
    check_line_counts(hypotheses, references, "<stdin>" if input == "-" else input, reference_paths)
    if sentence:
        metric_names, signatures, rows = sentence_scores(hypotheses, references, options)
        for name, signature in zip(metric_names, signatures):
            print_info(f"{name}|{signature}", quiet=quiet)
        with open_output(output) as out:
            for row in rows:
                if as_json:
                    out.write(json.dumps(dict(zip(metric_names, row))) + "\n")
                else:
                    out.write("\t".join(f"{value:.4f}" for value in row) + "\n")
        return
    results = corpus_scores(hypotheses, references, options)
    with open_output(output) as out:
        if as_json:
            records = [
                {"name": r.name, "score": r.score, "signature": r.signature, "verbose_score": r.summary, **r.details}
                for r in results
            ]
            out.write(json.dumps(records, indent=1) + "\n")
        elif output == "-" and sys.stdout is not None and sys.stdout.isatty():
            rows = [[r.name, f"{r.score:.2f}", details_text(r.summary), r.signature] for r in results]
            stdout_console().print(data_table(["metric", "score", "details", "signature"], rows))
        else:
            # sacrebleu's own text form: NAME|signature = verbose score.
            for r in results:
                out.write(f"{r.name}|{r.signature} = {r.summary.split(' = ', 1)[1]}\n")


def details_text(summary: str) -> str:
    """What sacrebleu's verbose score says beyond the score itself (BLEU's precisions, BP, lengths)."""
    parts = summary.split(" = ", 1)[1].split(" ", 1)
    return parts[1] if len(parts) > 1 else ""


JSON_SCHEMA = "tfm-score/1"  # the `score -m --json` line format; bump on any incompatible change (README.md)


def remember_targets(pairs: Iterable[tuple[str, str]], targets: deque[str]) -> Iterator[tuple[str, str]]:
    """Yield `pairs` unchanged, appending each target to `targets` (scores come back in input order)."""
    for source, target in pairs:
        targets.append(target)
        yield source, target


def json_record(result: SentenceScore, value: float, pieces: list[str]) -> dict:
    """The `score -m --json` object of one pair (schema JSON_SCHEMA; `tokens` as in translate --json)."""
    return {
        "schema": JSON_SCHEMA,
        "score": value,
        "raw": result.raw,
        "tokens": pieces,  # the target's subword pieces, EOS not listed
        "n_scored_tokens": result.n_tokens,  # len(tokens) + 1: EOS is scored too
        "per_token": result.per_token,
        "length_normalized": result.length_normalized,
        "token_log_probs": list(result.token_log_probs),  # one per scored token, EOS last
    }


def too_long_record(result: TooLongPair) -> dict:
    """The `score -m --json` object of a pair the model cannot take: json_record's fields, null, and why."""
    return {
        "schema": JSON_SCHEMA, "score": None, "raw": None, "tokens": None, "n_scored_tokens": None, "per_token": None,
        "length_normalized": None, "token_log_probs": None,
        "skipped": f"{result.src_tokens} source / {result.tgt_tokens} target tokens exceed max_positions={result.max_positions}",
    }


def score_with_model(
    ctx: typer.Context,
    model_paths: list[str],
    ensemble_weights: str | None,
    src: str,
    tgt: str,
    normalize: str,
    alpha: float | None,
    batch_size: int,
    device: str,
    dtype: str,
    threads: int,
    output: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Forced-decode every (--src, --tgt) pair with the model (or the ensemble) and write one score per line, streaming."""
    from tfm_cli.config import check_length_penalty
    from tfm_cli.inference.model_scores import NORMALIZATIONS, score_text_pairs
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.streams import check_parallel_line_counts, iter_lines, zip_parallel

    if normalize not in NORMALIZATIONS:
        raise TfmError(f"--normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    if alpha is not None:
        check_length_penalty(alpha, "--length-penalty")
    if src == "-" and tgt == "-":
        raise TfmError("--src and --tgt cannot both be stdin")
    check_parallel_line_counts(src, tgt)  # files that do not pair up: an error before any score is written
    model_runs.set_up_process(ctx, threads)
    placement = model_runs.resolve_placement(device, dtype, quiet)
    loaded, ensemble = model_runs.load_models(model_paths, ensemble_weights, placement, quiet)
    length_penalty, excluded_ids = translate_scoring(loaded, alpha, normalize, quiet)
    # Read lazily, in a thread (scoring.score_text_pairs): each window is scored and written before
    # the next read blocks, so `--tgt -` may be an interactive pipe.
    src_lines, tgt_lines = iter_lines(src), iter_lines(tgt)
    pairs = zip_parallel(src_lines, tgt_lines, "<stdin>" if src == "-" else src, "<stdin>" if tgt == "-" else tgt)
    targets: deque[str] = deque()  # the targets read so far and not yet written, for the JSON pieces
    if as_json:
        pairs = remember_targets(pairs, targets)
    scored = ensemble if ensemble is not None else loaded.model
    with open_output(output) as out:
        scores = score_text_pairs(scored, loaded.src_tokenizer, loaded.tgt_tokenizer, pairs, length_penalty, batch_size,
                                  excluded_ids=excluded_ids)
        totals = write_scores(scores, targets if as_json else None, normalize, loaded.tgt_tokenizer, out)
    if totals.pairs:
        per_token = totals.log_prob / totals.tokens
        print_info(
            f"scored {totals.pairs} pairs, {totals.tokens} target tokens (EOS included): {per_token:.4f} nats/token, "
            f"perplexity {math.exp(-per_token):.2f}",
            quiet=quiet,
        )


def translate_scoring(
    loaded: LoadedModel, alpha: float | None, normalize: str, quiet: bool
) -> tuple[LengthPenalty, tuple[int, ...] | None]:
    """The length penalty and the excluded token ids (None: none) translate would score with: the
    model's decoding defaults under --length-penalty. Says on stderr when the model's alpha is used."""
    from tfm_cli.inference.settings import resolve_decode
    from tfm_cli.length_penalty import decode_length_penalty

    decode = resolve_decode({"length_penalty": alpha}, loaded.decode_defaults)  # the settings translate uses
    if alpha is None and "length_penalty" in loaded.decode_defaults and normalize == "length":
        print_info(f"length_penalty {decode.length_penalty} (the model's default; --length-penalty overrides)", quiet=quiet)
    length_penalty = decode_length_penalty(decode)  # the rule translate normalises with (the model's kind)
    if not decode.renormalize:
        return length_penalty, None
    config = loaded.model.config  # translate's scores are then over the tokens it may generate
    return length_penalty, (config.pad_id, config.bos_id, *decode.banned_ids)


@dataclass
class ScoreTotals:
    """What the scored pairs add up to: their count, summed log-probability and target tokens (EOS included)."""

    pairs: int = 0
    log_prob: float = 0.0
    tokens: int = 0


def write_scores(
    scores: Iterable[SentenceScore | TooLongPair], targets: deque[str] | None, normalize: str,
    tgt_tokenizer: Tokenizer | MappedTokenizer, out: IO[str],
) -> ScoreTotals:
    """Write one line per pair as its score comes: the `normalize` score, or with `targets` (the targets
    not yet written, in order) its JSON record; a pair too long for the model gets an empty line (or
    null scores) and a warning. Returns the totals of the pairs scored."""
    from tfm_cli.inference.model_scores import TooLongPair

    totals = ScoreTotals()
    for result in scores:
        target = targets.popleft() if targets is not None else None
        if isinstance(result, TooLongPair):
            answer = "its JSON record has null scores" if targets is not None else "its score line is empty"
            print_warning(f"{result.describe()}: not scored, {answer}")
            out.write((json_line(too_long_record(result)) if targets is not None else "") + "\n")
            out.flush()
            continue
        value = result.value(normalize)
        if targets is not None:
            out.write(json_line(json_record(result, value, tgt_tokenizer.encode_pieces(target))) + "\n")
        else:
            out.write(f"{value:.6f}\n")  # the precision translate --scores prints
        out.flush()
        totals.log_prob += result.raw
        totals.tokens += result.n_tokens
        totals.pairs += 1
    return totals
