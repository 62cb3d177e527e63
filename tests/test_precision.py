"""--dtype bf16 and int8 against float32: the linear layers, whole searches, batch invariance, refusals."""

from __future__ import annotations

import json

import pytest
import sacrebleu
import torch

from conftest import run_cli
from tfm_cli.inference.alignment import parse_pharaoh
from tfm_cli.checkpoints.format import load_model, model_with_weights, read_checkpoint
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.training.step import resolve_precision
from tfm_cli.model.precision import (
    WEIGHT_BLOCK_ROWS,
    quantize_weight_rows,
    WEIGHT_MAX_WITHOUT_VNNI,
    BFloat16Linear,
    CpuSupport,
    Int8Linear,
    Int8LinearWithoutVnni,
    choose_dtype,
    convert_linear_layers,
    cpu_support,
    int8_layer_class,
    int8_row_bucket,
    quantize_rows,
)
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)

REDUCED = ("bf16", "int8")
CPU = torch.device("cpu")
# A torch build without oneDNN (and without torch._int_mm on an AVX512-VNNI CPU) has no fast int8.
INT8_RUNS_HERE = int8_layer_class(cpu_support()) is not None
# torch._int_mm is exact with oneDNN's VNNI kernels and in its plain loops; not on a VNNI CPU whose
# oneDNN or torch kernels an environment variable capped below VNNI (cpu_support then says so).
INT_MM_EXACT_HERE = cpu_support().int8_vnni or not torch.cpu.get_capabilities().get("avx512_vnni", False)
INT8_LAYERS = [
    pytest.param(Int8Linear, marks=pytest.mark.skipif(not INT_MM_EXACT_HERE, reason="oneDNN capped below VNNI")),
    Int8LinearWithoutVnni,
]


def refused_here(model_path, dtype: str) -> bool:
    """True (after checking the refusal: one line, no output, exit 1) when `dtype` cannot run with this torch."""
    if dtype != "int8" or INT8_RUNS_HERE:
        return False
    result = run_cli(["translate", "-m", model_path, "--dtype", "int8"], input="a b\n")
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --dtype int8: this torch build") and "float32" in lines[0]
    return True


@pytest.fixture(scope="module")
def model_path():
    return trained_checkpoint()


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return held_out_sources()


@pytest.fixture(scope="module")
def references(model_path) -> list[str]:
    return (model_path.parent / "test.tgt").read_text(encoding="utf-8").splitlines()


