"""Guided-alignment training (Garg et al. 2019, "Jointly Learning to Align and Translate"; Marian's
--guided-alignment): word alignments read line-parallel to the training text, words mapped to subword
positions, a batch's reference attention, and its cross-entropy with one head's cross-attention.

Only word-level links are kept per corpus row; which subwords make up a word is derived from the
token ids at batch time (a per-vocabulary table), so the links survive any tokenizer.
"""

from __future__ import annotations

import array
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from tfm_cli.corpus.batching import Batch, SpecialIds, pad_rows
from tfm_cli.corpus.tokenized import TokenizedCorpus
from tfm_cli.errors import TfmError
from tfm_cli.tokenization.words import count_words, ends_with_space, has_content, starts_with_space
# Added to the attention before its log, as Marian does: a reference link to a position the head gives
# (almost) no weight costs -log(EPSILON) at most instead of infinity.
EPSILON = 1e-6
CHUNK_LINES = 50_000  # alignment lines parsed at a time
WORD_COUNT_ROWS = 4096  # corpus rows whose words are counted from their ids at a time
# One Pharaoh line: "src-tgt" (or "src?tgt") pairs of ASCII digits separated by whitespace, or nothing.
PHARAOH_LINE = re.compile(rb"\s*(?:\d+[-?]\d+(?:\s+\d+[-?]\d+)*)?\s*")
NUMBER = re.compile(rb"\d+")


