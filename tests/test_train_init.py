"""`tfm train --init MODEL`: fine-tuning a checkpoint on a new domain, the recipe checked against it, exact resume.

Two synthetic domains share one 20-piece tokenizer: A reverses sequences of the letters a-d, B of
e-h. A base model trained on A only (300 updates) has never seen B's letters; 200 updates on B from
its weights make it translate B. Measured on 100 held-out B pairs (greedy, sacreBLEU): base 0.0, after
fine-tuning 78.8-82.9 (train.seed 1-4 for both runs), so the test asks for a gain of at least 40.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import sacrebleu
import torch
from safetensors.torch import load_file

from conftest import REPO_ROOT, run_cli
from tfm_cli.checkpoints.format import read_checkpoint

TINY = REPO_ROOT / "recipes" / "tiny.toml"
DOMAIN_A, DOMAIN_B = "abcd", "efgh"
# The base model: tiny.toml with a 1+1-layer pre-norm model that learns reversal in a few hundred updates.
BASE_SETTINGS = {
    "model.d_model": 64, "model.d_ff": 128, "model.n_enc_layers": 1, "model.n_dec_layers": 1,
    "model.norm_first": "true", "model.dropout": 0.0, "train.max_tokens": 1024, "train.lr": 0.002,
    "train.warmup_steps": 50, "train.label_smoothing": 0, "train.max_steps": 300, "train.valid_every": 10000,
    "train.save_every": 10000, "train.log_every": 100,
}
# A fine-tuning recipe names its data and training settings only: model and tokenizers come from --init.
FINE_TUNE_RECIPE = """\
[data]
train_src = "b_train.src"
train_tgt = "b_train.tgt"
valid_src = "b_valid.src"
valid_tgt = "b_valid.tgt"
max_length = 64

[train]
max_tokens = 1024
lr = 0.002
warmup_steps = 20
label_smoothing = 0.0
clip_norm = 1.0
max_steps = 200
valid_every = 10000
save_every = 10000
log_every = 100
"""


def write_domain(folder: Path, name: str, alphabet: str, count: int, seed: int) -> tuple[Path, Path]:
    """`count` pairs 'c a d' -> 'd a c' (3 to 7 letters of `alphabet`) as NAME.src / NAME.tgt; returns both paths."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(alphabet) for _ in range(rng.randint(3, 7))) for _ in range(count)]
    src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tgt.write_text("".join(" ".join(reversed(line.split())) + "\n" for line in lines), encoding="utf-8")
    return src, tgt


def set_options(settings: dict[str, object]) -> list[str]:
    """`--set key=value` for every item of `settings`."""
    return [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]


def train(*args: object):
    """`tfm train ARGS --threads 1` in-process."""
    return run_cli(["train", *args, "--threads", "1"])


def error_lines(stderr: str) -> list[str]:
    """The `error:` lines of stderr."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def model_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint (the embedded tokenizer bytes left out)."""
    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


def greedy_bleu(checkpoint: Path, pair: tuple[Path, Path]) -> float:
    """sacreBLEU of `tfm translate --beam 1` on pair's source against its target."""
    result = run_cli(["translate", "-m", checkpoint, "-i", pair[0], "--beam", "1", "--threads", "1", "-q"])
    assert result.exit_code == 0, result.stderr
    references = pair[1].read_text(encoding="utf-8").splitlines()
    return sacrebleu.corpus_bleu(result.stdout.splitlines(), [references]).score


@pytest.fixture(scope="module")
def domains(tmp_path_factory) -> dict[str, object]:
    """Both domains' data, a tokenizer trained on both, the fine-tuning recipe, and the base model trained on A."""
    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    folder = tmp_path_factory.mktemp("domains")
    a_train, a_valid = write_domain(folder, "a_train", DOMAIN_A, 1000, 1), write_domain(folder, "a_valid", DOMAIN_A, 30, 2)
    b_train = write_domain(folder, "b_train", DOMAIN_B, 1000, 3)
    write_domain(folder, "b_valid", DOMAIN_B, 30, 4)
    b_test = write_domain(folder, "b_test", DOMAIN_B, 100, 5)
    # One tokenizer for both domains: a model trained on A alone has pieces for B's letters it never saw.
    spm = train_sentencepiece([a_train[0], b_train[0]], folder / "spm", TokenizerTrainConfig(vocab_size=20))
    recipe = folder / "fine_tune.toml"
    recipe.write_text(FINE_TUNE_RECIPE, encoding="utf-8")
    data = {"data.train_src": a_train[0], "data.train_tgt": a_train[1], "data.valid_src": a_valid[0],
            "data.valid_tgt": a_valid[1], "tokenizer.src_model": spm}
    result = train(TINY, "--run", folder / "base", *set_options({**data, **BASE_SETTINGS}))
    assert result.exit_code == 0, result.stderr
    return {"folder": folder, "spm": spm, "recipe": recipe, "b_test": b_test,
            "base": folder / "base" / "checkpoint_last.safetensors"}


