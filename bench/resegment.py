"""Re-segmenting a translation to its reference lines by minimum word error, as mwerSegmenter does.

When a system's output segments do not match the reference lines (a paragraph translated as one
line, a sentence splitter that missed a boundary), the IWSLT evaluations cut the output into as
many pieces as there are reference lines, at the word boundaries that minimise the total word edit
distance to those references (Matusov et al. 2005, "Evaluating machine translation output with
automatic sentence segmentation"), and then score the pieces line by line. This module does that for
one output and its few reference lines; words are whitespace tokens, compared case-sensitively.
"""

from __future__ import annotations


def edit_distances_from(hypothesis: list[str], start: int, reference: list[str]) -> list[int]:
    """Word edit distances between reference and hypothesis[start:end] for every end in start..len(hypothesis).

    Returns a list of len(hypothesis) - start + 1 ints: item k is the distance to hypothesis[start:start + k].
    """
    previous = list(range(len(reference) + 1))  # the distances of the empty hypothesis piece
    distances = [previous[-1]]
    for word in hypothesis[start:]:
        current = [previous[0] + 1]
        for j, ref_word in enumerate(reference, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != ref_word)))
        distances.append(current[-1])
        previous = current
    return distances


def resegment(output: str, references: list[str]) -> list[str]:
    """`output` cut into len(references) pieces (its words joined by single spaces, possibly empty) at the
    word boundaries that minimise the summed word edit distance of piece k to references[k].

    Ties go to the earliest cut. Returns a list of len(references) strings.
    """
    words = output.split()
    refs = [reference.split() for reference in references]
    n = len(words)
    infinity = float("inf")
    # best[k][i]: least cost of cutting words[:i] into the first k pieces; cut[k][i]: where piece k starts.
    best = [[infinity] * (n + 1) for _ in range(len(refs) + 1)]
    cut = [[0] * (n + 1) for _ in range(len(refs) + 1)]
    best[0][0] = 0
    for k, ref in enumerate(refs, start=1):
        for start in range(n + 1):
            if best[k - 1][start] == infinity:
                continue
            for offset, distance in enumerate(edit_distances_from(words, start, ref)):
                cost = best[k - 1][start] + distance
                if cost < best[k][start + offset]:
                    best[k][start + offset] = cost
                    cut[k][start + offset] = start
    pieces, end = [], n
    for k in range(len(refs), 0, -1):
        start = cut[k][end]
        pieces.append(" ".join(words[start:end]))
        end = start
    return pieces[::-1]
