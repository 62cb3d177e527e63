"""Sentence spans for --split-sentences: hand-checked splits, the whitespace-only-between invariant on
Multi30k paragraphs, rejoining, word offsets, hostile lines, and the message when the extra is missing."""

from __future__ import annotations

import itertools
import re
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from tfm_cli.errors import TfmError
from tfm_cli.inference.sentence_splitting import (
    MISSING_SPLITTER,
    SentenceSplitter,
    join_sentences,
    merge_empty,
    number_starts_masked,
    sentence_spans,
    splitter_language,
    word_offsets,
)

MULTI30K = Path("/work/shared/data/multi30k")


@pytest.fixture
def splitter_installed():
    pytest.importorskip("sentencex")


def words(text: str) -> list[str]:
    """The whitespace-separated tokens of `text` (re's \\S+, independent of tfm's own rule)."""
    return re.findall(r"\S+", text)


def assert_well_formed(line: str, spans: list[tuple[int, int]]) -> None:
    """The contract of sentence_spans: stripped, non-blank spans, whitespace only around and between
    them, and the words of the sentences are exactly the words of the line."""
    assert spans, repr(line)
    for start, end in spans:
        assert 0 <= start < end <= len(line)
        assert not line[start].isspace() and not line[end - 1].isspace() and line[start:end].strip()
    for (_, end), (start, _) in itertools.pairwise(spans):
        gap = line[end:start]
        assert gap and gap.isspace(), (line, spans)
    assert (line[: spans[0][0]] + line[spans[-1][1] :]).strip() == ""
    assert [word for start, end in spans for word in words(line[start:end])] == words(line)
    counts = [len(words(line[start:end])) for start, end in spans]
    assert word_offsets(line, spans) == [sum(counts[:index]) for index in range(len(spans))]


def test_an_english_paragraph_splits_where_a_reader_would(splitter_installed):
    line = "Dr. Smith arrived at 3.5 p.m. today.  He was late! Was he?"
    # "Dr. Smith arrived at 3.5 p.m. today." | two spaces | "He was late!" | "Was he?"
    assert sentence_spans(line, "en") == [(0, 36), (38, 50), (51, 58)]


def test_a_german_paragraph_keeps_abbreviations_and_numbers(splitter_installed):
    line = "Das ist z. B. ein Test. Er wohnt in Haus Nr. 5 in Berlin. Was?! Ja."
    # "Das ist z. B. ein Test." | "Er wohnt in Haus Nr. 5 in Berlin." | "Was?!" | "Ja."
    assert sentence_spans(line, "de") == [(0, 23), (24, 57), (58, 63), (64, 67)]


def test_a_sentence_that_starts_with_a_number_is_cut_off(splitter_installed):
    # Multi30k's German often starts a caption with a digit; sentencex alone keeps these pairs together.
    line = "Sechs Leute fahren durch eine Landschaft. 2 blonde Mädchen sitzen. Ein Kind planscht."
    assert [line[a:b] for a, b in sentence_spans(line, "de")] == [
        "Sechs Leute fahren durch eine Landschaft.", "2 blonde Mädchen sitzen.", "Ein Kind planscht."]
    line = "He was born in 1990. 3 years later he left! 12 dogs barked."
    assert [line[a:b] for a, b in sentence_spans(line, "en")] == [
        "He was born in 1990.", "3 years later he left!", "12 dogs barked."]


@pytest.mark.parametrize("line, language", [
    ("Er wohnt in Haus Nr. 5 in Berlin.", "de"), ("Siehe S. 5 und Abb. 3 oben.", "de"),
    ("Das ist ca. 5 km weit.", "de"), ("Das ist z.B. 5 km weit.", "de"), ("Das ist z. B. 5 km weit.", "de"),
    ("See Fig. 3 for details.", "en"), ("The U.S. 5 states.", "en"), ("They live at No. 5 Main St. in London.", "en"),
])
def test_an_abbreviation_before_a_number_is_no_boundary(splitter_installed, line, language):
    assert sentence_spans(line, language) == [(0, len(line))]


def test_the_number_mask_keeps_length_and_touches_only_numbers_after_a_stop():
    line = "Eine Landschaft. 23 Mädchen, 4 Jungen. Nr. 5 und z.B. 6 oder Was?  7 Leute"
    masked = number_starts_masked(line)
    assert masked == "Eine Landschaft. ZZ Mädchen, 4 Jungen. Nr. 5 und z.B. 6 oder Was?  Z Leute"
    assert number_starts_masked("3.5 und 1990.4 bleiben") == "3.5 und 1990.4 bleiben"  # no space: no stop


def test_no_split_inside_a_token_without_a_space(splitter_installed):
    # sentencex cuts "end.|Next"; that would split the word "end.Next" in two, so the pieces merge.
    assert sentence_spans("The end.Next one starts. Yes.", "en") == [(0, 24), (25, 29)]


