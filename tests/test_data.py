"""Data: token-budget batches, epochs of weighted corpora, padding (preparing corpora: test_corpus_cache.py)."""

from __future__ import annotations

import torch

from tfm_cli.config import SEED_LIMIT, derive_seed
from tfm_cli.corpus.batching import EpochSampler, batch_indices, collate, epoch_generator, epoch_rows, sorted_batches
from tfm_cli.corpus.tokenized import FilterStats, TokenizedCorpus, flatten
from tfm_cli.distributed import World
from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID


def random_lengths(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, 40, (count,), generator=generator), torch.randint(2, 40, (count,), generator=generator)


def test_batches_cover_every_sentence_once_within_the_token_budget():
    src_lengths, tgt_lengths = random_lengths(500, 0)
    batches = batch_indices(src_lengths, tgt_lengths, 300, epoch_generator(7, 0))
    assert sorted(torch.cat(batches).tolist()) == list(range(500))
    for batch in batches:
        longest = max(int(src_lengths[batch].max()), int(tgt_lengths[batch].max()))
        assert batch.numel() * longest <= 300
    # Length bucketing keeps padding small: far below the ~50% of random batches.
    padded = sum(b.numel() * (int(src_lengths[b].max()) + int(tgt_lengths[b].max())) for b in batches)
    assert 1 - int(src_lengths.sum() + tgt_lengths.sum()) / padded < 0.3


def test_batch_order_depends_on_seed_and_epoch_only():
    src_lengths, tgt_lengths = random_lengths(300, 1)
    order = lambda seed, epoch: [b.tolist() for b in batch_indices(src_lengths, tgt_lengths, 200, epoch_generator(seed, epoch))]  # noqa: E731
    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)


def test_collate_pads_and_shifts_targets():
    src_tokens, src_offsets = flatten([[10, 11, 12], [20]])
    tgt_tokens, tgt_offsets = flatten([[30], [40, 41, 42]])
    corpus = TokenizedCorpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets, torch.arange(2), (FilterStats(2, 2),))
    batch = collate(corpus, torch.tensor([1, 0]))
    P, B, E = PAD_ID, BOS_ID, EOS_ID
    assert batch.src.tolist() == [[20, E, P, P], [10, 11, 12, E]]
    assert batch.tgt_in.tolist() == [[B, 40, 41, 42], [B, 30, P, P]]
    assert batch.tgt_out.tolist() == [[40, 41, 42, E], [30, E, P, P]]
    assert batch.targets.tolist() == [40, 41, 42, E, 30, E]
    assert batch.tgt_out.view(-1)[batch.target_index].tolist() == batch.targets.tolist()
    assert (batch.n_src_tokens, batch.n_tgt_tokens, batch.n_padded_tokens) == (6, 6, 16)


def greedy_reference(src_lengths, tgt_lengths, max_tokens, seed, epoch):
    """The batching rule written out plainly, list by list: shuffle, sort by target then source length
    (stable), cut a batch where one more sentence would break the budget, shuffle the batches."""
    generator = epoch_generator(seed, epoch)
    order = torch.randperm(len(src_lengths), generator=generator).tolist()
    order.sort(key=lambda i: int(tgt_lengths[i]))
    order.sort(key=lambda i: int(src_lengths[i]))
    batches, current = [], []
    for i in order:
        longest = max([int(src_lengths[j]) for j in current + [i]] + [int(tgt_lengths[j]) for j in current + [i]])
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    return [batches[k] for k in torch.randperm(len(batches), generator=generator).tolist()]


def test_batches_equal_the_plainly_written_rule():
    src_lengths, tgt_lengths = random_lengths(700, 3)
    batches = batch_indices(src_lengths, tgt_lengths, 250, epoch_generator(5, 2))
    assert [b.tolist() for b in batches] == greedy_reference(src_lengths, tgt_lengths, 250, 5, 2)


