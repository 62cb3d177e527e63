"""Tokenized parallel text in memory: sentence pairs as flat token tensors with offsets, and what
filtering kept of each input corpus.

Sources are stored as `ids + [eos]`, targets as `ids + [eos]` (the decoder input is `[bos] + ids`).
Reading and tokenizing the text is cache.py's job; batching it, batching.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from tfm_cli.special_ids import EOS_ID


@dataclass(frozen=True)
class FilterStats:
    """What filtering one corpus kept and skipped; each skipped pair is counted once, by the first filter
    that skips it (the filters and their reasons: filters.py)."""

    read: int
    kept: int
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # reason -> pairs, one key per active filter
    invalid_utf8: int = 0  # pairs with a side that is not UTF-8 (invalid_utf8 = "skip")
    invalid_examples: tuple[str, ...] = ()  # "file:line" of the first few of those

    def to_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        values = dataclasses.asdict(self)
        values["invalid_examples"] = list(self.invalid_examples)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FilterStats:
        """The inverse of to_dict."""
        return cls(**{**values, "invalid_examples": tuple(values.get("invalid_examples", ()))})


@dataclass
class TokenizedCorpus:
    """Kept sentence pairs as flat token tensors with offsets (cheap to cache, slice and batch).

    A corpus prepared from several files holds their pairs one corpus after another: part i is the
    rows [sum(kept of parts before i), + stats[i].kept). The tensors may be memory-mapped files.
    """

    src_tokens: torch.Tensor  # (total source tokens,) int32, each sentence ending in EOS
    src_offsets: torch.Tensor  # (N + 1,) int64: sentence i is src_tokens[off[i]:off[i+1]]
    tgt_tokens: torch.Tensor  # (total target tokens,) int32, each sentence ending in EOS
    tgt_offsets: torch.Tensor  # (N + 1,) int64
    line_numbers: torch.Tensor  # (N,) int64, the 0-based input line of each kept pair (in its own file)
    stats: tuple[FilterStats, ...]  # one per input corpus

    def __len__(self) -> int:
        return self.line_numbers.numel()

    @property
    def src_lengths(self) -> torch.Tensor:
        """(N,) int64 source lengths, EOS included."""
        return self.src_offsets[1:] - self.src_offsets[:-1]

    @property
    def tgt_lengths(self) -> torch.Tensor:
        """(N,) int64 target lengths, EOS included (= decoder input length with BOS)."""
        return self.tgt_offsets[1:] - self.tgt_offsets[:-1]

    def part_rows(self) -> list[tuple[int, int]]:
        """(first row, row count) of each input corpus's pairs."""
        rows, start = [], 0
        for stats in self.stats:
            rows.append((start, stats.kept))
            start += stats.kept
        return rows



def flatten(sequences: list[list[int]], eos_id: int = EOS_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (flat (total,) int32 with `eos_id` after each, offsets (N + 1,) int64)."""
    lengths = torch.tensor([len(s) + 1 for s in sequences], dtype=torch.int64)
    offsets = torch.zeros(len(sequences) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = [token for sequence in sequences for token in (*sequence, eos_id)]
    return torch.tensor(flat, dtype=torch.int32), offsets


def count_tokens(corpus: TokenizedCorpus) -> tuple[int, int]:
    """(source tokens, target tokens) of the whole corpus, EOS included."""
    return int(corpus.src_offsets[-1]), int(corpus.tgt_offsets[-1])
