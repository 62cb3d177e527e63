"""Decoding settings resolved once (inference/settings.py): flag > the checkpoint's decode_defaults > DecodeConfig's
default, the same for translate, score -m and inspect-attention, and --help says where a default comes from."""

from __future__ import annotations

import json

import pytest
from conftest import rewritten_checkpoint, run_cli

from tfm_cli.config import DecodeConfig
from tfm_cli.inference.settings import decode_default, resolve_decode

LINES = 6


def test_a_flag_beats_the_model_which_beats_the_built_in_default():
    model = {"beam_size": 3, "length_penalty": 2.0, "banned_ids": (7,)}
    decode = resolve_decode({"beam_size": 2, "length_penalty": None, "max_len_b": None, "nbest": 2}, model)
    assert decode == DecodeConfig(beam_size=2, length_penalty=2.0, banned_ids=(7,), nbest=2)
    assert resolve_decode({}, {}) == DecodeConfig()
    assert decode_default("length_penalty") == DecodeConfig().length_penalty


def test_settings_that_do_not_fit_together_are_refused():
    from tfm_cli.errors import TfmError

    with pytest.raises(TfmError, match="nbest must be between 1 and the beam size \\(2\\)"):
        resolve_decode({"nbest": 3}, {"beam_size": 2})


@pytest.fixture(scope="module")
def tuned(random_checkpoint, synthetic, tmp_path_factory):
    """The random model with non-default decoding settings in its checkpoint: a strong length penalty, a
    tight length limit and, banned, the first token the plain model's beam search puts out; and test lines."""
    from tfm_cli.checkpoints.format import load_model

    lines = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:LINES]
    plain = run_cli(["translate", "-m", random_checkpoint, "--json", "-q"], input="\n".join(lines) + "\n")
    assert plain.exit_code == 0, plain.stderr
    first_piece = json.loads(plain.stdout.splitlines()[0])["tokens"][0]
    banned = load_model(random_checkpoint).tgt_tokenizer.piece_to_id(first_piece)
    settings = {"beam_size": 3, "length_penalty": 2.0, "max_len_a": 0.0, "max_len_b": 3, "banned_ids": [banned]}
    path = rewritten_checkpoint(random_checkpoint, tmp_path_factory.mktemp("tuned") / "model.safetensors",
                                metadata=lambda meta: meta.update(decode_defaults=json.dumps(settings)))
    return path, lines, plain.stdout.splitlines()


def inspected_translation(model, line: str, *options: str) -> str:
    result = run_cli(["inspect-attention", "-m", model, line, "--format", "json", "-q", *options])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["target"]


@pytest.mark.parametrize("options", [(), ("--beam", "1")], ids=["model-beam", "beam-1"])
def test_inspect_attention_shows_the_translation_translate_prints(tuned, options):
    model, lines, _ = tuned
    translated = run_cli(["translate", "-m", model, "-q", *options], input="\n".join(lines) + "\n")
    assert translated.exit_code == 0, translated.stderr
    printed = translated.stdout.splitlines()
    assert len(printed) == len(lines)
    assert [inspected_translation(model, line, *options) for line in lines] == printed


def test_the_tuned_settings_change_the_translations(tuned):
    # Otherwise the test above could not tell inspect-attention's search from a plain beam search.
    model, lines, plain_json = tuned
    plain = [json.loads(record)["translation"] for record in plain_json]
    translated = run_cli(["translate", "-m", model, "-q"], input="\n".join(lines) + "\n").stdout.splitlines()
    assert translated != plain
    assert all(len(record["tokens"]) <= 3 for record in
               map(json.loads, run_cli(["translate", "-m", model, "-q", "--json"],
                                       input="\n".join(lines) + "\n").stdout.splitlines()))


def test_score_and_inspect_attention_say_on_stderr_which_model_default_they_use(tuned, tmp_path):
    model, lines, _ = tuned
    (tmp_path / "src").write_text(lines[0] + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("a b\n", encoding="utf-8")
    scored = run_cli(["score", "-m", model, "--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt")])
    assert scored.exit_code == 0, scored.stderr
    assert "length_penalty 2.0 (the model's default" in scored.stderr
    flagged = run_cli(["score", "-m", model, "--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt"), "--alpha", "1.0"])
    assert "the model's default" not in flagged.stderr
    inspected = run_cli(["inspect-attention", "-m", model, lines[0], "--format", "json"])
    assert inspected.exit_code == 0, inspected.stderr
    assert "beam_size 3 (the model's default" in inspected.stderr


@pytest.mark.parametrize("path, option, field", [
    (("translate",), "--beam", "beam_size"),
    (("translate",), "--length-penalty", "length_penalty"),
    (("translate",), "--max-len-a", "max_len_a"),
    (("translate",), "--max-len-b", "max_len_b"),
    (("score",), "--length-penalty", "length_penalty"),
    (("inspect-attention",), "--beam", "beam_size"),
])
def test_help_says_the_default_is_the_models_else_the_built_in_one(path, option, field, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one row per option: nothing wraps
    result = run_cli([*path, "--help"])
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if f"{option} " in line or f"{option}," in line)
    assert f"default: the model's own, else {decode_default(field)}" in row, row
    assert "[default:" not in row, row