def translate_lines(model_path, lines: list[str], *options: str) -> list[str]:
    result = run_cli(["translate", "-m", model_path, "-q", *options], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == len(lines)
    return outputs


# ---- which precision a machine gets ----

def test_cpu_support_reads_the_capability_flags():
    assert cpu_support({"avx512_bf16": True, "avx512_vnni": True}, "AVX512", {}) == CpuSupport(True, True)
    assert cpu_support({"amx_bf16": True, "avx512_vnni": True}, "AVX512", {}) == CpuSupport(True, True)
    # AVX-VNNI (256-bit) is not enough: torch._int_mm uses oneDNN only with AVX512-VNNI ...
    assert cpu_support({"avx2": True, "avx_vnni": True, "avx512_bf16": False}, "AVX2", {}) == CpuSupport(False, False)
    assert cpu_support({"avx2": True, "cpu_name": "x"}, "AVX2", {}) == CpuSupport(False, False)
    # ... and neither is a VNNI CPU whose torch kernels or oneDNN are capped below it.
    assert cpu_support({"avx512_vnni": True}, "AVX2", {}) == CpuSupport(False, False)
    assert cpu_support({"avx512_vnni": True}, "AVX512", {"ONEDNN_MAX_CPU_ISA": "AVX2"}) == CpuSupport(False, False)
    assert cpu_support({"avx512_vnni": True}, "AVX512", {"DNNL_MAX_CPU_ISA": "avx512_core"}) == CpuSupport(False, False)
    assert cpu_support({"avx512_vnni": True}, "AVX512", {"ONEDNN_MAX_CPU_ISA": "avx512_core_amx"}) == CpuSupport(False, True)


def test_auto_picks_bf16_only_where_the_cpu_has_it():
    assert choose_dtype("auto", CPU, CpuSupport(native_bf16=True, int8_vnni=True)).dtype == "bf16"
    assert choose_dtype("auto", CPU, CpuSupport(native_bf16=False, int8_vnni=True)).dtype == "float32"
    assert choose_dtype("float32", CPU, CpuSupport(True, True)) == choose_dtype("float32", CPU, CpuSupport(False, False))


def test_training_auto_precision_is_fp32_on_any_cpu_and_bf16_is_there_when_asked():
    # bf16 autocast lost to fp32 at equal wall time on a CPU with AMX (recipes/multi30k/RESULTS.md).
    assert resolve_precision("auto", CPU) == "fp32"
    assert resolve_precision("bf16", CPU) == "bf16"
    assert resolve_precision("fp32", CPU) == "fp32"


def test_explicit_bf16_without_native_support_runs_with_a_warning():
    slow = choose_dtype("bf16", CPU, CpuSupport(native_bf16=False, int8_vnni=False))
    assert slow.dtype == "bf16" and "slower than float32" in slow.warning
    assert choose_dtype("bf16", CPU, CpuSupport(native_bf16=True, int8_vnni=False)).warning is None


def test_int8_runs_with_or_without_vnni():
    if not INT8_RUNS_HERE:
        pytest.skip("this torch build has no int8 kernel (test_every_search_runs_in_reduced_precision checks the refusal)")
    assert choose_dtype("int8", CPU, CpuSupport(native_bf16=False, int8_vnni=False)).dtype == "int8"
    assert choose_dtype("int8", CPU, CpuSupport(native_bf16=False, int8_vnni=True)).dtype == "int8"
    assert int8_layer_class(CpuSupport(native_bf16=False, int8_vnni=False)) is Int8LinearWithoutVnni
    assert int8_layer_class(CpuSupport(native_bf16=False, int8_vnni=True)) is Int8Linear


def test_int8_on_cuda_and_unknown_values_are_refused():
    with pytest.raises(TfmError, match="int8 runs on the CPU only"):
        choose_dtype("int8", torch.device("cuda"))
    assert choose_dtype("auto", torch.device("cuda")).dtype == "float32"
    with pytest.raises(TfmError, match="--dtype fp8: choose one of auto, float32, bf16, int8"):
        choose_dtype("fp8", CPU)


def test_an_unknown_dtype_is_one_clear_line(model_path):
    result = run_cli(["translate", "-m", model_path, "--dtype", "int4"], input="a\n")
    assert result.exit_code != 0 and result.stdout == ""
    assert "--dtype int4" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---- the linear layers ----

def test_int8_matrix_product_is_exact_at_the_extremes():
    values = torch.tensor([-127, 127, -1, 0], dtype=torch.int8)
    left = values.repeat(64 * 256)[: 64 * 1024].view(64, 1024)
    right = values.flip(0).repeat(256 * 64)[: 1024 * 24].view(1024, 24)
    assert torch.equal(torch._int_mm(left, right).long(), left.long() @ right.long())


def test_int8_without_vnni_is_exact_where_16_bit_pair_sums_would_overflow():
    # Inputs at +-127 (bytes 255 and 1 after the shift) against weights at +-63, in adjacent pairs:
    # the sums a CPU without VNNI forms in 16 bits reach 255 * 63 * 2 = 32,130. With 8-bit weights
    # (255 * 127 * 2 = 64,770) they would saturate on such a CPU.
    pattern = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 0.0, 1.0])
    linear = torch.nn.Linear(512, 48, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.stack([pattern.roll(i).repeat(64) for i in range(48)]))
    x = torch.stack([pattern.roll(i).repeat(64) * (i + 1) for i in range(24)])
    # Every value is exactly representable: max|row| maps to 127 (inputs) and 63 (weights) exactly.
    with torch.inference_mode():
        got = Int8LinearWithoutVnni(linear)(x)
    expected = (x.double() @ linear.weight.detach().double().T)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("layer_class", INT8_LAYERS)
