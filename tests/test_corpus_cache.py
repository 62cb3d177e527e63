"""Preparing corpora (corpus_cache, parallel_text): streamed in chunks, filtered and counted, cached as
memory-mapped files, found again by fingerprint, rebuilt when damaged or changed, never half-written."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tfm_cli.corpus_cache import ARRAYS, MANIFEST, FilterSettings, prepare_corpus
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import EOS_ID
from tfm_cli.tokenizer import Tokenizer

SOURCE = ["the dog sees my cat", "", "the two cats", "the man " * 40, "my tree", "the cat", "a b"]
TARGET = ["la hundo mia kato vidas", "nenio", "   ", "la viro", "mia arbo", "the cat", "la la la la la la la la"]


@pytest.fixture
def tokenizer(small_spm):
    return Tokenizer.from_file(small_spm)


def write_pair(folder, name, src_lines, tgt_lines):
    src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
    src.write_text("".join(line + "\n" for line in src_lines), encoding="utf-8")
    tgt.write_text("".join(line + "\n" for line in tgt_lines), encoding="utf-8")
    return src, tgt


def prepare(tmp_path, tokenizer, inputs, filters=FilterSettings(max_length=20), **options):
    return prepare_corpus(inputs, tokenizer, tokenizer, filters, tmp_path / "cache", "train", EOS_ID, **options)


def rows_of(corpus, side):
    tokens, offsets = getattr(corpus, f"{side}_tokens"), getattr(corpus, f"{side}_offsets")
    return [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(corpus))]


@pytest.mark.parametrize("chunk_lines", [1, 2, 3, 1000])
def test_pairs_are_encoded_and_filtered_the_same_in_any_chunk_size(tmp_path, tokenizer, chunk_lines):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    filters = FilterSettings(max_length=20, max_length_ratio=3.0, skip_identical=True)
    corpus = prepare(tmp_path, tokenizer, inputs, filters, chunk_lines=chunk_lines).corpus
    (stats,) = corpus.stats
    assert (stats.read, stats.kept, stats.empty, stats.too_long, stats.identical, stats.ratio) == (7, 2, 2, 1, 1, 1)
    assert corpus.line_numbers.tolist() == [0, 4]
    # An independent reference: the tokenizer's own encoding of each kept line, EOS appended.
    assert rows_of(corpus, "src") == [tokenizer.encode_ids(SOURCE[i]) + [EOS_ID] for i in (0, 4)]
    assert rows_of(corpus, "tgt") == [tokenizer.encode_ids(TARGET[i]) + [EOS_ID] for i in (0, 4)]


def test_crlf_endings_and_a_missing_final_newline_are_read_as_lines(tmp_path, tokenizer):
    (tmp_path / "s").write_bytes(b"the dog\r\nmy cat\r\nthe tree")
    (tmp_path / "t").write_bytes(b"la hundo\nmia kato\r\nla arbo")
    corpus = prepare(tmp_path, tokenizer, [(tmp_path / "s", tmp_path / "t")], chunk_lines=2).corpus
    assert rows_of(corpus, "src")[2] == tokenizer.encode_ids("the tree") + [EOS_ID]
    assert rows_of(corpus, "tgt")[1] == tokenizer.encode_ids("mia kato") + [EOS_ID]


def test_line_count_mismatch_names_both_files_and_counts(tmp_path, tokenizer):
    (tmp_path / "a.de").write_text("1\n2\n3\n")
    (tmp_path / "a.en").write_text("1\n2\n")
    with pytest.raises(TfmError, match=r"a\.de has 3 lines but .*a\.en has 2"):
        prepare(tmp_path, tokenizer, [(tmp_path / "a.de", tmp_path / "a.en")], chunk_lines=2)
    (tmp_path / "a.en").write_text("1\n2\n3\n4\n5\n")
    with pytest.raises(TfmError, match=r"a\.de has 3 lines but .*a\.en has 5"):
        prepare(tmp_path, tokenizer, [(tmp_path / "a.de", tmp_path / "a.en")], chunk_lines=3)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing half-written


def test_invalid_utf8_fails_with_file_and_line_or_is_skipped_and_counted(tmp_path, tokenizer):
    (tmp_path / "s").write_bytes(b"the dog\nmy \xff cat\nthe tree\nthe man\n")
    (tmp_path / "t").write_bytes(b"la hundo\nmia kato\nla \xfe arbo\nla viro\n")
    inputs = [(tmp_path / "s", tmp_path / "t")]
    with pytest.raises(TfmError, match=r"s:2: invalid UTF-8 .*data.invalid_utf8"):
        prepare(tmp_path, tokenizer, inputs, chunk_lines=3)
    corpus = prepare(tmp_path, tokenizer, inputs, FilterSettings(max_length=20, skip_invalid_utf8=True)).corpus
    (stats,) = corpus.stats
    assert (stats.read, stats.kept, stats.invalid_utf8) == (4, 2, 2)
    assert stats.invalid_examples == (f"{tmp_path / 's'}:2", f"{tmp_path / 't'}:3")
    assert corpus.line_numbers.tolist() == [0, 3]


def test_several_corpora_follow_each_other_with_their_own_counts(tmp_path, tokenizer):
    first = write_pair(tmp_path, "general", ["the dog", "my cat", ""], ["la hundo", "mia kato", "x"])
    second = write_pair(tmp_path, "domain", ["the tree"], ["la arbo"])
    corpus = prepare(tmp_path, tokenizer, [first, second], chunk_lines=2).corpus
    assert [(s.read, s.kept) for s in corpus.stats] == [(3, 2), (1, 1)]
    assert corpus.part_rows() == [(0, 2), (2, 1)]
    assert corpus.line_numbers.tolist() == [0, 1, 0]  # line numbers within each corpus's own files
    assert rows_of(corpus, "tgt")[2] == tokenizer.encode_ids("la arbo") + [EOS_ID]


def test_a_prepared_corpus_is_found_again_and_memory_mapped(tmp_path, tokenizer):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    first = prepare(tmp_path, tokenizer, inputs)
    second = prepare(tmp_path, tokenizer, inputs)
    assert (first.from_cache, second.from_cache) == (False, True)
    for name in ARRAYS:
        assert torch.equal(getattr(first.corpus, name), getattr(second.corpus, name))
    # The tensors are views of the entry's files, not copies: the storage is as large as the file.
    tokens = second.corpus.src_tokens
    assert tokens.untyped_storage().nbytes() == (second.path / "src.tokens").stat().st_size
    manifest = json.loads((second.path / MANIFEST).read_text())
    assert len(manifest["inputs"][0]["src"]["sha256"]) == 64  # the full hash is recorded


def test_a_changed_file_is_noticed_without_reading_it_whole_and_prepared_again(tmp_path, tokenizer):
    src, tgt = write_pair(tmp_path, "a", SOURCE, TARGET)
    first = prepare(tmp_path, tokenizer, [(src, tgt)])
    tgt.write_text("".join(line + "\n" for line in TARGET[:-1] + ["la arbo"]), encoding="utf-8")
    again = prepare(tmp_path, tokenizer, [(src, tgt)])
    assert not again.from_cache and again.path == first.path  # the same entry, replaced
    assert again.changed == ("a.tgt: size, modification time, content",)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.path.name]
    # The same bytes with a new modification time count as changed too (cheap checks cannot tell).
    stamp = time.time() + 100
    os.utime(tgt, (stamp, stamp))
    assert prepare(tmp_path, tokenizer, [(src, tgt)]).changed == ("a.tgt: modification time",)


def test_other_filters_make_another_entry(tmp_path, tokenizer):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    prepare(tmp_path, tokenizer, inputs)
    other = prepare(tmp_path, tokenizer, inputs, FilterSettings(max_length=200))
    assert not other.from_cache and other.corpus.stats[0].too_long == 0
    assert len(list((tmp_path / "cache").iterdir())) == 2


@pytest.mark.parametrize("damage", ["token out of range", "offsets past the end", "file cut short", "manifest not JSON",
                                    "stats a list", "file missing"])
def test_a_damaged_entry_is_rebuilt_not_used(tmp_path, tokenizer, damage):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    good = prepare(tmp_path, tokenizer, inputs)
    entry = good.path
    expected = {name: getattr(good.corpus, name).clone() for name in ARRAYS}  # the entry's files are mapped
    if damage == "token out of range":
        data = bytearray((entry / "tgt.tokens").read_bytes())
        data[0:4] = tokenizer.vocab_size.to_bytes(4, "little")
        (entry / "tgt.tokens").write_bytes(bytes(data))
    elif damage == "offsets past the end":
        offsets = torch.frombuffer(bytearray((entry / "src.offsets").read_bytes()), dtype=torch.int64).clone()
        offsets[-1] += 5
        (entry / "src.offsets").write_bytes(offsets_bytes(offsets))
    elif damage == "file cut short":
        (entry / "src.tokens").write_bytes((entry / "src.tokens").read_bytes()[:-4])
    elif damage == "manifest not JSON":
        (entry / MANIFEST).write_text("{")
    elif damage == "stats a list":
        manifest = json.loads((entry / MANIFEST).read_text())
        manifest["stats"] = [1, 2]
        (entry / MANIFEST).write_text(json.dumps(manifest))
    else:
        (entry / "lines").unlink()
    again = prepare(tmp_path, tokenizer, inputs)
    assert not again.from_cache
    for name in ARRAYS:
        assert torch.equal(getattr(again.corpus, name), expected[name])


def offsets_bytes(offsets: torch.Tensor) -> bytes:
    return b"".join(int(value).to_bytes(8, "little", signed=True) for value in offsets.tolist())


def test_an_interrupted_preparation_leaves_no_entry_and_no_temp_folder(tmp_path, tokenizer):
    inputs = [write_pair(tmp_path, "a", SOURCE * 5, TARGET * 5)]
    asked = []

    def stop_on_second_chunk() -> bool:
        asked.append(1)
        return len(asked) == 2

    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path, tokenizer, inputs, chunk_lines=4, should_stop=stop_on_second_chunk)
    assert list((tmp_path / "cache").iterdir()) == []
    assert not prepare(tmp_path, tokenizer, inputs).from_cache


def test_a_rank_that_must_find_the_entry_does_not_prepare_it(tmp_path, tokenizer):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    with pytest.raises(TfmError, match="missing or out of date; rank 0 should have written it"):
        prepare(tmp_path, tokenizer, inputs, must_exist=True)
    prepare(tmp_path, tokenizer, inputs)
    assert prepare(tmp_path, tokenizer, inputs, must_exist=True).from_cache


def test_progress_is_reported_in_bytes_of_both_files(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr("tfm_cli.corpus_cache.PROGRESS_SECONDS", 0.0)
    src, tgt = write_pair(tmp_path, "a", SOURCE * 3, TARGET * 3)
    reports = []
    prepare(tmp_path, tokenizer, [(src, tgt)], chunk_lines=5, on_progress=reports.append)
    assert [r.pairs for r in reports] == [5, 10, 15, 20, 21]
    assert reports[-1].bytes_done == reports[-1].bytes_total == src.stat().st_size + tgt.stat().st_size
