"""Prepared corpora on disk: parallel text tokenized and filtered in one streaming pass (memory bounded
by a chunk, whatever the corpus size), kept as flat binary files that every process memory-maps (one
copy in the page cache however many ranks read it), and found again by cheap file fingerprints.

This module is the pipeline: finding an entry, waiting for another preparer, reading, tokenizing and
filtering the text into a new entry, and checking the text's full hash. The layout of the cache folder
and who may remove what in it: cache_folder.py; one entry's files: entry.py; the filters:
filters.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from tfm_cli.corpus.cache_folder import (
    CACHE_VERSION,
    MANIFEST,
    READERS_LOCK,
    TOOL,
    EntryNames,
    digest_of,
    read_manifest,
    remove_dead_temp_folders,
    retire_folder,
    temp_folder,
)
from tfm_cli.corpus.entry import EntryWriter, open_entry, recorded_sha256s
from tfm_cli.corpus.file_locks import exclusive_lock
from tfm_cli.corpus.filters import FilterSettings, filter_ids, filter_text
from tfm_cli.corpus.parallel_text import CHUNK_LINES, FileFingerprint, ReadReport, fingerprint, read_pairs
from tfm_cli.corpus.tokenized import FilterStats, TokenizedCorpus
from tfm_cli.errors import TfmError
from tfm_cli.textio.atomic_files import atomic_write_bytes
from tfm_cli.textio.paths import file_sha256, make_folder

SYNC_CHECK_BYTES = 64 << 20  # text up to this size is hashed before its entry is used; larger, while training runs
PROGRESS_SECONDS = 0.5


class PairTokenizer(Protocol):
    """What preparation needs of a tokenizer (tokenizer.Tokenizer and vocabulary.MappedTokenizer)."""

    model_bytes: bytes
    vocab_size: int

    @property
    def vocabulary(self) -> tuple[str, ...] | None: ...

    def encode_ids_batch(self, texts: list[str]) -> list[list[int]]: ...


@dataclass(frozen=True)
class PrepareProgress:
    """How far preparing (or, with stage "checking", hashing) a corpus has got: bytes of text read of all,
    pairs read, seconds so far."""

    name: str
    bytes_done: int
    bytes_total: int
    pairs: int
    seconds: float
    stage: str = "preparing"


class ContentCheck:
    """The full SHA-256 of an entry's text files compared with the ones its manifest records, in a
    background thread (a large corpus is used while it is checked).

    On a mismatch it removes the ref that led to the entry, so that the next run prepares the files anew.
    """

    def __init__(self, expected: list[tuple[str, str]], ref: Path) -> None:
        self.expected = expected  # [(text file path, hex SHA-256 recorded), ...]
        self.ref = ref
        self.failure: str | None = None
        self.thread = threading.Thread(target=self.run, name="tfm-content-check", daemon=True)
        self.thread.start()

    def run(self) -> None:
        self.failure = content_mismatch(self.expected)
        if self.failure is not None:
            self.ref.unlink(missing_ok=True)

    def result(self, wait: bool) -> str | None:
        """The mismatch found, in words; None if the files match or (without `wait`) the check is still running."""
        if wait:
            self.thread.join()
        return None if self.thread.is_alive() else self.failure


@dataclass(frozen=True)
class PreparedCorpus:
    """A corpus from the cache, and how it got there."""

    corpus: TokenizedCorpus
    from_cache: bool
    changed: tuple[str, ...]  # why an earlier entry for the same files was not used ("train.de: size, ...")
    path: Path
    content_check: ContentCheck | None = None  # running on a large entry found by fingerprint


def tokenizer_digest(tokenizer: PairTokenizer) -> str:
    """SHA-256 of a tokenizer's model bytes and (for an imported model) the piece table that numbers its ids."""
    digest = hashlib.sha256(tokenizer.model_bytes)
    if tokenizer.vocabulary is not None:
        digest.update(json.dumps(list(tokenizer.vocabulary)).encode())
    return digest.hexdigest()


