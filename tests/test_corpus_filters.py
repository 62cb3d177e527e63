"""Each corpus filter on hand-made pairs, the filters FilterSettings turns on, and the two passes that
count a skipped pair once, by the first filter that skips it."""

from __future__ import annotations

import pytest

from tfm_cli.corpus.filters import (
    EmptySide,
    FilterSettings,
    IdenticalSides,
    MaxLength,
    MaxLengthRatio,
    filter_ids,
    filter_text,
)

pytestmark = pytest.mark.unit


def test_empty_side_skips_a_pair_with_an_empty_or_blank_side():
    empty = EmptySide()
    assert (empty.reason, empty.needs_ids) == ("empty", False)
    assert empty.skips("", "a cat") and empty.skips("a cat", "  \t") and empty.skips(" ", "")
    assert not empty.skips("a", "b")
    assert empty.description == "with an empty side"


def test_identical_sides_compares_the_text_without_surrounding_whitespace():
    identical = IdenticalSides()
    assert (identical.reason, identical.needs_ids) == ("identical", False)
    assert identical.skips("Berlin", "Berlin") and identical.skips(" Berlin\t", "Berlin")
    assert not identical.skips("Berlin", "berlin") and not identical.skips("a b", "a  b")
    assert identical.description == "with the same text on both sides (data.skip_identical)"


def test_max_length_counts_eos_so_ids_may_have_one_token_fewer():
    # max_length 4 with EOS: up to 3 ids a side.
    limit = MaxLength(4)
    assert (limit.reason, limit.needs_ids) == ("too_long", True)
    assert not limit.skips([1, 2, 3], [1, 2, 3])
    assert limit.skips([1, 2, 3, 4], [1]) and limit.skips([1], [1, 2, 3, 4])
    assert limit.description == "over data.max_length (4) tokens"


def test_max_length_ratio_compares_the_longer_side_with_the_shorter():
    ratio = MaxLengthRatio(2.5)
    assert (ratio.reason, ratio.needs_ids) == ("ratio", True)
    assert not ratio.skips([1, 2], [1, 2, 3, 4, 5])  # 5 <= 2.5 * 2
    assert ratio.skips([1, 2, 3, 4, 5, 6], [1, 2])  # 6 > 2.5 * 2
    assert not ratio.skips([], [1, 2]) and ratio.skips([], [1, 2, 3])  # an empty side counts as 1 token
    assert ratio.description == "over data.max_length_ratio (2.5)"
    assert MaxLengthRatio(3.0).description == "over data.max_length_ratio (3)"


def test_settings_turn_on_the_filters_in_the_order_they_apply():
    assert FilterSettings(max_length=8).active() == (EmptySide(), MaxLength(8))
    everything = FilterSettings(max_length=8, max_length_ratio=3.0, skip_identical=True)
    assert everything.active() == (EmptySide(), IdenticalSides(), MaxLength(8), MaxLengthRatio(3.0))
    assert FilterSettings(max_length=8, skip_empty=False).active() == (MaxLength(8),)


def test_each_skipped_pair_is_counted_once_by_the_first_filter_that_skips_it():
    filters = FilterSettings(max_length=4, max_length_ratio=2.0, skip_identical=True).active()
    src = ["", "same", "a b", "x", "bad", "ok"]
    tgt = ["", "same", "c d", "y", "bad", "fine"]
    skipped = {item.reason: 0 for item in filters}
    # Line 0 is empty and identical: counted as empty only. Line 4 is invalid UTF-8: the reader's count.
    candidates = filter_text(src, tgt, {4}, filters, skipped)
    assert candidates == [2, 3, 5]
    # Ids of the candidates: line 2 too long and over the ratio (counted as too long), line 3 over the ratio.
    kept = filter_ids(10, candidates, [[1, 2, 3, 4], [1], [1, 2]], [[1], [1, 2, 3], [3]], filters, skipped)
    assert kept == ([15], [[1, 2]], [[3]])
    assert skipped == {"empty": 1, "identical": 1, "too_long": 1, "ratio": 1}