def test_int8_linear_computes_its_quantised_product(layer_class):
    weight_max = 127 if layer_class is Int8Linear else WEIGHT_MAX_WITHOUT_VNNI
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    x = torch.randn(7, 96) * 3
    # The same quantisation written out in float64: per-row scales max|row| / 127 (the weights'
    # max|row| / weight_max), rounded values.
    weight = linear.weight.detach().double()
    weight_scales = weight.abs().amax(1, keepdim=True) / weight_max
    x_scales = x.double().abs().amax(1, keepdim=True) / 127
    expected = ((x.double() / x_scales).round() @ (weight / weight_scales).round().T) * x_scales * weight_scales.T
    expected += linear.bias.detach().double()
    with torch.inference_mode():
        got = layer_class(linear)(x)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # ... and that product is close to the float32 layer's.
    with torch.inference_mode():
        reference = linear(x)
    assert float((got - reference).norm() / reference.norm()) < 0.02


def test_int8_row_buckets_are_few_and_waste_little():
    buckets = {count: int8_row_bucket(count) for count in range(1, 4097)}
    for count, bucket in buckets.items():
        assert bucket >= count
        assert bucket - count < (8 if count <= 64 else count / 4)
    for low in (64, 128, 256, 512, 1024, 2048):  # at most 4 row counts per doubling
        assert len({bucket for count, bucket in buckets.items() if low < count <= 2 * low}) <= 4
    assert len(set(buckets.values())) <= 8 + 4 * 6


def test_quantize_rows_keeps_zero_rows_finite():
    values, scales = quantize_rows(torch.tensor([[0.0, 0.0], [1.0, -0.5]]))
    assert values.tolist() == [[0, 0], [127, -64]] and bool(torch.isfinite(scales).all())


@pytest.mark.parametrize("largest", [127, 63])
def test_a_weight_quantised_in_blocks_equals_it_quantised_at_once(largest):
    torch.manual_seed(0)
    weight = torch.randn(2 * WEIGHT_BLOCK_ROWS + 5, 16) * torch.rand(2 * WEIGHT_BLOCK_ROWS + 5, 1)  # rows of any size
    weight[3] = 0.0
    values, scales = quantize_weight_rows(weight, largest)
    expected_values, expected_scales = quantize_rows(weight, largest)
    assert values.dtype == torch.int8 and torch.equal(values, expected_values)
    assert torch.equal(scales, expected_scales)


@pytest.mark.parametrize("layer_class", [BFloat16Linear, *INT8_LAYERS])
def test_reduced_linear_layers_are_close_and_batch_invariant(layer_class):
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 200)
    x = torch.randn(90, 64)
    with torch.inference_mode():
        layer = layer_class(linear)
        batched = layer(x)
        reference = linear(x)
        for start, count in ((0, 1), (3, 5), (10, 16), (30, 33), (0, 90)):
            assert torch.equal(layer(x[start : start + count]), batched[start : start + count])
        assert layer(x.view(9, 10, 64)).shape == (9, 10, 200)
    assert batched.dtype == torch.float32
    assert float((batched - reference).norm() / reference.norm()) < 0.02


# ---- whole translations ----

