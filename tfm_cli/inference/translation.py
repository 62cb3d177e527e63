"""Text in, translations out: streaming chunks, equal-length batches, input order restored, output formats.

A library module: it never prints. `tfm translate` reads lines, hands them to `translate_stream`,
and writes what `format_line` returns. Batches hold sources of one padded width
(decoding.padded_length), which with decoding.TransformerDecoder makes every sentence's
translation independent of the batch it lands in. Validation during training decodes through
`search_batches` too, so it measures exactly what `tfm translate` would output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from tfm_cli.inference.alignment import (
    chosen_attention,
    piece_rows,
    hard_alignment,
    merge_to_words,
    pharaoh,
    word_char_offsets,
    word_spans,
)
from tfm_cli.checkpoint import LoadedModel
from tfm_cli.config import AlignmentConfig, DecodeConfig
from tfm_cli.inference.decoding import TransformerDecoder, padded_length, source_batch
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer
from tfm_cli.length_penalty import LengthPenalty, decode_length_penalty
from tfm_cli.inference.search import Hypothesis, search_beams, search_samples
from tfm_cli.textio import INPUT_PAUSE_S, one_line, read_chunks

# Version of the `--json` line format; bump on any incompatible change (documented in README.md).
JSON_SCHEMA = "tfm-translate/1"


@dataclass(frozen=True)
class BatchingConfig:
    """How lines are read and grouped: chunk size, batch limits, and when a pause flushes a chunk."""

    buffer_size: int = 2000  # lines read (and held) at a time
    max_tokens: int = 8000  # source tokens (EOS included) per batch
    batch_size: int = 128  # sentences per batch
    pause_s: float = INPUT_PAUSE_S  # an input pause this long answers the lines read so far

    def __post_init__(self) -> None:
        for name in ("buffer_size", "max_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise TfmError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


@dataclass
class Output:
    """One translation of one line, ready to print."""

    text: str
    ids: list[int]  # output token ids, EOS excluded
    pieces: list[str]
    raw_score: float  # sum of token log-probs, EOS included
    score: float  # raw_score normalised by the decoding's length penalty rule at len(pieces) + 1
    finished: bool  # False if EOS was forced at the length limit
    alignment: list[tuple[int, int]] | None = None  # word-level (src, tgt) pairs
    words: list[tuple[int, int]] | None = None  # character offsets [start, end) of each output word


@dataclass
class TranslatedLine:
    """The answer for one input line: no outputs for an empty line, else n-best, best first."""

    index: int  # 0-based position in the input
    source: str
    outputs: list[Output] = field(default_factory=list)
    truncated: bool = False
    src_words: list[tuple[int, int]] | None = None  # character offsets of the source words (with alignment)


@dataclass
class TranslationStats:
    """What happened to the input, for the warnings and the summary on stderr."""

    lines: int = 0
    empty_lines: int = 0  # blank input lines (an empty output line each)
    unencodable_lines: int = 0  # non-blank lines the tokenizer turned into no tokens (empty output too)
    truncated_lines: int = 0
    src_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0  # time spent translating chunks; waits for input are not counted


@dataclass(frozen=True)
class OutputFormat:
    """What each output line holds."""

    scores: bool = False
    alignment: bool = False
    json: bool = False
    # The rule the scores were normalised with (--json states its formula).
    length_penalty: LengthPenalty = field(default_factory=lambda: decode_length_penalty(DecodeConfig()))


class Translator:
    """Translates chunks of raw lines with one loaded model (tokenize, batch, search, detokenize).

    `source_prefix` ids go before every source's own ids: a multilingual Marian model's `>>xx<<`
    target-language tag (vocabulary.language_tag_id). Word alignments leave them out.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        decode: DecodeConfig,
        batching: BatchingConfig,
        alignment: AlignmentConfig | None = None,
        source_prefix: tuple[int, ...] = (),
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.decode = decode
        self.length_penalty = decode_length_penalty(decode)
        self.batching = batching
        self.alignment = alignment
        self.source_prefix = list(source_prefix)
        self.device = next(self.model.parameters()).device
        if alignment is not None:
            alignment.check(self.model.config.n_dec_layers, self.model.config.n_heads)
        # Sources are fed as prefix + ids + [EOS] and must fit the positional table.
        self.max_src_ids = self.model.config.max_positions - 1 - len(self.source_prefix)

    def translate_chunk(self, lines: list[str], first_index: int, stats: TranslationStats) -> list[TranslatedLine]:
        """Translate `lines` (line `first_index` onwards); returns one TranslatedLine per line, in order."""
        results = [TranslatedLine(index=first_index + i, source=line) for i, line in enumerate(lines)]
        texts = [line for line in lines if line.strip()]
        encoded = iter(self.loaded.src_tokenizer.encode_ids_batch(texts)) if texts else iter(())
        sources: dict[int, list[int]] = {}
        for i, line in enumerate(lines):
            stats.lines += 1
            if not line.strip():
                stats.empty_lines += 1
                continue
            ids = next(encoded)
            if len(ids) > self.max_src_ids:
                ids = ids[: self.max_src_ids]
                results[i].truncated = True
                stats.truncated_lines += 1
            if ids:
                sources[i] = self.source_prefix + ids
            else:
                stats.unencodable_lines += 1
        for batch, hypotheses in search_batches(self.model, sources, self.decode, self.batching, first_index):
            for i, hyps in zip(batch, hypotheses):
                if not hyps:
                    # Every candidate of every step had a non-finite score: no model works that way.
                    raise TfmError(
                        f"line {first_index + i + 1}: the model gave no translation with a finite score "
                        "(its outputs are inf/nan; the checkpoint's weights may be damaged)"
                    )
                results[i].outputs = [self.render(h) for h in hyps]
                stats.src_tokens += len(sources[i]) + 1
                stats.output_tokens += len(hyps[0].tokens) + 1
            if self.alignment is not None:
                self.align(batch, sources, results)
        return results

    def render(self, hypothesis: Hypothesis) -> Output:
        """Detokenize one hypothesis and attach its normalised score."""
        tokenizer = self.loaded.tgt_tokenizer
        return Output(
            # A model can emit a newline or TAB (byte-fallback pieces such as <0x0A>): they become
            # spaces, so every input line gets exactly one output line with its TAB-separated columns.
            text=one_line(tokenizer.decode_ids(hypothesis.tokens), tabs=True),
            ids=hypothesis.tokens,
            pieces=[tokenizer.id_to_piece(t) for t in hypothesis.tokens],
            raw_score=hypothesis.score,
            score=hypothesis.normalised_score(self.length_penalty),
            finished=hypothesis.finished,
        )

    @torch.inference_mode()
    def align(self, batch: list[int], sources: dict[int, list[int]], results: list[TranslatedLine]) -> None:
        """Attach word alignments to every output of `batch` from forced-decoding cross-attention.

        The decoder re-reads each output teacher-forced (the same attention the search saw); the
        chosen layer/head's piece-level map is merged to words (alignment.py) and argmaxed.
        """
        config = self.model.config
        rows = [(i, output) for i in batch for output in results[i].outputs]
        src_width = max(len(sources[i]) for i, _ in rows) + 1
        src_rows = [sources[i] + [config.eos_id] + [config.pad_id] * (src_width - len(sources[i]) - 1) for i, _ in rows]
        width = max(len(output.ids) for _, output in rows) + 1
        tgt_in = torch.full((len(rows), width), config.pad_id, dtype=torch.long)  # (R, T): [BOS] + ids, padded
        for row, (_, output) in enumerate(rows):
            tgt_in[row, : len(output.ids) + 1] = torch.tensor([config.bos_id] + output.ids, dtype=torch.long)
        src = torch.tensor(src_rows, dtype=torch.long, device=self.device)  # (R, S), padded
        decoded = self.model.decode(tgt_in.to(self.device), self.model.encode(src), need_weights=True)
        attention = chosen_attention(decoded.cross_attention, self.alignment).float().cpu()  # (R, T, S)
        skip = len(self.source_prefix)  # the prefix columns are no source words
        src_pieces = {i: [self.loaded.src_tokenizer.id_to_piece(t) for t in sources[i][skip:]] for i in batch}
        for row, (i, output) in enumerate(rows):
            line = results[i]
            src_spans = word_spans(src_pieces[i])
            if line.src_words is None:
                line.src_words = word_char_offsets(line.source)[: len(src_spans)]
            # Rows: the output pieces' (EOS's dropped); columns: the source pieces (prefix and EOS dropped).
            matrix = piece_rows(attention[row], len(output.pieces), self.alignment.shift)[:, skip : len(sources[i])]
            words = merge_to_words(matrix, word_spans(output.pieces), src_spans)
            output.alignment = hard_alignment(words)
            output.words = word_char_offsets(output.text)


