"""tokenization/words.py: one definition of a word for every command, on text and on pieces."""

from __future__ import annotations

import re
import sys

import pytest

from tfm_cli.tokenization.words import (
    count_words,
    split_words,
    word_char_offsets,
    word_spans,
    words_before,
)

# Whitespace by Unicode (White_Space) that a user may meet between words, and look-alikes that are not.
SPACES = ["\t", "\u00a0", "\u1680", "\u2002", "\u2009", "\u200a", "\u202f", "\u205f", "\u3000", "\u2028", "\x85"]
NOT_SPACES = ["\u200b", "\u2060", "\ufeff", "\u180e"]


def test_the_text_rule_is_str_split_and_res_whitespace_on_every_code_point():
    whitespace = [chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()]
    assert whitespace == [chr(code) for code in range(sys.maxunicode + 1) if re.fullmatch(r"\s", chr(code))]
    for space in whitespace:
        text = f" a{space}b{space}{space}c "
        assert split_words(text) == ["a", "b", "c"] == [text[s:e] for s, e in word_char_offsets(text)]
        assert count_words(text) == 3


@pytest.mark.parametrize("space", SPACES)
def test_unicode_spaces_separate_words_in_text_and_in_pieces(space):
    text = f"Ein{space}Mann fährt{space}Rad."
    assert split_words(text) == ["Ein", "Mann", "fährt", "Rad."]
    assert [text[s:e] for s, e in word_char_offsets(text)] == split_words(text)
    assert words_before(text, text.index("fährt")) == 2
    # As an identity-normalized tokenizer keeps it: a piece of its own, or at the edge of a piece.
    assert word_spans(["\u2581Ein", space, "Mann", "\u2581fährt", space + "Rad", "."]) == [(0, 1), (1, 3), (3, 4), (4, 6)]
    assert word_spans(["\u2581Ein" + space, "Mann"]) == [(0, 1), (1, 2)]


@pytest.mark.parametrize("char", NOT_SPACES)
def test_zero_width_characters_stay_inside_a_word(char):
    text = f"Ein{char}Mann fährt"
    assert split_words(text) == [f"Ein{char}Mann", "fährt"]
    assert word_spans(["\u2581Ein", char, "Mann", "\u2581fährt"]) == [(0, 3), (3, 4)]


def test_whitespace_inside_one_piece_does_not_split_it():
    # Only a vocabulary learnt with such a piece makes one; the piece stays one word.
    assert word_spans(["\u2581100\u00a0000", "\u2581Euro"]) == [(0, 1), (1, 2)]


def test_a_whole_sentence_encodes_to_the_pieces_of_its_words_one_by_one(small_spm, synthetic):
    # tfm align and train-aligner encode word by word; translate encodes the line. Identical pieces on
    # single-space text mean the aligner is trained and applied on the same pieces.
    from tfm_cli.textio.streams import read_lines
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(small_spm)
    lines = read_lines(str(synthetic["test.src"])) + read_lines(str(synthetic["test.tgt"]))
    lines += ["\"Zwei\" Hunde — 犬 🐕, ½ Preis!", "la hundoj,vidas ."]
    for line in lines:
        whole = tokenizer.encode_pieces(" ".join(split_words(line)))
        word_by_word = [piece for word in split_words(line) for piece in tokenizer.encode_pieces(word)]
        assert whole == word_by_word, line
        assert len(word_spans(whole)) == count_words(line)
