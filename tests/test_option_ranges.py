"""Option values that the parser accepts but tfm cannot use: one error line naming the option, exit 1."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT, letter_settings, run_cli

TRANSLATE = ["translate", "-b", "1", "--max-len-a", "0", "--max-len-b", "2"]


@pytest.mark.parametrize("options, message", [
    (["--alignment", "--align-head", "²"], "--align-head must be a head number or 'mean', got '²'"),
    (["--sample", "--temperature", "nan"], "temperature must be between 0.01 and 100.0"),
    (["--sample", "--temperature", "1e-300"], "temperature must be between 0.01 and 100.0"),
    (["--sample", "--seed", "12345678901234567890123"], "seed must be between 0 and 2**63 - 1"),
    (["--length-penalty", "inf"], "must be finite"),
    (["--device", "meta"], "--device meta: tfm runs on cpu or cuda"),
    (["--device", "mps"], "--device mps: tfm runs on cpu or cuda"),
])
def test_translate_refuses_unusable_values(random_checkpoint, options, message):
    result = run_cli([*TRANSLATE, "-m", random_checkpoint, *options], input="a b\n")
    assert result.exit_code == 1, result.stdout
    assert result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert result.stdout == ""


def test_inspect_attention_parses_heads_the_same_way(random_checkpoint):
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "a b", "--beam", "1", "--head", "²"])
    assert result.exit_code == 1
    assert "--head must be a head number or 'mean', got '²'" in result.stderr


def test_train_refuses_a_seed_torch_cannot_take(tmp_path, letters):
    options = letter_settings(letters, **{"train.seed": 10**20, "train.max_steps": 1})
    result = run_cli(["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", tmp_path / "run", *options])
    assert result.exit_code == 1
    assert "train.seed must be between 0 and 2**63 - 1" in result.stderr
    assert not (tmp_path / "run").exists()
