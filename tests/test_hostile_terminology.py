"""Hostile input for `tfm translate --constraints`, `--glossary` and `--split-sentences` (issue 71).

The rules of test_bad_input.py (whose checks are imported): either exit 0 with one output line per
input line and exactly the warning named (commands run with -q), or exit 1 with one `error:` line,
never a traceback, and no `-o` file or temp file left after an error. The tables below say what each
case must do, decided as a user of Sockeye's, fairseq's or DeepL's terminology features expects:
a line is never lost for a constraint it cannot meet (the line is translated without it, and a
warning names it); a glossary file that cannot be what the user meant is refused before anything is
translated, naming its line; options that cannot go together are refused up front. The random
model decodes with test_bad_input's limits (beam 1, at most 5 tokens) except where a case needs more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli, run_tfm_process
from test_bad_input import (
    DECODE_LIMITS,
    Expect,
    assert_error,
    assert_tolerated,
    error,
    ok,
)
from test_paragraphs import json_lines

pytestmark = pytest.mark.usefixtures("one_torch_thread")
pytest.importorskip("sentencex")

SOURCE = "the dog sees my cat"  # the synthetic source language: every word is in the vocabulary
# A 500-word phrase needs more target tokens than the tiny model has positions (128).
TOO_LONG_FOR_THE_MODEL = "need 500 target tokens but the model outputs at most 126; translated without them"


def translate_case(tmp_path: Path, checkpoint: Path, lines: list[str], flags: list[str]):
    """`tfm translate -q` on `lines` (a file) with `flags`, writing tmp_path/out/result.txt; (result, output)."""
    source = tmp_path / "input.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    output = tmp_path / "out" / "result.txt"
    output.parent.mkdir()
    result = run_cli(["translate", "-m", checkpoint, "-i", source, "-o", output, "-q", *DECODE_LIMITS, *flags])
    return result, output


def check(result, output: Path, expect: Expect) -> str:
    """The case's rule: its one error line and nothing left behind, or its lines and warning; the output text."""
    if expect.error is not None:
        assert_error(result, expect.error, output)
        return ""
    assert result.stdout == ""
    text = output.read_text(encoding="utf-8")
    assert_tolerated(result, expect, text)
    assert not list(output.parent.glob(".*.tmp"))
    return text


# ---------------------------------------------------------------- --constraints

# name -> (input line, extra flags, expected). Fields after the first TAB are target phrases.
CONSTRAINT_CASES: dict[str, tuple[str, list[str], Expect]] = {
    # An empty or blank field is no constraint (a trailing TAB from a spreadsheet export).
    "empty_field": (f"{SOURCE}\t", [], ok(1)),
    "blank_fields": (f"{SOURCE}\t  \t\t", [], ok(1)),
    # No source: an empty line; the phrases are reported unused.
    "empty_source": ("\tla\tkato", [], ok(1, "the source is empty: its 2 constraint(s) were not used")),
    # Longer than any output the model can make: raising --max-len-b cannot help, so the warning
    # names the model's limit, not the flags.
    "500_words": (f"{SOURCE}\t" + " ".join(["la"] * 500), [], ok(1, TOO_LONG_FOR_THE_MODEL)),
    "500_words_longer_limit": (f"{SOURCE}\t" + " ".join(["la"] * 500), ["--max-len-b", "1000"],
                               ok(1, TOO_LONG_FOR_THE_MODEL)),
    "characters_the_vocabulary_lacks": (f"{SOURCE}\t中文 😀\tla", [],
                                        ok(1, "constraint '中文 😀' has characters the model's vocabulary lacks")),
    # 50 unusable phrases: one warning for the line, not 50.
    "50_unusable_constraints": (f"{SOURCE}\t" + "\t".join(f"Q{i}" for i in range(50)), [],
                                ok(1, "constraints 'Q0', 'Q1', 'Q2', 'Q3', 'Q4' and 45 more have characters")),
    # 50 phrases whose tokens exceed this source's length limit (5 tokens here): the flags can help.
    "50_constraints_over_the_length_limit": (f"{SOURCE}\t" + "\t".join(["la"] * 50), [],
                                             ok(1, "need 50 target tokens but the length limit allows 5 (--max-len-a/--max-len-b)")),
    # Sampling cannot promise a phrase (fairseq and Sockeye constrain beam search only).
    "with_sample": (f"{SOURCE}\tla", ["--sample"], error("need beam search or greedy decoding, not --sample")),
    "with_nbest": (f"{SOURCE}\tla", ["--nbest", "2", "--beam", "2"], ok(1)),
    # The phrases belong to the whole line; the glossary's terms are found per sentence instead.
    "with_split_sentences": (f"{SOURCE}\tla", ["--split-sentences"], error("use --glossary")),
    "with_markup_html": ("the <b>dog</b> sees my cat\tla", ["--markup", "html"], ok(1)),
}


