"""The on-disk format of one prepared corpus (an entry of the cache folder, cache_folder.py): flat int32
token and int64 offset/line files, written a chunk at a time and read back memory-mapped, checked against
the manifest and the vocabulary before use."""

from __future__ import annotations

import array
import itertools
import os
import weakref
from pathlib import Path
from typing import Any

import torch

from tfm_cli.corpus.cache_folder import READERS_LOCK, read_manifest
from tfm_cli.corpus.file_locks import try_lock
from tfm_cli.corpus.tokenized import FilterStats, TokenizedCorpus

# name -> (file, dtype) of an entry's arrays
ARRAYS = {
    "src_tokens": ("src.tokens", torch.int32),
    "src_offsets": ("src.offsets", torch.int64),
    "tgt_tokens": ("tgt.tokens", torch.int32),
    "tgt_offsets": ("tgt.offsets", torch.int64),
    "line_numbers": ("lines", torch.int64),
}
RANGE_CHECK_ELEMENTS = 1 << 24  # token ids checked this many at a time when an entry is read


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


def open_entry(
    path: Path, vocab_sizes: tuple[int, int], check_tokens: bool, manifest: dict[str, Any] | None = None
) -> TokenizedCorpus | None:
    """The memory-mapped corpus of the entry `path` with a shared lock on its readers.lock held for as long
    as the corpus object lives; None if the entry is damaged or being removed."""
    manifest = manifest if manifest is not None else read_manifest(path)
    if manifest is None:
        return None
    reader = try_lock(path / READERS_LOCK, shared=True)
    if reader is None:
        return None
    corpus = read_entry(path, manifest, *vocab_sizes, check_tokens)
    if corpus is None:
        os.close(reader)
        return None
    weakref.finalize(corpus, os.close, reader)
    return corpus


def recorded_sha256s(manifest: dict[str, Any]) -> list[tuple[str, str]] | None:
    """[(text file path, SHA-256), ...] as an entry's manifest records them; None if it does not."""
    try:
        return [(str(pair[side]["path"]), str(pair[side]["sha256"])) for pair in manifest["inputs"] for side in ("src", "tgt")]
    except (KeyError, TypeError):
        return None
