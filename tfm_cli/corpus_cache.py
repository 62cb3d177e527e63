"""Prepared corpora on disk: parallel text tokenized and filtered in one streaming pass (memory bounded
by a chunk, whatever the corpus size), kept as flat binary files that every process memory-maps (one
copy in the page cache however many ranks read it), and found again by cheap file fingerprints.

An entry is a folder CACHE/NAME-KEY/ holding src.tokens and tgt.tokens (int32), src.offsets,
tgt.offsets and lines (int64) and manifest.json. KEY covers the text files' paths, the tokenizers
and the filter settings; the manifest records each file's fingerprint (and full SHA-256), so a
changed file is noticed without reading it. Entries appear whole (a temp folder renamed) or not at all.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from tfm_cli.data import FilterStats, TokenizedCorpus
from tfm_cli.errors import TfmError
from tfm_cli.parallel_text import (
    CHUNK_LINES,
    FileFingerprint,
    ReadReport,
    fingerprint,
    read_pairs,
)
from tfm_cli.textio import make_folder

CACHE_VERSION = 2
MANIFEST = "manifest.json"
# name -> (file, dtype) of an entry's arrays
ARRAYS = {
    "src_tokens": ("src.tokens", torch.int32),
    "src_offsets": ("src.offsets", torch.int64),
    "tgt_tokens": ("tgt.tokens", torch.int32),
    "tgt_offsets": ("tgt.offsets", torch.int64),
    "line_numbers": ("lines", torch.int64),
}
TEMP_PREFIX = ".tmp-"  # an entry being written: CACHE/.tmp-NAME-KEY-PID
RANGE_CHECK_ELEMENTS = 1 << 24  # token ids checked this many at a time when an entry is read
PROGRESS_SECONDS = 0.5


class PairTokenizer(Protocol):
    """What preparation needs of a tokenizer (tokenizer.Tokenizer and vocabulary.MappedTokenizer)."""

    model_bytes: bytes
    vocab_size: int

    @property
    def vocabulary(self) -> tuple[str, ...] | None: ...

    def encode_ids_batch(self, texts: list[str]) -> list[list[int]]: ...


@dataclass(frozen=True)
class FilterSettings:
    """Which pairs a prepared corpus keeps."""

    max_length: int  # tokens per side, EOS included
    max_length_ratio: float = 0.0  # 0: no ratio filter
    skip_identical: bool = False
    skip_empty: bool = True
    skip_invalid_utf8: bool = False  # False: invalid UTF-8 is an error naming file and line


@dataclass(frozen=True)
class PrepareProgress:
    """How far preparing a corpus has got: bytes of text read of all, pairs read, seconds so far."""

    name: str
    bytes_done: int
    bytes_total: int
    pairs: int
    seconds: float


@dataclass(frozen=True)
class PreparedCorpus:
    """A corpus from the cache, and how it got there."""

    corpus: TokenizedCorpus
    from_cache: bool
    changed: tuple[str, ...]  # why an earlier entry for the same files was not used ("train.de: size, ...")
    path: Path


def tokenizer_digest(tokenizer: PairTokenizer) -> str:
    """SHA-256 of a tokenizer's model bytes and (for an imported model) the piece table that numbers its ids."""
    digest = hashlib.sha256(tokenizer.model_bytes)
    if tokenizer.vocabulary is not None:
        digest.update(json.dumps(list(tokenizer.vocabulary)).encode())
    return digest.hexdigest()


