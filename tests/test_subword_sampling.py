"""Subword regularization: drawn segmentations spell the same text, follow P ** alpha over the n best,
are a function of (seed, epoch, row), and `tfm train` with them resumes exactly."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    REPO_ROOT, assert_one_line_error, assert_resume_is_exact_and_setting_used, run_cli, small_training_settings,
    trained_tiny,
)
from tfm_cli.config import TokenizerTrainConfig
from tfm_cli.corpus.subword_sampling import SamplingSettings, check_unigram, sample_segmentations
from tfm_cli.corpus.tokenized import flatten
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import EOS_ID
from tfm_cli.tokenization.tokenizer import Tokenizer, train_sentencepiece

TINY = REPO_ROOT / "recipes" / "tiny.toml"
WORDS = ["the", "then", "there", "other", "brother", "mother", "moth", "her", "here", "where", "wherever",
         "ever", "never", "nevertheless", "less", "bless", "blessed", "shed", "she", "he", "hers"]


def word_text(count: int, seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    lines = []
    for _ in range(count):
        picks = torch.randint(0, len(WORDS), (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        lines.append(" ".join(WORDS[int(i)] for i in picks))
    return lines


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Tokenizer:
    """A 36-piece unigram model of English-like words: most of them have several segmentations."""
    folder = tmp_path_factory.mktemp("words")
    text = folder / "text"
    text.write_text("".join(line + "\n" for line in word_text(2000, seed=5)))
    return Tokenizer.from_file(train_sentencepiece([text], folder / "spm", TokenizerTrainConfig(vocab_size=36)))


def encoded_side(tokenizer: Tokenizer, lines: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return flatten([tokenizer.encode_ids(line) for line in lines], EOS_ID)


def sentences(tokens: torch.Tensor, offsets: torch.Tensor) -> list[list[int]]:
    bounds = offsets.tolist()
    return [tokens[bounds[i] : bounds[i + 1]].tolist() for i in range(len(bounds) - 1)]


def draw(tokenizer, lines, settings, seed):
    tokens, offsets = encoded_side(tokenizer, lines)
    return sample_segmentations(tokenizer, tokens, offsets, settings, torch.Generator().manual_seed(seed), EOS_ID)


def test_drawn_segmentations_spell_the_same_text_within_the_length_limit(word_tokenizer):
    lines = word_text(300, seed=9)
    best = [word_tokenizer.encode_ids(line) for line in lines]
    drawn = sentences(*draw(word_tokenizer, lines, SamplingSettings(nbest=16, alpha=0.1, max_length=40), seed=1))
    assert len(drawn) == len(lines)
    for line, ids in zip(lines, drawn):
        assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1]
        assert word_tokenizer.decode_ids(ids[:-1]) == line
        assert len(ids) <= 40
    changed = sum(ids[:-1] != b for ids, b in zip(drawn, best))
    assert changed > len(lines) // 2, f"only {changed} of {len(lines)} sentences drawn other than their best"


def test_the_same_seed_draws_the_same_and_another_seed_other_segmentations(word_tokenizer):
    lines = word_text(100, seed=3)
    settings = SamplingSettings(nbest=16, alpha=0.1, max_length=64)
    first, again, other = (sentences(*draw(word_tokenizer, lines, settings, seed)) for seed in (1, 1, 2))
    assert first == again
    assert sum(a != b for a, b in zip(first, other)) > 20


def test_chunks_of_sentences_draw_what_the_whole_corpus_draws(word_tokenizer, monkeypatch):
    from tfm_cli.corpus import subword_sampling

    lines = word_text(50, seed=6)
    settings = SamplingSettings(nbest=8, alpha=0.1, max_length=64)
    whole = draw(word_tokenizer, lines, settings, seed=3)
    monkeypatch.setattr(subword_sampling, "CHUNK_ROWS", 7)
    chunked = draw(word_tokenizer, lines, settings, seed=3)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_a_large_alpha_draws_the_best_segmentation(word_tokenizer):
    lines = word_text(100, seed=4)
    drawn = sentences(*draw(word_tokenizer, lines, SamplingSettings(nbest=16, alpha=100.0, max_length=64), seed=1))
    assert [ids[:-1] for ids in drawn] == [word_tokenizer.encode_ids(line) for line in lines]


def test_draws_follow_p_to_the_alpha_over_the_n_best(word_tokenizer):
    # The expected distribution computed here from sentencepiece's own n-best and piece scores.
    line = "nevertheless wherever"
    processor = word_tokenizer.processor
    candidates = processor.nbest_encode(line, nbest_size=4)
    assert len(candidates) == 4
    alpha = 0.1  # the score gaps here are ~10 nats: a larger alpha nearly always draws the best
    logits = [alpha * sum(processor.get_score(i) for i in c) for c in candidates]
    total = sum(math.exp(x) for x in logits)
    expected = [math.exp(x) / total for x in logits]
    draws = 8000
    settings = SamplingSettings(nbest=4, alpha=alpha, max_length=64)
    drawn = sentences(*draw(word_tokenizer, [line] * draws, settings, seed=11))
    counts = [sum(ids[:-1] == c for ids in drawn) for c in candidates]
    assert sum(counts) == draws
    for count, p in zip(counts, expected):
        # Four standard deviations of a binomial count.
        assert abs(count - draws * p) <= 4 * math.sqrt(draws * p * (1 - p)) + 1, (counts, expected)


def test_too_long_candidates_are_never_drawn(word_tokenizer):
    line = "nevertheless wherever brother"
    best = len(word_tokenizer.encode_ids(line))
    settings = SamplingSettings(nbest=32, alpha=0.0, max_length=best + 1)  # the best with EOS just fits
    drawn = sentences(*draw(word_tokenizer, [line] * 200, settings, seed=2))
    assert all(len(ids) <= best + 1 for ids in drawn)


def test_a_bpe_model_is_refused_in_one_line(tmp_path):
    text = tmp_path / "text"
    text.write_text("".join(line + "\n" for line in word_text(500, seed=5)))
    bpe = Tokenizer.from_file(train_sentencepiece([text], tmp_path / "bpe",
                                                  TokenizerTrainConfig(vocab_size=36, model_type="bpe")))
    with pytest.raises(TfmError, match="not one .BPE, word or char.; set tokenizer.model_type"):
        check_unigram(bpe, "source tokenizer")


def sampled_settings(letters, **values) -> list[str]:
    return small_training_settings(letters, **{"data.subword_nbest": 8, "data.subword_alpha": 0.2, **values})


def test_training_with_sampled_segmentations_resumes_exactly(tmp_path, letters):
    # And the same run on the best segmentations only ends elsewhere: the draws were used.
    assert_resume_is_exact_and_setting_used(tmp_path, sampled_settings(letters), {"data.subword_nbest": 1})


def test_sampling_from_a_later_epoch_trains_the_epochs_before_it_on_the_best_segmentations(tmp_path, letters):
    def trained(name: str, **values) -> dict[str, torch.Tensor]:
        return trained_tiny(tmp_path / name, sampled_settings(letters, **values))

    # The linear schedule's length depends on max_epochs, so runs are compared at equal max_epochs.
    late_one_epoch = trained("late1", **{"train.max_epochs": 1, "data.subword_sampling_from_epoch": 2})
    plain_one_epoch = trained("plain1", **{"train.max_epochs": 1, "data.subword_nbest": 1})
    for name in plain_one_epoch:
        assert torch.equal(late_one_epoch[name], plain_one_epoch[name]), name
    late = trained("late2", **{"train.max_epochs": 2, "data.subword_sampling_from_epoch": 2})
    plain = trained("plain2", **{"train.max_epochs": 2, "data.subword_nbest": 1})
    early = trained("early2", **{"train.max_epochs": 2})
    assert any(not torch.equal(late[name], plain[name]) for name in plain)  # epoch 2 drew segmentations
    assert any(not torch.equal(late[name], early[name]) for name in early)  # epoch 1 did not


@pytest.mark.parametrize(("setting", "message"), [
    ("data.subword_sampling_from_epoch=0", "data.subword_sampling_from_epoch counts epochs from 1, got 0"),
    ("data.subword_nbest=0", "data.subword_nbest must be 1 .off. to 1000, got 0"),
    ("data.subword_alpha=-1", r"data.subword_alpha must be in \[0, 100\], got -1"),
    ("data.train_alignment=links.txt", "use one of the two"),
])
def test_bad_sampling_settings_are_one_line(tmp_path, letters, setting, message):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *sampled_settings(letters), "--set", setting])
    assert_one_line_error(result, message)
