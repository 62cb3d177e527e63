"""Text in, translations out: streaming chunks, length-sorted batches, input order restored, output formats.

A library module: it never prints. `tfm translate` reads lines, hands them to `translate_stream`,
and writes what `format_line` returns. Batches hold sources of similar length; decoding.TransformerDecoder
encodes and attends each padded width (decoding.padded_length) apart, which makes every sentence's
translation independent of the batch it lands in. Validation during training decodes through
`search_batches` too, so it measures exactly what `tfm translate` would output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from tfm_cli.checkpoints.format import LoadedModel
from tfm_cli.config import AlignmentConfig, DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.alignment import (
    forced_attention,
    hard_alignment,
    merge_to_words,
    null_weights,
    pharaoh,
    piece_rows,
    transpose_pairs,
)
from tfm_cli.inference.constraints import ConstraintTracker, phrases_met, word_continuation_ids
from tfm_cli.inference.decoding import max_output_lengths, padded_length
from tfm_cli.inference.ensemble import Ensemble
from tfm_cli.inference.outputs import Output, TranslatedLine
from tfm_cli.inference.search import Hypothesis
from tfm_cli.inference.search_state import SearchState
from tfm_cli.inference.search_workers import SearchJob, SearchWorkers, search_batch
from tfm_cli.inference.shortlist import Shortlist, batch_shortlist
from tfm_cli.inference.text_preparation import TextOptions, assemble_line, prepare_line
from tfm_cli.length_penalty import LengthPenalty, decode_length_penalty
from tfm_cli.model import Transformer
from tfm_cli.tokenization.words import word_char_offsets, word_spans
from tfm_cli.textio.output_lines import json_line, one_line
from tfm_cli.textio.streams import INPUT_PAUSE_S, read_chunks

# How a warning about a truncated line ends when the line was not split into sentences.
LONG_LINE_HINT = " (--split-sentences translates a line sentence by sentence)"
# A line's warning about constraints it cannot use names this many of them.
MAX_PHRASES_NAMED = 5
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
class TranslationStats:
    """What happened to the input, for the warnings and the summary on stderr."""

    lines: int = 0
    empty_lines: int = 0  # blank input lines (an empty output line each)
    unencodable_lines: int = 0  # non-blank lines the tokenizer turned into no tokens (empty output too)
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
    nbest: int = 1  # hypotheses per line: an empty line gets as many (empty) columns as the others


class Translator:
    """Translates chunks of raw lines with one loaded model (tokenize, batch, search, detokenize).

    `source_prefix` ids go before every source's own ids: a multilingual Marian model's `>>xx<<`
    target-language tag (vocabulary.language_tag_id). Word alignments leave them out. `workers`:
    forked processes of the same model and decode settings that search the batches instead of this one.
    `ensemble`: the models searched together instead of `loaded` alone (ensemble.py); `loaded` is its
    first member, whose tokenizers, alignments and length limits the whole ensemble shares.
    `shortlist`: each line's output is restricted to its lexical shortlist (shortlist.py) and its
    constraint tokens.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        decode: DecodeConfig,
        batching: BatchingConfig,
        alignment: AlignmentConfig | None = None,
        source_prefix: tuple[int, ...] = (),
        text: TextOptions = TextOptions(),
        workers: SearchWorkers | None = None,
        ensemble: Ensemble | None = None,
        shortlist: Shortlist | None = None,
    ) -> None:
        self.loaded = loaded
        self.shortlist = shortlist
        self.workers = workers
        self.model = loaded.model  # aligns the outputs (with an ensemble, its first member)
        if ensemble is not None and ensemble.members[0] is not loaded.model:
            raise ValueError("an ensemble's Translator is given its first member as `loaded`")
        self.searched: Transformer | Ensemble = ensemble if ensemble is not None else loaded.model
        self.decode = decode
        self.length_penalty = decode_length_penalty(decode)
        self.batching = batching
        self.alignment = alignment
        self.source_prefix = list(source_prefix)
        self.text = text
        self.constrained = text.constraint_fields or text.glossary is not None
        # A constraint phrase must end its word: these target tokens may not follow one (constraints.py).
        self.continuation_ids: tuple[int, ...] = ()
        if self.constrained:
            target = loaded.tgt_tokenizer
            self.continuation_ids = word_continuation_ids([target.id_to_piece(i) for i in range(target.vocab_size)])
        self.continuation_set = frozenset(self.continuation_ids)  # for constraints_met, per output
        if self.constrained and decode.sample:
            raise TfmError("constraints (--constraints, --glossary) need beam search or greedy decoding, not --sample")
        if text.splitter is not None and decode.nbest > 1:
            raise TfmError("--split-sentences gives one translation per line: use it without --nbest")
        if text.splitter is not None and text.constraint_fields:
            raise TfmError(
                "--constraints belong to a whole line, which --split-sentences cuts into sentences: "
                "use --glossary, whose terms are found in each sentence"
            )
        if workers is not None and workers.decode != decode:
            raise ValueError("the decoding workers were started with other decode settings than this Translator's")
        if text.markup is not None and alignment is None:
            raise TfmError("--markup puts tags back through word alignments: the Translator needs an AlignmentConfig")
        self.device = next(self.model.parameters()).device
        if alignment is not None:
            alignment.check(self.model.config.n_dec_layers, self.model.config.n_heads)
        # Sources are fed as prefix + ids + [EOS] and must fit the positional table (every member's).
        self.max_positions = self.searched.config.max_positions
        self.max_src_ids = self.max_positions - 1 - len(self.source_prefix)

    def translate_chunk(self, lines: list[str], first_index: int, stats: TranslationStats) -> list[TranslatedLine]:
        """Translate `lines` (line `first_index` onwards); returns one TranslatedLine per line, in order.

        Each line is taken apart by text_preparation (constraint fields, markup, sentences, glossary
        terms); all segments of the chunk are translated together, then put back together per line.
        """
        prepared = [prepare_line(line, self.text) for line in lines]
        owners = [i for i, line in enumerate(prepared) for _ in line.segments]  # the line of each segment
        answers = self.translate_segments(
            [segment.text for line in prepared for segment in line.segments],
            [segment.phrases for line in prepared for segment in line.segments],
            [first_index + i for i in owners],  # a line's sampling seed does not depend on its chunk
            stats,
        )
        per_line: list[list[TranslatedLine]] = [[] for _ in lines]
        for owner, answer in zip(owners, answers):
            per_line[owner].append(answer)
        results = []
        for i, (line, line_answers) in enumerate(zip(prepared, per_line)):
            stats.lines += 1
            if not line.segments:
                stats.empty_lines += 1
            results.append(assemble_line(first_index + i, line, line_answers, self.length_penalty))
        return results

    def translate_segments(
        self, texts: list[str], phrases: list[list[str]], seed_indices: list[int], stats: TranslationStats
    ) -> list[TranslatedLine]:
        """Translate each text (non-blank) with its required target phrases; one TranslatedLine each, in order.

        seed_indices: per text, the line number its samples are drawn for (decode.seed + that).
        """
        results = [TranslatedLine(index=i, source=text) for i, text in enumerate(texts)]
        encoded = self.loaded.src_tokenizer.encode_ids_batch(texts) if texts else []
        sources: dict[int, list[int]] = {}
        constraints: dict[int, list[list[int]]] = {}
        for i, ids in enumerate(encoded):
            if len(ids) > self.max_src_ids:
                results[i].warnings.append(
                    f"its {len(ids)} source tokens exceed the model's {self.max_src_ids}; only the first "
                    f"{self.max_src_ids} were translated{LONG_LINE_HINT if not self.text.splitter else ''}"
                )
                ids = ids[: self.max_src_ids]
                results[i].truncated = True
            if not ids:
                stats.unencodable_lines += 1
                continue
            sources[i] = self.source_prefix + ids
            if self.constrained:
                results[i].constraints = phrases[i]
                constraints[i] = self.encode_phrases(phrases[i], len(sources[i]) + 1, results[i].warnings)
        searched = search_batches(
            self.searched, sources, self.decode, self.batching, seeds={i: self.decode.seed + seed_indices[i] for i in sources},
            workers=self.workers, search_state=self.constraint_tracker(constraints) if self.constrained else None,
            shortlist=self.shortlist, required_ids={i: [t for phrase in constraints[i] for t in phrase] for i in constraints},
        )
        for batch, hypotheses in searched:
            for i, hyps in zip(batch, hypotheses):
                if not hyps:
                    # Every candidate of every step had a non-finite score: no model works that way.
                    raise TfmError(
                        f"line {seed_indices[i] + 1}: the model gave no translation with a finite score "
                        "(its outputs are inf/nan; the checkpoint's weights may be damaged)"
                    )
                results[i].outputs = [self.render(h, constraints.get(i)) for h in hyps]
                if i in constraints:
                    met = results[i].outputs[0].constraints_met
                    missed = [phrase for phrase, ids, ok in zip(phrases[i], constraints[i], met) if ids and not ok]
                    if missed:  # --json says so per phrase; plain output would not show it at all
                        listed = ", ".join(repr(phrase) for phrase in missed[:MAX_PHRASES_NAMED])
                        results[i].warnings.append(f"its translation lacks constraint(s) {listed}: the length limit came first")
                stats.src_tokens += len(sources[i]) + 1
                stats.output_tokens += len(hyps[0].tokens) + 1
            if self.alignment is not None:
                self.align(batch, sources, results)
        return results

    def constraint_tracker(
        self, constraints: dict[int, list[list[int]]]
    ) -> Callable[[list[int]], ConstraintTracker | None]:
        """Per batch (line indices), the tracker of its lines' phrases (token ids, keyed by line), or None
        where none of its lines has one; a phrase ends a word (no continuation id may follow it)."""

        def for_batch(batch: list[int]) -> ConstraintTracker | None:
            phrases = [constraints.get(i, []) for i in batch]
            if not any(phrases):
                return None
            return ConstraintTracker(phrases, self.model.config.eos_id, self.continuation_ids)

        return for_batch

    def encode_phrases(self, phrases: list[str], src_length: int, warnings: list[str]) -> list[list[int]]:
        """The target token ids of each phrase ([] for one that cannot be met), noting why in `warnings`.

        A phrase with characters the target vocabulary lacks can never be produced; phrases whose
        tokens together exceed the output length limit of this source (src_length tokens, EOS
        included) cannot all be: they are all dropped, and the line is translated without them.
        """
        tokenizer = self.loaded.tgt_tokenizer
        encoded, unusable = [], []
        for phrase in phrases:
            ids = tokenizer.encode_ids(phrase)
            if not ids or self.loaded.config.unk_id in ids:
                unusable.append(phrase)
                ids = []
            encoded.append(ids)
        if unusable:  # one warning for the line, however many fields it has
            listed = ", ".join(repr(phrase) for phrase in unusable[:MAX_PHRASES_NAMED])
            more = f" and {len(unusable) - MAX_PHRASES_NAMED} more" if len(unusable) > MAX_PHRASES_NAMED else ""
            warnings.append(
                f"constraint {listed} has characters the model's vocabulary lacks; it was not used" if len(unusable) == 1
                else f"constraints {listed}{more} have characters the model's vocabulary lacks; they were not used"
            )
        most = self.max_positions - 2
        limit = int(max_output_lengths(torch.tensor([src_length]), self.decode.max_len_a, self.decode.max_len_b, most)[0])
        needed = sum(len(ids) for ids in encoded)
        if needed > limit:
            # Past the model's positions no length flag helps.
            cap = f"the model outputs at most {most}" if needed > most else f"the length limit allows {limit} (--max-len-a/--max-len-b)"
            warnings.append(f"its constraints need {needed} target tokens but {cap}; translated without them")
            return [[] for _ in encoded]
        return encoded

    def render(self, hypothesis: Hypothesis, phrases: list[list[int]] | None = None) -> Output:
        """Detokenize one hypothesis and attach its normalised score (and which of `phrases` it holds)."""
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
            constraints_met=(
                phrases_met(hypothesis.tokens, phrases, self.continuation_set) if phrases is not None else None
            ),
        )

    @torch.inference_mode()
    def align(self, batch: list[int], sources: dict[int, list[int]], results: list[TranslatedLine]) -> None:
        """Attach word alignments to every output of `batch` from forced-decoding cross-attention.

        The decoder re-reads each output teacher-forced (the same attention the search saw); the
        chosen layer/head's piece-level map is merged to words (alignment.py) and argmaxed.
        """
        rows = [(i, output) for i in batch for output in results[i].outputs]
        attention = forced_attention(  # per row (T, S): [BOS] + output ids by source ids + EOS
            self.model, self.loaded.aligner, self.alignment, [sources[i] for i, _ in rows], [output.ids for _, output in rows],
            self.device,
        )
        skip = len(self.source_prefix)  # the prefix columns are no source words
        # Pieces as strings of the text, not of the ids: an unknown character (a tab, a no-break space the
        # vocabulary lacks) keeps its surface there, so it still separates words (tokenization/words.py).
        src_pieces = {i: self.loaded.src_tokenizer.encode_pieces(results[i].source)[: len(sources[i]) - skip] for i in batch}
        for row, (i, output) in enumerate(rows):
            line = results[i]
            src_spans = word_spans(src_pieces[i])
            if line.src_words is None:
                line.src_words = word_char_offsets(line.source)[: len(src_spans)]
            # Rows: the output pieces' (EOS's dropped); columns: the source pieces (prefix dropped), then EOS.
            matrix = piece_rows(attention[row], len(output.pieces), self.alignment.shift)[:, skip : len(sources[i]) + 1]
            tgt_spans = word_spans(output.pieces)
            words = merge_to_words(matrix, tgt_spans, src_spans)
            null = null_weights(matrix, tgt_spans, matrix.size(1) - 1) if self.alignment.null else None
            output.alignment = hard_alignment(words, null)
            output.words = word_char_offsets(output.text)
            if self.text.markup is not None:
                # Tags also follow each source word to its best target word, so that an element
                # around a word no target word chose still encloses a translation of it.
                from_source = transpose_pairs(hard_alignment(words.T))
                output.markup_links = sorted(set(output.alignment) | set(from_source), key=lambda p: (p[1], p[0]))