def entry_key(
    inputs: list[tuple[FileFingerprint, FileFingerprint]], src_tokenizer: PairTokenizer, tgt_tokenizer: PairTokenizer,
    filters: FilterSettings, eos_id: int,
) -> str:
    """The hex digest naming an entry: text file paths, tokenizers, filters and EOS id (not the files' contents,
    which the manifest's fingerprints check, so that a changed file replaces its entry)."""
    parts = {
        "version": CACHE_VERSION,
        "inputs": [[src.path, tgt.path] for src, tgt in inputs],
        "tokenizers": [tokenizer_digest(src_tokenizer), tokenizer_digest(tgt_tokenizer)],
        "filters": asdict(filters),
        "eos_id": eos_id,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def prepare_corpus(
    inputs: list[tuple[str | Path, str | Path]], src_tokenizer: PairTokenizer, tgt_tokenizer: PairTokenizer,
    filters: FilterSettings, cache_dir: Path, name: str, eos_id: int,
    on_progress: Callable[[PrepareProgress], None] | None = None, should_stop: Callable[[], bool] | None = None,
    must_exist: bool = False, check_tokens: bool = True, chunk_lines: int = CHUNK_LINES,
) -> PreparedCorpus:
    """The corpus of the parallel files `inputs` [(src, tgt), ...], from `cache_dir` or prepared into it.

    An entry is used when the fingerprints of all its files match; else the text is read once in
    chunks, tokenized, filtered and written. `should_stop` is asked between chunks (True: the temp
    folder is removed and KeyboardInterrupt raised). With `must_exist` (a rank that is not the one
    preparing), a missing entry is a TfmError. `check_tokens` scans a cached entry's ids against the
    vocabulary sizes. The pairs of several inputs follow each other (TokenizedCorpus.part_rows).
    Text is read `chunk_lines` pairs at a time.
    """
    what = "training" if name == "train" else "validation"
    prints = [(fingerprint(src, f"{what} source"), fingerprint(tgt, f"{what} target")) for src, tgt in inputs]
    key = entry_key(prints, src_tokenizer, tgt_tokenizer, filters, eos_id)
    path = cache_dir / f"{name}-{key[:20]}"
    make_folder(cache_dir, "cache folder")
    changed: tuple[str, ...] = ()
    manifest = read_manifest(path)
    if manifest is not None:
        changed = changed_files(manifest, prints)
        if not changed:
            corpus = read_entry(path, manifest, src_tokenizer.vocab_size, tgt_tokenizer.vocab_size, check_tokens)
            if corpus is not None:
                return PreparedCorpus(corpus, True, (), path)
    if must_exist:
        raise TfmError(f"{path}: the prepared {name} data is missing or out of date; rank 0 should have written it")
    corpus = write_entry(inputs, prints, src_tokenizer, tgt_tokenizer, filters, eos_id, path, name, key,
                         on_progress, should_stop, chunk_lines)
    return PreparedCorpus(corpus, False, changed, path)


def changed_files(manifest: dict[str, Any], prints: list[tuple[FileFingerprint, FileFingerprint]]) -> tuple[str, ...]:
    """What differs between the files an entry was made from and `prints`: ("FILE: size, content", ...)."""
    found = []
    recorded = manifest.get("inputs", [])
    for index, pair in enumerate(prints):
        for side, current in zip(("src", "tgt"), pair):
            try:
                old = FileFingerprint(**{k: v for k, v in recorded[index][side].items() if k != "sha256"})
            except (IndexError, KeyError, TypeError, AttributeError):
                return (f"{current.path}: not recorded",)
            differences = current.differences(old)
            if differences:
                found.append(f"{Path(current.path).name}: {', '.join(differences)}")
    return tuple(found)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """An entry's manifest.json, or None if there is no entry or it is unreadable or of another version."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("version") != CACHE_VERSION:
        return None
    return manifest


def map_array(path: Path, count: int, dtype: torch.dtype) -> torch.Tensor:
    """(count,) `dtype` memory-mapped read-only from `path` (copy-on-write: writes never reach the file).

    Raises ValueError if the file does not hold exactly `count` elements.
    """
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if path.stat().st_size != count * itemsize:
        raise ValueError(f"{path}: {path.stat().st_size} bytes, expected {count * itemsize}")
    if count == 0:
        return torch.zeros(0, dtype=dtype)
    return torch.from_file(str(path), shared=False, size=count, dtype=dtype)


def token_ids_in_range(path: Path, vocab_size: int) -> bool:
    """Whether every int32 id in `path` is in [0, vocab_size); reads the file in chunks without mapping it,
    so the check leaves no pages in this process's memory."""
    with open(path, "rb") as f:
        while data := f.read(RANGE_CHECK_ELEMENTS * 4):
            ids = torch.frombuffer(bytearray(data), dtype=torch.int32)
            low, high = torch.aminmax(ids)
            if int(low) < 0 or int(high) >= vocab_size:
                return False
    return True


def read_entry(
    path: Path, manifest: dict[str, Any], src_vocab_size: int, tgt_vocab_size: int, check_tokens: bool
) -> TokenizedCorpus | None:
    """The memory-mapped corpus of an entry, or None if its files are missing, of the wrong size or inconsistent."""
    try:
        pairs, src_total, tgt_total = (int(manifest[key]) for key in ("pairs", "src_tokens", "tgt_tokens"))
        stats = tuple(FilterStats.from_dict(item) for item in manifest["stats"])
        counts = {"src_tokens": src_total, "tgt_tokens": tgt_total, "src_offsets": pairs + 1,
                  "tgt_offsets": pairs + 1, "line_numbers": pairs}
        arrays = {name: map_array(path / file, counts[name], dtype) for name, (file, dtype) in ARRAYS.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if sum(item.kept for item in stats) != pairs:
        return None
    for side, vocab_size in (("src", src_vocab_size), ("tgt", tgt_vocab_size)):
        offsets, total = arrays[f"{side}_offsets"], arrays[f"{side}_tokens"].numel()
        if int(offsets[0]) != 0 or int(offsets[-1]) != total or bool((offsets[1:] < offsets[:-1]).any()):
            return None
        if check_tokens and not token_ids_in_range(path / ARRAYS[f"{side}_tokens"][0], vocab_size):
            return None
    return TokenizedCorpus(**arrays, stats=stats)


class ArrayWriter:
    """Appends typed values to a binary file, a chunk at a time."""

    def __init__(self, path: Path, typecode: str) -> None:
        self.file = open(path, "wb")
        self.buffer = array.array(typecode)
        self.count = 0

    def flush(self) -> None:
        """Write what is buffered."""
        self.buffer.tofile(self.file)
        self.count += len(self.buffer)
        del self.buffer[:]

    def close(self) -> None:
        """Flush, fsync and close the file."""
        self.flush()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


class EntryWriter:
    """The arrays of an entry being written: kept pairs are appended chunk by chunk."""

    def __init__(self, folder: Path, eos_id: int) -> None:
        self.arrays = {name: ArrayWriter(folder / file, "i" if dtype == torch.int32 else "q")
                       for name, (file, dtype) in ARRAYS.items()}
        self.eos_id = eos_id
        self.totals = {"src": 0, "tgt": 0}
        for side in self.totals:
            self.arrays[f"{side}_offsets"].buffer.append(0)

    def append(self, line_numbers: list[int], src_ids: list[list[int]], tgt_ids: list[list[int]]) -> None:
        """Append kept pairs: their 0-based line numbers and token ids (EOS is added here)."""
        for side, sequences in (("src", src_ids), ("tgt", tgt_ids)):
            for ids in sequences:
                ids.append(self.eos_id)
            self.arrays[f"{side}_tokens"].buffer.extend(itertools.chain.from_iterable(sequences))
            start = self.totals[side]
            self.arrays[f"{side}_offsets"].buffer.extend(start + end for end in itertools.accumulate(map(len, sequences)))
            self.totals[side] = self.arrays[f"{side}_offsets"].buffer[-1] if sequences else start
        self.arrays["line_numbers"].buffer.extend(line_numbers)
        for writer in self.arrays.values():
            writer.flush()

    def close(self) -> None:
        """Flush and close every file."""
        for writer in self.arrays.values():
            writer.close()

    @property
    def pairs(self) -> int:
        """Pairs written so far."""
        return self.arrays["line_numbers"].count + len(self.arrays["line_numbers"].buffer)


@contextlib.contextmanager
def temp_entry(path: Path) -> Iterator[Path]:
    """A temp folder beside the entry `path`, removed unless the caller renamed it into place."""
    temp = path.parent / f"{TEMP_PREFIX}{path.name}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        yield temp
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def write_entry(
    inputs: list[tuple[str | Path, str | Path]], prints: list[tuple[FileFingerprint, FileFingerprint]],
    src_tokenizer: PairTokenizer, tgt_tokenizer: PairTokenizer, filters: FilterSettings, eos_id: int,
    path: Path, name: str, key: str, on_progress: Callable[[PrepareProgress], None] | None,
    should_stop: Callable[[], bool] | None, chunk_lines: int,
) -> TokenizedCorpus:
    """Tokenize and filter `inputs` into a new entry at `path` (replacing an old one); returns it memory-mapped.

    Sentencepiece encodes a chunk in a worker thread (it releases the GIL) while this thread reads the
    next chunk and writes the one before: two chunks are in memory at most.
    """
    what = "training" if name == "train" else "validation"
    total_bytes = sum(src.size + tgt.size for src, tgt in prints)
    started, last_report = time.monotonic(), 0.0
    done_bytes = done_pairs = 0
    stats, records = [], []

    def encode(src_texts: list[str], tgt_texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        return src_tokenizer.encode_ids_batch(src_texts), tgt_tokenizer.encode_ids_batch(tgt_texts)

    with temp_entry(path) as temp, ThreadPoolExecutor(max_workers=1) as encoder:
        writer = EntryWriter(temp, eos_id)
        for (src_path, tgt_path), (src_print, tgt_print) in zip(inputs, prints):
            report = ReadReport()
            counts = dict.fromkeys(("kept", "empty", "too_long", "ratio", "identical"), 0)
            pending: tuple[int, list[int], Future] | None = None
            for chunk in read_pairs(src_path, tgt_path, what, filters.skip_invalid_utf8, report, chunk_lines):
                if should_stop is not None and should_stop():
                    if pending is not None:
                        pending[2].result()  # let the worker finish before the folder goes
                    raise KeyboardInterrupt
                candidates = unencoded_filter(chunk.src, chunk.tgt, chunk.invalid, filters, counts)
                future = encoder.submit(encode, [chunk.src[i] for i in candidates], [chunk.tgt[i] for i in candidates])
                if pending is not None:
                    writer.append(*length_filter(*pending[:2], *pending[2].result(), filters, counts))
                pending = (chunk.first_line, candidates, future)
                now = time.monotonic()
                if on_progress is not None and now - last_report >= PROGRESS_SECONDS:
                    last_report = now
                    on_progress(PrepareProgress(name, done_bytes + chunk.bytes_read, total_bytes,
                                                done_pairs + report.lines, now - started))
            if pending is not None:
                writer.append(*length_filter(*pending[:2], *pending[2].result(), filters, counts))
            done_bytes += src_print.size + tgt_print.size
            done_pairs += report.lines
            stats.append(FilterStats(
                read=report.lines, invalid_utf8=report.invalid_utf8, invalid_examples=report.invalid_examples, **counts,
            ))
            records.append({"src": {**src_print.to_dict(), "sha256": report.src_sha256},
                            "tgt": {**tgt_print.to_dict(), "sha256": report.tgt_sha256}})
        writer.close()
        manifest = {
            "version": CACHE_VERSION, "key": key, "inputs": records, "stats": [item.to_dict() for item in stats],
            "pairs": writer.pairs, "src_tokens": writer.totals["src"], "tgt_tokens": writer.totals["tgt"],
            "filters": asdict(filters), "eos_id": eos_id,
        }
        (temp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        replace_folder(temp, path)
    corpus = read_entry(path, manifest, src_tokenizer.vocab_size, tgt_tokenizer.vocab_size, check_tokens=False)
    if corpus is None:
        raise TfmError(f"{path}: the prepared data could not be read back; is the cache folder's disk full?")
    return corpus


def replace_folder(new: Path, target: Path) -> None:
    """Move the folder `new` to `target`, replacing an old folder there (removed first)."""
    if target.exists():
        old = target.parent / f"{TEMP_PREFIX}old-{target.name}-{os.getpid()}"
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    new.rename(target)


def unencoded_filter(
    src_lines: list[str], tgt_lines: list[str], invalid: set[int], filters: FilterSettings, counts: dict[str, int],
) -> list[int]:
    """The indices of a chunk's pairs that pass the filters needing no tokens (empty, identical).

    Adds each pair skipped here to `counts` under its reason; pairs in `invalid` are skipped uncounted
    (the reader counts them).
    """
    candidates = []
    for index, (src, tgt) in enumerate(zip(src_lines, tgt_lines)):
        if index in invalid:
            continue
        src_text, tgt_text = src.strip(), tgt.strip()
        if filters.skip_empty and not (src_text and tgt_text):
            counts["empty"] += 1
        elif filters.skip_identical and src_text == tgt_text:
            counts["identical"] += 1
        else:
            candidates.append(index)
    return candidates


def length_filter(
    first_line: int, candidates: list[int], src_ids: list[list[int]], tgt_ids: list[list[int]],
    filters: FilterSettings, counts: dict[str, int],
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """The encoded candidates within max_length and max_length_ratio: (line numbers, source ids, target ids).

    Adds the pairs skipped here to `counts` (too_long, ratio) and the kept ones under "kept".
    """
    kept: tuple[list[int], list[list[int]], list[list[int]]] = ([], [], [])
    limit, ratio = filters.max_length, filters.max_length_ratio
    for index, src, tgt in zip(candidates, src_ids, tgt_ids):
        if len(src) >= limit or len(tgt) >= limit:
            counts["too_long"] += 1
        elif ratio and max(len(src), len(tgt)) > ratio * max(min(len(src), len(tgt)), 1):
            counts["ratio"] += 1
        else:
            kept[0].append(first_line + index)
            kept[1].append(src)
            kept[2].append(tgt)
    counts["kept"] += len(kept[0])
    return kept


def remove_temp_entries(cache_dir: Path) -> list[Path]:
    """Remove the temp folders of preparations that were killed (SIGKILL); returns what was removed.

    Only folders of processes that no longer run are removed: another run may be preparing beside this one.
    """
    removed = []
    if not cache_dir.is_dir():
        return removed
    for path in cache_dir.iterdir():
        if path.name.startswith(TEMP_PREFIX) and path.is_dir():
            pid = path.name.rsplit("-", 1)[-1]
            if pid.isdigit() and process_alive(int(pid)):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
