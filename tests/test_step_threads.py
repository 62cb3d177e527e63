"""Decoding steps on one thread under OMP_WAIT_POLICY=PASSIVE: when, and that the output does not change."""

from __future__ import annotations

import pytest
import torch

from conftest import run_cli, tiny_config
from tfm_cli.checkpoint import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.model.precision import cpu_support
from tfm_cli.search import beam_search
from tfm_cli.step_threads import PASSIVE_SINGLE_THREAD_WORK, StepThreads, one_thread, threads_sleep
from translate_support import held_out_sources, trained_checkpoint

MULTI30K_SIZE = tiny_config(d_model=256, d_ff=1024)


def test_only_a_passive_wait_policy_makes_threads_sleep():
    assert threads_sleep({"OMP_WAIT_POLICY": "PASSIVE"}) and threads_sleep({"OMP_WAIT_POLICY": " passive "})
    assert not threads_sleep({"OMP_WAIT_POLICY": "ACTIVE"}) and not threads_sleep({})


def test_small_steps_run_on_one_thread_only_when_threads_sleep():
    passive, active = {"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}
    for dtype in ("float32", "bf16", "int8"):
        assert StepThreads.for_model(MULTI30K_SIZE, dtype, passive, "AVX512").single_thread(160)
        assert not StepThreads.for_model(MULTI30K_SIZE, dtype, active, "AVX512").single_thread(160)
    # 256 x 1024 float32 multiply-adds per row: the limit falls at ~190 rows, 4x further in int8.
    limit = PASSIVE_SINGLE_THREAD_WORK // (256 * 1024)
    assert not StepThreads.for_model(MULTI30K_SIZE, "float32", passive, "AVX512").single_thread(limit + 1)
    assert StepThreads.for_model(MULTI30K_SIZE, "int8", passive, "AVX512").single_thread(limit + 1)
    # AVX2 kernels do half the work per instruction: the same float32 step counts double.
    assert not StepThreads.for_model(MULTI30K_SIZE, "float32", passive, "AVX2").single_thread(160)
    assert StepThreads.for_model(MULTI30K_SIZE, "float32", passive, "AVX2").single_thread(limit // 2)


def test_one_thread_gives_the_count_back():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with one_thread(enabled=False):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_passive_steps_really_run_on_one_thread(monkeypatch):
    loaded = load_model(trained_checkpoint())
    seen: list[int] = []
    layer = loaded.model.decoder_layers[0]
    handle = layer.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    src = torch.tensor([loaded.src_tokenizer.encode_ids(held_out_sources()[0]) + [loaded.config.eos_id]])
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
        beam_search(loaded.model, src, DecodeConfig(beam_size=2))
        assert seen and set(seen) == {1}
        seen.clear()
        monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
        beam_search(loaded.model, src, DecodeConfig(beam_size=2))
        assert seen and set(seen) == {2}
    finally:
        handle.remove()
        torch.set_num_threads(previous)


@pytest.mark.parametrize("dtype", ("float32", "bf16", "int8"))
def test_translations_are_the_same_bits_on_one_thread(monkeypatch, dtype):
    if dtype == "int8" and not cpu_support().fast_int8:
        pytest.skip("int8 is refused on a CPU without AVX512-VNNI (tests/test_precision.py checks the refusal)")
    lines = "\n".join(held_out_sources()[:40]) + "\n"
    command = ["translate", "-m", trained_checkpoint(), "-q", "--threads", "2", "--dtype", dtype, "--scores", "-b", "4"]
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    every_thread = run_cli(command, input=lines)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    single_thread = run_cli(command, input=lines)
    assert every_thread.exit_code == single_thread.exit_code == 0
    assert single_thread.stdout == every_thread.stdout
