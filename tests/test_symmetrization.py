"""symmetrization.py against hand-computed cases of intersection, union and grow-diag-final-and.

Each case lists the forward (src->tgt) pairs and the reverse model's pairs already in (src, tgt)
order; the expected grow-diag-final-and was worked out by hand from Koehn's definition.
"""

from __future__ import annotations

import pytest

from tfm_cli.inference.symmetrization import SYMMETRIZATIONS, grow_diag_final_and, intersection, union


def test_intersection_and_union_are_sorted_by_target_then_source():
    forward = [(2, 0), (0, 1), (1, 1)]
    backward = [(0, 1), (2, 0), (3, 2)]
    assert intersection(forward, backward) == [(2, 0), (0, 1)]
    assert union(forward, backward) == [(2, 0), (0, 1), (1, 1), (3, 2)]


@pytest.mark.parametrize(
    "forward, backward, expected",
    [
        # Both agree: nothing to grow.
        ([(0, 0), (1, 1)], [(0, 0), (1, 1)], [(0, 0), (1, 1)]),
        # (1, 2) neighbours (1, 1) and its target word is unaligned: grown. (2, 2) is the diagonal
        # neighbour of (1, 1) with an unaligned source word: grown too.
        ([(0, 0), (1, 1), (1, 2)], [(0, 0), (1, 1), (2, 2)], [(0, 0), (1, 1), (1, 2), (2, 2)]),
        # (0, 1) neighbours (0, 0) but both its words are already aligned: never added.
        ([(0, 0), (1, 1), (0, 1)], [(0, 0), (1, 1)], [(0, 0), (1, 1)]),
        # (3, 3) is no neighbour of anything aligned; final-and adds it: both words unaligned.
        ([(0, 0), (3, 3)], [(0, 0)], [(0, 0), (3, 3)]),
        # (0, 3): no neighbour, and its source word 0 is aligned, so final-AND refuses it.
        ([(0, 0), (0, 3)], [(0, 0)], [(0, 0)]),
        # Empty intersection: final-and takes the forward point, then the backward one (its two
        # words are still unaligned after the first).
        ([(0, 1)], [(1, 0)], [(1, 0), (0, 1)]),
        # ... but a backward point sharing a word with an added forward point is refused.
        ([(0, 1)], [(0, 0)], [(0, 1)]),
        # Growth chains within one pass: (1, 1) grows from (0, 0), then (2, 2) from (1, 1).
        ([(0, 0), (1, 1), (2, 2)], [(0, 0)], [(0, 0), (1, 1), (2, 2)]),
        # Growing only through union points: (1, 0) is in neither direction.
        ([(0, 0), (2, 1)], [(0, 0), (2, 1)], [(0, 0), (2, 1)]),
        ([], [], []),
    ],
)
def test_grow_diag_final_and_on_hand_computed_cases(forward, backward, expected):
    assert grow_diag_final_and(forward, backward) == expected


def test_grow_diag_final_and_lies_between_intersection_and_union():
    forward = [(0, 0), (1, 2), (2, 1), (3, 3), (4, 3), (0, 4)]
    backward = [(0, 0), (1, 1), (2, 1), (3, 3), (4, 4), (3, 4)]
    grown = set(grow_diag_final_and(forward, backward))
    assert set(intersection(forward, backward)) <= grown <= set(union(forward, backward))
    # Worked by hand: intersection {0-0, 2-1, 3-3}. In grid order, 0-0 grows its diagonal 1-1
    # (source word 1 unaligned), then 1-1 grows 1-2 (target word 2 unaligned). 3-3 grows 4-3
    # (source word 4) and then 3-4 (target word 4): side neighbours come before diagonals. By
    # then 4-4 and 0-4 have both words aligned, and final-and adds nothing.
    assert grown == {(0, 0), (2, 1), (3, 3), (1, 1), (1, 2), (4, 3), (3, 4)}


def test_every_symmetrization_is_listed_by_its_cli_name():
    assert set(SYMMETRIZATIONS) == {"intersection", "union", "grow-diag-final-and"}
