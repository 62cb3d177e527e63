"""`tfm average`: identity on equal inputs, the hand-computed mean, provenance, refusals."""

from __future__ import annotations

import hashlib

import pytest
import torch

from conftest import run_cli, tiny_config
from tfm_cli.checkpoints.format import model_weights, read_checkpoint, save_model
from tfm_cli.model import Transformer
from tfm_cli.tokenization.tokenizer import Tokenizer


def make_checkpoint(path, tokenizer, seed=0, fill=None, step=None, **config):
    """Save a tiny model (seeded random weights, or every parameter = `fill`) and return its weights."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, **config))
    if fill is not None:
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(fill)
    save_model(path, model, tokenizer, tokenizer, provenance={} if step is None else {"step": step})
    return model_weights(model)


@pytest.fixture(scope="module")
def tokenizer(small_spm):
    return Tokenizer.from_file(small_spm)


def test_averaging_identical_checkpoints_is_the_identity(tmp_path, tokenizer):
    weights = make_checkpoint(tmp_path / "a.safetensors", tokenizer, seed=1)
    (tmp_path / "b.safetensors").write_bytes((tmp_path / "a.safetensors").read_bytes())
    result = run_cli(["average", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "-o", tmp_path / "avg.safetensors"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    averaged = read_checkpoint(tmp_path / "avg.safetensors")
    assert averaged.weights.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(averaged.weights[name], tensor), name
    assert averaged.src_tokenizer_bytes == tokenizer.model_bytes


def test_averaging_two_gives_their_mean(tmp_path, tokenizer):
    # Every parameter is 1.0 in one checkpoint and 4.0 in the other: the mean is exactly 2.5.
    make_checkpoint(tmp_path / "ones.safetensors", tokenizer, fill=1.0)
    make_checkpoint(tmp_path / "fours.safetensors", tokenizer, fill=4.0)
    out = tmp_path / "avg.safetensors"
    assert run_cli(["average", tmp_path / "ones.safetensors", tmp_path / "fours.safetensors", "-o", out]).exit_code == 0
    for name, tensor in read_checkpoint(out).weights.items():
        assert torch.all(tensor == 2.5), name
    # Random weights: the float64 mean of the two, rounded once to float32.
    a = make_checkpoint(tmp_path / "a.safetensors", tokenizer, seed=1)
    b = make_checkpoint(tmp_path / "b.safetensors", tokenizer, seed=2)
    assert run_cli(["average", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "-o", out]).exit_code == 0
    for name, tensor in read_checkpoint(out).weights.items():
        expected = ((a[name].double() + b[name].double()) / 2).float()
        assert torch.equal(tensor, expected), name


def test_run_last_n_and_provenance(tmp_path, tokenizer):
    run = tmp_path / "run"
    run.mkdir()
    for step, fill in [(100, 9.0), (1200, 1.0), (10000, 2.0), (20000, 6.0)]:
        make_checkpoint(run / f"checkpoint_{step:08d}.safetensors", tokenizer, fill=fill, step=step)
    (run / "checkpoint_best.safetensors").write_bytes((run / "checkpoint_00000100.safetensors").read_bytes())
    out = tmp_path / "avg3.safetensors"
    result = run_cli(["average", "--run", run, "--last", "3", "-o", out])
    assert result.exit_code == 0, result.stderr
    averaged = read_checkpoint(out)
    assert all(torch.all(t == 3.0) for t in averaged.weights.values())  # (1 + 2 + 6) / 3
    inputs = averaged.provenance["averaged"]
    assert [item["name"] for item in inputs] == [
        "checkpoint_00001200.safetensors", "checkpoint_00010000.safetensors", "checkpoint_00020000.safetensors"
    ]
    assert [item["step"] for item in inputs] == [1200, 10000, 20000]
    for item in inputs:
        assert item["sha256"] == hashlib.sha256((run / item["name"]).read_bytes()).hexdigest()
    assert averaged.provenance["step"] == 20000
    too_many = run_cli(["average", "--run", run, "--last", "5", "-o", out])
    assert too_many.exit_code == 1 and "only 4" in too_many.stderr


def test_incompatible_checkpoints_are_refused_naming_the_difference(tmp_path, tokenizer, synthetic):
    make_checkpoint(tmp_path / "a.safetensors", tokenizer)
    make_checkpoint(tmp_path / "wide.safetensors", tokenizer, d_ff=128)
    result = run_cli(["average", tmp_path / "a.safetensors", tmp_path / "wide.safetensors", "-o", tmp_path / "x.safetensors"])
    assert result.exit_code == 1
    wide, first = tmp_path / "wide.safetensors", tmp_path / "a.safetensors"
    assert f"model.d_ff is 128 in {wide} but 64 in {first}" in result.stderr
    assert not (tmp_path / "x.safetensors").exists()

    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    # The same text and size as small_spm, another model type: other pieces, another tokenizer.
    other_spm = train_sentencepiece(
        [synthetic["train.src"], synthetic["train.tgt"]], tmp_path / "other",
        TokenizerTrainConfig(vocab_size=tokenizer.vocab_size, model_type="bpe"),
    )
    make_checkpoint(tmp_path / "bpe.safetensors", Tokenizer.from_file(other_spm))
    result = run_cli(["average", tmp_path / "a.safetensors", tmp_path / "bpe.safetensors", "-o", tmp_path / "x.safetensors"])
    assert result.exit_code == 1 and "tokenizers differ" in result.stderr


def test_average_needs_inputs_and_refuses_overwriting_an_input(tmp_path, tokenizer):
    make_checkpoint(tmp_path / "a.safetensors", tokenizer)
    assert run_cli(["average", "-o", tmp_path / "x.safetensors"]).exit_code == 1
    same = run_cli(["average", tmp_path / "a.safetensors", "-o", tmp_path / "a.safetensors"])
    assert same.exit_code == 1 and "also an input" in same.stderr
