"""Which sentence pairs a prepared corpus keeps: one class per filter (its reason, its test, its words
for the report), the settings that choose them, and the two passes that apply them, before tokenizing
(the filters on text) and after (those on token ids), each skip counted under its filter's reason.

Adding a filter is one class here, made by `FilterSettings.active`, plus its test: the counts, the
manifest and the training report take the reason and the words from the filter.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar


class CorpusFilter(ABC):
    """One reason a pair is skipped."""

    reason: ClassVar[str]  # its key in FilterStats.skipped and the manifest's stats
    needs_ids: ClassVar[bool] = False  # True: tested on token ids (EOS excluded) after encoding; False: on the text

    @abstractmethod
    def skips(self, src, tgt) -> bool:
        """Whether the pair is skipped: two lines of text, or two lists of token ids if `needs_ids`."""

    @property
    @abstractmethod
    def description(self) -> str:
        """The skipped pairs in words, as the report puts them after "N pairs"."""


@dataclass(frozen=True)
class EmptySide(CorpusFilter):
    """A side that is empty or whitespace only."""

    reason = "empty"

    def skips(self, src: str, tgt: str) -> bool:
        return not (src.strip() and tgt.strip())

    @property
    def description(self) -> str:
        return "with an empty side"


@dataclass(frozen=True)
class IdenticalSides(CorpusFilter):
    """The same text on both sides (an untranslated copy), surrounding whitespace aside."""

    reason = "identical"

    def skips(self, src: str, tgt: str) -> bool:
        return src.strip() == tgt.strip()

    @property
    def description(self) -> str:
        return "with the same text on both sides (data.skip_identical)"


@dataclass(frozen=True)
class MaxLength(CorpusFilter):
    """More than `max_length` tokens on a side, EOS included (so the ids, without it, may have one fewer)."""

    max_length: int
    reason = "too_long"
    needs_ids = True

    def skips(self, src: list[int], tgt: list[int]) -> bool:
        return len(src) >= self.max_length or len(tgt) >= self.max_length

    @property
    def description(self) -> str:
        return f"over data.max_length ({self.max_length}) tokens"


@dataclass(frozen=True)
class MaxLengthRatio(CorpusFilter):
    """A longer side with more than `ratio` times the shorter side's tokens (an empty side counts as 1)."""

    ratio: float
    reason = "ratio"
    needs_ids = True

    def skips(self, src: list[int], tgt: list[int]) -> bool:
        return max(len(src), len(tgt)) > self.ratio * max(min(len(src), len(tgt)), 1)

    @property
    def description(self) -> str:
        return f"over data.max_length_ratio ({self.ratio:g})"


@dataclass(frozen=True)
class FilterSettings:
    """Which pairs a prepared corpus keeps."""

    max_length: int  # tokens per side, EOS included
    max_length_ratio: float = 0.0  # 0: no ratio filter
    skip_identical: bool = False
    skip_empty: bool = True
    skip_invalid_utf8: bool = False  # False: invalid UTF-8 is an error naming file and line (the reader's job)

    def active(self) -> tuple[CorpusFilter, ...]:
        """The filters these settings turn on, in the order they apply: a pair is counted by the first one
        that skips it. Those on text come first (they run before tokenizing)."""
        filters: list[CorpusFilter] = []
        if self.skip_empty:
            filters.append(EmptySide())
        if self.skip_identical:
            filters.append(IdenticalSides())
        filters.append(MaxLength(self.max_length))
        if self.max_length_ratio:
            filters.append(MaxLengthRatio(self.max_length_ratio))
        return tuple(filters)


def first_skip(filters: Sequence[CorpusFilter], src, tgt, skipped: dict[str, int]) -> bool:
    """Whether one of `filters` skips the pair; the first that does counts it in `skipped` under its reason."""
    for item in filters:
        if item.skips(src, tgt):
            skipped[item.reason] = skipped.get(item.reason, 0) + 1
            return True
    return False


def filter_text(
    src_lines: list[str], tgt_lines: list[str], invalid: set[int], filters: Sequence[CorpusFilter],
    skipped: dict[str, int],
) -> list[int]:
    """The indices of a chunk's pairs that pass those of `filters` that work on text.

    Counts each pair skipped here in `skipped`; pairs in `invalid` are skipped uncounted (the reader counts them).
    """
    on_text = [item for item in filters if not item.needs_ids]
    return [
        index for index, (src, tgt) in enumerate(zip(src_lines, tgt_lines))
        if index not in invalid and not first_skip(on_text, src, tgt, skipped)
    ]


def filter_ids(
    first_line: int, candidates: list[int], src_ids: list[list[int]], tgt_ids: list[list[int]],
    filters: Sequence[CorpusFilter], skipped: dict[str, int],
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """The encoded candidates that pass those of `filters` that need token ids: (line numbers, source ids,
    target ids). Counts each pair skipped here in `skipped`."""
    on_ids = [item for item in filters if item.needs_ids]
    kept: tuple[list[int], list[list[int]], list[list[int]]] = ([], [], [])
    for index, src, tgt in zip(candidates, src_ids, tgt_ids):
        if not first_skip(on_ids, src, tgt, skipped):
            kept[0].append(first_line + index)
            kept[1].append(src)
            kept[2].append(tgt)
    return kept
