"""Decoding steps under OMP_WAIT_POLICY=PASSIVE: which run on one thread or on all for their products only,
that they really do, and that the output does not change."""

from __future__ import annotations

import pytest
import torch

from conftest import run_cli, tiny_config
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.inference.decoding import TransformerDecoder, source_batch
from tfm_cli.model import kernels
from tfm_cli.model.precision import cpu_support, int8_layer_class, linear_layers
from tfm_cli.inference.search import search_beams
from tfm_cli.model.step_threads import (
    ONE_THREAD_WORK,
    PRODUCTS_ONLY_WORK,
    StepMode,
    StepThreads,
    on_threads,
    one_thread,
    threads_sleep,
)
from translate_support import held_out_sources, trained_checkpoint

MULTI30K_SIZE = tiny_config(d_model=256, d_ff=1024)


def test_only_a_passive_wait_policy_makes_threads_sleep():
    assert threads_sleep({"OMP_WAIT_POLICY": "PASSIVE"}) and threads_sleep({"OMP_WAIT_POLICY": " passive "})
    assert not threads_sleep({"OMP_WAIT_POLICY": "ACTIVE"}) and not threads_sleep({})


def test_passive_steps_pick_their_mode_by_work():
    passive, active = {"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}

    def mode(dtype: str, rows: int, environ=passive, capability="AVX512") -> StepMode:
        return StepThreads.for_model(MULTI30K_SIZE, dtype, environ, capability).mode(rows)

    for dtype in ("float32", "bf16", "int8"):
        assert mode(dtype, 16, active) is mode(dtype, 160, active) is StepMode.ALL_THREADS
        assert mode(dtype, 16) is StepMode.ONE_THREAD
    # 256 x 1024 float32 multiply-adds per row: one thread below ~57 rows, products only below ~572.
    per_row = 256 * 1024
    assert mode("float32", ONE_THREAD_WORK // per_row) is StepMode.ONE_THREAD
    assert mode("float32", ONE_THREAD_WORK // per_row + 1) is StepMode.PRODUCTS_ONLY
    assert mode("float32", 160) is StepMode.PRODUCTS_ONLY
    assert mode("float32", PRODUCTS_ONLY_WORK // per_row + 1) is StepMode.ALL_THREADS
    # int8 multiplies 4x faster, so its steps count a quarter; AVX2 kernels half as fast: double.
    assert mode("int8", 160) is StepMode.ONE_THREAD and mode("int8", 640) is StepMode.PRODUCTS_ONLY
    assert mode("float32", 32) is StepMode.ONE_THREAD and mode("float32", 32, capability="AVX2") is StepMode.PRODUCTS_ONLY
    assert mode("float32", 320) is StepMode.PRODUCTS_ONLY and mode("float32", 320, capability="AVX2") is StepMode.ALL_THREADS


def test_on_threads_gives_the_count_back():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert on_threads(2, torch.get_num_threads) == 2
        assert torch.get_num_threads() == 1
        assert on_threads(None, torch.get_num_threads) == 1
    finally:
        torch.set_num_threads(previous)


class ForcedMode(StepThreads):
    """StepThreads whose every step runs in one mode, whatever its rows (1 to 48 in these tests)."""

    def __init__(self, mode: StepMode) -> None:
        super().__init__(threads_sleep=mode is not StepMode.ALL_THREADS, work_per_row=0.0)
        object.__setattr__(self, "forced_mode", mode)

    def mode(self, rows: int) -> StepMode:
        return self.forced_mode


def forced(mode: StepMode) -> StepThreads:
    """A StepThreads that puts every step of a search in `mode`."""
    return ForcedMode(mode)


@pytest.mark.parametrize(
    "mode, layer_threads, product_threads",
    [(StepMode.ALL_THREADS, 2, 2), (StepMode.PRODUCTS_ONLY, 1, 2), (StepMode.ONE_THREAD, 1, 1)],
)
def test_each_mode_runs_its_thread_counts(monkeypatch, mode, layer_threads, product_threads):
    loaded = load_model(trained_checkpoint())
    seen_by_layer: list[int] = []
    seen_by_product: list[int] = []
    layer = loaded.model.decoder_layers[0]
    layer_step = layer.step

    def recording_layer_step(*args):
        seen_by_layer.append(torch.get_num_threads())
        return layer_step(*args)

    monkeypatch.setattr(layer, "step", recording_layer_step)
    packed_linear = kernels.packed_linear

    def recording_packed_linear(*args):
        seen_by_product.append(torch.get_num_threads())
        return packed_linear(*args)

    monkeypatch.setattr(kernels, "packed_linear", recording_packed_linear)
    src = torch.tensor([loaded.src_tokenizer.encode_ids(held_out_sources()[0]) + [loaded.config.eos_id]])
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            decoder = TransformerDecoder(loaded.model, src)
            decoder.step_threads = forced(mode)
            decoder.start(1, grouped=True)
            seen_by_product.clear()  # the encoder ran in start(), on every thread
            decoder.step(torch.tensor([loaded.config.bos_id]))
        assert set(seen_by_layer) == {layer_threads} and set(seen_by_product) == {product_threads}
        assert torch.get_num_threads() == 2
        assert all(layer.product_threads is None for layer in linear_layers(loaded.model))
    finally:
        torch.set_num_threads(previous)


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


@pytest.mark.parametrize("dtype", ("float32", "bf16", "int8"))
def test_every_mode_gives_the_same_bits(dtype):
    if dtype == "int8" and int8_layer_class(cpu_support()) is None:
        pytest.skip("this torch build has no int8 kernel (tests/test_precision.py checks the refusal)")
    loaded = load_model(trained_checkpoint(), dtype=dtype)
    src = source_batch([loaded.src_tokenizer.encode_ids(line) for line in held_out_sources()[:12]], loaded.config)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    results = {}
    try:
        for mode in StepMode:
            with torch.inference_mode():
                decoder = TransformerDecoder(loaded.model, src)
                decoder.step_threads = forced(mode)
                nbests = search_beams(decoder, DecodeConfig(beam_size=4, nbest=2))
            results[mode] = [[(h.tokens, h.score) for h in nbest] for nbest in nbests]
    finally:
        torch.set_num_threads(previous)
    assert results[StepMode.PRODUCTS_ONLY] == results[StepMode.ALL_THREADS] == results[StepMode.ONE_THREAD]


@pytest.mark.parametrize("dtype", ("float32", "bf16", "int8"))
def test_translations_are_the_same_bits_on_one_thread(monkeypatch, dtype):
    if dtype == "int8" and int8_layer_class(cpu_support()) is None:
        pytest.skip("this torch build has no int8 kernel (tests/test_precision.py checks the refusal)")
    lines = "\n".join(held_out_sources()[:40]) + "\n"
    command = ["translate", "-m", trained_checkpoint(), "-q", "--threads", "2", "--dtype", dtype, "--scores", "-b", "4"]
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    every_thread = run_cli(command, input=lines)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    single_thread = run_cli(command, input=lines)
    assert every_thread.exit_code == single_thread.exit_code == 0
    assert single_thread.stdout == every_thread.stdout
