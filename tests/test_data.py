"""Data: reading with file:line errors, filtering counts, the tokenized cache, token-budget batches, padding."""

from __future__ import annotations

import pytest
import torch

from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID
from tfm_cli.data import (
    FilterStats,
    TokenizedCorpus,
    batch_indices,
    collate,
    epoch_generator,
    flatten,
    load_or_tokenize,
    read_parallel,
    read_text_file,
    tokenize_parallel,
)
from tfm_cli.errors import TfmError
from tfm_cli.tokenizer import Tokenizer


def test_read_text_file_handles_crlf_and_missing_final_newline(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"eins\r\nzwei\n\ndrei")
    assert read_text_file(path, "test").lines == ["eins", "zwei", "", "drei"]


def test_invalid_utf8_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.de"
    path.write_bytes(b"gut\nauch gut\nschlecht \xff\n")
    with pytest.raises(TfmError, match=r"bad\.de:3: invalid UTF-8"):
        read_text_file(path, "test")


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    (tmp_path / "a.de").write_text("1\n2\n3\n")
    (tmp_path / "a.en").write_text("1\n2\n")
    with pytest.raises(TfmError, match=r"a\.de has 3 lines but .*a\.en has 2"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en", "training")


def test_filtering_counts_empty_and_too_long_pairs(tmp_path, small_spm):
    tokenizer = Tokenizer.from_file(small_spm)
    long_line = "the man " * 40
    (tmp_path / "s").write_text(f"the dog sees my cat\n\nthe two cats\n{long_line}\nmy tree\n", encoding="utf-8")
    (tmp_path / "t").write_text("la hundo mia kato vidas\nnenio\n   \nla viro\nmia arbo\n", encoding="utf-8")
    text = read_parallel(tmp_path / "s", tmp_path / "t", "test")
    corpus = tokenize_parallel(text, tokenizer, tokenizer, max_length=20)
    assert corpus.stats == FilterStats(read=5, kept=2, empty=2, too_long=1)
    assert corpus.line_numbers.tolist() == [0, 4]
    first = corpus.src_tokens[corpus.src_offsets[0] : corpus.src_offsets[1]].tolist()
    assert first == tokenizer.encode_ids("the dog sees my cat") + [EOS_ID]


def test_tokenized_cache_is_reused_and_keyed_by_content(tmp_path, small_spm):
    tokenizer = Tokenizer.from_file(small_spm)
    (tmp_path / "s").write_text("the dog\nmy cat\n", encoding="utf-8")
    (tmp_path / "t").write_text("la hundo\nmia kato\n", encoding="utf-8")
    cache = tmp_path / "cache"
    text = read_parallel(tmp_path / "s", tmp_path / "t", "test")
    first, cached_first = load_or_tokenize(text, tokenizer, tokenizer, 64, cache, "train")
    second, cached_second = load_or_tokenize(text, tokenizer, tokenizer, 64, cache, "train")
    assert (cached_first, cached_second) == (False, True)
    assert torch.equal(first.src_tokens, second.src_tokens) and torch.equal(first.tgt_offsets, second.tgt_offsets)
    (tmp_path / "t").write_text("la hundo\nmia kato malgranda\n", encoding="utf-8")
    changed = read_parallel(tmp_path / "s", tmp_path / "t", "test")
    third, cached_third = load_or_tokenize(changed, tokenizer, tokenizer, 64, cache, "train")
    assert not cached_third
    assert third.tgt_tokens.numel() > first.tgt_tokens.numel()


@pytest.mark.parametrize("damage", ["token out of range", "offsets past the end", "stats a list", "not safetensors"])
def test_a_damaged_cache_entry_is_rebuilt_not_used(tmp_path, small_spm, damage):
    from safetensors import safe_open
    from safetensors.torch import save_file

    tokenizer = Tokenizer.from_file(small_spm)
    (tmp_path / "s").write_text("the dog\nmy cat\n", encoding="utf-8")
    (tmp_path / "t").write_text("la hundo\nmia kato\n", encoding="utf-8")
    text = read_parallel(tmp_path / "s", tmp_path / "t", "test")
    good, _ = load_or_tokenize(text, tokenizer, tokenizer, 64, tmp_path / "cache", "train")
    (entry,) = (tmp_path / "cache").iterdir()
    with safe_open(str(entry), framework="pt") as f:
        tensors, metadata = {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata())
    if damage == "token out of range":
        tensors["tgt_tokens"][0] = tokenizer.vocab_size
    elif damage == "offsets past the end":
        tensors["src_offsets"][-1] += 5
    elif damage == "stats a list":
        metadata["stats"] = "[1, 2]"
    save_file(tensors, str(entry), metadata=metadata)
    if damage == "not safetensors":
        entry.write_bytes(b"garbage")
    again, cached = load_or_tokenize(text, tokenizer, tokenizer, 64, tmp_path / "cache", "train")
    assert not cached
    assert torch.equal(again.tgt_tokens, good.tgt_tokens) and torch.equal(again.src_offsets, good.src_offsets)


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
    corpus = TokenizedCorpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets, torch.arange(2), FilterStats(2, 2, 0, 0))
    batch = collate(corpus, torch.tensor([1, 0]))
    P, B, E = PAD_ID, BOS_ID, EOS_ID
    assert batch.src.tolist() == [[20, E, P, P], [10, 11, 12, E]]
    assert batch.tgt_in.tolist() == [[B, 40, 41, 42], [B, 30, P, P]]
    assert batch.tgt_out.tolist() == [[40, 41, 42, E], [30, E, P, P]]
    assert batch.targets.tolist() == [40, 41, 42, E, 30, E]
    assert batch.tgt_out.view(-1)[batch.target_index].tolist() == batch.targets.tolist()
    assert (batch.n_src_tokens, batch.n_tgt_tokens, batch.n_padded_tokens) == (6, 6, 16)