@dataclass(frozen=True)
class WordLinks:
    """The reference word links of every corpus row: row i's (source word, target word) pairs are
    links[offsets[i]:offsets[i + 1]] (0-based word indices)."""

    links: torch.Tensor  # (L, 2) int64
    offsets: torch.Tensor  # (N + 1,) int64

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def row(self, index: int) -> torch.Tensor:
        """(k, 2) int64 links of row `index`."""
        return self.links[int(self.offsets[index]) : int(self.offsets[index + 1])]

    def select(self, rows: torch.Tensor) -> WordLinks:
        """The links of `rows` (M,) int64, in that order."""
        starts, lengths = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]  # (M,), (M,)
        offsets = torch.zeros(rows.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        # Link j of the new table comes from starts[row] + (j - offsets[row]).
        row_of_link = torch.repeat_interleave(torch.arange(rows.numel()), lengths)
        source = starts[row_of_link] + torch.arange(int(offsets[-1])) - offsets[:-1][row_of_link]
        return WordLinks(self.links[source], offsets)


def masked_links(links: WordLinks, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(links, offsets) of `links` with the rows where `keep` (N,) bool is False emptied."""
    lengths = (links.offsets[1:] - links.offsets[:-1]) * keep  # (N,)
    row_of_link = torch.repeat_interleave(torch.arange(len(links)), links.offsets[1:] - links.offsets[:-1])
    offsets = torch.zeros_like(links.offsets)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return links.links[keep[row_of_link]], offsets


def line_count_error(alignment_path: Path, src_path: Path, tgt_path: Path) -> TfmError:
    """The error for an alignment file whose line count differs from the training data's (each file counted)."""
    counts = {}
    for path in (alignment_path, src_path, tgt_path):
        with open(path, "rb") as f:
            counts[path] = sum(1 for _ in f)
    return TfmError(
        f"{alignment_path} has {counts[alignment_path]:,} lines but the training data {src_path.name} / {tgt_path.name} "
        f"has {counts[src_path]:,} / {counts[tgt_path]:,}; data.train_alignment needs one line of links per training "
        "pair (an empty line for a pair without links)"
    )


def parse_links(text: str, path: Path, line_number: int) -> list[int]:
    """The links of one Pharaoh line ("0-0 1-2 2?3": source-target word indices; '?' marks a possible
    link, taken as a link) as a flat [s0, t0, s1, t1, ...]; TfmError naming the file and 1-based line."""
    flat = []
    for item in text.split():
        source, separator, target = item.replace("?", "-").partition("-")
        if not (separator and source.isdigit() and target.isdigit() and source.isascii() and target.isascii()):
            raise TfmError(
                f"{path}:{line_number}: {item!r} is not an alignment link; data.train_alignment is Pharaoh format, "
                "'src-tgt' pairs of 0-based word indices separated by spaces (e.g. '0-0 1-2 2-1')"
            )
        flat += (int(source), int(target))
    return flat


def count_raw_words(raw: bytes) -> int:
    """Words (tokenization/words.py) of one line of UTF-8 text as read from a file."""
    return count_words(raw.decode("utf-8", errors="replace"))


def int64_tensor(values: array.array) -> torch.Tensor:
    """A 'q' array as a (n,) int64 tensor (copied: the array may grow or go)."""
    return torch.frombuffer(values, dtype=torch.int64).clone() if values else torch.zeros(0, dtype=torch.int64)


def read_word_links(
    alignment_path: str | Path, src_path: str | Path, tgt_path: str | Path
) -> tuple[WordLinks, torch.Tensor]:
    """Every line's links of `alignment_path`, checked against the parallel files' lines, and the words of
    each line: (WordLinks over input lines, (lines, 2) int64 source and target word counts).

    Raises TfmError, naming the file and line and what to do, when the line counts differ, a line is not
    Pharaoh format, or a link names a word beyond its line's words.
    """
    alignment_path, src_path, tgt_path = Path(alignment_path), Path(src_path), Path(tgt_path)
    if not alignment_path.is_file():
        raise TfmError(f"{alignment_path}: no such alignment file (data.train_alignment)")
    # Flat int64 arrays (8 bytes a number, where a list would hold an object per number).
    numbers = array.array("q")  # s0, t0, s1, t1, ... of every line
    per_line = array.array("q")  # links of each line
    words = array.array("q")  # source words, target words of each line
    with open(alignment_path, "rb") as alignments, open(src_path, "rb") as src, open(tgt_path, "rb") as tgt:
        number = 0
        while chunk := list(itertools.zip_longest(*(itertools.islice(f, CHUNK_LINES) for f in (alignments, src, tgt)))):
            for raw_links, raw_src, raw_tgt in chunk:
                number += 1
                if raw_links is None or raw_src is None or raw_tgt is None:
                    raise line_count_error(alignment_path, src_path, tgt_path)
                if not PHARAOH_LINE.fullmatch(raw_links):
                    parse_links(raw_links.decode("utf-8", errors="replace"), alignment_path, number)  # names the link
                    raise TfmError(f"{alignment_path}:{number}: not an alignment line; links are 'src-tgt' pairs such as '0-0 1-2'")
                per_line.append(raw_links.count(b"-") + raw_links.count(b"?"))
                words.extend((count_raw_words(raw_src), count_raw_words(raw_tgt)))
            # One regex and one int conversion per chunk: a per-line loop over the numbers costs several times more.
            numbers.extend(map(int, NUMBER.findall(b" ".join(raw_links for raw_links, _, _ in chunk))))
    lines = len(per_line)
    links = int64_tensor(numbers).view(-1, 2)  # (L, 2)
    offsets_tensor = torch.zeros(lines + 1, dtype=torch.int64)
    torch.cumsum(int64_tensor(per_line), 0, out=offsets_tensor[1:])  # (lines + 1,)
    counts = int64_tensor(words).view(-1, 2)  # (lines, 2)
    line_of_link = torch.repeat_interleave(torch.arange(lines), offsets_tensor[1:] - offsets_tensor[:-1])  # (L,)
    beyond = (links >= counts[line_of_link]).any(dim=1).nonzero()  # (bad links, 1)
    if beyond.numel():
        link = int(beyond[0, 0])
        line = int(line_of_link[link])
        (source, target), (n_src, n_tgt) = links[link].tolist(), counts[line].tolist()
        raise TfmError(
            f"{alignment_path}:{line + 1}: link {source}-{target} is beyond the pair's words: line {line + 1} of "
            f"{src_path.name} has {n_src} words and of {tgt_path.name} {n_tgt} (0-based indices of "
            "space-separated words); align the very files data.train_src and data.train_tgt name"
        )
    return WordLinks(links, offsets_tensor), counts


@dataclass(frozen=True)
class PieceTable:
    """Per vocabulary id, what word_spans (tokenization/words.py) asks of its piece: whether it has
    content (more than whitespace), starts with whitespace ('▁' or another), or ends with it."""

    content: torch.Tensor  # (V,) bool
    leading_space: torch.Tensor  # (V,) bool
    trailing_space: torch.Tensor  # (V,) bool

    @classmethod
    def of(cls, tokenizer) -> PieceTable:
        """The table of a tokenizer (anything with vocab_size and id_to_piece)."""
        pieces = [tokenizer.id_to_piece(index) for index in range(tokenizer.vocab_size)]
        return cls(
            torch.tensor([has_content(piece) for piece in pieces]),
            torch.tensor([starts_with_space(piece) for piece in pieces]),
            torch.tensor([ends_with_space(piece) for piece in pieces]),
        )


def word_index(ids: torch.Tensor, real: torch.Tensor, table: PieceTable) -> torch.Tensor:
    """The word of every token: ids (B, L) int64, real (B, L) bool (False: padding, EOS) -> (B, L) int64, -1
    where not real or the row has no word.

    word_spans' rules, on whole batches: a piece with content starts a word if it starts with whitespace,
    is the first piece with content, or follows a piece ending in whitespace; pieces with content join the
    word before, pieces without (a bare '▁') the word after (trailing ones the last word). (word_spans also
    lets a bare '▁' carry over an empty-string piece; sentencepiece makes none.)
    """
    content = table.content[ids] & real  # (B, L)
    trailing = table.trailing_space[ids] & real
    after_space = torch.zeros_like(trailing)
    after_space[:, 1:] = trailing[:, :-1]
    first = content & (content.cumsum(1) == 1)
    starts = content & (table.leading_space[ids] | after_space | first)
    count = starts.cumsum(1)  # (B, L): words started up to here
    n_words = count[:, -1:]  # (B, 1)
    words = torch.where(content, count - 1, torch.minimum(count, n_words - 1))
    return words.masked_fill(~real | (n_words == 0), -1)


def real_tokens(ids: torch.Tensor, special: SpecialIds) -> torch.Tensor:
    """(B, L) bool: the tokens that belong to words (not padding, EOS or BOS)."""
    return (ids != special.pad_id) & (ids != special.eos_id) & (ids != special.bos_id)


def corpus_word_counts(
    tokens: torch.Tensor, offsets: torch.Tensor, table: PieceTable, special: SpecialIds
) -> torch.Tensor:
    """(N,) int64 words of every sentence of a flat token tensor (TokenizedCorpus), counted from its ids."""
    counts = []
    for first in range(0, offsets.numel() - 1, WORD_COUNT_ROWS):
        rows = torch.arange(first, min(first + WORD_COUNT_ROWS, offsets.numel() - 1))
        ids = pad_rows(tokens, offsets, rows, special.pad_id)
        counts.append(word_index(ids, real_tokens(ids, special), table).max(dim=1).values + 1)
    return torch.cat(counts) if counts else torch.zeros(0, dtype=torch.int64)


def corpus_word_links(
    alignment_path: str | Path, src_path: str | Path, tgt_path: str | Path, corpus: TokenizedCorpus,
    src_table: PieceTable, tgt_table: PieceTable, special: SpecialIds,
) -> tuple[WordLinks, int]:
    """The links of every row of `corpus` (prepared from src_path/tgt_path alone): the alignment lines of
    the pairs filtering kept, in corpus order; rows whose tokens make other words than their text's
    spaces (a tokenizer that normalises spaces) are left without links. Returns (links, such rows).
    """
    by_line, words = read_word_links(alignment_path, src_path, tgt_path)
    lines = corpus.line_numbers.to(torch.int64)
    links = by_line.select(lines)
    tokenized = torch.stack([
        corpus_word_counts(corpus.src_tokens, corpus.src_offsets, src_table, special),
        corpus_word_counts(corpus.tgt_tokens, corpus.tgt_offsets, tgt_table, special),
    ], dim=1)  # (N, 2)
    differ = (tokenized != words[lines]).any(dim=1)  # (N,)
    if bool(differ.any()):
        links = WordLinks(*masked_links(links, ~differ))
    return links, int(differ.sum())


class AlignmentGuide:
    """What a guided run adds to each batch: the reference attention of its rows (`shift` and `null` as
    reference_attention takes them)."""

    def __init__(
        self, links: WordLinks, src_table: PieceTable, tgt_table: PieceTable, special: SpecialIds,
        shift: bool = False, null: bool = False,
    ) -> None:
        self.links, self.src_table, self.tgt_table, self.special = links, src_table, tgt_table, special
        self.shift, self.null = shift, null

    def annotate(self, batch: Batch) -> Batch:
        """`batch` (on the host) with its reference attention and supervised row count set."""
        batch.alignment, batch.n_aligned_rows = reference_attention(
            batch.src, batch.tgt_out, [self.links.row(int(row)) for row in batch.indices],
            self.src_table, self.tgt_table, self.special, self.shift, self.null,
        )
        return batch


def reference_attention(
    src: torch.Tensor, tgt_out: torch.Tensor, links: list[torch.Tensor], src_table: PieceTable,
    tgt_table: PieceTable, special: SpecialIds, shift: bool = False, null: bool = False,
) -> tuple[torch.Tensor, int]:
    """The attention each decoder row should have: src (B, S), tgt_out (B, T) int64, links per row (k, 2).

    Token t's reference spreads evenly over the source subwords of the source words linked to the
    target word that holds token t. Row t of a teacher-forced pass predicts tgt_out[:, t] (its input
    is token t - 1); without `shift` it learns token t's reference, with `shift` row t + 1 does (the
    row whose input is token t) and row 0 learns nothing. Tokens of words without a link learn the
    source's EOS with `null`, nothing without. Rows of EOS and of padding are all zero. Returns
    ((B, T, S) float32, rows with a reference).
    """
    src_words = word_index(src, real_tokens(src, special), src_table)  # (B, S)
    tgt_words = word_index(tgt_out, real_tokens(tgt_out, special), tgt_table)  # (B, T)
    batch = src.size(0)
    # (B, source words, target words); at least 1 x 1, so a batch without words still indexes it.
    linked = torch.zeros(batch, max(int(src_words.max()), 0) + 1, max(int(tgt_words.max()), 0) + 1, dtype=torch.bool)
    rows = torch.repeat_interleave(torch.arange(batch), torch.tensor([row.size(0) for row in links]))
    if rows.numel():
        pairs = torch.cat(links)  # (L, 2)
        linked[rows, pairs[:, 0], pairs[:, 1]] = True
    # (B, T, S): is source token s's word linked to target token t's word?
    reference = linked[
        torch.arange(batch)[:, None, None], src_words.clamp(min=0)[:, None, :], tgt_words.clamp(min=0)[:, :, None]
    ]
    reference &= (src_words >= 0)[:, None, :] & (tgt_words >= 0)[:, :, None]
    counts = reference.sum(dim=-1, keepdim=True)  # (B, T, 1)
    reference = reference / counts.clamp(min=1)
    if null:
        unlinked = (counts[..., 0] == 0) & (tgt_words >= 0)  # (B, T): tokens of words without a link
        reference = reference + (unlinked[:, :, None] & (src == special.eos_id)[:, None, :])
    if shift:
        reference = torch.cat([torch.zeros_like(reference[:, :1]), reference[:, :-1]], dim=1)
    return reference, int((reference.sum(dim=-1) > 0).sum())


def alignment_loss(attention: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Cross-entropy -sum q log(a + EPSILON) of attention a against reference q, both (B, T, S), summed over
    all rows (rows without a reference are zero); a float32 scalar."""
    return -(reference * torch.log(attention.float() + EPSILON)).sum()