def test_fine_tuning_on_a_new_domain_gains_bleu_there(tmp_path, domains):
    before = greedy_bleu(domains["base"], domains["b_test"])
    result = train(domains["recipe"], "--init", domains["base"], "--run", tmp_path / "tuned")
    assert result.exit_code == 0, result.stderr
    assert "initialised from" in result.stderr and result.stdout == ""
    after = greedy_bleu(tmp_path / "tuned" / "checkpoint_last.safetensors", domains["b_test"])
    assert after >= before + 40, (before, after)


def test_an_init_run_starts_from_the_checkpoint_and_records_it(tmp_path, domains):
    base = domains["base"]
    # Keys equal to the checkpoint's are no contradiction; the dropout rates are the run's own.
    agreeing = {"model.d_model": 64, "model.share_embeddings": "true", "tokenizer.src_model": domains["spm"],
                "tokenizer.vocab_size": 500, "model.dropout": 0.3, "model.attention_dropout": 0.1}
    # A peak learning rate of 1e-12 leaves the weights where they started (to float32 rounding) after one update.
    one_update = {"train.max_steps": 1, "train.lr": 1e-12, "train.warmup_steps": 1}
    result = train(domains["recipe"], "--init", base, "--run", tmp_path / "run", *set_options({**agreeing, **one_update}))
    assert result.exit_code == 0, result.stderr

    tuned = read_checkpoint(tmp_path / "run" / "checkpoint_last.safetensors")
    original = read_checkpoint(base)
    assert tuned.config.dropout == 0.3 and tuned.config.attention_dropout == 0.1
    assert tuned.config == dataclasses.replace(original.config, dropout=0.3, attention_dropout=0.1)
    assert tuned.src_tokenizer_bytes == original.src_tokenizer_bytes
    assert tuned.tgt_tokenizer_bytes == original.tgt_tokenizer_bytes
    assert tuned.weights.keys() == original.weights.keys()
    assert all(torch.allclose(tuned.weights[k], original.weights[k], rtol=0, atol=1e-6) for k in tuned.weights)
    # The step counter and the optimizer start fresh: step 1, Adam at its first step.
    assert tuned.provenance["step"] == 1
    state = load_file(str(tmp_path / "run" / "train_state.safetensors"))
    assert {float(v) for k, v in state.items() if k.startswith("optimizer.") and k.endswith(".step")} == {1.0}
    # Provenance: the checkpoint that was MODEL, by absolute path and the SHA-256 of its bytes.
    expected = {"path": str(base.absolute()), "sha256": hashlib.sha256(base.read_bytes()).hexdigest()}
    assert tuned.provenance["init"] == expected
    assert json.loads((tmp_path / "run" / "config.json").read_text())["init"] == expected
    # The run records the model it trains: the checkpoint's shape, and no tokenizer files or training settings.
    recipe = tuned.provenance["recipe"]
    assert recipe["model"]["d_model"] == 64 and recipe["model"]["n_enc_layers"] == 1
    assert recipe["tokenizer"] == {"src_model": "", "tgt_model": "", "joint": True}


@pytest.mark.parametrize("settings, message", [
    ({}, "--init: model.d_model is 32 in the recipe but 64 in"),  # tiny.toml's own [model] section
    ({"model.norm_first": "false"}, "--init: model.norm_first is False in the recipe but True in"),
    ({"model.src_vocab_size": 8000}, "--init: model.src_vocab_size is 8000 in the recipe but 20 in"),
    ({"tokenizer.joint": "false"}, "--init: tokenizer.joint is False in the recipe but True in"),
    ({"tokenizer.src_model": "OTHER_SPM"}, "--init: tokenizer.src_model is"),
])
def test_a_recipe_that_contradicts_the_checkpoint_is_one_error_line(tmp_path, domains, settings, message):
    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    if settings.get("tokenizer.src_model") == "OTHER_SPM":
        other = write_domain(tmp_path, "other", "abcdefghij", 200, 6)
        other_spm = train_sentencepiece([other[0]], tmp_path / "other", TokenizerTrainConfig(vocab_size=24))
        settings = {"tokenizer.src_model": other_spm}
    recipe = TINY if not settings else domains["recipe"]
    result = train(recipe, "--init", domains["base"], "--run", tmp_path / "run", *set_options(settings))
    assert result.exit_code == 1
    assert len(error_lines(result.stderr)) == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_a_missing_or_bad_init_checkpoint_is_one_error_line(tmp_path, domains):
    not_a_checkpoint = tmp_path / "notes.safetensors"
    not_a_checkpoint.write_text("not a checkpoint\n", encoding="utf-8")
    cases = [
        (tmp_path / "missing.safetensors", "no such file"),
        (not_a_checkpoint, "not a safetensors file"),
        (domains["spm"], "a sentencepiece model, not a tfm checkpoint"),
    ]
    for path, fragment in cases:
        result = train(domains["recipe"], "--init", path, "--run", tmp_path / "run")
        lines = error_lines(result.stderr)
        assert result.exit_code == 1 and len(lines) == 1, result.stderr
        assert lines[0].startswith("error: --init: ") and fragment in lines[0], lines
        assert not (tmp_path / "run").exists()


