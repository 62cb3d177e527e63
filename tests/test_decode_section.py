"""A recipe's [decode] section: checked like translate's options, carried by every checkpoint of the run
(and by `tfm average`), and used by translate, score -m and inspect-attention where no flag is given."""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT, letter_settings, run_cli
from safetensors import safe_open

TINY = REPO_ROOT / "recipes" / "tiny.toml"


def decode_defaults(path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata().get("decode_defaults", "{}"))


@pytest.fixture(scope="module")
def decoded_run(tmp_path_factory, letters):
    run = tmp_path_factory.mktemp("decode") / "run"
    options = letter_settings(letters, **{"train.max_steps": 4, "train.save_every": 2, "train.valid_every": 2,
                                          "decode.beam_size": 3, "decode.length_penalty": 1.5,
                                          "decode.max_len_a": 0.0, "decode.max_len_b": 4})
    result = run_cli(["train", TINY, "--run", run, "--threads", "1", "-q", *options])
    assert result.exit_code == 0, result.stderr
    return run


def test_every_checkpoint_and_the_average_carry_the_section(decoded_run, tmp_path):
    wanted = {"beam_size": 3, "length_penalty": 1.5, "max_len_a": 0.0, "max_len_b": 4}
    for name in ("checkpoint_00000002.safetensors", "checkpoint_last.safetensors", "checkpoint_best.safetensors"):
        assert decode_defaults(decoded_run / name) == wanted, name
    average = tmp_path / "average.safetensors"
    assert run_cli(["average", "--run", decoded_run, "--last", "2", "-o", average, "-q"]).exit_code == 0
    assert decode_defaults(average) == wanted
    assert json.loads((decoded_run / "config.json").read_text())["recipe"]["decode"] == wanted


def test_translate_uses_them_unless_a_flag_overrides_and_says_which(decoded_run, letters):
    model = decoded_run / "checkpoint_last.safetensors"
    source = letters["valid_src"].read_text()
    plain = run_cli(["translate", "-m", model], input=source)
    explicit = run_cli(["translate", "-m", model, "--beam", "3", "--length-penalty", "1.5", "--max-len-a", "0",
                        "--max-len-b", "4"], input=source)
    assert plain.exit_code == 0 and explicit.exit_code == 0, plain.stderr
    assert plain.stdout == explicit.stdout
    assert "decoding with beam_size 3, length_penalty 1.5, max_len_a 0.0, max_len_b 4" in plain.stderr
    greedy = run_cli(["translate", "-m", model, "--beam", "1", "--scores"], input=source)
    assert "decoding with beam_size 1, length_penalty 1.5" in greedy.stderr
    sampled = run_cli(["translate", "-m", model, "--sample"], input=source)
    assert sampled.exit_code == 0, sampled.stderr
    assert "decoding with length_penalty 1.5" in sampled.stderr and "beam_size" not in sampled.stderr  # no beam


def test_score_uses_the_length_penalty_and_inspect_the_beam(decoded_run, letters, tmp_path):
    model = decoded_run / "checkpoint_last.safetensors"
    text = tmp_path / "pair"
    text.write_text("a b c\n", encoding="utf-8")
    own = run_cli(["score", "-m", model, "--src", text, "--tgt", text])
    given = run_cli(["score", "-m", model, "--src", text, "--tgt", text, "--length-penalty", "1.5"])
    default = run_cli(["score", "-m", model, "--src", text, "--tgt", text, "--length-penalty", "0.6"])
    assert own.stdout == given.stdout and own.stdout != default.stdout


@pytest.mark.parametrize("key, value, message", [
    ("decode.beam_size", "0", "[decode]: beam size must be between 1 and 1024"),
    ("decode.length_penalty", "-1.0", "[decode]: length penalty alpha must be between 0 and 10.0"),
    ("decode.nbest", "2", "unknown key decode.nbest; valid keys in [decode]: beam_size, length_penalty"),
    ("decode.beam_size", "'five'", "decode.beam_size must be of type int"),
])
def test_a_bad_decode_section_is_one_line_naming_the_key(tmp_path, letters, key, value, message):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *letter_settings(letters, **{"train.max_steps": 1}),
                      "--set", f"{key}={value}"])
    assert result.exit_code == 1 and result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
