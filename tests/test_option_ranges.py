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
    (["--length-penalty", "inf"], "length penalty alpha must be between 0 and 10.0, got inf"),
    (["--length-penalty", "1e308"], "length penalty alpha must be between 0 and 10.0"),
    (["--beam", "99999999999999999999"], "beam size must be between 1 and 1024"),
    (["--max-len-b", "99999999999999999999"], "max_len_b must be between 0 and 65536"),
    (["--threads", "99999999999999999999"], "--threads must be between 0 (the default) and 1024"),
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
    assert "train.seed must be between" in result.stderr and "2**63 - 1" in result.stderr
    assert not (tmp_path / "run").exists()


def test_train_runs_with_the_largest_seed_it_accepts(tmp_path, letters):
    # The seeds derived from it (each epoch's order) once overflowed torch's 64 bits: a traceback after preparation.
    options = letter_settings(letters, **{"train.seed": 2**63 - 1, "train.max_steps": 2, "train.max_tokens": 256})
    result = run_cli(["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", tmp_path / "run", "--threads", "1", *options])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "run" / "checkpoint_last.safetensors").is_file()


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


@pytest.mark.parametrize("options, message", [
    (["--length-penalty", "nan"], "--length-penalty must be between 0 and 10.0, got nan"),
    (["--length-penalty", "inf"], "--length-penalty must be between 0 and 10.0, got inf"),
    (["--threads", "99999999999999999999"], "--threads must be between 0"),
])
def test_score_model_refuses_unusable_values(random_checkpoint, tmp_path, options, message):
    text = tmp_path / "text"
    text.write_text("a b\n", encoding="utf-8")
    result = run_cli(["score", "-m", random_checkpoint, "--src", text, "--tgt", text, *options])
    assert result.exit_code == 1 and result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("options, message", [
    (["--beam", "99999999999999999999"], "beam size must be between 1 and 1024"),
    (["--walkthrough", "--dims", "0"], "--dims must be at least 1, got 0"),
])
def test_inspect_attention_refuses_unusable_values(random_checkpoint, options, message):
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "a b", *options])
    assert result.exit_code == 1 and message in result.stderr, result.stderr


def test_inspect_attention_refuses_an_empty_sentence_and_a_model_beside_the_seed_example(random_checkpoint):
    empty = run_cli(["inspect-attention", "-m", random_checkpoint, " "])
    assert empty.exit_code == 1 and "the SENTENCE is empty" in empty.stderr
    seed = run_cli(["inspect-attention", "--walkthrough", "--seed-example", "-m", random_checkpoint])
    assert seed.exit_code == 1 and "it takes no -m model or SENTENCE" in seed.stderr


@pytest.mark.parametrize("key, value, message", [
    ("train.adam_eps", "nan", "train.adam_eps must be a finite number, got nan"),
    ("train.max_minutes", "nan", "train.max_minutes must be a finite number"),
    ("train.dist_timeout", "inf", "train.dist_timeout must be a finite number"),
    ("train.dist_timeout", "1e300", "train.dist_timeout must be between 0 and"),
    ("train.clip_norm", "nan", "train.clip_norm must be a finite number"),
    ("train.valid_beam_size", "99999999999999999999", "must be between -2**63 and 2**63 - 1"),
    ("train.valid_beam_size", "5000", "train.valid_beam_size must be between 1 and 1024"),
    ("train.valid_max_len_b", "100000", "train.valid_max_len_b must be between 0 and 65536"),
    ("data.train_src", "", "data.train_src is empty"),
])
def test_train_refuses_unusable_recipe_values(tmp_path, letters, key, value, message):
    options = letter_settings(letters, **{"train.max_steps": 1})
    result = run_cli(["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", tmp_path / "run", *options,
                      "--set", f"{key}={value}"])
    assert result.exit_code == 1, result.stderr
    assert result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_bleu_tokenizer_that_must_download_fails_in_one_line_offline(tmp_path, monkeypatch):
    # flores200 downloads a sentencepiece model on first use; with no network that is one error line.
    monkeypatch.setenv("SACREBLEU", str(tmp_path / "sacrebleu-home"))  # no cached model
    reference = tmp_path / "ref.txt"
    reference.write_text("a b c\n", encoding="utf-8")
    result = run_cli(["score", "-r", reference, "--tokenize", "flores200"], input="a b c\n")
    assert "Traceback" not in result.stderr
    if result.exit_code != 0:  # offline, as CI is
        assert result.exit_code == 1 and result.stderr.count("error:") == 1
        assert "--tokenize flores200 downloads its sentencepiece model on first use, which failed" in result.stderr


def test_a_cpu_index_is_refused_like_any_other_device(random_checkpoint):
    result = run_cli([*TRANSLATE, "-m", random_checkpoint, "--device", "cpu:99"], input="a b\n")
    assert result.exit_code == 1 and "--device cpu:99: tfm runs on cpu or cuda[:N]" in result.stderr


def test_align_head_counts_from_the_end_as_inspect_attention_head_does(random_checkpoint):
    from tfm_cli.checkpoints.format import read_checkpoint

    n_heads = read_checkpoint(random_checkpoint).config.n_heads
    last, negative = (run_cli([*TRANSLATE, "-m", random_checkpoint, "--alignment", "--align-head", head], input="a b c\n")
                      for head in (str(n_heads - 1), "-1"))
    assert last.exit_code == 0 and negative.exit_code == 0, negative.stderr
    assert negative.stdout == last.stdout
    beyond = run_cli([*TRANSLATE, "-m", random_checkpoint, "--alignment", "--align-head", str(-n_heads - 1)], input="a\n")
    assert beyond.exit_code == 1 and "does not exist" in beyond.stderr


def test_names_with_colons_are_printed_as_they_are(tmp_path, random_checkpoint):
    # rich turns ":x:" into an emoji unless told not to; a file name must come out unchanged.
    name = tmp_path / "notes:x:draft.txt"
    result = run_cli([*TRANSLATE, "-m", random_checkpoint, "-i", name])
    assert result.exit_code == 1 and f"{name}: no such file" in result.stderr, result.stderr
