"""Word alignments of GIVEN sentence pairs (`tfm align`): pre-tokenized words in, (src, tgt) links out.

Words are tokenization/words.py's: runs of non-whitespace of each side as given. Each word is encoded on its own and the
pieces concatenated, so word k owns a known piece range whatever the tokenizer normalises. The
links come from one teacher-forced pass per batch and alignment.py's merge and argmax, the same
path as `translate --alignment` and `inspect-attention --format pharaoh`. Never prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from tfm_cli.checkpoints.format import LoadedModel
from tfm_cli.config import AlignmentConfig
from tfm_cli.inference.alignment import (
    AlignmentPair,
    forced_attention,
    hard_alignment,
    merge_to_words,
    null_weights,
    pharaoh,
    piece_rows,
    transpose_pairs,
)
from tfm_cli.inference.symmetrization import SYMMETRIZATIONS, ordered
from tfm_cli.inference.translation import BatchingConfig, length_sorted_batches
from tfm_cli.textio.output_lines import json_line
from tfm_cli.textio.streams import read_chunks
from tfm_cli.tokenization.words import Span, split_words

SEPARATOR = "|||"  # fast_align's input format: "source words ||| target words"
WordPair = tuple[list[str], list[str]]


def split_pair(line: str) -> WordPair | None:
    """A fast_align line "src words ||| tgt words" -> (src words, tgt words); None without exactly one
    `|||` token. A blank line is ([], []). Words are tokenization/words.py's (runs of non-whitespace)."""
    tokens = split_words(line)
    if not tokens:
        return [], []
    if tokens.count(SEPARATOR) != 1:
        return None
    cut = tokens.index(SEPARATOR)
    return tokens[:cut], tokens[cut + 1 :]


@dataclass
class Direction:
    """One model's answer for one pair: links (src, tgt) in the pair's own orientation, and the
    word-level matrix (tgt words x src words) with each row renormalised over the source words."""

    pairs: list[AlignmentPair] = field(default_factory=list)
    matrix: torch.Tensor | None = None  # (T_words, S_words) float32; None when not kept


@dataclass(frozen=True)
class TooLong:
    """A pair a side of which does not fit the model's positions: its piece counts and the most allowed."""

    src_pieces: int
    tgt_pieces: int
    most: int  # max_positions - 1: room for the source's EOS and the target's BOS

    def swapped(self) -> TooLong:
        """The same, seen from the other direction (a reverse model's source is the pair's target)."""
        return TooLong(self.tgt_pieces, self.src_pieces, self.most)


@dataclass
class AlignedPair:
    """The answer for one input line."""

    index: int  # 0-based line number
    src_words: list[str]
    tgt_words: list[str]
    malformed: bool = False  # a `|||` line without exactly one separator: no words, no links
    too_long: TooLong | None = None  # in the pair's orientation, whichever model it did not fit
    forward: Direction | None = None
    backward: Direction | None = None  # the reverse model's, pairs transposed into (src, tgt)
    pairs: list[AlignmentPair] = field(default_factory=list)  # what is printed (symmetrized with a reverse model)


@dataclass
class AlignStats:
    """What happened to the input, for the summary on stderr."""

    lines: int = 0
    empty_lines: int = 0  # a side with no words (a blank line included)
    malformed_lines: int = 0
    first_malformed: int | None = None  # 1-based
    too_long_lines: int = 0
    seconds: float = 0.0


