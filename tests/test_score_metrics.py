"""`tfm score` metrics equal sacrebleu's own API on the same input, exactly."""

from __future__ import annotations

import json

import pytest
from sacrebleu.metrics import BLEU, CHRF, TER

from conftest import run_cli


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, synthetic):
    """200 reference lines, a second reference, and a degraded 'system output' (Cased differently).

    The references are the synthetic test sources written as sentences: capitalised, ending in " .".
    """
    folder = tmp_path_factory.mktemp("score")
    refs = [f"{line[0].upper()}{line[1:]} ." for line in synthetic["test.src"].read_text(encoding="utf-8").splitlines()]
    assert len(refs) == 200
    # A second reference: the first with determiners swapped; hypotheses: words dropped and case changed.
    ref2 = [line.replace(" the ", " my ").replace("The ", "My ") for line in refs]
    hyps = []
    for i, line in enumerate(refs):
        words = line.split()
        if i % 3 == 0 and len(words) > 3:
            del words[2]
        if i % 4 == 0:
            words = [w.upper() if j == 0 else w for j, w in enumerate(words)]
        hyps.append(" ".join(words))
    paths = {"ref": folder / "ref.en", "ref2": folder / "ref2.en", "hyp": folder / "hyp.en"}
    for key, lines in (("ref", refs), ("ref2", ref2), ("hyp", hyps)):
        paths[key].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths, hyps, refs, ref2


def scores_by_name(stdout: str) -> dict[str, dict]:
    return {record["name"]: record for record in json.loads(stdout)}


def test_corpus_scores_equal_sacrebleu_api_with_two_references(corpus):
    paths, hyps, refs, ref2 = corpus
    result = run_cli(["score", "-r", paths["ref"], "-r", paths["ref2"], "-i", paths["hyp"],
                      "--metrics", "bleu,chrf,chrf++,ter", "--json"])
    assert result.exit_code == 0, result.stderr
    got = scores_by_name(result.stdout)
    for metric in (BLEU(), CHRF(), CHRF(word_order=2), TER()):
        expected = metric.corpus_score(hyps, [refs, ref2])
        assert got[expected.name]["score"] == expected.score
        assert got[expected.name]["signature"] == str(metric.get_signature())
        assert got[expected.name]["verbose_score"] == str(expected)
    assert set(got) == {"BLEU", "chrF2", "chrF2++", "TER"}
    assert "nrefs:2" in got["BLEU"]["signature"]


def test_tokenize_lowercase_and_ter_case_pass_through(corpus):
    paths, hyps, refs, _ = corpus
    result = run_cli(["score", "-r", paths["ref"], "-i", paths["hyp"], "--tokenize", "intl", "--lowercase",
                      "--ter-case-sensitive", "--json"])
    assert result.exit_code == 0, result.stderr
    got = scores_by_name(result.stdout)
    bleu, chrf, ter = BLEU(tokenize="intl", lowercase=True), CHRF(lowercase=True), TER(case_sensitive=True)
    assert got["BLEU"]["score"] == bleu.corpus_score(hyps, [refs]).score  # the signature needs a score first
    assert got["BLEU"]["signature"] == str(bleu.get_signature())
    assert "tok:intl" in got["BLEU"]["signature"] and "case:lc" in got["BLEU"]["signature"]
    assert got["chrF2"]["score"] == chrf.corpus_score(hyps, [refs]).score
    assert got["TER"]["score"] == ter.corpus_score(hyps, [refs]).score
    assert "case:mixed" in got["TER"]["signature"]
    # Lowercasing matters on this data, so the pass-through is really exercised.
    assert got["BLEU"]["score"] != BLEU().corpus_score(hyps, [refs]).score


def test_plain_text_output_when_piped_is_sacrebleus_text_form(corpus):
    paths, hyps, refs, _ = corpus
    result = run_cli(["score", "-r", paths["ref"], "--metrics", "bleu,ter"], input=paths["hyp"].read_bytes())
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    bleu, ter = BLEU(), TER()
    bleu_score, ter_score = bleu.corpus_score(hyps, [refs]), ter.corpus_score(hyps, [refs])
    assert lines[0] == f"BLEU|{bleu.get_signature()} = {str(bleu_score).split(' = ', 1)[1]}"
    assert lines[1] == f"TER|{ter.get_signature()} = {ter_score.score:.2f}"
    assert len(lines) == 2 and "\x1b[" not in result.stdout


