"""bench/resegment.py: minimum-word-error re-segmentation on hand-computed cases and against brute force."""

from __future__ import annotations

import importlib.util
import itertools
import random
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "resegment.py"
spec = importlib.util.spec_from_file_location("resegment", SCRIPT)
resegment = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = resegment
spec.loader.exec_module(resegment)


def levenshtein(a: list[str], b: list[str]) -> int:
    """Word edit distance, written independently of the module (memoised recursion)."""
    memo: dict[tuple[int, int], int] = {}

    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        if (i, j) not in memo:
            memo[(i, j)] = min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
        return memo[(i, j)]

    return d(len(a), len(b))


def test_edit_distances_of_every_prefix():
    # "a b" against "a c": the empty piece costs 2 deletions, "a" 1, "a b" 1 substitution.
    assert resegment.edit_distances_from(["a", "b"], 0, ["a", "c"]) == [2, 1, 1]
    assert resegment.edit_distances_from(["z", "a", "b"], 1, ["a", "c"]) == [2, 1, 1]


def test_an_exact_concatenation_is_cut_back_exactly():
    assert resegment.resegment("a b c d e", ["a b", "c", "d e"]) == ["a b", "c", "d e"]


def test_a_missing_boundary_is_cut_where_the_words_match():
    refs = ["the dog runs .", "a cat sleeps ."]
    # Cutting after "runs" costs 1 (the missing "."); after "a" it would cost 2.
    assert resegment.resegment("the dog runs a cat sleeps .", refs) == ["the dog runs", "a cat sleeps ."]


def test_too_few_words_leave_empty_pieces_and_ties_go_to_the_earliest_cut():
    assert resegment.resegment("x", ["a", "b"]) == ["", "x"]
    assert resegment.resegment("", ["a", "b"]) == ["", ""]
    assert resegment.resegment("  a   b ", ["a b"]) == ["a b"]


def test_the_cut_is_optimal_against_brute_force():
    rng = random.Random(7)
    vocabulary = ["a", "b", "c", "d"]
    for _ in range(200):
        refs = [" ".join(rng.choices(vocabulary, k=rng.randint(0, 4))) for _ in range(rng.randint(1, 3))]
        words = rng.choices(vocabulary, k=rng.randint(0, 8))
        pieces = resegment.resegment(" ".join(words), refs)
        assert len(pieces) == len(refs)
        assert " ".join(piece for piece in pieces if piece).split() == words  # nothing lost, reordered or added
        cost = sum(levenshtein(p.split(), r.split()) for p, r in zip(pieces, refs))
        brute = min(
            sum(levenshtein(words[s:e], r.split()) for (s, e), r in zip(zip((0, *cuts), (*cuts, len(words))), refs))
            for cuts in itertools.combinations_with_replacement(range(len(words) + 1), len(refs) - 1)
        )
        assert cost == brute