def family_key(
    paths: list[tuple[str, str]], src_tokenizer: PairTokenizer, tgt_tokenizer: PairTokenizer, filters: FilterSettings,
    eos_id: int,
) -> str:
    """The hex digest of what makes entries comparable: text file paths, tokenizers, filters and EOS id
    (not the files' contents: the entries of one family differ in those)."""
    return digest_of({
        "version": CACHE_VERSION,
        "inputs": [list(pair) for pair in paths],
        "tokenizers": [tokenizer_digest(src_tokenizer), tokenizer_digest(tgt_tokenizer)],
        "filters": asdict(filters),
        "eos_id": eos_id,
    })


def prepare_corpus(
    inputs: list[tuple[str | Path, str | Path]], src_tokenizer: PairTokenizer, tgt_tokenizer: PairTokenizer,
    filters: FilterSettings, cache_dir: Path, name: str, eos_id: int,
    on_progress: Callable[[PrepareProgress], None] | None = None, should_stop: Callable[[], bool] | None = None,
    must_exist: bool = False, check_tokens: bool = True, chunk_lines: int = CHUNK_LINES,
    on_wait: Callable[[str], None] | None = None,
) -> PreparedCorpus:
    """The corpus of the parallel files `inputs` [(src, tgt), ...], from `cache_dir` or prepared into it.

    The entry a ref names for the files' fingerprints is used as it is; else, under the family's lock,
    the files are hashed and an entry of the same content used, or the text is read once in chunks,
    tokenized, filtered and published as a new entry. `on_wait(message)` is called when another process
    holds the lock (this one waits for it). `should_stop` is asked between chunks and while waiting
    (True: the temp folder is removed and KeyboardInterrupt raised). With `must_exist` (a rank that is
    not the one preparing), a missing entry is a TfmError. `check_tokens` scans a cached entry's ids
    against the vocabulary sizes. The pairs of several inputs follow each other (TokenizedCorpus.part_rows).
    Text is read `chunk_lines` pairs at a time.
    """
    what = "training" if name == "train" else "validation"
    prints = [(fingerprint(src, f"{what} source"), fingerprint(tgt, f"{what} target")) for src, tgt in inputs]
    paths = [(src.path, tgt.path) for src, tgt in prints]
    names = EntryNames(cache_dir, f"{name}-{family_key(paths, src_tokenizer, tgt_tokenizer, filters, eos_id)[:12]}")
    vocab_sizes = (src_tokenizer.vocab_size, tgt_tokenizer.vocab_size)
    ref = names.ref(prints)
    if must_exist:
        found = use_referenced_entry(ref, vocab_sizes, check_tokens, verify=False)
        if found is None:
            raise TfmError(f"{cache_dir}: the prepared {name} data is missing or out of date; rank 0 should have written it")
        return found
    make_folder(cache_dir, "cache folder")
    found = use_referenced_entry(ref, vocab_sizes, check_tokens, verify=True)
    if found is not None:
        return found
    waiting = None if on_wait is None else (
        lambda holder: on_wait(f"waiting for another process that is preparing the {name} data in {cache_dir} ({holder})")
    )
    with exclusive_lock(names.lock, waiting, should_stop):
        found = use_referenced_entry(ref, vocab_sizes, check_tokens, verify=True)  # prepared while this one waited
        if found is not None:
            return found
        remove_dead_temp_folders(cache_dir, held_lock=names.lock.name)
        earlier = names.entries()
        if earlier:
            sha256s = hash_inputs(prints, name, on_progress)
            path = names.entry(sha256s)
            corpus = open_entry(path, vocab_sizes, check_tokens) if path.is_dir() else None
            if corpus is not None:
                atomic_write_bytes(ref, path.name.encode())
                return PreparedCorpus(corpus, True, (), path)
        corpus, path, manifest = write_entry(inputs, prints, src_tokenizer, tgt_tokenizer, filters, eos_id, names,
                                             name, on_progress, should_stop, chunk_lines)
        atomic_write_bytes(ref, path.name.encode())
    changed = changed_files(read_manifest(earlier[0]), manifest) if earlier else ()
    return PreparedCorpus(corpus, False, changed, path)