def test_sentence_scores_equal_sacrebleu_sentence_score(corpus):
    paths, hyps, refs, ref2 = corpus
    result = run_cli(["score", "-r", paths["ref"], "-r", paths["ref2"], "-i", paths["hyp"],
                      "--metrics", "bleu,chrf++,ter", "--sentence", "--json"])
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == len(hyps)
    # sacrebleu's CLI also switches effective order on for sentence-level BLEU.
    bleu, chrf, ter = BLEU(effective_order=True), CHRF(word_order=2), TER()
    for row, hyp, r1, r2 in zip(rows, hyps, refs, ref2):
        assert row["BLEU"] == bleu.sentence_score(hyp, [r1, r2]).score
        assert row["chrF2++"] == chrf.sentence_score(hyp, [r1, r2]).score
        assert row["TER"] == ter.sentence_score(hyp, [r1, r2]).score
    assert "eff:yes" in result.stderr and "nrefs:2" in result.stderr


def test_sentence_scores_plain_are_tab_separated_one_line_per_hypothesis(corpus):
    paths, hyps, refs, _ = corpus
    result = run_cli(["score", "-r", paths["ref"], "-i", paths["hyp"], "--metrics", "chrf", "--sentence"])
    assert result.exit_code == 0, result.stderr
    values = [float(line) for line in result.stdout.splitlines()]
    expected = [round(CHRF().sentence_score(h, [r]).score, 4) for h, r in zip(hyps, refs)]
    assert values == expected


def test_different_line_counts_name_both_counts(corpus, tmp_path):
    paths, *_ = corpus
    short = tmp_path / "short.en"
    short.write_text("one line\ntwo lines\n", encoding="utf-8")
    result = run_cli(["score", "-r", paths["ref"], "-i", short])
    assert result.exit_code == 1
    assert "2 lines" in result.stderr and "200" in result.stderr and str(short) in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["--metrics", "bleu,meteor"], "unknown metric 'meteor'"),
        (["--tokenize", "nope"], "unknown BLEU tokenizer 'nope'"),
        (["--src", "x"], "--src/--tgt are for model scoring"),
    ],
)
def test_bad_options_are_one_line_errors(corpus, args, message):
    paths, *_ = corpus
    result = run_cli(["score", "-r", paths["ref"], "-i", paths["hyp"], *args])
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_no_reference_is_an_error():
    result = run_cli(["score"], input="a\n")
    assert result.exit_code == 1 and "no reference" in result.stderr


def test_empty_hypotheses_are_an_error_not_a_traceback(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    for extra in ([], ["--sentence"]):
        result = run_cli(["score", "-r", empty, "-i", empty, *extra])
        assert result.exit_code == 1 and "no hypotheses to score" in result.stderr


def test_a_terminal_gets_a_table(corpus):
    import os
    import subprocess
    import sys

    paths, *_ = corpus
    primary, secondary = os.openpty()
    try:
        process = subprocess.run(
            [sys.executable, "-m", "tfm_cli", "score", "-r", paths["ref"], "-i", paths["hyp"], "--metrics", "bleu"],
            stdout=secondary, stderr=subprocess.PIPE, timeout=120, env={**os.environ, "COLUMNS": "200"},
        )
        os.close(secondary)
        secondary = None
        output = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(primary)
        if secondary is not None:
            os.close(secondary)
    assert process.returncode == 0, process.stderr
    text = output.decode("utf-8")
    assert "metric" in text and "signature" in text and "┃" in text and "nrefs:1|case:mixed" in text


def test_metric_scoring_does_not_import_torch(corpus):
    import subprocess
    import sys

    paths, *_ = corpus
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from tfm_cli.cli import app\n"
        f"result = CliRunner().invoke(app, ['score', '-r', {str(paths['ref'])!r}, '-i', {str(paths['hyp'])!r}])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert 'torch' not in sys.modules, 'tfm score -r imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
