"""The glossary's term matching: whole words, longest first, case as a term base expects, clear errors."""

from __future__ import annotations

import pytest

from tfm_cli.errors import TfmError
from tfm_cli.inference.glossary import Glossary, GlossaryEntry


def glossary(*pairs: tuple[str, str]) -> Glossary:
    return Glossary([GlossaryEntry(source, target) for source, target in pairs])


def test_whole_words_only():
    terms = glossary(("cat", "Katze"))
    assert terms.constraints("A cat sat on the category.") == ["Katze"]
    assert terms.constraints("Cats and bobcat.") == []
    assert terms.constraints("cat, cat.") == ["Katze", "Katze"]  # every occurrence


def test_the_longest_term_wins_and_matches_do_not_overlap():
    terms = glossary(("York", "York"), ("New York", "New York City"), ("New", "neu"))
    assert terms.matches("New York is new.") == [
        (0, 8, GlossaryEntry("New York", "New York City")),
    ]
    assert terms.constraints("I love New  York and York.") == ["New York City", "York"]  # spaces: any run


def test_lower_case_terms_ignore_case_and_others_do_not():
    terms = glossary(("dog", "Hund"), ("Apple", "Apple Inc."), ("EU", "UE"))
    assert terms.constraints("Dog bites DOG; dog.") == ["Hund", "Hund", "Hund"]
    assert terms.constraints("an apple from the eu") == []
    assert terms.constraints("Apple and the EU") == ["Apple Inc.", "UE"]


def test_terms_with_punctuation_keep_their_boundaries():
    terms = glossary(("C++", "C++"), ("e.g.", "z. B."))
    assert terms.constraints("C++ and C, e.g. this") == ["C++", "z. B."]
    assert terms.constraints("MC++ or C++, e.g.,") == ["C++", "z. B."]


def test_load_reads_tsv_and_names_bad_lines(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("dog\tHund\n\nNew York\tNew York City\n", encoding="utf-8")
    assert Glossary.load(path).constraints("A dog in New York") == ["Hund", "New York City"]
    path.write_text("dog\tHund\ncat\n", encoding="utf-8")
    with pytest.raises(TfmError, match=r"terms.tsv line 2: expected `source term<TAB>target term`, got 1 field"):
        Glossary.load(path)
    path.write_text("dog\tHund\ndog\tRüde\n", encoding="utf-8")
    with pytest.raises(TfmError, match=r"line 2: 'dog' already has the target 'Hund' \(line 1\)"):
        Glossary.load(path)
    path.write_text("dog\t \n", encoding="utf-8")
    with pytest.raises(TfmError, match="with an empty one"):
        Glossary.load(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(TfmError, match="not UTF-8"):
        Glossary.load(path)
    with pytest.raises(TfmError, match="not found"):
        Glossary.load(tmp_path / "missing.tsv")


def test_a_byte_order_mark_is_no_part_of_the_first_term(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_bytes("\ufeffdog\tHund\ncat\tKatze\n".encode("utf-8"))
    assert Glossary.load(path).constraints("A dog and a cat") == ["Hund", "Katze"]