def bucketed_batches(sources: dict[int, list[int]], batching: BatchingConfig) -> Iterator[list[int]]:
    """Group line indices by padded source width, each group split by --batch-size/--max-tokens.

    Yields lists of line indices, narrowest first; within a batch, shortest source first.
    """
    by_width: dict[int, list[int]] = {}
    for i, ids in sorted(sources.items(), key=lambda item: len(item[1])):
        by_width.setdefault(padded_length(len(ids) + 1), []).append(i)
    for width in sorted(by_width):
        group = by_width[width]
        per_batch = max(1, min(batching.batch_size, batching.max_tokens // width))
        for start in range(0, len(group), per_batch):
            yield group[start : start + per_batch]


def search_batches(
    model: Transformer,
    sources: dict[int, list[int]],
    decode: DecodeConfig,
    batching: BatchingConfig,
    first_index: int = 0,
) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
    """Search every source (ids without EOS, keyed by line index) in bucketed, batch-invariant batches.

    Yields (line indices of a batch, n-best hypotheses per line). Sampling draws line i's samples
    from seed decode.seed + first_index + i, so they depend on the line, not on its batch or chunk.
    """
    device = next(model.parameters()).device
    for batch in bucketed_batches(sources, batching):
        decoder = TransformerDecoder(model, source_batch([sources[i] for i in batch], model.config, device))
        with torch.inference_mode():
            if decode.sample:
                hypotheses = search_samples(decoder, decode, [decode.seed + first_index + i for i in batch])
            else:
                hypotheses = search_beams(decoder, decode)
        yield batch, hypotheses


def translate_stream(
    translator: Translator,
    lines: Iterable[str],
    stats: TranslationStats,
) -> Iterator[list[TranslatedLine]]:
    """Translate `lines` chunk by chunk; yields each chunk's TranslatedLines, in input order."""
    done = 0
    batching = translator.batching
    for chunk in read_chunks(lines, batching.buffer_size, batching.pause_s):
        started = time.perf_counter()
        translated = translator.translate_chunk(chunk, done, stats)
        stats.seconds += time.perf_counter() - started
        yield translated
        done += len(chunk)


def format_score(value: float) -> str:
    """A score as printed everywhere (the same precision as `tfm score -m`)."""
    return f"{value:.6f}"


def format_line(line: TranslatedLine, output_format: OutputFormat) -> str:
    """The text written for one input line (no newline).

    Plain: the translation; with --scores a TAB and the score; with --alignment a TAB and the
    Pharaoh pairs; with --nbest K the K hypotheses' columns follow each other on the same line.
    An empty input line gives an empty line. --json: one object per line (see json_record).
    """
    if output_format.json:
        return json.dumps(json_record(line, output_format), ensure_ascii=False)
    columns = []
    for output in line.outputs:
        columns.append(output.text)
        if output_format.scores:
            columns.append(format_score(output.score))
        if output_format.alignment:
            columns.append(pharaoh(output.alignment or []))
    return "\t".join(columns)


def json_record(line: TranslatedLine, output_format: OutputFormat) -> dict:
    """The `--json` object of one line (schema JSON_SCHEMA, documented in README.md)."""
    hypotheses = []
    for output in line.outputs:
        hypothesis = {
            "translation": output.text,
            "score": output.score,
            "raw_score": output.raw_score,
            "tokens": output.pieces,
            "n_scored_tokens": len(output.pieces) + 1,
            "finished": output.finished,
        }
        if output.alignment is not None:
            hypothesis["alignment"] = pharaoh(output.alignment)
            hypothesis["target_words"] = [list(span) for span in output.words or []]
        hypotheses.append(hypothesis)
    best = hypotheses[0] if hypotheses else None
    record = {
        "schema": JSON_SCHEMA,
        "line": line.index + 1,
        "source": line.source,
        "translation": best["translation"] if best else "",
        "score": best["score"] if best else None,
        "score_normalisation": f"raw / {output_format.length_penalty.formula()}, n = output tokens including EOS",
        "raw_score": best["raw_score"] if best else None,
        "tokens": best["tokens"] if best else [],
        "truncated": line.truncated,
    }
    if line.src_words is not None or output_format.alignment:
        record["alignment"] = best.get("alignment", "") if best else ""
        record["source_words"] = [list(span) for span in line.src_words or []]
        record["target_words"] = best.get("target_words", []) if best else []
    record["nbest"] = hypotheses
    return record