def word_matrix(
    piece_matrix: torch.Tensor, tgt_spans: list[Span], src_spans: list[Span], null: bool = False
) -> tuple[torch.Tensor, list[AlignmentPair]]:
    """Piece-level attention (T_pieces, S_pieces + 1; the last column is the source's EOS) -> (word
    matrix (T_words, S_words), hard (src, tgt) links).

    merge_to_words and hard_alignment run on the words that have pieces; words without any get a
    zero row or column and no link. The links are the argmax of the merged rows (as translate's),
    with `null` none for a word whose EOS weight is larger; the returned rows are then renormalised
    to sum to 1 (the EOS column's mass spread out), which moves no argmax.
    """
    src_kept = [k for k, (start, end) in enumerate(src_spans) if end > start]
    tgt_kept = [k for k, (start, end) in enumerate(tgt_spans) if end > start]
    full = torch.zeros(len(tgt_spans), len(src_spans))
    if not src_kept or not tgt_kept:
        return full, []
    kept_tgt_spans = [tgt_spans[k] for k in tgt_kept]
    merged = merge_to_words(piece_matrix, kept_tgt_spans, [src_spans[k] for k in src_kept])
    eos = null_weights(piece_matrix, kept_tgt_spans, piece_matrix.size(1) - 1) if null else None
    links = [(src_kept[s], tgt_kept[t]) for s, t in hard_alignment(merged, eos)]
    merged = merged / merged.sum(dim=1, keepdim=True).clamp_min(1e-30)
    full[torch.tensor(tgt_kept)[:, None], torch.tensor(src_kept)[None, :]] = merged  # (T_kept, S_kept) into place
    return full, links


class WordAligner:
    """Aligns batches of word pairs with one model (source->target), reading `alignment`'s attention."""

    def __init__(self, loaded: LoadedModel, alignment: AlignmentConfig, batching: BatchingConfig) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.alignment = alignment
        self.batching = batching
        self.device = next(self.model.parameters()).device
        alignment.check(self.model.config.n_dec_layers, self.model.config.n_heads)
        # Sources are fed as ids + [EOS], targets as [BOS] + ids: each must fit the positional table.
        self.max_ids = self.model.config.max_positions - 1

    def encode(self, pairs: list[WordPair]) -> list[tuple[list[int], list[Span], list[int], list[Span]]]:
        """Each pair's (src ids, src word spans, tgt ids, tgt word spans), words encoded one by one."""
        src_tok, tgt_tok = self.loaded.src_tokenizer, self.loaded.tgt_tokenizer
        src_all = iter(src_tok.encode_ids_batch([w for s, _ in pairs for w in s]) if any(s for s, _ in pairs) else [])
        tgt_all = iter(tgt_tok.encode_ids_batch([w for _, t in pairs for w in t]) if any(t for _, t in pairs) else [])
        encoded = []
        for src_words, tgt_words in pairs:
            sides = []
            for words, stream in ((src_words, src_all), (tgt_words, tgt_all)):
                ids: list[int] = []
                spans: list[Span] = []
                for _ in words:
                    word_ids = next(stream)
                    spans.append((len(ids), len(ids) + len(word_ids)))
                    ids.extend(word_ids)
                sides += [ids, spans]
            encoded.append(tuple(sides))
        return encoded

    @torch.inference_mode()
    def align(self, pairs: list[WordPair], keep_matrices: bool) -> list[Direction | TooLong | None]:
        """Align each (src words, tgt words) pair: a Direction; TooLong for a pair a side of which does
        not fit the model; None for a pair with an empty side."""
        encoded = self.encode(pairs)
        answers: list = [None] * len(pairs)
        sources: dict[int, list[int]] = {}
        for i, (src_ids, _, tgt_ids, _) in enumerate(encoded):
            if max(len(src_ids), len(tgt_ids)) > self.max_ids:
                answers[i] = TooLong(len(src_ids), len(tgt_ids), self.max_ids)
            elif src_ids and tgt_ids:
                sources[i] = src_ids
            elif pairs[i][0] and pairs[i][1]:
                answers[i] = Direction(matrix=torch.zeros(len(pairs[i][1]), len(pairs[i][0])))
        for batch in length_sorted_batches(sources, self.batching):
            attention = forced_attention(  # per pair (T, S): [BOS] + target ids by source ids + EOS
                self.model, self.loaded.aligner, self.alignment, [sources[i] for i in batch], [encoded[i][2] for i in batch],
                self.device,
            )
            for row, i in enumerate(batch):
                src_ids, src_spans, tgt_ids, tgt_spans = encoded[i]
                # Rows: the target pieces (the </s> row dropped); columns: the source pieces and EOS.
                pieces = piece_rows(attention[row], len(tgt_ids), self.alignment.shift)
                matrix, links = word_matrix(pieces, tgt_spans, src_spans, self.alignment.null)
                answers[i] = Direction(links, matrix if keep_matrices else None)
        return answers