def test_tabs_and_unicode_spaces_separate_sentences_as_they_separate_words(splitter_installed):
    # Every whitespace character separates words (tokenization/words.py), so a sentence may end there.
    assert sentence_spans("Ende.\tNeu. Ja.", "de") == [(0, 5), (6, 10), (11, 14)]
    assert sentence_spans("Ende.\u00a0Neu.\u3000Ja.", "de") == [(0, 5), (6, 10), (11, 14)]
    # Spans are stripped of every kind of whitespace; no blank sentence is made of it.
    assert sentence_spans("Hello. \t", "en") == [(0, 6)]
    assert sentence_spans("\t Hello.\u2009There.", "en") == [(2, 8), (9, 15)]
    # Not whitespace: a zero-width space is part of a word, so no cut beside it.
    assert sentence_spans("Ende.\u200bNeu. Ja.", "de") == [(0, 10), (11, 14)]


def test_whitespace_only_pieces_join_a_neighbouring_sentence():
    # sentencex keeps whitespace with the piece before it, so this guards other splitter versions:
    # "Hi." | "\t" | "Yo." -> the tab joins "Hi."; a leading "\t" joins the first real sentence.
    assert merge_empty("Hi. \t Yo.", [(0, 3), (4, 5), (6, 9)]) == [(0, 5), (6, 9)]
    assert merge_empty("\t Yo. Hi.", [(0, 1), (2, 5), (6, 9)]) == [(0, 5), (6, 9)]
    assert merge_empty("\t", [(0, 1)]) == []


def test_blank_and_single_sentence_lines(splitter_installed):
    assert sentence_spans("", "en") == []
    assert sentence_spans("    ", "en") == []
    assert sentence_spans(" \t\u00a0 ", "en") == []  # blank by the rule tfm translate uses (str.strip)
    assert sentence_spans("  A dog runs.  ", "en") == [(2, 13)]
    assert sentence_spans("a dog runs", "en") == [(0, 10)]


def test_unknown_and_regional_language_codes_fall_back(splitter_installed):
    assert splitter_language("de-AT") == "de"
    assert splitter_language("PT_br") == "pt"
    assert splitter_language("") == "en"
    line = "Dr. Smith came. He sat down."
    assert sentence_spans(line, "xx") == sentence_spans(line, "en") == [(0, 15), (16, 28)]
    assert sentence_spans(line, "") == [(0, 15), (16, 28)]


@pytest.mark.parametrize("language", ["de", "en"])
def test_every_multi30k_triple_is_well_formed_and_rejoins_exactly(splitter_installed, language):
    path = MULTI30K / f"test_2016_flickr.{language}"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    splitter = SentenceSplitter(language)
    recovered = 0
    for index in range(len(lines) - 2):
        for separator in (" ", "  "):
            line = separator.join(lines[index : index + 3])
            spans = splitter.spans(line)
            assert_well_formed(line, spans)
            assert join_sentences(line, spans, [line[start:end] for start, end in spans]) == line
            recovered += [line[start:end] for start, end in spans] == lines[index : index + 3]
    # The splitter, not this module, decides the cuts; this only guards against losing them all.
    assert recovered > 0.85 * 2 * (len(lines) - 2)


def test_join_keeps_the_spacing_between_sentences_and_drops_the_edges():
    line = "  One.  Two.   Three.  "
    spans = [(2, 6), (8, 12), (15, 21)]
    assert join_sentences(line, spans, ["Eins.", "Zwei.", "Drei."]) == "Eins.  Zwei.   Drei."
    assert join_sentences(line, spans, [line[start:end] for start, end in spans]) == line.strip(" ")
    assert join_sentences("", [], []) == ""
    with pytest.raises(ValueError):
        join_sentences(line, spans, ["Eins."])


def test_word_offsets_count_the_words_before_each_sentence():
    line = " A b.  C d e. F."
    spans = [(1, 5), (7, 13), (14, 16)]
    assert word_offsets(line, spans) == [0, 2, 5]
    assert word_offsets("", []) == []


@pytest.mark.parametrize(
    "line",
    [
        "?!.... !!! ... ? .",
        ". . . .",
        "x\x00. \x01y. \x1b[31mred\x1b[0m. Done.",
        "\ufffd\ufffd. \ufffd. Gut \ufffd.",
        "Zeile\x0bmit\x0cSteuerzeichen. Und\x85mehr.",
        "A.B.C.D. E.F. g.h.",
    ],
)
def test_hostile_lines_stay_well_formed(splitter_installed, line):
    for language in ("en", "de", "xx"):
        spans = sentence_spans(line, language)
        assert_well_formed(line, spans)
        assert join_sentences(line, spans, [line[start:end] for start, end in spans]) == line.strip(" ")


def test_a_long_line_without_punctuation_is_one_sentence_quickly(splitter_installed):
    line = "wort " * 50_000 + "ende"
    start = time.perf_counter()
    assert sentence_spans(line, "de") == [(0, len(line))]
    assert time.perf_counter() - start < 1.0


def test_a_missing_extra_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencex", None)  # what `import sentencex` meets when not installed
    with pytest.raises(TfmError, match="pip install"):
        SentenceSplitter("en")
    with pytest.raises(TfmError):
        sentence_spans("Hello. World.", "en")


def test_the_install_hint_names_a_real_distribution_and_extra():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert f"pip install '{project['name']}[sentences]'" in MISSING_SPLITTER
    sentences = project["optional-dependencies"]["sentences"]
    assert [req.split(">=")[0] for req in sentences] == ["sentencex"]
    assert set(sentences) <= set(project["optional-dependencies"]["test"])  # so CI runs these tests
