"""Sentence concatenation (Kondo et al. 2021; Nguyen et al. 2021): each epoch, a random share of the
training pairs is trained joined to another random pair, source after source and target after target.

A model that has only seen one sentence per line tends to drop part of a line holding two (e.g. two
captions where the first has no final punctuation, which no sentence splitter can separate). Joined
pairs teach it to translate such lines whole. The joining is on token ids: the first pair loses its EOS
and the second follows, so with a sentencepiece vocabulary the joined line decodes as the two texts
separated by a space. Which rows are joined, and to which partner, is a function of (seed, epoch) only,
so a resumed run trains on exactly what an uninterrupted one would. Every row keeps its place and its
line number (a joined row is "row i, then its partner"), so batching, corpus weights and resume see the
same N rows as without it.
"""

from __future__ import annotations

import torch

from tfm_cli.config import derive_seed
from tfm_cli.corpus.tokenized import TokenizedCorpus

CHUNK_ROWS = 1 << 20  # rows joined at a time: bounds the index tensors of a large corpus
EPOCHS_KEPT = 2  # joined corpora kept in memory (the batcher counts epoch 0's updates once, at any epoch)


def joined_side(
    tokens: torch.Tensor, offsets: torch.Tensor, partners: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One side with row i followed by row partners[i] where partners[i] >= 0 (row i's EOS dropped).

    `tokens` (total,) / `offsets` (N + 1,) hold sentences ending in EOS; `partners` (N,) int64 holds a
    row index or -1 (row i stays alone). Returns (flat tokens (total',) of tokens' dtype, offsets (N + 1,) int64).
    """
    rows = partners.numel()
    lengths = offsets[1:] - offsets[:-1]  # (N,)
    joined = partners >= 0
    flats, new_lengths = [], []
    for first in range(0, rows, CHUNK_ROWS):
        last = min(first + CHUNK_ROWS, rows)
        own_start, own_length = offsets[first:last], lengths[first:last] - joined[first:last].long()
        partner = partners[first:last].clamp(min=0)
        partner_start = offsets[partner]
        partner_length = torch.where(joined[first:last], lengths[partner], torch.zeros_like(own_length))
        # Two pieces per row, own then partner: (rows, 2) -> flat, in output order.
        starts = torch.stack([own_start, partner_start], dim=1).view(-1)
        piece_lengths = torch.stack([own_length, partner_length], dim=1).view(-1)
        piece_of_token = torch.repeat_interleave(torch.arange(piece_lengths.numel()), piece_lengths)
        piece_first_token = torch.cumsum(piece_lengths, 0) - piece_lengths  # output position of each piece
        index = starts[piece_of_token] + torch.arange(piece_of_token.numel()) - piece_first_token[piece_of_token]
        flats.append(tokens[index])
        new_lengths.append(own_length + partner_length)
    new_offsets = torch.zeros(rows + 1, dtype=torch.int64)
    if rows:
        torch.cumsum(torch.cat(new_lengths), 0, out=new_offsets[1:])
    flat = torch.cat(flats) if flats else tokens[:0].clone()
    return flat, new_offsets


def drawn_partners(
    src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, share: float, max_length: int, generator: torch.Generator
) -> torch.Tensor:
    """(N,) int64: for a random `share` of the rows another random row to join after it, -1 elsewhere.

    A row and its partner are never the same row, and a draw whose joined source or target would have
    more than `max_length` tokens (EOS included, the training filter's limit) leaves the row alone.
    """
    rows = src_lengths.numel()
    if rows < 2:
        return torch.full((rows,), -1, dtype=torch.int64)
    chosen = torch.rand(rows, generator=generator) < share
    # A partner drawn among the other N - 1 rows: skip over row i itself.
    partners = torch.randint(0, rows - 1, (rows,), generator=generator)
    partners += (partners >= torch.arange(rows)).long()
    fits = ((src_lengths + src_lengths[partners] - 1 <= max_length)
            & (tgt_lengths + tgt_lengths[partners] - 1 <= max_length))
    return torch.where(chosen & fits, partners, torch.full_like(partners, -1))


class SentenceConcatenation:
    """The corpus each epoch trains on with a share of its rows joined to a partner (data.concatenation_share)."""

    def __init__(self, share: float, max_length: int, seed: int) -> None:
        self.share, self.max_length, self.seed = share, max_length, seed
        self.kept: dict[int, TokenizedCorpus] = {}

    def epoch_corpus(self, corpus: TokenizedCorpus, epoch: int) -> TokenizedCorpus:
        """`corpus` (that epoch's segmentation) with epoch `epoch`'s rows joined; the same N rows, line numbers and stats."""
        if epoch not in self.kept:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "sentence concatenation", epoch))
            partners = drawn_partners(corpus.src_lengths, corpus.tgt_lengths, self.share, self.max_length, generator)
            src = joined_side(corpus.src_tokens, corpus.src_offsets, partners)
            tgt = joined_side(corpus.tgt_tokens, corpus.tgt_offsets, partners)
            if len(self.kept) >= EPOCHS_KEPT:
                del self.kept[next(iter(self.kept))]  # the one joined first
            self.kept[epoch] = TokenizedCorpus(*src, *tgt, corpus.line_numbers, corpus.stats)
        return self.kept[epoch]