def length_sorted_batches(sources: dict[int, list[int]], batching: BatchingConfig) -> Iterator[list[int]]:
    """Line indices in batches of sources of similar length, by --batch-size and --max-tokens, for the
    searches and the forced passes of `tfm align`.

    Yields lists of line indices, shortest source first within a batch and from batch to batch. A batch
    may hold several padded source widths (a round of one-sentence requests is one batch, not one per
    width): decoding.TransformerDecoder and alignment.forced_attention run each width apart, so a
    sentence's result does not depend on its batch. --max-tokens bounds a batch's sentences times its
    widest padded width.
    """
    batch: list[int] = []
    for i, ids in sorted(sources.items(), key=lambda item: len(item[1])):
        width = padded_length(len(ids) + 1)  # the widest so far: sources come shortest first
        if batch and (len(batch) >= batching.batch_size or (len(batch) + 1) * width > batching.max_tokens):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def search_batches(
    model: Transformer | Ensemble,
    sources: dict[int, list[int]],
    decode: DecodeConfig,
    batching: BatchingConfig,
    first_index: int = 0,
    seeds: dict[int, int] | None = None,
    workers: SearchWorkers | None = None,
    search_state: Callable[[list[int]], SearchState | None] | None = None,
    shortlist: Shortlist | None = None,
    required_ids: dict[int, list[int]] | None = None,
) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
    """Search every source (ids without EOS, keyed by line index) in length-sorted, batch-invariant batches
    of `model` (one model or an ensemble).

    Yields (line indices of a batch, n-best hypotheses per line), batch by batch in length_sorted_batches's
    order. Sampling draws line i's samples from seeds[i], by default decode.seed + first_index + i, so
    they depend on the line, not on its batch or chunk. search_state: per batch (its line indices), the
    state its beam search keeps (search_state.SearchState, e.g. the constraints of those lines), or None.
    workers: search the batches in these processes instead of this one (the same hypotheses).
    shortlist: restrict each line's output to its shortlist (plus EOS and its `required_ids`, e.g. the
    ids of its constraints).
    """
    batches = list(length_sorted_batches(sources, batching))
    eos = model.config.eos_id
    required_ids = required_ids or {}
    jobs = (
        SearchJob(
            sources=[sources[i] for i in batch],
            seeds=[seeds[i] if seeds else decode.seed + first_index + i for i in batch] if decode.sample else None,
            state=search_state(batch) if search_state is not None else None,
            shortlist=None if shortlist is None else batch_shortlist(
                shortlist, [sources[i] for i in batch], [[eos, *required_ids.get(i, ())] for i in batch]
            ),
        )
        for batch in batches
    )
    if workers is not None:
        yield from zip(batches, workers.search(jobs))
        return
    for batch, job in zip(batches, jobs):
        yield batch, search_batch(model, job, decode)


