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


def test_tokenize_train_refuses_a_negative_sample_size(tmp_path, synthetic):
    result = run_cli(["tokenize", "train", synthetic["train.src"], "-o", tmp_path / "spm", "--vocab-size", "100",
                      "--max-sentences", "-5"])
    assert result.exit_code == 1
    assert result.stderr.count("error:") == 1 and "--max-sentences" in result.stderr and "got -5" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_decode_ids_are_ascii_digits(small_spm):
    result = run_cli(["tokenize", "decode", "-m", small_spm, "--ids"], input="5 ² 7\n")
    assert result.exit_code == 1
    assert "<stdin>:1: '²' is not a piece id" in result.stderr and "Traceback" not in result.stderr


def missing_bleu_tokenizer() -> str:
    """A sacrebleu BLEU tokenizer whose extra package is not installed here (skips if all are)."""
    from sacrebleu.metrics import BLEU

    for name in ("ja-mecab", "ko-mecab"):
        try:
            BLEU(tokenize=name)
        except (ImportError, RuntimeError):
            return name
    pytest.skip("sacrebleu's ja-mecab and ko-mecab packages are both installed")


@pytest.mark.parametrize("sentence_level", [False, True])
def test_score_names_the_package_a_bleu_tokenizer_needs(tmp_path, sentence_level):
    name = missing_bleu_tokenizer()
    reference = tmp_path / "ref.txt"
    reference.write_text("a b c\n", encoding="utf-8")
    result = run_cli(["score", "-r", reference, "--tokenize", name, *(["--sentence"] if sentence_level else [])],
                     input="a b c\n")
    assert result.exit_code == 1
    assert result.stderr.count("error:") == 1 and f"--tokenize {name} needs a package" in result.stderr
    assert "pip install sacrebleu[" in result.stderr and result.stdout == ""