def use_referenced_entry(
    ref: Path, vocab_sizes: tuple[int, int], check_tokens: bool, verify: bool
) -> PreparedCorpus | None:
    """The entry `ref` names, or None if there is no ref or the entry is gone, damaged or (checked here for
    small corpora) made from other content. With `verify`, a large entry comes with a running ContentCheck."""
    try:
        entry_name = ref.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = ref.parent / entry_name
    if "/" in entry_name or not entry_name or not path.is_dir():
        return None
    manifest = read_manifest(path)
    if manifest is None:
        return None
    check = None
    if verify:
        expected = recorded_sha256s(manifest)
        if expected is None:
            return None
        if sum(os.path.getsize(file) for file, _ in expected if os.path.isfile(file)) <= SYNC_CHECK_BYTES:
            if content_mismatch(expected) is not None:
                ref.unlink(missing_ok=True)
                return None
        else:
            check = ContentCheck(expected, ref)
    corpus = open_entry(path, vocab_sizes, check_tokens, manifest)
    if corpus is None:
        return None
    return PreparedCorpus(corpus, True, (), path, check)


def content_mismatch(expected: list[tuple[str, str]]) -> str | None:
    """None if every file's full SHA-256 is the one expected; else what differs, in one line."""
    for path, sha256 in expected:
        try:
            actual = file_sha256(path)
        except OSError as error:
            return f"{path}: cannot be read to check it against its prepared data ({error.strerror})"
        if actual != sha256:
            return (
                f"{path}: its content changed since its prepared data was made, although its size and "
                "modification and change times did not (its SHA-256 differs); the prepared data no longer "
                "matches it. Run again: the next run prepares it anew"
            )
    return None


def hash_inputs(
    prints: list[tuple[FileFingerprint, FileFingerprint]], name: str,
    on_progress: Callable[[PrepareProgress], None] | None,
) -> list[str]:
    """The full SHA-256 of every text file (src, tgt of each input in turn), with progress (stage "checking")."""
    total = sum(src.size + tgt.size for src, tgt in prints)
    started, last_report, done = time.monotonic(), 0.0, 0

    def count(n: int) -> None:
        nonlocal done, last_report
        done += n
        now = time.monotonic()
        if on_progress is not None and now - last_report >= PROGRESS_SECONDS:
            last_report = now
            on_progress(PrepareProgress(name, done, total, 0, now - started, stage="checking"))

    sha256s = []
    for pair in prints:
        for side in pair:
            try:
                sha256s.append(file_sha256(side.path, count))
            except OSError as error:
                raise TfmError(f"{side.path}: cannot be read: {error.strerror}") from None
    return sha256s