def test_batching_in_chunks_changes_nothing(monkeypatch):
    src_lengths, tgt_lengths = random_lengths(600, 4)
    whole = sorted_batches(src_lengths, tgt_lengths, 200, epoch_generator(1, 0))
    monkeypatch.setattr("tfm_cli.corpus.batching.BATCHING_CHUNK", 7)
    chunked = sorted_batches(src_lengths, tgt_lengths, 200, epoch_generator(1, 0))
    assert torch.equal(whole.order, chunked.order) and torch.equal(whole.starts, chunked.starts)


def test_epoch_rows_take_each_corpus_by_its_weight():
    parts = [(0, 100, 1.0), (100, 10, 3.0), (110, 40, 0.5)]
    rows = epoch_rows(parts, seed=1, epoch=0)
    counts = torch.bincount(rows, minlength=150)
    assert counts[:100].tolist() == [1] * 100
    assert counts[100:110].tolist() == [3] * 10
    assert sorted(counts[110:].tolist()) == [0] * 20 + [1] * 20  # a seeded half of the last corpus
    assert torch.equal(rows, epoch_rows(parts, seed=1, epoch=0))
    assert not torch.equal(rows, epoch_rows(parts, seed=1, epoch=1))  # another half next epoch
    assert epoch_rows([(0, 100, 1.0), (100, 10, 1.0)], seed=1, epoch=0) is None  # all weights 1: every row once


def test_weighted_epochs_batch_the_sampled_rows_and_split_them_between_ranks():
    src_lengths, tgt_lengths = random_lengths(120, 5)
    parts = [(0, 100, 1.0), (100, 20, 2.0)]
    samplers = [EpochSampler(src_lengths, tgt_lengths, 150, 3, 1, World(rank, 2, rank), parts) for rank in (0, 1)]
    seen = []
    epoch, position = 0, 0
    while epoch == 0:
        (rank0,), next_epoch, next_position = samplers[0].update(epoch, position)
        (rank1,), *_ = samplers[1].update(epoch, position)
        seen += rank0.tolist() + rank1.tolist()
        epoch, position = next_epoch, next_position
    counts = torch.bincount(torch.tensor(seen), minlength=120)
    # Batches cut to a multiple of the 2 ranks may drop one batch; every other row comes by its weight.
    assert counts.sum() >= 140 - 150 // 2
    assert set(counts[:100].tolist()) <= {0, 1} and set(counts[100:].tolist()) <= {0, 1, 2}
    assert int(counts[100:].sum()) >= 40 - 150 // 2


def test_the_largest_seeds_order_and_sample_epochs():
    # Epoch seeds were seed * 1_000_003 + epoch: from seed ~1.8e13 torch refused them ("Overflow when
    # unpacking long long"), a traceback once the corpus was prepared.
    src_lengths, tgt_lengths = random_lengths(120, 6)
    parts = [(0, 100, 1.0), (100, 20, 0.5)]  # a fractional weight: corpus sampling draws from the seed too
    for seed in (2**62, SEED_LIMIT - 1):
        sampler = EpochSampler(src_lengths, tgt_lengths, 150, seed, 1, World(), parts)
        orders = [sampler.epoch_batches(epoch).order.tolist() for epoch in (0, 1)]
        assert orders[0] != orders[1]  # another order, and another half of the last corpus, every epoch
        again = EpochSampler(src_lengths, tgt_lengths, 150, seed, 1, World(), parts)
        assert again.epoch_batches(1).order.tolist() == orders[1]  # what a resume rebuilds


def test_derived_seeds_are_seeds_and_differ_between_streams():
    for seed in (0, 1, 2**62, SEED_LIMIT - 1):
        derived = {(purpose, index): derive_seed(seed, purpose, index)
                   for purpose in ("epoch order", "corpus sampling", "dropout") for index in range(50)}
        assert all(0 <= value < SEED_LIMIT for value in derived.values())
        assert len(set(derived.values())) == len(derived)  # every epoch, rank and purpose its own stream
        assert derive_seed(seed, "dropout", 3) == derived["dropout", 3]  # a function of its arguments alone
    # A sum gave seed 0's epoch 1_000_003 the order of seed 1's epoch 0.
    assert derive_seed(0, "epoch order", 1_000_003) != derive_seed(1, "epoch order", 0)