@pytest.mark.parametrize("dtype", REDUCED)
def test_translations_stay_close_to_float32(model_path, sources, references, tmp_path, dtype):
    if refused_here(model_path, dtype):
        return
    # This small, briefly trained model has many near-ties between hypotheses, which rounding flips:
    # 94.5% (bf16), 86.5% (int8 with VNNI) and 82-83% (int8 without VNNI: 7-bit weights) of its 200
    # lines come out identical, against 94.2%, 90.9% and 86.9% for the Multi30k model. Closeness is
    # therefore also judged by the float32 model itself: its score of the reduced-precision output
    # may be only a little below its score of its own output.
    reference_run = translate_lines(model_path, sources)
    reduced = translate_lines(model_path, sources, "--dtype", dtype)
    identical = sum(a == b for a, b in zip(reference_run, reduced)) / len(sources)
    assert len(set(reference_run)) > 80, "outputs too uniform for a meaningful test"
    assert identical >= 0.75, f"{dtype}: {identical:.1%} of lines identical to float32"
    bleu_float32 = sacrebleu.corpus_bleu(reference_run, [references]).score
    bleu_reduced = sacrebleu.corpus_bleu(reduced, [references]).score
    assert abs(bleu_reduced - bleu_float32) <= 1.0, (bleu_float32, bleu_reduced)
    float32_scores = {}
    (tmp_path / "src").write_text("\n".join(sources) + "\n")
    for name, outputs in (("own", reference_run), ("reduced", reduced)):
        (tmp_path / name).write_text("\n".join(outputs) + "\n")
        result = run_cli(["score", "-m", model_path, "--src", tmp_path / "src", "--tgt", tmp_path / name, "-q"])
        assert result.exit_code == 0, result.stderr
        float32_scores[name] = [float(value) for value in result.stdout.split()]
    mean_loss = sum(a - b for a, b in zip(float32_scores["own"], float32_scores["reduced"])) / len(sources)
    assert mean_loss < 0.05, f"{dtype}: the float32 model scores its outputs {mean_loss:.3f} nats lower per line"


@pytest.mark.parametrize("dtype", ("float32", *REDUCED))
def test_every_precision_is_batch_invariant(model_path, sources, dtype):
    loaded = load_model(model_path, dtype=dtype)
    lines = sources[:60]
    decode = DecodeConfig(beam_size=4)

    def translate(batching: BatchingConfig) -> list[tuple[str, float]]:
        translator, stats, results = Translator(loaded, decode, batching), TranslationStats(), []
        for start in range(0, len(lines), batching.buffer_size):
            results += translator.translate_chunk(lines[start : start + batching.buffer_size], start, stats)
        return [(r.outputs[0].text, r.outputs[0].raw_score) for r in results]

    batched = translate(BatchingConfig(buffer_size=60))
    assert translate(BatchingConfig(buffer_size=1)) == batched
    assert translate(BatchingConfig(buffer_size=60, batch_size=7)) == batched


def test_int8_without_vnni_translates_close_to_float32_and_batch_invariant(model_path, sources, references):
    # The CLI tests run the int8 kernel of the machine they run on; this one the other kernel on any CPU.
    if not INT8_RUNS_HERE:
        pytest.skip("this torch build has no int8 kernel")
    float32 = load_model(model_path)
    int8 = load_model(model_path)
    int8.model = model_with_weights(read_checkpoint(model_path)).eval()  # plain layers, not yet packed
    convert_linear_layers(int8.model, "int8", CpuSupport(native_bf16=False, int8_vnni=False))
    assert any(isinstance(module, Int8LinearWithoutVnni) for module in int8.model.modules())
    decode = DecodeConfig(beam_size=4)

    def translate(loaded, lines: list[str], batching: BatchingConfig) -> list[tuple[str, float]]:
        translator, stats, results = Translator(loaded, decode, batching), TranslationStats(), []
        for start in range(0, len(lines), batching.buffer_size):
            results += translator.translate_chunk(lines[start : start + batching.buffer_size], start, stats)
        return [(r.outputs[0].text, r.outputs[0].raw_score) for r in results]

    reference_run = [text for text, _ in translate(float32, sources, BatchingConfig())]
    batched = translate(int8, sources, BatchingConfig())
    identical = sum(a == b for a, (b, _) in zip(reference_run, batched)) / len(sources)
    assert identical >= 0.75, f"{identical:.1%} of lines identical to float32"  # measured 82%
    bleu_float32 = sacrebleu.corpus_bleu(reference_run, [references]).score
    bleu_int8 = sacrebleu.corpus_bleu([text for text, _ in batched], [references]).score
    assert abs(bleu_int8 - bleu_float32) <= 1.0, (bleu_float32, bleu_int8)
    assert translate(int8, sources[:60], BatchingConfig(buffer_size=1)) == batched[:60]
    assert translate(int8, sources[:60], BatchingConfig(buffer_size=60, batch_size=7)) == batched[:60]