def translate_stream(
    translator: Translator,
    lines: Iterable[str],
    stats: TranslationStats,
    first_index: int = 0,
) -> Iterator[list[TranslatedLine]]:
    """Translate `lines` chunk by chunk; yields each chunk's TranslatedLines, in input order. The first
    line is line `first_index` of its input (0-based): it numbers the lines and their sampling seeds."""
    done = first_index
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
    An empty input line gives a line of as many empty columns (an empty line without TABs when
    there is one column). --json: one object per line (see json_record).
    """
    if output_format.json:
        return json_line(json_record(line, output_format))
    if not line.outputs:
        per_hypothesis = 1 + output_format.scores + output_format.alignment
        return "\t" * (per_hypothesis * output_format.nbest - 1)
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
            "n_scored_tokens": output.n_scored_tokens,
            "finished": output.finished,
        }
        if output.alignment is not None:
            hypothesis["alignment"] = pharaoh(output.alignment)
            hypothesis["target_words"] = [list(span) for span in output.words or []]
        if output.plain_text is not None:
            hypothesis["plain_translation"] = output.plain_text
        if output.constraints_met is not None:
            hypothesis["constraints_met"] = output.constraints_met
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
    if line.plain_source is not None:  # --markup: alignments and word offsets refer to the text without tags
        record["plain_source"] = line.plain_source
        record["plain_translation"] = best.get("plain_translation", "") if best else ""
    if line.constraints is not None:
        met = best.get("constraints_met") if best else None
        record["constraints"] = [
            {"phrase": phrase, "met": bool(met[k]) if met else False} for k, phrase in enumerate(line.constraints)
        ]
    record["nbest"] = hypotheses
    return record
