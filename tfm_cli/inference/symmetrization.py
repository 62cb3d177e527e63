"""Combining the word alignments of two translation directions into one (symmetrization).

Both inputs are lists of (src, tgt) word-index pairs: the forward model's (source->target) and the
reverse model's (target->source) pairs already transposed into (src, tgt) order. The heuristics
are the ones of Och & Ney (2003) and Koehn et al. (2003), as Moses, fast_align's atools and
eflomal's users run them: intersection (high precision), union (high recall), and
grow-diag-final-and (the usual default: start from the intersection, grow into neighbouring union
points, then add union points whose words are both still unaligned). `voted` combines any number of
alignments of one sentence pair, e.g. several runs of a sampling aligner such as eflomal.
"""

from __future__ import annotations

from collections import Counter

AlignmentPair = tuple[int, int]
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))  # diagonals last


def ordered(pairs: set[AlignmentPair]) -> list[AlignmentPair]:
    """`pairs` sorted by (tgt, src): the order tfm prints alignments in."""
    return sorted(pairs, key=lambda pair: (pair[1], pair[0]))


def intersection(forward: list[AlignmentPair], backward: list[AlignmentPair]) -> list[AlignmentPair]:
    """The (src, tgt) pairs both directions have, sorted by (tgt, src)."""
    return ordered(set(forward) & set(backward))


def union(forward: list[AlignmentPair], backward: list[AlignmentPair]) -> list[AlignmentPair]:
    """The (src, tgt) pairs either direction has, sorted by (tgt, src)."""
    return ordered(set(forward) | set(backward))


def grow_diag_final_and(forward: list[AlignmentPair], backward: list[AlignmentPair]) -> list[AlignmentPair]:
    """Koehn's grow-diag-final-and of two directions; (src, tgt) pairs sorted by (tgt, src).

    1. Start from the intersection.
    2. grow-diag: repeatedly, for every aligned point in (src, tgt) grid order, add each of its
       eight neighbours that is in the union and whose source word or target word is still
       unaligned, until a full pass adds nothing.
    3. final-and: for the forward direction, then the backward one, add each of its points (in
       grid order) whose source word AND target word are both still unaligned.
    """
    forward_set, backward_set = set(forward), set(backward)
    both = forward_set | backward_set
    if not both:
        return []
    src_count = 1 + max(src for src, _ in both)
    tgt_count = 1 + max(tgt for _, tgt in both)
    alignment = forward_set & backward_set
    src_aligned = {src for src, _ in alignment}
    tgt_aligned = {tgt for _, tgt in alignment}

    def add(point: AlignmentPair) -> None:
        alignment.add(point)
        src_aligned.add(point[0])
        tgt_aligned.add(point[1])

    added = True
    while added:
        added = False
        for src in range(src_count):
            for tgt in range(tgt_count):
                if (src, tgt) not in alignment:
                    continue
                for d_src, d_tgt in NEIGHBOURS:
                    point = (src + d_src, tgt + d_tgt)
                    if point in both and point not in alignment and (
                        point[0] not in src_aligned or point[1] not in tgt_aligned
                    ):
                        add(point)
                        added = True
    for direction in (forward_set, backward_set):
        for point in sorted(direction):
            if point[0] not in src_aligned and point[1] not in tgt_aligned:
                add(point)
    return ordered(alignment)


def voted(alignments: list[list[AlignmentPair]], at_least: int) -> list[AlignmentPair]:
    """The (src, tgt) pairs that at least `at_least` of `alignments` (each one alignment of the same
    sentence pair; a pair repeated within one counts once) have, sorted by (tgt, src)."""
    if at_least < 1:
        raise ValueError(f"at_least must be 1 or more, not {at_least}")
    votes = Counter(pair for alignment in alignments for pair in set(alignment))
    return ordered({pair for pair, count in votes.items() if count >= at_least})


SYMMETRIZATIONS = {
    "intersection": intersection,
    "union": union,
    "grow-diag-final-and": grow_diag_final_and,
}
