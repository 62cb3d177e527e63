"""Which sentence pairs a prepared corpus keeps: the filter settings and the two passes that apply them,
before tokenizing (empty, identical) and after (length, length ratio), each skip counted by its reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FilterSettings:
    """Which pairs a prepared corpus keeps."""

    max_length: int  # tokens per side, EOS included
    max_length_ratio: float = 0.0  # 0: no ratio filter
    skip_identical: bool = False
    skip_empty: bool = True
    skip_invalid_utf8: bool = False  # False: invalid UTF-8 is an error naming file and line


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
