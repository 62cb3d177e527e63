"""`tfm translate --constraints / --glossary` on the briefly trained synthetic model: every satisfiable
phrase appears, the scores stay the model's own, batches do not matter, bad constraints cost no line."""

from __future__ import annotations

import json
import random

import pytest

from conftest import run_cli
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.text_preparation import TextOptions
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)

N_LINES = 40


@pytest.fixture(scope="module")
def model_path():
    return trained_checkpoint()


@pytest.fixture(scope="module")
def constrained_lines() -> list[str]:
    """Held-out sources, each with 1-2 phrases (one or two words) drawn from its reference."""
    references = (trained_checkpoint().parent / "test.tgt").read_text(encoding="utf-8").splitlines()
    rng = random.Random(0)
    lines = []
    for source, reference in list(zip(held_out_sources(), references))[:N_LINES]:
        words = reference.split()
        phrases = []
        for _ in range(rng.randint(1, 2)):
            start = rng.randrange(len(words))
            phrases.append(" ".join(words[start : start + rng.randint(1, 2)]))
        lines.append("\t".join([source, *phrases]))
    return lines


def translate(model_path, lines: list[str], buffer_size: int = 100, **decode) -> list:
    translator = Translator(
        load_model(model_path), DecodeConfig(**decode), BatchingConfig(buffer_size=buffer_size),
        text=TextOptions(constraint_fields=True),
    )
    results = []
    for start in range(0, len(lines), buffer_size):
        results += translator.translate_chunk(lines[start : start + buffer_size], start, TranslationStats())
    return results


@pytest.mark.parametrize("beam_size", [1, 4])
def test_every_phrase_appears_and_batches_do_not_matter(model_path, constrained_lines, beam_size):
    batched = translate(model_path, constrained_lines, beam_size=beam_size)
    alone = translate(model_path, constrained_lines, buffer_size=1, beam_size=beam_size)
    for line, result in zip(constrained_lines, batched):
        text = result.outputs[0].text
        assert all(phrase in text for phrase in line.split("\t")[1:]), (line, text)
        assert result.outputs[0].constraints_met == [True] * len(result.constraints)
        assert not result.warnings
    assert [(r.outputs[0].text, r.outputs[0].raw_score) for r in batched] == [
        (r.outputs[0].text, r.outputs[0].raw_score) for r in alone
    ]


def test_constrained_scores_are_the_models_own(model_path, constrained_lines, tmp_path):
    # The constraints choose among hypotheses; they never change a token's log-prob, so `score -m`
    # on the output gives the printed score.
    lines = constrained_lines[:12]
    result = run_cli(["translate", "-m", model_path, "--constraints", "--scores", "-b", "4", "-q"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    printed = [row.split("\t") for row in result.stdout.splitlines()]
    (tmp_path / "src").write_text("".join(line.split("\t")[0] + "\n" for line in lines), encoding="utf-8")
    (tmp_path / "hyp").write_text("".join(text + "\n" for text, _ in printed), encoding="utf-8")
    scored = run_cli([
        "score", "-m", model_path, "--src", tmp_path / "src", "--tgt", tmp_path / "hyp",
        "--normalize", "length", "--length-penalty", "0.6", "-q",
    ])
    assert scored.exit_code == 0, scored.stderr
    assert [float(s) for s in scored.stdout.split()] == pytest.approx([float(s) for _, s in printed], abs=1e-4)


def test_json_reports_each_constraint_and_nbest_and_alignment_work(model_path, constrained_lines):
    line = constrained_lines[3]
    result = run_cli(["translate", "-m", model_path, "--constraints", "--json", "--nbest", "2", "-b", "3", "-q"], input=line + "\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["source"] == line.split("\t")[0]
    assert [c["phrase"] for c in record["constraints"]] == line.split("\t")[1:]
    assert all(c["met"] for c in record["constraints"])
    assert len(record["nbest"]) == 2 and all("constraints_met" in h for h in record["nbest"])
    assert record["alignment"]  # --json always aligns


def test_unsatisfiable_and_unknown_constraints_are_reported_and_the_line_kept(model_path, test_lines=None):
    source = held_out_sources()[0]
    too_long = " ".join(["word"] * 80)
    lines = [f"{source}\t{too_long}", f"{source}\t\u4e2d\u6587", source, f"\t{source}", f"{source}\t"]
    result = run_cli(["translate", "-m", model_path, "--constraints", "--json"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(row) for row in result.stdout.splitlines()]
    assert len(records) == len(lines)
    assert "line 1: its constraints need" in result.stderr and "translated without them" in result.stderr
    assert "line 2: constraint '\u4e2d\u6587' has characters the model's vocabulary lacks" in result.stderr
    assert records[0]["translation"] and records[1]["translation"] and records[2]["constraints"] == []
    assert records[3]["translation"] == "" and "line 4: the source is empty" in result.stderr
    assert records[4]["constraints"] == []  # an empty field is no constraint


def test_glossary_terms_become_constraints(model_path, tmp_path):
    # Require, for the source's second word, a target word its translation does not have unconstrained.
    source = held_out_sources()[1]
    plain = run_cli(["translate", "-m", model_path, "-q"], input=source + "\n").stdout.split()
    references = (trained_checkpoint().parent / "test.tgt").read_text(encoding="utf-8").split()
    term = next(word for word in references if word not in plain and word.isalpha())
    glossary = tmp_path / "terms.tsv"
    glossary.write_text(f"{source.split()[1]}\t{term}\n", encoding="utf-8")
    result = run_cli(["translate", "-m", model_path, "--glossary", glossary, "--json", "-q"], input=source + "\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["constraints"] == [{"phrase": term, "met": True}] and term in record["translation"].split()


def test_constraints_refuse_sampling_and_a_split_line(model_path):
    with pytest.raises(TfmError, match="need beam search or greedy"):
        Translator(load_model(model_path), DecodeConfig(sample=True), BatchingConfig(), text=TextOptions(constraint_fields=True))
    result = run_cli(["translate", "-m", model_path, "--constraints", "--split-sentences"], input="a\n")
    assert result.exit_code == 1 and "use --glossary" in result.stderr


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_constraints_hold_in_every_precision(model_path, constrained_lines, dtype):
    lines = constrained_lines[:8]
    result = run_cli(["translate", "-m", model_path, "--constraints", "--dtype", dtype, "-b", "3", "--json"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(row) for row in result.stdout.splitlines()]
    assert len(records) == len(lines)
    assert all(c["met"] for record in records for c in record["constraints"])