@pytest.mark.parametrize("dtype", REDUCED)
def test_every_search_runs_in_reduced_precision(model_path, sources, dtype):
    if refused_here(model_path, dtype):
        return
    lines = sources[:12]
    greedy = translate_lines(model_path, lines, "--dtype", dtype, "--beam", "1")
    # 10-11 of these 12 lines are identical with VNNI, 8-10 without (see the test above)
    assert sum(a == b for a, b in zip(greedy, translate_lines(model_path, lines, "--beam", "1"))) >= 6
    nbest = translate_lines(model_path, lines, "--dtype", dtype, "--beam", "4", "--nbest", "3", "--scores")
    float_nbest = translate_lines(model_path, lines, "--beam", "4", "--nbest", "3", "--scores")
    for line, float_line in zip(nbest, float_nbest):
        fields, float_fields = line.split("\t"), float_line.split("\t")
        assert len(fields) == 6  # three (text, score) pairs
        if fields[0] == float_fields[0]:
            assert abs(float(fields[1]) - float(float_fields[1])) < 0.2
    sampled = translate_lines(model_path, lines, "--dtype", dtype, "--sample", "--nbest", "2", "--seed", "3")
    assert all(len(line.split("\t")) == 2 for line in sampled)
    assert sampled == translate_lines(model_path, lines, "--dtype", dtype, "--sample", "--nbest", "2", "--seed", "3")
    aligned = translate_lines(model_path, lines, "--dtype", dtype, "--json")
    for line in aligned:
        record = json.loads(line)
        assert record["translation"] and parse_pharaoh(record["alignment"])


@pytest.mark.parametrize("dtype", REDUCED)
def test_score_model_in_reduced_precision_is_close(model_path, sources, tmp_path, dtype):
    if refused_here(model_path, dtype):
        return
    src = tmp_path / "src"
    tgt = tmp_path / "tgt"
    src.write_text("\n".join(sources[:20]) + "\n")
    tgt.write_text("\n".join(translate_lines(model_path, sources[:20])) + "\n")
    scores = {}
    for name in ("float32", dtype):
        result = run_cli(["score", "-m", model_path, "--src", src, "--tgt", tgt, "--dtype", name, "-q"])
        assert result.exit_code == 0, result.stderr
        scores[name] = [float(line) for line in result.stdout.split()]
    assert len(scores[dtype]) == 20
    differences = [abs(a - b) for a, b in zip(scores["float32"], scores[dtype])]
    assert max(differences) < 0.2 and sum(differences) / len(differences) < 0.05, differences


@pytest.mark.parametrize("dtype", REDUCED)
def test_inspect_attention_in_reduced_precision(model_path, sources, dtype):
    if refused_here(model_path, dtype):
        return
    result = run_cli(["inspect-attention", "-m", model_path, sources[0], "--dtype", dtype, "--format", "json", "-q"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    matrix = record["matrix"]  # (target pieces, source pieces), rows sum to 1
    assert len(matrix) == len(record["rows"]) and all(abs(sum(row) - 1.0) < 1e-4 for row in matrix)


def test_auto_says_what_it_chose(model_path, sources):
    result = run_cli(["translate", "-m", model_path, "--dtype", "auto"], input=sources[0] + "\n")
    assert result.exit_code == 0, result.stderr
    chosen = "bf16" if cpu_support().native_bf16 else "float32"
    assert f"--dtype auto: running in {chosen} on cpu" in result.stderr