@pytest.mark.parametrize("case", list(CONSTRAINT_CASES))
def test_constraints(case, tmp_path, random_checkpoint):
    line, flags, expect = CONSTRAINT_CASES[case]
    result, output = translate_case(tmp_path, random_checkpoint, [line], ["--constraints", *flags])
    text = check(result, output, expect)
    if case == "with_nbest":
        assert text.count("\t") == 1  # two hypotheses, TAB-separated, on the line's one output line
    if case == "with_markup_html":
        assert "la" in text.split() or "<b>la</b>" in text


def target_words(synthetic: dict[str, Path]) -> list[str]:
    """The synthetic target language's words, sorted."""
    return sorted(set(synthetic["train.tgt"].read_text(encoding="utf-8").split()))


def unmet_constraints(checkpoint: Path, phrases: list[str], beam: int) -> list[str]:
    """The phrases the best translation of SOURCE lacks, with room for all of them (--max-len-b 300)."""
    result = run_cli(["translate", "-m", checkpoint, "--constraints", "--json", "-q", "--device", "cpu",
                      "--beam", str(beam), "--max-len-a", "0", "--max-len-b", "300"],
                     input="\t".join([SOURCE, *phrases]) + "\n")
    record = json_lines(result)[0]
    unmet = [c["phrase"] for c in record["constraints"] if not c["met"]]
    assert bool(unmet) == ("lacks constraint(s)" in result.stderr), result.stderr  # a miss is never silent
    return unmet


@pytest.mark.parametrize("beam", [1, 4])
def test_fifty_constraints_on_one_line_all_appear(beam, random_checkpoint, synthetic):
    # Many phrases share their first piece ("▁se" of "ses", "sep", "sekvas"): credited once per
    # phrase, that piece was worth more than finishing one, and the search repeated it to the limit.
    words = target_words(synthetic)
    distinct = [w for w in words if not any(o != w and (o.startswith(w) or w.startswith(o)) for o in words)]
    assert unmet_constraints(random_checkpoint, distinct, beam) == []
    assert unmet_constraints(random_checkpoint, words[:50], beam) == []


@pytest.mark.parametrize("beam", [1, 4])
def test_a_phrase_and_a_longer_word_it_begins_both_appear(beam, random_checkpoint, synthetic):
    # "birdo" and "birdoj": "▁birdo" + "j" makes "birdoj"; the "birdo" in it is no occurrence of
    # "birdo" (a phrase ends its word), so "birdo" must come again.
    words = target_words(synthetic)
    pairs = [phrase for w in words for phrase in (w, w + "j") if w + "j" in words][:16]
    assert unmet_constraints(random_checkpoint, pairs, beam) == []


def test_a_phrase_the_search_misses_is_named_in_a_warning(random_checkpoint, monkeypatch):
    # Whatever the reason a translation lacks a phrase, plain output would not show it: a warning does.
    monkeypatch.setattr("tfm_cli.inference.translation.ConstraintTracker", lambda *args: None)  # a search that ignores them
    result = run_cli(["translate", "-m", random_checkpoint, "--constraints", "-q", *DECODE_LIMITS],
                     input=f"{SOURCE}\tkonas\n")
    assert_tolerated(result, ok(1, "line 1: its translation lacks constraint(s) 'konas'"), result.stdout)


# ---------------------------------------------------------------- --glossary

# name -> (glossary file content: bytes, None = missing, "dir" = a directory; input line; expected).
GLOSSARY_CASES: dict[str, tuple[bytes | str | None, str, Expect]] = {
    "missing": (None, SOURCE, error("not found")),
    "directory": ("dir", SOURCE, error("is a directory; give the TSV file")),
    "empty": (b"", SOURCE, error("has no terms")),
    "only_blank_lines": (b"\n  \n\n", SOURCE, error("has no terms")),
    "binary": (bytes(range(256)) * 4, SOURCE, error("is not UTF-8 text")),
    # UTF-16 without a byte-order mark is "valid UTF-8" with NULs: read on, no term would ever match.
    "utf16_without_bom": ("dog\tla\n".encode("utf-16-le"), SOURCE, error("line 1 has a NUL byte")),
    "utf8_bom": ("\ufeffdog\tla\n".encode(), SOURCE, ok(1)),
    "crlf": (b"dog\tla\r\ncat\tkato\r\n", SOURCE, ok(1)),
    "without_tabs": (b"dog la\ncat kato\n", SOURCE, error("line 1: expected `source term<TAB>target term`, got 1 field(s)")),
    "three_columns": (b"dog\tla\tx\n", SOURCE, error("line 1: expected `source term<TAB>target term`, got 3 field(s)")),
    "duplicate_entries": (b"dog\tla\ncat\tkato\ndog\tla\n", SOURCE, ok(1)),  # the same pair twice: harmless
    "conflicting_duplicates": (b"dog\tla\ndog\tkato\n", SOURCE, error("line 2: 'dog' already has the target 'la' (line 1)")),
    "target_the_vocabulary_lacks": ("dog\t中文\n".encode(), SOURCE,
                                    ok(1, "constraint '中文' has characters the model's vocabulary lacks")),
    # U+00B5 MICRO SIGN in the term, U+03BC GREEK SMALL LETTER MU in the text: equal to a
    # case-insensitive regular expression, not lower-cased; the lookup used to raise KeyError.
    "micro_sign_and_mu": ("µm\tla\n".encode(), "the dog sees 5 μm", ok(1)),
    "regex_characters": (b"a.*b\tla\n(\tkato\n", "a.*b ( dog", ok(1)),
}


