"""Subword regularization (Kudo 2018): each epoch trains on a sampled segmentation of every sentence.

For each training row the unigram model's `nbest` best segmentations are listed (sentencepiece's
NBestEncode) and one is drawn with probability proportional to P(segmentation) ** alpha, by a
generator seeded from (seed, epoch). So the segmentation a row gets in an epoch is a function of the
run's seed, the epoch and the row: a resumed run trains on exactly what an uninterrupted one would.
The draw is made here rather than by sentencepiece's own sampler because that one cannot be seeded
from Python (with sentencepiece 0.2.3, the same set_random_generator_seed gives other draws in every
process). Validation and inference always use the best segmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfm_cli.config import derive_seed
from tfm_cli.corpus.tokenized import TokenizedCorpus, flatten
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import UNK_ID
from tfm_cli.tokenization.tokenizer import Tokenizer

CHUNK_ROWS = 100_000  # sentences turned into Python lists at a time
EPOCHS_KEPT = 2  # sampled corpora kept in memory (the batcher counts epoch 0's updates once, at any epoch)


@dataclass(frozen=True)
class SamplingSettings:
    """How segmentations are drawn: among the `nbest` best, with probability proportional to P ** alpha.

    alpha 0 draws uniformly among the n best; a large alpha nearly always gives the best. Candidates
    longer than `max_length` tokens with EOS (the training filter's limit) are never drawn."""

    nbest: int
    alpha: float
    max_length: int


def check_unigram(tokenizer: Tokenizer, origin: str) -> None:
    """Raise TfmError unless `tokenizer` can list n-best segmentations (a unigram sentencepiece model
    whose ids are the model's own, not an imported vocabulary's)."""
    if tokenizer.vocabulary is not None:
        raise TfmError(f"data.subword_nbest > 1 needs tfm's own sentencepiece ids, but the {origin} maps its pieces "
                       "to an imported vocabulary; set data.subword_nbest = 1")
    try:
        tokenizer.processor.nbest_encode("a", nbest_size=2)
    except RuntimeError:
        raise TfmError(
            f"data.subword_nbest > 1 samples segmentations from a unigram sentencepiece model, but the {origin} "
            "is not one (BPE, word or char); set tokenizer.model_type = \"unigram\" or data.subword_nbest = 1"
        ) from None


def sample_segmentations(
    tokenizer: Tokenizer, tokens: torch.Tensor, offsets: torch.Tensor, settings: SamplingSettings,
    generator: torch.Generator, eos_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A drawn segmentation of every sentence of one side: (flat (total,) int32 with EOS after each, offsets (N + 1,) int64).

    `tokens`/`offsets` hold the sentences' best segmentations with EOS (a TokenizedCorpus side). Each is
    decoded to its text and segmented again n-best; a sentence with an unknown piece keeps its best
    segmentation (its text would not decode back to the same input). Works through CHUNK_ROWS
    sentences at a time, so a large corpus is never a Python list whole.
    """
    processor = tokenizer.processor
    piece_scores = [processor.get_score(i) for i in range(processor.get_piece_size())]
    rows = offsets.numel() - 1
    flats, lengths = [], []
    for first in range(0, rows, CHUNK_ROWS):
        last = min(first + CHUNK_ROWS, rows)
        bounds = (offsets[first : last + 1] - offsets[first]).tolist()
        flat = tokens[int(offsets[first]) : int(offsets[last])].tolist()
        best = [flat[bounds[i] : bounds[i + 1] - 1] for i in range(last - first)]  # EOS dropped
        texts = processor.decode(best)
        # Gumbel-max: the argmax over candidates of alpha * log P + Gumbel noise draws one with P ** alpha.
        uniform = torch.rand((last - first, settings.nbest), generator=generator, dtype=torch.float64)
        gumbel = (-torch.log(-torch.log(uniform.clamp(min=1e-300)))).tolist()  # (rows, nbest)
        chosen = []
        for ids, text, noise in zip(best, texts, gumbel):
            if UNK_ID in ids or not ids:
                chosen.append(ids)
                continue
            candidates = [c for c in processor.nbest_encode(text, nbest_size=settings.nbest)
                          if len(c) < settings.max_length] or [ids]
            keys = [settings.alpha * sum(piece_scores[i] for i in c) + noise[k] for k, c in enumerate(candidates)]
            chosen.append(candidates[max(range(len(keys)), key=keys.__getitem__)])
        chunk_tokens, chunk_offsets = flatten(chosen, eos_id)
        flats.append(chunk_tokens)
        lengths.append(chunk_offsets[1:] - chunk_offsets[:-1])
    all_lengths = torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.int64)
    sampled_offsets = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(all_lengths, 0, out=sampled_offsets[1:])
    return (torch.cat(flats) if flats else torch.zeros(0, dtype=torch.int32)), sampled_offsets


class SegmentationSampler:
    """The training corpus of each epoch with drawn segmentations; line numbers and stats are the corpus's."""

    def __init__(
        self, corpus: TokenizedCorpus, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
        settings: SamplingSettings, seed: int, eos_id: int,
    ) -> None:
        check_unigram(src_tokenizer, "source tokenizer")
        check_unigram(tgt_tokenizer, "target tokenizer")
        self.corpus, self.settings, self.seed, self.eos_id = corpus, settings, seed, eos_id
        self.tokenizers = (src_tokenizer, tgt_tokenizer)
        self.kept: dict[int, TokenizedCorpus] = {}

    def epoch_corpus(self, epoch: int) -> TokenizedCorpus:
        """The corpus epoch `epoch` trains on: every row drawn anew (the same rows, order and count)."""
        if epoch not in self.kept:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "subword sampling", epoch))
            base = self.corpus
            src = sample_segmentations(self.tokenizers[0], base.src_tokens, base.src_offsets, self.settings,
                                       generator, self.eos_id)
            tgt = sample_segmentations(self.tokenizers[1], base.tgt_tokens, base.tgt_offsets, self.settings,
                                       generator, self.eos_id)
            if len(self.kept) >= EPOCHS_KEPT:
                del self.kept[next(iter(self.kept))]  # the one drawn first
            self.kept[epoch] = TokenizedCorpus(*src, *tgt, base.line_numbers, base.stats)
        return self.kept[epoch]