def changed_files(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[str, ...]:
    """What differs between the files of an earlier entry's manifest `old` and of `new`:
    ("FILE: size, modification time, content", ...); empty if `old` records nothing comparable."""
    found = []
    try:
        for old_pair, new_pair in zip(old["inputs"], new["inputs"], strict=True):
            for side in ("src", "tgt"):
                before, after = old_pair[side], new_pair[side]
                differences = [word for key, word in (("size", "size"), ("mtime_ns", "modification time"),
                                                      ("sha256", "content")) if before[key] != after[key]]
                if differences:
                    found.append(f"{Path(after['path']).name}: {', '.join(differences)}")
    except (KeyError, TypeError, ValueError):
        return ()
    return tuple(found)


def write_entry(
    inputs: list[tuple[str | Path, str | Path]], prints: list[tuple[FileFingerprint, FileFingerprint]],
    src_tokenizer: PairTokenizer, tgt_tokenizer: PairTokenizer, filters: FilterSettings, eos_id: int,
    names: EntryNames, name: str, on_progress: Callable[[PrepareProgress], None] | None,
    should_stop: Callable[[], bool] | None, chunk_lines: int,
) -> tuple[TokenizedCorpus, Path, dict[str, Any]]:
    """Tokenize and filter `inputs` into a new entry of the family `names`, named by the content read;
    returns it memory-mapped, its path and its manifest. The caller holds the family's lock.

    Sentencepiece encodes a chunk in a worker thread (it releases the GIL) while this thread reads the
    next chunk and writes the one before: two chunks are in memory at most.
    """
    what = "training" if name == "train" else "validation"
    total_bytes = sum(src.size + tgt.size for src, tgt in prints)
    started, last_report = time.monotonic(), 0.0
    done_bytes = done_pairs = 0
    stats, records = [], []
    active = filters.active()

    def encode(src_texts: list[str], tgt_texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        return src_tokenizer.encode_ids_batch(src_texts), tgt_tokenizer.encode_ids_batch(tgt_texts)

    with temp_folder(names) as temp, ThreadPoolExecutor(max_workers=1) as encoder:
        writer = EntryWriter(temp, eos_id)
        for (src_path, tgt_path), (src_print, tgt_print) in zip(inputs, prints):
            report = ReadReport()
            skipped = {item.reason: 0 for item in active}
            pairs_before = writer.pairs
            pending: tuple[int, list[int], Future] | None = None
            for chunk in read_pairs(src_path, tgt_path, what, filters.skip_invalid_utf8, report, chunk_lines):
                if should_stop is not None and should_stop():
                    if pending is not None:
                        pending[2].result()  # let the worker finish before the folder goes
                    raise KeyboardInterrupt
                candidates = filter_text(chunk.src, chunk.tgt, chunk.invalid, active, skipped)
                future = encoder.submit(encode, [chunk.src[i] for i in candidates], [chunk.tgt[i] for i in candidates])
                if pending is not None:
                    writer.append(*filter_ids(*pending[:2], *pending[2].result(), active, skipped))
                pending = (chunk.first_line, candidates, future)
                now = time.monotonic()
                if on_progress is not None and now - last_report >= PROGRESS_SECONDS:
                    last_report = now
                    on_progress(PrepareProgress(name, done_bytes + chunk.bytes_read, total_bytes,
                                                done_pairs + report.lines, now - started))
            if pending is not None:
                writer.append(*filter_ids(*pending[:2], *pending[2].result(), active, skipped))
            done_bytes += src_print.size + tgt_print.size
            done_pairs += report.lines
            stats.append(FilterStats(
                read=report.lines, kept=writer.pairs - pairs_before, skipped=skipped, invalid_utf8=report.invalid_utf8,
                invalid_examples=report.invalid_examples,
            ))
            records.append({"src": {**src_print.to_dict(), "sha256": report.src_sha256},
                            "tgt": {**tgt_print.to_dict(), "sha256": report.tgt_sha256}})
        writer.close()
        check_unchanged_while_read(prints, what)
        (temp / READERS_LOCK).touch()
        path = names.entry([record[side]["sha256"] for record in records for side in ("src", "tgt")])
        manifest = {
            "tool": TOOL, "version": CACHE_VERSION, "inputs": records, "stats": [item.to_dict() for item in stats],
            "pairs": writer.pairs, "src_tokens": writer.totals["src"], "tgt_tokens": writer.totals["tgt"],
            "filters": asdict(filters), "eos_id": eos_id, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        (temp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        if path.exists():
            retire_folder(path, names)  # a damaged entry (a good one would have been used)
        temp.rename(path)
    corpus = open_entry(path, (src_tokenizer.vocab_size, tgt_tokenizer.vocab_size), False, manifest)
    if corpus is None:
        raise TfmError(f"{path}: the prepared data could not be read back; is the cache folder's disk full?")
    return corpus, path, manifest


def check_unchanged_while_read(prints: list[tuple[FileFingerprint, FileFingerprint]], what: str) -> None:
    """Raise TfmError if a text file's fingerprint changed while it was read (a copy or download still running)."""
    for pair in prints:
        for before in pair:
            if fingerprint(before.path, what) != before:
                raise TfmError(f"{before.path}: changed while it was being prepared; run again once it is complete")


