"""alignment.py on hand-built inputs and against a trained tokenizer's detokenized text."""

from __future__ import annotations

import pytest
import torch

from tfm_cli.inference.alignment import (
    hard_alignment,
    merge_to_words,
    null_weights,
    parse_pharaoh,
    pharaoh,
    transpose_pairs,
)
from tfm_cli.inference.symmetrization import intersection
from tfm_cli.tokenization.words import word_char_offsets, word_spans


@pytest.mark.parametrize(
    "pieces, expected",
    [
        ([], []),
        (["▁Ein", "▁Mann", "▁fährt", "▁Fahr", "rad", "."], [(0, 1), (1, 2), (2, 3), (3, 6)]),
        (["▁Fahr", "rad", "▁."], [(0, 2), (2, 3)]),
        # A sentence that starts without '▁' (no dummy prefix): the first piece still starts a word.
        (["Fahr", "rad", "▁fährt"], [(0, 2), (2, 3)]),
        # A bare '▁' belongs with the piece after it.
        (["▁", "Ä", "pfel", "▁und", "▁", "Ö", "l"], [(0, 3), (3, 4), (4, 7)]),
        # A bare '▁' before a '▁' piece (double space) still joins the next word.
        (["▁a", "▁", "▁b"], [(0, 1), (1, 3)]),
        # Trailing content-less pieces join the last word; only-space input has no word.
        (["▁a", "▁"], [(0, 2)]),
        (["▁", "▁"], []),
        # A piece ending in '▁' makes the next piece a new word.
        (["▁a▁", "b"], [(0, 1), (1, 2)]),
    ],
)
def test_word_spans_edge_cases(pieces, expected):
    assert word_spans(pieces) == expected


def test_word_char_offsets_split_on_every_whitespace_character():
    text = "Ein  Mann\u00a0fährt\tRad\u3000\u2009."
    offsets = word_char_offsets(text)
    assert [text[a:b] for a, b in offsets] == ["Ein", "Mann", "fährt", "Rad", "."]
    assert word_char_offsets("") == [] and word_char_offsets("   ") == []
    assert word_char_offsets(" a") == [(1, 2)]


# Lines unlike the tokenizer's training text: unseen characters (pieces of their own), punctuation
# glued to words, a no-break space, a tab and other Unicode spaces between words, repeated, leading and
# trailing spaces.
ODD_LINES = [
    "Ein Mann fährt Fahrrad auf der Straße.",
    "\"Zwei\" Hunde — 犬 🐕, ½ Preis!",
    "the  dog sees\u00a0my cat .",
    " the dog",
    "the dog ",
    "la hundoj,vidas",
    "the\tdog\u2009sees\u3000my\u202fcat\u2028.",
]


def test_spans_and_char_offsets_agree_with_sentencepiece_on_synthetic_and_odd_text(small_spm, synthetic):
    from tfm_cli.textio.streams import read_lines
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(small_spm)
    lines = read_lines(str(synthetic["test.src"])) + read_lines(str(synthetic["test.tgt"])) + ODD_LINES
    for line in lines:
        pieces = tokenizer.encode_pieces(line)
        text = tokenizer.decode_pieces(pieces)
        spans, offsets = word_spans(pieces), word_char_offsets(text)
        assert len(spans) == len(offsets), line
        for (start, end), (a, b) in zip(spans, offsets):
            assert "".join(pieces[start:end]).replace("▁", " ").strip() == text[a:b]


def test_merge_to_words_sums_source_pieces_and_averages_target_pieces():
    # 3 target pieces (words: [0], [1, 2]) x 4 source pieces (words: [0, 1], [2], [3]).
    matrix = torch.tensor(
        [
            [0.1, 0.2, 0.3, 0.4],
            [0.5, 0.0, 0.5, 0.0],
            [0.0, 0.2, 0.2, 0.6],
        ]
    )
    merged = merge_to_words(matrix, [(0, 1), (1, 3)], [(0, 2), (2, 3), (3, 4)])
    expected = torch.tensor(
        [
            [0.1 + 0.2, 0.3, 0.4],
            [((0.5 + 0.0) + (0.0 + 0.2)) / 2, (0.5 + 0.2) / 2, (0.0 + 0.6) / 2],
        ]
    )
    torch.testing.assert_close(merged, expected)
    torch.testing.assert_close(merged.sum(1), torch.ones(2))


def test_hard_alignment_and_pharaoh_on_a_hand_built_matrix():
    # Rows: target words; columns: source words. Row 2 ties between source 0 and 2: the first wins.
    matrix = torch.tensor(
        [
            [0.7, 0.2, 0.1],
            [0.1, 0.1, 0.8],
            [0.4, 0.2, 0.4],
            [0.1, 0.6, 0.3],
        ]
    )
    pairs = hard_alignment(matrix)
    assert pairs == [(0, 0), (2, 1), (0, 2), (1, 3)]
    assert pharaoh(pairs) == "0-0 2-1 0-2 1-3"
    assert parse_pharaoh("0-0 2-1 0-2 1-3") == pairs
    assert hard_alignment(torch.zeros(0, 3)) == [] and hard_alignment(torch.zeros(2, 0)) == []
    assert pharaoh([]) == ""


def test_a_word_whose_eos_weight_beats_every_source_word_is_left_unaligned():
    # Pieces: target words "x" (piece 0) and "yz" (pieces 1-2); source words "a" (piece 0), "b"
    # (piece 1), then the source's EOS (column 2).
    pieces = torch.tensor(
        [
            [0.6, 0.1, 0.3],
            [0.1, 0.2, 0.7],
            [0.3, 0.2, 0.5],
        ]
    )
    tgt_spans, src_spans = [(0, 1), (1, 3)], [(0, 1), (1, 2)]
    words = merge_to_words(pieces, tgt_spans, src_spans)  # EOS is in no span: ignored
    null = null_weights(pieces, tgt_spans, eos_column=2)
    torch.testing.assert_close(null, torch.tensor([0.3, 0.6]))  # "yz": the mean of 0.7 and 0.5
    assert hard_alignment(words, null) == [(0, 0)]  # "yz": EOS 0.6 beats a 0.2 and b 0.2
    assert hard_alignment(words) == [(0, 0), (0, 1)]
    # A tie keeps the link: only an EOS weight larger than the best source word's removes it.
    assert hard_alignment(torch.tensor([[0.4, 0.2]]), torch.tensor([0.4])) == [(0, 0)]


def test_intersection_of_two_directions():
    forward = [(0, 0), (2, 1), (0, 2), (1, 3)]
    # A reverse (tgt -> src) model aligns each of ITS targets (our source words) to our target words.
    reverse = [(0, 0), (3, 1), (1, 2)]  # (reverse src = our tgt, reverse tgt = our src)
    assert intersection(forward, transpose_pairs(reverse)) == [(0, 0), (2, 1), (1, 3)]
    assert pharaoh(intersection(forward, transpose_pairs(reverse))) == "0-0 2-1 1-3"


def test_parse_pharaoh_rejects_garbage():
    with pytest.raises(ValueError):
        parse_pharaoh("0-0 1:2")
    assert parse_pharaoh("") == [] and parse_pharaoh("3?4") == [(3, 4)]
