"""`tfm translate --split-sentences` on the trained synthetic model: a paragraph translates exactly as its
sentences one by one, rejoined with its own spacing; alignments map back; long lines are named."""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_cli
from tfm_cli.inference.alignment import parse_pharaoh
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)

pytest.importorskip("sentencex")


@pytest.fixture(scope="module")
def model_path():
    return trained_checkpoint()


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """Held-out sources made into sentences sentencex splits: a capital letter and a full stop."""
    return [line[0].upper() + line[1:] + "." for line in held_out_sources()[:12]]


def json_lines(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(row) for row in result.stdout.splitlines()]


def test_a_paragraph_is_its_sentences_translated_one_by_one(model_path, sentences):
    paragraphs = [" ".join(sentences[0:3]), "  ".join(sentences[3:5]), sentences[5], " ".join(sentences[6:12])]
    alone = json_lines(run_cli(["translate", "-m", model_path, "--alignment", "--json", "-q"], input="\n".join(sentences) + "\n"))
    split = json_lines(run_cli(
        ["translate", "-m", model_path, "--split-sentences", "--alignment", "--json", "-q"], input="\n".join(paragraphs) + "\n",
    ))
    groups = [alone[0:3], alone[3:5], alone[5:6], alone[6:12]]
    gaps = [" ", "  ", " ", " "]
    for record, group, gap in zip(split, groups, gaps):
        assert record["translation"] == gap.join(r["translation"] for r in group)
        # Alignment pairs: each sentence's, shifted by the words before it on both sides.
        expected, src_offset, tgt_offset = [], 0, 0
        for r in group:
            expected += [(s + src_offset, t + tgt_offset) for s, t in parse_pharaoh(r["alignment"])]
            src_offset += len(r["source"].split())
            tgt_offset += len(r["translation"].split())
        assert parse_pharaoh(record["alignment"]) == expected
        assert record["raw_score"] == pytest.approx(sum(r["raw_score"] for r in group), abs=1e-4)
        # Every sentence's EOS is scored: the line's n is the sentences' n summed, and the score is
        # the raw score normalised at that n by the GNMT rule, with the alpha a sentence's own score shows.
        n = sum(r["nbest"][0]["n_scored_tokens"] for r in group)
        first = group[0]["nbest"][0]
        alpha = math.log(first["raw_score"] / first["score"]) / math.log((5 + first["n_scored_tokens"]) / 6)
        assert record["nbest"][0]["n_scored_tokens"] == n
        assert record["score"] == pytest.approx(record["raw_score"] / ((5 + n) / 6) ** alpha, rel=1e-5)


def test_one_output_line_per_input_line_on_hostile_input(model_path, sentences):
    lines = ["", "   ", sentences[0] + "   " + sentences[1], "...", "\u00a0", "a\tb. C d.", "\ufffd\ufffd. X.", sentences[2]]
    result = run_cli(["translate", "-m", model_path, "--split-sentences", "-q"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == len(lines)
    assert outputs[0] == outputs[1] == ""
    assert "   " in outputs[2]  # the original spacing between the sentences


def test_a_line_longer_than_the_positions_is_named_and_split_translates_it_whole(model_path, sentences):
    long_line = " ".join(sentences * 2)  # 24 sentences, far over the model's 128 positions
    lines = [sentences[0], long_line]
    plain = run_cli(["translate", "-m", model_path], input="\n".join(lines) + "\n")
    assert plain.exit_code == 0 and len(plain.stdout.splitlines()) == 2
    assert "line 2: its" in plain.stderr and "source tokens exceed the model's" in plain.stderr
    assert "--split-sentences" in plain.stderr
    split = run_cli(["translate", "-m", model_path, "--split-sentences"], input="\n".join(lines) + "\n")
    assert split.exit_code == 0 and "exceed" not in split.stderr
    alone = run_cli(["translate", "-m", model_path, "-q"], input="\n".join(sentences) + "\n").stdout.splitlines()
    assert split.stdout.splitlines()[1] == " ".join(alone * 2)


def test_split_sentences_refuses_nbest(model_path):
    result = run_cli(["translate", "-m", model_path, "--split-sentences", "--nbest", "2"], input="A b.\n")
    assert result.exit_code == 1 and "without --nbest" in result.stderr
