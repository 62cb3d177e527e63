"""An embedding table that holds only the rows a process has looked up, each read from the checkpoint
file the first time it is needed.

A model that only translates needs its float32 embedding table for lookups alone once its output layer
has its own packed (or int8, or bf16) copy. At the OPUS-MT base shape that table is 58,101 x 512 float32,
119 MB, while a text of a few thousand lines looks up a few thousand distinct tokens. `RowsFromFile`
gives the table untouched anonymous memory (pages the kernel maps only when written) and copies a row
from the checkpoint into it before its first lookup, so the process holds the rows it used.

Rows are read from the file opened at load. A checkpoint replaced by a new file (tfm and safetensors
write a new file and rename it over the old) is not seen: the open file is still the old one. One written
over in place (`cp new.safetensors model.safetensors`) is caught: each row's checksum is taken from the
full table at load, and a row read back with another raises ModelFileError. A row's values are the file's bytes,
so lookups give the same bits as the full table.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import torch
from torch import nn

from tfm_cli.errors import ModelFileError

FLOAT32_BYTES = 4
CHECKSUM_BLOCK_ROWS = 4096  # rows summed at a time: a 64-bit copy of one block, not of the table


def row_checksums(table: torch.Tensor) -> torch.Tensor:
    """table: (V, D) float32 -> (V,) int64, the sum of each row's 32-bit patterns (to recognise a row)."""
    patterns = table.view(torch.int32)
    checksums = torch.empty(table.size(0), dtype=torch.int64)
    for start in range(0, table.size(0), CHECKSUM_BLOCK_ROWS):
        block = patterns[start : start + CHECKSUM_BLOCK_ROWS]
        checksums[start : start + block.size(0)] = block.sum(dim=1, dtype=torch.int64)
    return checksums


def reads_rows_from_files() -> bool:
    """True where rows can be read into place by offset (os.preadv, anonymous private mmap): Linux, macOS."""
    return hasattr(os, "preadv") and hasattr(mmap, "MAP_PRIVATE")


class RowsFromFile:
    """A (V, D) float32 table backed by untouched memory; `ensure(ids)` reads missing rows from a file.

    path, offset: the file and the byte offset of row 0 of the table stored there as little-endian
    float32, row after row (a safetensors tensor). checksums: (V,) row_checksums of the table as loaded.
    """

    def __init__(self, path: Path, offset: int, shape: tuple[int, int], checksums: torch.Tensor) -> None:
        rows, width = shape
        self.path = path
        self.offset = offset
        self.row_bytes = width * FLOAT32_BYTES
        self.checksums = checksums
        self.file = open(path, "rb")  # rows are read with os.preadv: no shared file position
        # Anonymous and private: zero pages that take memory only once written, copied on write after a
        # fork (tfm translate --workers), so each process holds the rows it read itself.
        self.memory = mmap.mmap(-1, rows * self.row_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.table = torch.frombuffer(self.memory, dtype=torch.float32).view(rows, width)
        self.loaded = torch.zeros(rows, dtype=torch.bool)

    def ensure(self, ids: torch.Tensor) -> None:
        """Read every row of `ids` (any shape, int64) that is not in the table yet."""
        ids = ids.reshape(-1).cpu()
        present = self.loaded[ids]
        if bool(present.all()):  # every decoding step asks; after the first few, nothing is missing
            return
        missing = torch.unique(ids[~present])  # sorted
        for first, last in consecutive_runs(missing.tolist()):
            self.read_rows(first, last)
        if not torch.equal(row_checksums(self.table[missing]), self.checksums[missing]):
            raise ModelFileError(
                f"{self.path}: the checkpoint changed on disk while its model was in use (its embedding rows no "
                "longer match what was loaded); restart the command with the new file"
            )
        self.loaded[missing] = True

    def read_rows(self, first: int, last: int) -> None:
        """Copy rows first..last (inclusive) from the file into the table."""
        start, end = first * self.row_bytes, (last + 1) * self.row_bytes
        view = memoryview(self.memory)[start:end]
        try:
            count = os.preadv(self.file.fileno(), [view], self.offset + start)
        except (OSError, ValueError) as error:  # a file system gone, the file closed
            raise ModelFileError(f"{self.path}: cannot read the model's embedding rows from the checkpoint ({error})") from None
        finally:
            view.release()
        if count != end - start:
            raise ModelFileError(f"{self.path}: the checkpoint is shorter than when it was loaded (it changed on disk)")


def consecutive_runs(sorted_ids: list[int]) -> list[tuple[int, int]]:
    """[1, 2, 3, 7, 9, 10] -> [(1, 3), (7, 7), (9, 10)]: runs of consecutive ids, each read with one call."""
    runs: list[tuple[int, int]] = []
    for index in sorted_ids:
        if runs and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


class Embedding(nn.Embedding):
    """nn.Embedding (same parameters, same state dict) whose weight can be a RowsFromFile table.

    With `rows` set (use_rows_from_file), each lookup first reads the rows it needs; the weight is then
    the table, whose rows not yet looked up are zeros, so it serves lookups only.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: RowsFromFile | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (...) int64 -> (..., D), the rows of `tokens`."""
        if self.rows is not None:
            self.rows.ensure(tokens)
        return super().forward(tokens)

    def use_rows_from_file(self, path: Path, offset: int) -> None:
        """Replace the weight's values by a RowsFromFile table of the same file data (the checkpoint the
        weight was read from, its float32 tensor at byte `offset`); the loaded values are given up."""
        weight = self.weight.detach()
        rows = RowsFromFile(path, offset, tuple(weight.shape), row_checksums(weight))
        self.weight.data = rows.table
        self.rows = rows