def test_init_with_resume_is_refused(tmp_path, domains):
    result = train(domains["recipe"], "--init", domains["base"], "--run", tmp_path / "run", "--resume")
    assert result.exit_code == 1 and len(error_lines(result.stderr)) == 1
    assert "--init and --resume cannot be combined" in result.stderr


def test_resuming_an_init_run_is_bit_exact_and_needs_no_model(tmp_path, domains):
    # Dropout on (so the RNG state matters), 2 batches per update, the resume point mid-epoch.
    settings = set_options({"model.dropout": 0.1, "model.attention_dropout": 0.1, "train.max_tokens": 256,
                            "train.update_freq": 2, "train.warmup_steps": 5, "train.valid_every": 5})
    model = tmp_path / "model.safetensors"
    shutil.copyfile(domains["base"], model)
    straight = train(domains["recipe"], "--init", model, "--run", tmp_path / "straight", *settings,
                     "--set", "train.max_steps=10")
    assert straight.exit_code == 0, straight.stderr
    first = train(domains["recipe"], "--init", model, "--run", tmp_path / "resumed", *settings,
                  "--set", "train.max_steps=5")
    assert first.exit_code == 0, first.stderr
    model.unlink()  # resuming reads the run's own files only
    second = train("--run", tmp_path / "resumed", "--resume", "--set", "train.max_steps=10")
    assert second.exit_code == 0, second.stderr
    assert "resumed at step 5" in second.stderr and "initialised from" not in second.stderr
    a = model_tensors(tmp_path / "straight" / "checkpoint_last.safetensors")
    b = model_tensors(tmp_path / "resumed" / "checkpoint_last.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), [n for n in a if not torch.equal(a[n], b[n])]
    # The provenance still names the checkpoint the run started from, not the run's own checkpoint_last.
    assert read_checkpoint(tmp_path / "resumed" / "checkpoint_last.safetensors").provenance["init"]["path"] == str(model)
    # Resuming with the recipe file given works the same way (its checks run against the run's own model).
    third = train(domains["recipe"], "--run", tmp_path / "resumed", "--resume", *settings, "--set", "train.max_steps=11")
    assert third.exit_code == 0, third.stderr


def test_an_imported_marian_model_trains_on_its_own_special_ids(tmp_path, synthetic):
    # An imported OPUS-MT-style model ends sentences with id 0 and starts the decoder from padding (the
    # last id), not tfm's fixed ids. After one update at lr 1e-12 (weights unchanged to float32
    # rounding), the validation NLL per target token must equal the one `tfm score -m` computes by
    # forced decoding (tested against Hugging Face in test_import_marian.py): the batches the training
    # loop builds use the model's ids.
    pytest.importorskip("transformers")
    from test_import_marian import VARIANTS, build_marian_folder
    from tfm_cli.checkpoints.format import load_model

    model = tmp_path / "model.safetensors"
    folder = build_marian_folder(tmp_path / "hf", synthetic, VARIANTS[0])
    assert run_cli(["import", folder, "-o", model]).exit_code == 0
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        f'[data]\ntrain_src = "{synthetic["train.src"]}"\ntrain_tgt = "{synthetic["train.tgt"]}"\n'
        f'valid_src = "{synthetic["valid.src"]}"\nvalid_tgt = "{synthetic["valid.tgt"]}"\nmax_length = 64\n'
        '[train]\nmax_tokens = 1024\nlr = 1e-12\nwarmup_steps = 1\nmax_steps = 1\nvalid_bleu = false\n'
        'best_metric = "loss"\n',
        encoding="utf-8",
    )
    result = train(recipe, "--init", model, "--run", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid_nll = [r for r in records if r["kind"] == "valid"][-1]["nll_loss"]

    scored = run_cli(["score", "-m", model, "--src", synthetic["valid.src"], "--tgt", synthetic["valid.tgt"],
                      "--normalize", "none", "--threads", "1"])
    assert scored.exit_code == 0, scored.stderr
    tokenizer = load_model(model).tgt_tokenizer
    references = synthetic["valid.tgt"].read_text(encoding="utf-8").splitlines()
    n_tokens = sum(len(tokenizer.encode_ids(line)) + 1 for line in references)  # EOS included
    assert valid_nll == pytest.approx(-sum(map(float, scored.stdout.split())) / n_tokens, rel=1e-5)
    # The fine-tuned checkpoint keeps the imported tokenizers (piece tables included) and translates.
    translated = run_cli(["translate", "-m", tmp_path / "run" / "checkpoint_last.safetensors", "-i",
                          synthetic["test.src"], "--beam", "1", "-q", "--threads", "1"])
    assert translated.exit_code == 0 and len(translated.stdout.splitlines()) == 200, translated.stderr
