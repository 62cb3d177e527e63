"""CUDA: the model, the searches and training on a GPU agree with the CPU (run by bench/gpu_check.sh).

Every test here needs a CUDA device and is skipped, with that reason, on a machine without one
(CI has none). References are the CPU results of the same weights, computed in the same test.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import REPO_ROOT, letter_settings, run_tfm_process, tiny_config
from tfm_cli.checkpoints.format import read_checkpoint
from tfm_cli.config import DecodeConfig
from tfm_cli.model import Transformer
from tfm_cli.inference.search import beam_search, greedy_search

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")

TINY = REPO_ROOT / "recipes" / "tiny.toml"
GPU = "cuda"


def model_pair(**overrides) -> tuple[Transformer, Transformer]:
    """The same seeded tiny model on the CPU and on CUDA, in eval mode."""
    torch.manual_seed(0)
    cpu = Transformer(tiny_config(**overrides)).eval()
    gpu = Transformer(tiny_config(**overrides)).eval()
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.cuda()


def test_forward_on_cuda_matches_the_cpu():
    cpu, gpu = model_pair()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 9), generator=generator)
    tgt = torch.randint(4, 40, (3, 7), generator=generator)
    src[1, 6:] = 0  # padding
    with torch.no_grad():
        expected = cpu(src, tgt)
        actual = gpu(src.cuda(), tgt.cuda()).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_incremental_decoding_on_cuda_equals_the_full_forward():
    _, gpu = model_pair()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 11, 3, 0]], device="cuda")
    tgt_in = torch.tensor([[2, 12, 13, 14], [2, 15, 16, 17]], device="cuda")
    with torch.no_grad():
        full = gpu(src, tgt_in)  # (B, T, V)
        state = gpu.start_decoding(gpu.encode(src))
        steps = [gpu.decode_step(tgt_in[:, t], state).logits for t in range(tgt_in.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-4, atol=1e-4)


def test_greedy_and_beam_search_on_cuda_match_the_cpu():
    cpu, gpu = model_pair(tgt_vocab_size=40, src_vocab_size=40)
    generator = torch.Generator().manual_seed(2)
    src = torch.randint(4, 40, (12, 8), generator=generator)
    src[:, -1] = 3  # EOS
    config = DecodeConfig(beam_size=4, nbest=1, max_len_a=1.0, max_len_b=3)
    pairs = list(zip(greedy_search(cpu, src), greedy_search(gpu, src.cuda())))
    pairs += [(a[0], b[0]) for a, b in zip(beam_search(cpu, src, config), beam_search(gpu, src.cuda(), config))]
    same = [(a, b) for a, b in pairs if a.tokens == b.tokens]
    # A random model's close calls may round the other way on another device; most must not.
    assert len(same) >= 0.8 * len(pairs), [(a.tokens, b.tokens) for a, b in pairs]
    for a, b in same:
        assert a.score == pytest.approx(b.score, abs=1e-3)


def test_constrained_beam_search_on_cuda_meets_every_phrase_as_on_the_cpu():
    from tfm_cli.inference.constraints import ConstraintTracker
    from tfm_cli.inference.decoding import TransformerDecoder
    from tfm_cli.inference.search import search_beams

    cpu, gpu = model_pair(tgt_vocab_size=40, src_vocab_size=40)
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (6, 8), generator=generator)
    src[:, -1] = 3  # EOS
    phrases = [[[5, 6]], [[7], [8]], [], [[9, 10, 11]], [[12]], [[12], [12]]]
    config = DecodeConfig(beam_size=4, max_len_a=1.0, max_len_b=4)
    with torch.inference_mode():
        on_cpu = search_beams(TransformerDecoder(cpu, src), config, ConstraintTracker(phrases, cpu.config.eos_id))
        on_gpu = search_beams(TransformerDecoder(gpu, src.cuda()), config, ConstraintTracker(phrases, gpu.config.eos_id))
    for cpu_best, gpu_best in zip(on_cpu, on_gpu):
        assert cpu_best[0].unmet == gpu_best[0].unmet == 0
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(on_cpu, on_gpu))
    assert same >= 4, [(a[0].tokens, b[0].tokens) for a, b in zip(on_cpu, on_gpu)]


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_translate_command_on_cuda_keeps_every_line_and_agrees_with_the_cpu(random_checkpoint, synthetic, dtype):
    lines = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:40]
    source = ("\n".join(lines) + "\n").encode()

    def translate(device: str, precision: str) -> list[str]:
        command = ["translate", "-m", random_checkpoint, "--device", device, "--dtype", precision, "-b", "4", "-q"]
        result = run_tfm_process(command, input=source)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode().split("\n")[:-1]  # one line out per line in

    on_cpu = translate("cpu", "float32")
    on_gpu = translate(GPU, dtype)
    assert len(on_gpu) == len(on_cpu) == len(lines)
    if dtype == "float32":
        # A random model's close calls may round the other way on another device; most must not.
        same = sum(a == b for a, b in zip(on_cpu, on_gpu))
        assert same >= 0.8 * len(lines), list(zip(on_cpu, on_gpu))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_on_cuda_learns_and_loads_on_the_cpu(tmp_path, letters, precision):
    run = tmp_path / "run"
    options = letter_settings(
        letters, **{
            "train.max_tokens": 256, "train.warmup_steps": 20, "train.max_steps": 200, "train.valid_every": 200,
            "train.save_every": 200, "train.log_every": 10, "train.precision": precision,
        },
    )
    result = run_tfm_process(["train", TINY, "--run", run, "--device", "cuda", "-q", *options], timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.8 * losses[0], losses
    checkpoint = read_checkpoint(run / "checkpoint_last.safetensors")
    assert all(t.device.type == "cpu" and bool(torch.isfinite(t).all()) for t in checkpoint.weights.values())
    translated = run_tfm_process(
        ["translate", "-m", run / "checkpoint_last.safetensors", "-i", letters["valid_src"], "--device", "cpu", "-q"]
    )
    assert translated.returncode == 0, translated.stderr.decode()
    assert len(translated.stdout.decode().splitlines()) == 20


def test_train_aligner_on_cuda_trains_there_and_matches_the_cpu(random_checkpoint, synthetic, tmp_path):
    for name in ("src", "tgt", "align"):
        lines = synthetic[f"train.{name}"].read_text(encoding="utf-8").splitlines()[:200]
        (tmp_path / f"train.{name}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    outputs = {}
    for device in ("cpu", GPU):
        outputs[device] = tmp_path / f"{device}.safetensors"
        result = run_tfm_process(["train-aligner", "-m", random_checkpoint, "--src", tmp_path / "train.src", "--tgt",
                                  tmp_path / "train.tgt", "--links", tmp_path / "train.align", "-o", outputs[device],
                                  "--epochs", "3", "--hidden", "32", "--dim", "16", "--device", device])
        assert result.returncode == 0, result.stderr.decode()
    cpu, gpu = (read_checkpoint(outputs[device]) for device in ("cpu", GPU))
    assert cpu.provenance["aligner"]["best_epoch"] == gpu.provenance["aligner"]["best_epoch"]
    for name, weight in cpu.aligner_weights.items():
        torch.testing.assert_close(gpu.aligner_weights[name], weight, atol=2e-3, rtol=2e-2)