class PairAligner:
    """A forward WordAligner, and optionally a reverse one (target->source) and a symmetrization."""

    def __init__(
        self, forward: WordAligner, backward: WordAligner | None = None, symmetrize: str | None = None,
        keep_matrices: bool = False,
    ) -> None:
        if (backward is None) != (symmetrize is None):
            raise ValueError("a reverse aligner and a symmetrization go together")
        self.forward = forward
        self.backward = backward
        self.symmetrize = symmetrize
        self.keep_matrices = keep_matrices

    def align_chunk(self, items: list[WordPair | None], first_index: int, stats: AlignStats) -> list[AlignedPair]:
        """One AlignedPair per item (None = a malformed line), in order."""
        results = []
        for offset, item in enumerate(items):
            stats.lines += 1
            line = AlignedPair(first_index + offset, *(item or ([], [])), malformed=item is None)
            if item is None:
                stats.malformed_lines += 1
                if stats.first_malformed is None:
                    stats.first_malformed = line.index + 1
            elif not item[0] or not item[1]:
                stats.empty_lines += 1
            results.append(line)
        pairs = [(line.src_words, line.tgt_words) for line in results]
        forward = self.forward.align(pairs, self.keep_matrices)
        backward = None
        if self.backward is not None:
            backward = self.backward.align([(t, s) for s, t in pairs], self.keep_matrices)
        for k, line in enumerate(results):
            if isinstance(forward[k], TooLong):
                line.too_long = forward[k]
            elif backward is not None and isinstance(backward[k], TooLong):
                line.too_long = backward[k].swapped()
            if line.too_long is not None:
                stats.too_long_lines += 1
                continue
            if forward[k] is None:
                continue
            line.forward = forward[k]
            line.pairs = line.forward.pairs
            if backward is not None:
                reverse = backward[k]
                line.backward = Direction(ordered(set(transpose_pairs(reverse.pairs))), reverse.matrix)
                line.pairs = SYMMETRIZATIONS[self.symmetrize](line.forward.pairs, line.backward.pairs)
        return results


def align_stream(aligner: PairAligner, items: Iterable[WordPair | None], batching: BatchingConfig, stats: AlignStats) -> Iterator[list[AlignedPair]]:
    """Align `items` chunk by chunk (textio.read_chunks); yields each chunk's AlignedPairs in input order."""
    done = 0
    for chunk in read_chunks(items, batching.buffer_size, batching.pause_s):
        started = time.perf_counter()
        aligned = aligner.align_chunk(chunk, done, stats)
        stats.seconds += time.perf_counter() - started
        yield aligned
        done += len(chunk)


# Version of the `--json` line format; bump on any incompatible change (documented in README.md).
JSON_SCHEMA = "tfm-align/1"


def rounded(matrix: torch.Tensor | None) -> list[list[float]]:
    """A word matrix as JSON rows, 4 decimals."""
    return [] if matrix is None else [[round(value, 4) for value in row] for row in matrix.tolist()]


def format_aligned(line: AlignedPair, as_json: bool, symmetrize: str | None = None) -> str:
    """The text written for one input line (no newline): its Pharaoh links sorted by target then
    source ("" when the line has none), or with `as_json` one object (schema JSON_SCHEMA)."""
    links = pharaoh(line.pairs)
    if not as_json:
        return links
    skipped = "malformed" if line.malformed else "too long" if line.too_long else None
    if skipped is None and not (line.src_words and line.tgt_words):
        skipped = "empty"
    record = {"schema": JSON_SCHEMA, "line": line.index + 1, "src": line.src_words, "tgt": line.tgt_words,
              "alignment": links, "skipped": skipped}
    if symmetrize is None:
        record["probabilities"] = rounded(line.forward.matrix if line.forward else None)
    else:
        record["symmetrization"] = symmetrize
        for name, direction in (("forward", line.forward), ("reverse", line.backward)):
            record[name] = {
                "alignment": pharaoh(direction.pairs) if direction else "",
                "probabilities": rounded(direction.matrix if direction else None),
            }
    return json_line(record)
