"""Sentence concatenation: joined rows are row i then its partner (one EOS), the draw respects the share and
the length limit and is a function of (seed, epoch), and `tfm train` with it resumes exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    REPO_ROOT, assert_one_line_error, assert_resume_is_exact_and_setting_used, run_cli, small_training_settings,
)
from tfm_cli.corpus import sentence_concatenation
from tfm_cli.corpus.sentence_concatenation import SentenceConcatenation, drawn_partners, joined_side
from tfm_cli.corpus.tokenized import FilterStats, TokenizedCorpus, flatten
from tfm_cli.special_ids import EOS_ID

TINY = REPO_ROOT / "recipes" / "tiny.toml"
E = EOS_ID


def rows_of(tokens: torch.Tensor, offsets: torch.Tensor) -> list[list[int]]:
    bounds = offsets.tolist()
    return [tokens[bounds[i] : bounds[i + 1]].tolist() for i in range(len(bounds) - 1)]


def test_a_joined_row_is_the_row_without_its_eos_then_its_partner_written_out():
    tokens, offsets = flatten([[10, 11], [20], [30, 31, 32]], E)
    joined = rows_of(*joined_side(tokens, offsets, torch.tensor([2, -1, 0])))
    assert joined == [[10, 11, 30, 31, 32, E], [20, E], [30, 31, 32, 10, 11, E]]
    assert rows_of(*joined_side(tokens, offsets, torch.tensor([-1, -1, -1]))) == rows_of(tokens, offsets)
    assert rows_of(*joined_side(tokens, offsets, torch.tensor([1, 0, 1]))) == [
        [10, 11, 20, E], [20, 10, 11, E], [30, 31, 32, 20, E]]


def random_corpus(rows: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (rows,), generator=generator).tolist()
    return [torch.randint(5, 100, (n,), generator=generator).tolist() for n in lengths]


def test_joining_in_chunks_gives_what_joining_at_once_gives(monkeypatch):
    tokens, offsets = flatten(random_corpus(500, seed=1), E)
    lengths = offsets[1:] - offsets[:-1]
    partners = drawn_partners(lengths, lengths, 0.4, 100, torch.Generator().manual_seed(2))
    whole = joined_side(tokens, offsets, partners)
    monkeypatch.setattr(sentence_concatenation, "CHUNK_ROWS", 7)
    chunked = joined_side(tokens, offsets, partners)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
    # And every joined row is what a Python loop makes of it.
    rows = rows_of(tokens, offsets)
    expected = [row[:-1] + rows[p] if p >= 0 else row for row, p in zip(rows, partners.tolist())]
    assert rows_of(*whole) == expected


def test_the_draw_takes_the_share_never_the_row_itself_and_keeps_the_length_limit():
    rows = 20_000
    generator = torch.Generator().manual_seed(3)
    src_lengths = torch.randint(2, 30, (rows,), generator=generator)
    tgt_lengths = torch.randint(2, 30, (rows,), generator=generator)
    partners = drawn_partners(src_lengths, tgt_lengths, 0.25, 40, torch.Generator().manual_seed(4))
    joined = partners >= 0
    assert not (partners == torch.arange(rows)).any()
    assert ((src_lengths + src_lengths[partners] - 1)[joined] <= 40).all()
    assert ((tgt_lengths + tgt_lengths[partners] - 1)[joined] <= 40).all()
    # Of the chosen quarter, those whose join fits: about half of the pairs of lengths fit under 40 here.
    fits = (src_lengths[:, None] + src_lengths[None, :1000] - 1 <= 40) & (tgt_lengths[:, None] + tgt_lengths[None, :1000] - 1 <= 40)
    expected = 0.25 * fits.float().mean().item()
    assert abs(joined.float().mean().item() - expected) < 0.02, (joined.float().mean().item(), expected)
    assert (drawn_partners(src_lengths, tgt_lengths, 0.0, 40, torch.Generator().manual_seed(4)) == -1).all()
    everything = drawn_partners(src_lengths, tgt_lengths, 1.0, 1000, torch.Generator().manual_seed(4))
    assert (everything >= 0).all()
    assert (drawn_partners(torch.tensor([3]), torch.tensor([3]), 1.0, 100, generator) == -1).all()


def corpus_of(rows: list[list[int]]) -> TokenizedCorpus:
    tokens, offsets = flatten(rows, E)
    count = len(rows)
    return TokenizedCorpus(tokens, offsets, tokens.clone(), offsets.clone(), torch.arange(count) + 100,
                           (FilterStats(read=count, kept=count),))


def test_each_epoch_joins_its_own_rows_and_the_same_epoch_joins_the_same():
    corpus = corpus_of(random_corpus(400, seed=5))
    first = SentenceConcatenation(0.3, 64, seed=1)
    again = SentenceConcatenation(0.3, 64, seed=1)
    other_seed = SentenceConcatenation(0.3, 64, seed=2)
    epoch0 = first.epoch_corpus(corpus, 0)
    assert torch.equal(epoch0.src_tokens, again.epoch_corpus(corpus, 0).src_tokens)
    assert not torch.equal(epoch0.src_tokens, first.epoch_corpus(corpus, 1).src_tokens)
    assert not torch.equal(epoch0.src_tokens, other_seed.epoch_corpus(corpus, 0).src_tokens)
    assert len(epoch0) == len(corpus) and torch.equal(epoch0.line_numbers, corpus.line_numbers)
    longer = (epoch0.src_lengths > corpus.src_lengths).float().mean().item()
    assert 0.2 < longer < 0.4, longer
    # Both sides join the same partner: the copied target is the joined source.
    assert torch.equal(epoch0.src_tokens, epoch0.tgt_tokens)


def joined_settings(letters, **values) -> list[str]:
    return small_training_settings(letters, **{"data.concatenation_share": 0.3, **values})


def test_training_with_joined_pairs_resumes_exactly_and_uses_them(tmp_path, letters):
    assert_resume_is_exact_and_setting_used(tmp_path, joined_settings(letters), {"data.concatenation_share": 0})


def test_the_training_log_says_what_share_is_joined(tmp_path, letters):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", "--threads", "1",
                      *joined_settings(letters, **{"train.max_steps": 1})])
    assert result.exit_code == 0, result.stderr
    assert "sentence concatenation: every epoch trains 30% of the pairs joined to another random pair" in result.stderr


@pytest.mark.parametrize(("setting", "message"), [
    ("data.concatenation_share=1.5", r"data.concatenation_share must be in \[0, 1\] .0 is off., got 1.5"),
    ("data.train_alignment=links.txt", "joins pairs; use one of the two"),
])
def test_bad_concatenation_settings_are_one_line(tmp_path, letters, setting, message):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *joined_settings(letters), "--set", setting])
    assert_one_line_error(result, message)