@pytest.mark.parametrize("case", list(GLOSSARY_CASES))
def test_glossary(case, tmp_path, random_checkpoint):
    content, line, expect = GLOSSARY_CASES[case]
    glossary = tmp_path / "terms.tsv"
    if content == "dir":
        glossary.mkdir()
    elif content is not None:
        glossary.write_bytes(content)
    result, output = translate_case(tmp_path, random_checkpoint, [line], ["--glossary", glossary])
    check(result, output, expect)


# A glossary beside the other options: one line, as with --constraints (sampling refused the same way).
GLOSSARY_COMBINATIONS: dict[str, tuple[list[str], str, Expect]] = {
    "with_sample": (["--sample"], SOURCE, error("need beam search or greedy decoding, not --sample")),
    "with_nbest": (["--nbest", "2", "--beam", "2"], SOURCE, ok(1)),
    "with_split_sentences": (["--split-sentences"], "The dog sees my cat. My dog sees the cat.", ok(1)),
    "with_markup_html": (["--markup", "html"], "the <b>dog</b> sees my cat", ok(1)),
    "with_constraints": (["--constraints"], f"{SOURCE}\tkato", ok(1)),
}


@pytest.mark.parametrize("case", list(GLOSSARY_COMBINATIONS))
def test_glossary_with_other_options(case, tmp_path, random_checkpoint):
    flags, line, expect = GLOSSARY_COMBINATIONS[case]
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tla\n", encoding="utf-8")
    result, output = translate_case(tmp_path, random_checkpoint, [line], ["--glossary", glossary, *flags])
    check(result, output, expect)


def test_a_glossary_of_100000_terms_is_used(tmp_path, random_checkpoint):
    # A real term base's size. One regular expression of 100,000 alternatives took ~8 s to compile on
    # a 2-core machine; terms are looked up now. No time is asserted: the terms must be found.
    glossary = tmp_path / "terms.tsv"
    rows = [f"term{i} word{i % 997}\tziel{i}" for i in range(100_000)]
    glossary.write_text("\n".join([*rows, "dog\tla", "New York\tkato", "cat\tfiŝo"]) + "\n", encoding="utf-8")
    lines = [SOURCE, "in New  York a Dog", "nothing here", "term99999 word99999 term5 word5"]
    result = run_cli(["translate", "-m", random_checkpoint, "--glossary", glossary, "--json", "-q", *DECODE_LIMITS,
                      "--max-len-b", "20"], input="\n".join(lines) + "\n")
    records = json_lines(result)
    assert [[c["phrase"] for c in r["constraints"]] for r in records] == [
        ["la", "fiŝo"], ["kato", "la"], [], ["ziel5"],  # "term99999 word99999" is no term (word99999 % 997)
    ]
    assert records[0]["constraints"] == [{"phrase": "la", "met": True}, {"phrase": "fiŝo", "met": True}]
    # "ziel5": a target term the model cannot spell (the synthetic target has no digits).
    assert result.stderr.splitlines() == [
        "warning: line 4: constraint 'ziel5' has characters the model's vocabulary lacks; it was not used"
    ]


def test_a_byte_order_mark_glossary_term_is_found_and_met(tmp_path, random_checkpoint):
    glossary = tmp_path / "terms.tsv"
    glossary.write_bytes("\ufeffdog\tla\n".encode())
    result = run_cli(["translate", "-m", random_checkpoint, "--glossary", glossary, "--json", "-q", *DECODE_LIMITS],
                     input=SOURCE + "\n")
    assert json_lines(result)[0]["constraints"] == [{"phrase": "la", "met": True}]


# ---------------------------------------------------------------- --split-sentences

