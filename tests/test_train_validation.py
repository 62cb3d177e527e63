"""Validation during training measures the weights the run saves: logged figures equal a fresh process's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
import torch

from conftest import REPO_ROOT, letter_settings, run_cli, run_tfm_process

TINY = REPO_ROOT / "recipes" / "tiny.toml"


def fresh_process_nll(checkpoint: Path, src: Path, tgt: Path, device: str) -> float:
    """Per-token negative log-likelihood (EOS counted) of the pairs under `checkpoint`, by `tfm score -m`."""
    result = run_tfm_process(
        ["score", "-m", checkpoint, "--src", src, "--tgt", tgt, "--normalize", "none", "--json", "-q",
         "--threads", "1", "--device", device]
    )
    assert result.returncode == 0, result.stderr.decode()
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    total = sum(record["score"] for record in records)
    n_tokens = sum(len(record["token_log_probs"]) for record in records)
    return -total / n_tokens


def fresh_process_bleu(checkpoint: Path, src: Path, tgt: Path, max_len_a: float, max_len_b: int, device: str) -> float:
    """sacreBLEU of `tfm translate -b 1` (greedy, as validation decodes) against the references."""
    result = run_tfm_process(
        ["translate", "-m", checkpoint, "-i", src, "-b", "1", "--max-len-a", max_len_a, "--max-len-b", max_len_b,
         "-q", "--threads", "1", "--device", device]
    )
    assert result.returncode == 0, result.stderr.decode()
    hypotheses = result.stdout.decode().splitlines()
    references = tgt.read_text(encoding="utf-8").splitlines()
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


@pytest.mark.parametrize("device, precision", [
    ("cpu", "fp32"),
    ("cpu", "bf16"),  # bf16 autocast for training; validation must still run in float32
    pytest.param("cuda", "fp32", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
])
def test_logged_validation_equals_a_fresh_evaluation_of_the_saved_checkpoint(tmp_path, letters, device, precision):
    # The run trains with the optimizer `tfm train` always uses (fused AdamW, which updates weights
    # in place without bumping their version counter). Every validation must see the weights of
    # that moment: a cached copy of an earlier validation's weights would make every later figure wrong.
    # Trained under bf16 autocast on the CPU, validation still runs in float32, as translate and score do.
    run = tmp_path / "run"
    options = letter_settings(
        letters, **{
            "train.max_tokens": 256, "train.warmup_steps": 5, "train.max_steps": 30, "train.valid_every": 10,
            "train.save_every": 10, "train.keep_last": 5, "train.valid_max_len_a": 1.0, "train.valid_max_len_b": 4,
            "train.precision": precision,
        },
    )
    result = run_tfm_process(
        ["train", TINY, "--run", run, "--threads", "1", "-q", "--device", device, *options], timeout=300
    )
    assert result.returncode == 0, result.stderr.decode()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = {record["step"]: record for record in records if record["kind"] == "valid"}
    assert sorted(valid) == [10, 20, 30]
    # The weights changed between validations, so a stale copy would show.
    assert len({round(record["nll_loss"], 4) for record in valid.values()}) == 3
    for step, record in valid.items():
        checkpoint = run / f"checkpoint_{step:08d}.safetensors"
        nll = fresh_process_nll(checkpoint, letters["valid_src"], letters["valid_tgt"], device)
        assert abs(nll - record["nll_loss"]) <= 1e-4 * max(1.0, nll), (step, nll, record["nll_loss"])
        bleu = fresh_process_bleu(checkpoint, letters["valid_src"], letters["valid_tgt"], 1.0, 4, device)
        assert abs(bleu - record["bleu"]) <= 1e-6, (step, bleu, record["bleu"])


def line_of_exactly(tokenizer, pieces: int) -> str:
    """A letter line that the tokenizer cuts into exactly `pieces` pieces."""
    letters = "a b c d e f g h " * pieces
    for end in range(1, len(letters)):
        if len(tokenizer.encode_ids(letters[:end].strip())) == pieces:
            return letters[:end].strip()
    raise AssertionError(f"no line of {pieces} pieces")


def test_a_validation_pair_of_exactly_max_positions_pieces_is_filtered_not_fed_to_the_model(tmp_path, letters):
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(letters["spm"])
    positions = 12
    long_line = line_of_exactly(tokenizer, positions)  # + EOS: one token more than the model has positions
    src_lines = letters["valid_src"].read_text().splitlines()
    tgt_lines = letters["valid_tgt"].read_text().splitlines()
    src_lines[0], tgt_lines[1] = long_line, long_line  # the source of one pair, the target of another
    (tmp_path / "valid.src").write_text("\n".join(src_lines) + "\n")
    (tmp_path / "valid.tgt").write_text("\n".join(tgt_lines) + "\n")
    settings = letter_settings(letters, **{
        "data.valid_src": tmp_path / "valid.src", "data.valid_tgt": tmp_path / "valid.tgt",
        "model.max_positions": positions, "data.max_length": 10, "train.max_steps": 2, "train.valid_every": 1,
    })
    result = run_cli(["train", TINY, "--run", tmp_path / "run", "--threads", "1", *settings])
    assert result.exit_code == 0, result.stderr
    assert f"valid data: {len(src_lines)} pairs read, {len(src_lines) - 2} kept" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records if record["kind"] == "valid"] == [1, 2]
