"""Preparing corpora (corpus_cache, parallel_text): streamed in chunks, filtered and counted, cached as
memory-mapped files, found again by fingerprint, rebuilt when damaged or changed, never half-written."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tfm_cli.corpus.cache import prepare_corpus
from tfm_cli.corpus.cache_folder import MANIFEST
from tfm_cli.corpus.entry import ARRAYS
from tfm_cli.corpus.filters import FilterSettings
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import EOS_ID
from tfm_cli.tokenization.tokenizer import Tokenizer

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


def folders(cache):
    """The entries and temp folders in a cache folder (lock and ref files are small and stay)."""
    return sorted(path.name for path in cache.iterdir() if path.is_dir())


def rows_of(corpus, side):
    tokens, offsets = getattr(corpus, f"{side}_tokens"), getattr(corpus, f"{side}_offsets")
    return [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(corpus))]


@pytest.mark.parametrize("chunk_lines", [1, 2, 3, 1000])
def test_pairs_are_encoded_and_filtered_the_same_in_any_chunk_size(tmp_path, tokenizer, chunk_lines):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    filters = FilterSettings(max_length=20, max_length_ratio=3.0, skip_identical=True)
    corpus = prepare(tmp_path, tokenizer, inputs, filters, chunk_lines=chunk_lines).corpus
    (stats,) = corpus.stats
    assert (stats.read, stats.kept) == (7, 2)
    assert stats.skipped == {"empty": 2, "identical": 1, "too_long": 1, "ratio": 1}
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
    assert folders(tmp_path / "cache") == []  # nothing half-written


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


def test_a_changed_file_gets_a_new_entry_and_the_old_one_stays_for_its_readers(tmp_path, tokenizer):
    src, tgt = write_pair(tmp_path, "a", SOURCE, TARGET)
    first = prepare(tmp_path, tokenizer, [(src, tgt)])
    old_rows = rows_of(first.corpus, "tgt")  # still mapped, as a running training run maps it
    tgt.write_text("".join(line + "\n" for line in TARGET[:-1] + ["la arbo"]), encoding="utf-8")
    again = prepare(tmp_path, tokenizer, [(src, tgt)])
    assert not again.from_cache and again.path != first.path
    assert again.changed == ("a.tgt: size, modification time, content",)
    assert folders(tmp_path / "cache") == sorted([first.path.name, again.path.name])
    assert rows_of(first.corpus, "tgt") == old_rows  # entries are never replaced under their readers
    row = again.corpus.line_numbers.tolist().index(len(TARGET) - 1)
    assert rows_of(again.corpus, "tgt")[row] == tokenizer.encode_ids("la arbo") + [EOS_ID]


def test_the_same_bytes_with_new_times_are_recognised_by_their_hash_not_prepared_again(tmp_path, tokenizer):
    src, tgt = write_pair(tmp_path, "a", SOURCE, TARGET)
    first = prepare(tmp_path, tokenizer, [(src, tgt)])
    stamp = time.time() + 100
    os.utime(tgt, (stamp, stamp))
    again = prepare(tmp_path, tokenizer, [(src, tgt)])
    assert again.from_cache and again.path == first.path and again.changed == ()


def big_pair(folder, lines=6000):
    """A pair large enough (> 256 KiB) that a fingerprint samples blocks instead of hashing it whole."""
    src_lines = [f"{SOURCE[i % 7]} {i}" for i in range(lines)]
    tgt_lines = [f"{TARGET[i % 7]} {i}" for i in range(lines)]
    src, tgt = write_pair(folder, "big", src_lines, tgt_lines)
    assert src.stat().st_size > 64 * 4096
    return src, tgt


def edit_between_sampled_blocks(path, keep_times=True):
    """Change the number ending one line in place, same length, outside every block the fingerprint samples,
    keeping the modification time (as cp -p, rsync -a or tar do); returns the line's 0-based number."""
    from tfm_cli.corpus.parallel_text import SAMPLE_BLOCK_BYTES, SAMPLE_BLOCKS

    stat = path.stat()
    data = bytearray(path.read_bytes())
    last_start = len(data) - SAMPLE_BLOCK_BYTES
    sampled = [(start, start + SAMPLE_BLOCK_BYTES) for start in
               (last_start * block // (SAMPLE_BLOCKS - 1) for block in range(SAMPLE_BLOCKS))]
    for line in range(0, 6000, 7):  # the short lines "the dog sees my cat N"
        at = data.index(f" {line}\n".encode()) + 1
        if all(at + 4 <= start or at >= end for start, end in sampled) and len(str(line)) == 4:
            break
    data[at : at + 4] = b"7777"
    with open(path, "r+b") as f:
        f.write(bytes(data))
    if keep_times:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    return line


def test_a_same_length_edit_with_the_modification_time_kept_is_noticed(tmp_path, tokenizer):
    src, tgt = big_pair(tmp_path)
    first = prepare(tmp_path, tokenizer, [(src, tgt)], FilterSettings(max_length=100))
    line = edit_between_sampled_blocks(src)
    again = prepare(tmp_path, tokenizer, [(src, tgt)], FilterSettings(max_length=100))
    assert not again.from_cache and again.path != first.path
    assert again.changed == ("big.src: content",)
    row = again.corpus.line_numbers.tolist().index(line)
    assert rows_of(again.corpus, "src")[row] == tokenizer.encode_ids(f"{SOURCE[0]} 7777") + [EOS_ID]


def forge_ref_for_current_files(cache, inputs, entry=None):
    """Make the ref of the files' current fingerprints name `entry` (default: the one entry): the state a
    cache is in when a file changed without its change time (a file system whose times cannot be trusted)."""
    from tfm_cli.corpus.cache_folder import EntryNames
    from tfm_cli.corpus.parallel_text import fingerprint

    if entry is None:
        (entry,) = [path for path in cache.iterdir() if path.is_dir()]
    family = entry.name.rsplit("-", 1)[0]
    prints = [(fingerprint(src, "source"), fingerprint(tgt, "target")) for src, tgt in inputs]
    ref = EntryNames(cache, family).ref(prints)
    ref.write_text(entry.name)
    return ref


@pytest.mark.parametrize("check_in", ["foreground", "background"])
def test_a_change_the_fingerprint_misses_is_found_by_the_full_hash(tmp_path, tokenizer, monkeypatch, check_in):
    inputs = [big_pair(tmp_path)]
    filters = FilterSettings(max_length=100)
    first = prepare(tmp_path, tokenizer, inputs, filters)
    edit_between_sampled_blocks(inputs[0][0])
    ref = forge_ref_for_current_files(tmp_path / "cache", inputs)
    if check_in == "foreground":
        # A small corpus is hashed before its entry is used: the stale entry is never handed out.
        again = prepare(tmp_path, tokenizer, inputs, filters)
        assert not again.from_cache and again.path != first.path
    else:
        monkeypatch.setattr("tfm_cli.corpus.cache.SYNC_CHECK_BYTES", 0)
        stale = prepare(tmp_path, tokenizer, inputs, filters)
        assert stale.from_cache and stale.path == first.path
        failure = stale.content_check.result(wait=True)
        assert "big.src: its content changed since its prepared data was made" in failure
        assert not ref.exists()  # the next run does not trust the fingerprint again
        again = prepare(tmp_path, tokenizer, inputs, filters)
        assert not again.from_cache and again.path != first.path
        assert again.content_check is None
        third = prepare(tmp_path, tokenizer, inputs, filters)
        assert third.from_cache and third.content_check.result(wait=True) is None


def test_other_filters_make_another_entry(tmp_path, tokenizer):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    prepare(tmp_path, tokenizer, inputs)
    other = prepare(tmp_path, tokenizer, inputs, FilterSettings(max_length=200))
    assert not other.from_cache and other.corpus.stats[0].skipped["too_long"] == 0
    assert len(folders(tmp_path / "cache")) == 2


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
    assert folders(tmp_path / "cache") == []
    assert not prepare(tmp_path, tokenizer, inputs).from_cache


def test_a_rank_that_must_find_the_entry_does_not_prepare_it(tmp_path, tokenizer):
    inputs = [write_pair(tmp_path, "a", SOURCE, TARGET)]
    with pytest.raises(TfmError, match="missing or out of date; rank 0 should have written it"):
        prepare(tmp_path, tokenizer, inputs, must_exist=True)
    prepare(tmp_path, tokenizer, inputs)
    assert prepare(tmp_path, tokenizer, inputs, must_exist=True).from_cache


def test_progress_is_reported_in_bytes_of_both_files(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr("tfm_cli.corpus.cache.PROGRESS_SECONDS", 0.0)
    src, tgt = write_pair(tmp_path, "a", SOURCE * 3, TARGET * 3)
    reports = []
    prepare(tmp_path, tokenizer, [(src, tgt)], chunk_lines=5, on_progress=reports.append)
    assert [r.pairs for r in reports] == [5, 10, 15, 20, 21]
    assert reports[-1].bytes_done == reports[-1].bytes_total == src.stat().st_size + tgt.stat().st_size


# -- a cache folder shared by processes, containers and hosts ---------------------------------------

WORKER = """
import json, os, sys, time
from pathlib import Path
from tfm_cli.corpus.cache import prepare_corpus
from tfm_cli.corpus.filters import FilterSettings
from tfm_cli.special_ids import EOS_ID
from tfm_cli.tokenization.tokenizer import Tokenizer

cache, spm, src, tgt, flags, pid = sys.argv[1:7]
if pid != "own":
    os.getpid = lambda: int(pid)  # two containers both run tfm as PID 1
tokenizer = Tokenizer.from_file(Path(spm))
flags = Path(flags)
waits = []

def slowly():  # asked between chunks: says preparation has begun, then goes on once the test says so
    (flags / "started").touch()
    while not (flags / "go").exists():
        time.sleep(0.01)
    return False

def waiting(message):
    waits.append(message)
    (flags / "waiting").touch()

import inspect
options = {"on_wait": waiting} if "on_wait" in inspect.signature(prepare_corpus).parameters else {}  # older tfm: none
prepared = prepare_corpus([(src, tgt)], tokenizer, tokenizer, FilterSettings(max_length=100), Path(cache), "train",
                          EOS_ID, should_stop=slowly, chunk_lines=50, **options)
print(json.dumps({"from_cache": prepared.from_cache, "path": str(prepared.path), "pairs": len(prepared.corpus),
                  "waits": waits}))
"""


def start_worker(tmp_path, small_spm, inputs, tag, pid):
    import subprocess
    import sys

    flags = tmp_path / f"flags-{tag}"
    flags.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path / "cache"), str(small_spm), *map(str, inputs[0]), str(flags), pid],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    return process, flags


def wait_for(condition, process, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_two_processes_preparing_the_same_entry_at_once_prepare_it_once(tmp_path, small_spm):
    # Both are PID 1, as tfm is in two containers sharing the cache volume: nothing may depend on PIDs.
    pid = "1"
    inputs = [write_pair(tmp_path, "a", SOURCE * 30, TARGET * 30)]
    first, first_flags = start_worker(tmp_path, small_spm, inputs, "first", pid)
    wait_for((first_flags / "started").exists, first)  # the first one is preparing, held at its first chunk
    second, second_flags = start_worker(tmp_path, small_spm, inputs, "second", pid)
    (second_flags / "go").touch()
    # The second one waits for the first (where it does not, it prepares beside it and finishes first).
    deadline = time.monotonic() + 60
    while not (second_flags / "waiting").exists() and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    (first_flags / "go").touch()
    results = []
    for process in (first, second):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results.append(json.loads(out))
    assert [result["from_cache"] for result in results] == [False, True]
    assert results[0]["path"] == results[1]["path"] and results[0]["pairs"] == results[1]["pairs"] > 0
    (message,) = results[1]["waits"]
    assert message.startswith(f"waiting for another process that is preparing the train data in {tmp_path / 'cache'} (host ")
    assert len(folders(tmp_path / "cache")) == 1  # one entry, no temp folder left


def hold_lock(path):
    """A process holding an exclusive lock on `path` until its stdin closes (a preparation that is alive,
    on this host or any other)."""
    import subprocess
    import sys

    code = ("import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.lockf(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")
    process = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline() == "locked\n"
    return process


def test_only_temp_folders_that_tfm_made_and_whose_preparer_is_dead_are_removed(tmp_path):
    from tfm_cli.corpus.cache_folder import TEMP_MARKER, remove_dead_temp_folders

    cache = tmp_path / "cache"
    foreign = {".tmp-notes": "a user's notes", ".tmp-train-0123456789ab-99999999": "named like an old tfm temp"}
    for name, text in foreign.items():
        (cache / name).mkdir(parents=True)
        (cache / name / "keep.txt").write_text(text)

    def tfm_temp(name, lock):
        (cache / name).mkdir()
        marker = {"tool": "tfm", "lock": lock, "host": "elsewhere", "pid": 99999999, "since": "2026-12-01 00:00:00"}
        (cache / name / TEMP_MARKER).write_text(json.dumps(marker))

    tfm_temp(".tmp-train-aaaaaaaaaaaa-x1", "train-aaaaaaaaaaaa.lock")  # its preparer is gone
    tfm_temp(".tmp-train-bbbbbbbbbbbb-x2", "train-bbbbbbbbbbbb.lock")  # alive on another host: holds its lock
    holder = hold_lock(cache / "train-bbbbbbbbbbbb.lock")
    try:
        removed = remove_dead_temp_folders(cache)
    finally:
        holder.communicate("")
    assert [path.name for path in removed] == [".tmp-train-aaaaaaaaaaaa-x1"]
    assert folders(cache) == sorted([*foreign, ".tmp-train-bbbbbbbbbbbb-x2"])
    for name, text in foreign.items():
        assert (cache / name / "keep.txt").read_text() == text
    # Once its preparer has died (the lock released with the process), its folder goes too.
    assert [path.name for path in remove_dead_temp_folders(cache)] == [".tmp-train-bbbbbbbbbbbb-x2"]


def test_a_training_run_starting_on_a_shared_cache_keeps_folders_it_did_not_make(tmp_path, letters):
    from conftest import REPO_ROOT, letter_settings, run_cli

    cache = tmp_path / "shared"
    (cache / ".tmp-notes").mkdir(parents=True)
    (cache / ".tmp-notes" / "plan.txt").write_text("do not delete")
    # A preparation running on another host (or container): its PID means nothing here, its lock is held.
    live = cache / ".tmp-train-0123456789abcdef0123-99999999"
    live.mkdir()
    marker = {"tool": "tfm", "lock": "train-0123456789ab.lock", "host": "elsewhere", "pid": 99999999,
              "since": "2026-12-01 00:00:00"}
    (live / "tfm-temp.json").write_text(json.dumps(marker))
    (live / "src.tokens").write_bytes(b"half-written")
    holder = hold_lock(cache / "train-0123456789ab.lock")
    try:
        settings = letter_settings(letters, **{"train.max_steps": 1, "data.cache_dir": cache})
        result = run_cli(["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", tmp_path / "run", "--threads", "1",
                          *settings])
    finally:
        holder.communicate("")
    assert result.exit_code == 0, result.stderr
    assert (cache / ".tmp-notes" / "plan.txt").read_text() == "do not delete"
    assert (live / "src.tokens").read_bytes() == b"half-written"