TEN_THOUSAND_SENTENCES = " ".join(f"The dog sees cat number {i}." for i in range(10_000))
MIXED_SCRIPTS = "The dog runs. Собака бежит. 狗在跑。犬が走る。 الكلب يجري. 🐕 runs! Done."

# name -> (input line, extra flags, expected).
SPLIT_CASES: dict[str, tuple[str, list[str], Expect]] = {
    "10000_sentences": (TEN_THOUSAND_SENTENCES, [], ok(1)),  # each sentence fits: no truncation warning
    "no_punctuation": ("the dog sees my cat and the cat sees my dog " * 5, [], ok(1)),
    "only_punctuation": ("...!!!???...;;;,,,.", [], ok(1)),
    "spaced_punctuation": (". . . ! ? .", [], ok(1)),
    "mixed_scripts": (MIXED_SCRIPTS, [], ok(1)),
    # sentencex falls back to English rules for a code it does not know (sentence_splitting.splitter_language).
    "unknown_source_lang": ("The dog runs. The cat sleeps.", ["--source-lang", "xx-unknown"], ok(1)),
    "path_as_source_lang": ("The dog runs. The cat sleeps.", ["--source-lang", "../../etc/passwd"], ok(1)),
    "empty_source_lang": ("The dog runs. The cat sleeps.", ["--source-lang", ""], ok(1)),
    # One translation per line is what rejoining sentences gives.
    "with_nbest": ("The dog runs. The cat sleeps.", ["--nbest", "2", "--beam", "2"], error("without --nbest")),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split_sentences(case, tmp_path, random_checkpoint):
    line, flags, expect = SPLIT_CASES[case]
    result, output = translate_case(tmp_path, random_checkpoint, [line], ["--split-sentences", *flags])
    text = check(result, output, expect)
    if case == "10000_sentences":
        assert len(text.split()) >= 10_000  # every sentence translated (at least one word each)


def test_source_lang_without_split_sentences_is_named_as_ignored(tmp_path, random_checkpoint):
    result, output = translate_case(tmp_path, random_checkpoint, ["The dog runs."], ["--source-lang", "de"])
    check(result, output, ok(1, "ignored without --split-sentences: --source-lang"))


# Lines that take sentence splitting apart in every way; line separators other than LF (U+2028,
# VT, FF, NEL) are no line breaks for tfm, as for `wc -l`.
COLUMN_LINES = [
    "The dog runs. The cat sleeps.", "", "   ", "...", "no punctuation here", MIXED_SCRIPTS, "😀. 😀.",
    "The dog\u2028runs.\x0bA man.\x0cB man.\x85C. D\u2029E.", "a\tb. C d.", "The dog\u00a0runs. The\u3000cat sleeps.",
]


@pytest.mark.parametrize("flags, columns", [
    (["--scores"], 2), (["--alignment"], 2), (["--scores", "--alignment"], 3),
    (["--scores", "--alignment", "--glossary", "GLOSSARY"], 3),
], ids=["scores", "alignment", "scores-alignment", "scores-alignment-glossary"])
def test_split_sentences_columns_stay_per_input_line(flags, columns, tmp_path, random_checkpoint):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tla\n", encoding="utf-8")
    flags = [str(glossary) if flag == "GLOSSARY" else flag for flag in flags]
    result, output = translate_case(tmp_path, random_checkpoint, COLUMN_LINES, ["--split-sentences", *flags])
    text = check(result, output, ok(len(COLUMN_LINES)))
    rows = text.split("\n")[:-1]
    assert [row.count("\t") for row in rows] == [columns - 1] * len(COLUMN_LINES), rows
    assert rows[1] == rows[2] == "\t" * (columns - 1)  # blank lines: empty columns, in place
    if "--scores" in flags:
        assert all(float(row.split("\t")[1]) < 0 for row in rows if row.strip("\t"))


def test_everything_at_once_through_a_pipe(tmp_path, random_checkpoint):
    # A real process: the lines and their columns as a pipeline downstream sees them.
    glossary = tmp_path / "terms.tsv"
    glossary.write_bytes("\ufeffdog\tla\nNew York\tkato\n".encode())
    lines = [*COLUMN_LINES, TEN_THOUSAND_SENTENCES[:20_000], "in New York. A dog."]
    result = run_tfm_process(
        ["translate", "-m", random_checkpoint, "--split-sentences", "--glossary", glossary, "--scores",
         "--alignment", "--threads", "1", "-q", *DECODE_LIMITS],
        input="".join(line + "\n" for line in lines).encode(),
    )
    assert result.returncode == 0 and result.stderr == b"", result.stderr.decode()
    rows = result.stdout.decode().split("\n")
    assert len(rows) == len(lines) + 1 and rows[-1] == ""
    assert all(row.count("\t") == 2 for row in rows[:-1])
