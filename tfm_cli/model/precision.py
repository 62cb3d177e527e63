"""Inference in float32, bfloat16 or int8: which one a machine runs natively, and the linear layers of each.

float32 is the default and the reference. The other two change the linear layers only (the attention
projections, the feed-forward layers and the output projection); embeddings, LayerNorm, the attention
products and softmax, and the searches stay float32.

- bf16: the weights are stored in bfloat16 (packed once for oneDNN), each input is rounded to
  bfloat16, oneDNN accumulates the products in float32, and the result comes back as float32. Fast
  where the CPU multiplies bfloat16 natively (AVX512-BF16, AMX-BF16); elsewhere the conversions are
  done in software and bf16 is slower than float32.
- int8: each weight row (output feature) is quantised once with its own scale; each input row is
  quantised at each call with its own scale max|row| / 127 (dynamic, per token); the product runs in
  exact int32 arithmetic and is rescaled to float32. Two kernels, by what the CPU has:
  - with AVX512-VNNI (and torch's AVX-512 kernels), `Int8Linear`: weights to +-127, product by
    `torch._int_mm` (signed x signed), which torch runs through oneDNN's int8 GEMM only on such CPUs
    (vpdpbusd; AMX CPUs all have it, and oneDNN uses their tile units), in plain loops elsewhere
    (pytorch PR #136942), many times slower than float32 (see bench/RESULTS.md, section
    "Reduced precision");
  - everywhere else, `Int8LinearWithoutVnni`: oneDNN's u8 x s8 product
    (`torch.ops.onednn.qlinear_pointwise`, the kernel Inductor's x86 int8 quantisation lowers to),
    inputs shifted to unsigned bytes by +128 and weights quantised to +-63 (7 bits). Without VNNI
    the CPU multiplies bytes with vpmaddubsw, which adds two products into a 16-bit sum;
    255 x 63 x 2 = 32,130 fits, 255 x 127 x 2 would not, so 7-bit weights keep the sums exact.
  Neither is part of the deprecated `torch.ao.quantization`: `torch._int_mm` is the ATen operator
  torchao's dynamic quantisation and Inductor call, `qlinear_pointwise` the oneDNN operator of
  Inductor's x86 quantisation backend. Because the int32 products are exact and every other step
  works row by row, a row's result never depends on the other rows of its batch: int8 decoding is
  batch invariant, as float32's is.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfm_cli.errors import TfmError
from tfm_cli.model.kernels import Linear, onednn_linear_available, pack_weights, packed_linear
from tfm_cli.model.step_threads import on_threads

INFERENCE_DTYPES = ("auto", "float32", "bf16", "int8")
INT8_MAX = 127
# Rows of a weight quantised at once when an int8 layer is made (quantize_weight_rows): 4096 x 512 float32 = 8 MiB.
WEIGHT_BLOCK_ROWS = 4096


@dataclass(frozen=True)
class CpuSupport:
    """What this CPU does natively for the reduced precisions (from torch's cpuinfo)."""

    native_bf16: bool  # bfloat16 dot products: AVX512-BF16 or AMX-BF16
    # AVX512-VNNI with torch's AVX-512 kernels: torch._int_mm runs on oneDNN (Int8Linear); without
    # it, int8 runs with 7-bit weights (Int8LinearWithoutVnni)
    int8_vnni: bool


# oneDNN instruction-set levels (ONEDNN_MAX_CPU_ISA values) that include AVX512-VNNI.
ONEDNN_ISAS_WITH_AVX512_VNNI = frozenset({
    "ALL", "DEFAULT", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512",
    "AVX512_CORE_AMX", "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
    "AVX10_2_512_AMX_2",
})


def onednn_may_use_avx512_vnni(environ: Mapping[str, str] | None = None) -> bool:
    """False when ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA) caps oneDNN below AVX512-VNNI.

    torch._int_mm decides by the CPU alone; a capped oneDNN then runs its non-VNNI int8 kernels on
    signed bytes, whose 16-bit sums saturate: large errors (see bench/RESULTS.md, section
    "Reduced precision").
    """
    environ = os.environ if environ is None else environ
    cap = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA")
    return cap is None or cap.strip().upper() in ONEDNN_ISAS_WITH_AVX512_VNNI


def cpu_support(
    capabilities: Mapping[str, object] | None = None,
    aten_capability: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> CpuSupport:
    """The CPU's bf16/int8 support from `capabilities` (default: torch.cpu.get_capabilities()), the
    kernels torch runs (`aten_capability`, default torch.backends.cpu.get_cpu_capability(), which
    ATEN_CPU_CAPABILITY lowers) and oneDNN's cap in `environ` (default os.environ). Returns a
    CpuSupport; a torch without get_capabilities reports neither.
    """
    if capabilities is None:
        capabilities = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    if aten_capability is None:
        aten_capability = torch.backends.cpu.get_cpu_capability()
    has = {name for name, value in capabilities.items() if value is True}
    return CpuSupport(
        native_bf16=bool(has & {"avx512_bf16", "amx_bf16"}),
        int8_vnni=(
            "avx512_vnni" in has and aten_capability.upper().startswith("AVX512") and onednn_may_use_avx512_vnni(environ)
        ),
    )


@functools.cache
def int8_matmul_available() -> bool:
    """True when this torch build multiplies int8 matrices on the CPU (torch._int_mm)."""
    if not hasattr(torch, "_int_mm"):
        return False
    try:
        ones = torch.ones(16, 16, dtype=torch.int8)
        return bool(torch._int_mm(ones, ones)[0, 0] == 16)
    except (RuntimeError, NotImplementedError):
        return False


@functools.cache
def onednn_int8_available() -> bool:
    """True when this torch build has oneDNN's u8 x s8 linear (torch.ops.onednn.qlinear_pointwise)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")):
        return False
    try:
        weight = torch.ops.onednn.qlinear_prepack(torch.ones(4, 16, dtype=torch.int8), None)
        inputs = torch.full((2, 16), 129, dtype=torch.uint8)  # all 1 after the shift by 128
        output = torch.ops.onednn.qlinear_pointwise(
            inputs, 1.0, 128, weight, torch.ones(4), torch.zeros(4, dtype=torch.int64), None, 1.0, 0,
            torch.float32, "none", [], "",
        )
        return bool(output[0, 0] == 16)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def int8_layer_class(support: CpuSupport) -> type[nn.Module] | None:
    """The int8 linear layer for a CPU with `support` and this torch build; None if it has neither kernel."""
    if support.int8_vnni and int8_matmul_available():
        return Int8Linear
    if onednn_int8_available():
        return Int8LinearWithoutVnni
    return None


@dataclass(frozen=True)
class DtypeChoice:
    """The precision a command runs in, and a warning to show when the request is a poor fit."""

    dtype: str  # "float32", "bf16" or "int8"
    warning: str | None = None


def choose_dtype(requested: str, device: torch.device, support: CpuSupport | None = None) -> DtypeChoice:
    """Resolve a --dtype value for `device` (support: the CPU's, default cpu_support()).

    auto: bf16 on a CPU with native bf16, float32 everywhere else (int8 is never chosen for the
    user: it is a deliberate trade of quality for speed). An explicit bf16 on a CPU without native
    bf16 runs with a warning that it is slower than float32. Raises TfmError for an unknown value,
    for int8 on CUDA, for bf16 on a GPU without bfloat16, and for int8 with a torch build that has
    neither int8 kernel (int8_layer_class).
    """
    if requested not in INFERENCE_DTYPES:
        raise TfmError(f"--dtype {requested}: choose one of {', '.join(INFERENCE_DTYPES)}")
    if device.type == "cuda":
        if requested == "int8":
            raise TfmError("--dtype int8 runs on the CPU only; on CUDA use --dtype bf16 or float32")
        if requested == "bf16" and not torch.cuda.is_bf16_supported():
            raise TfmError(f"--dtype bf16: {device} has no bfloat16 support; use --dtype float32")
        return DtypeChoice("float32" if requested == "auto" else requested)
    support = cpu_support() if support is None else support
    if requested == "auto":
        return DtypeChoice("bf16" if support.native_bf16 else "float32")
    if requested == "bf16" and not support.native_bf16:
        return DtypeChoice(
            "bf16",
            "--dtype bf16: this CPU has no native bfloat16 (AVX512-BF16 or AMX); it runs, but slower than "
            "float32 (--dtype auto never picks bf16 here)",
        )
    if requested == "int8" and int8_layer_class(support) is None:
        raise TfmError(
            f"--dtype int8: this torch build ({torch.__version__}) has no fast CPU int8 matrix product (oneDNN's "
            "qlinear, or torch._int_mm on a CPU with AVX512-VNNI); use --dtype float32, or a torch with oneDNN"
        )
    return DtypeChoice(requested)


class BFloat16Linear(nn.Module):
    """x @ W.T + b with W and b in bfloat16: float32 in, float32 out, products in bfloat16.

    On a CPU with oneDNN the weight is packed once into oneDNN's layout (as kernels.Linear does for
    float32); elsewhere (a GPU, a torch without oneDNN) it is F.linear in bfloat16.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().to(torch.bfloat16)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        packable = weight.device.type == "cpu" and onednn_linear_available()
        self.packed = packable and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight) if self.packed else weight
        self.product_threads: int | None = None  # see kernels.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) float32 -> (..., out_features) float32."""
        x = x.to(torch.bfloat16)
        product = packed_linear if self.packed else F.linear
        return on_threads(self.product_threads, product, x, self.weight, self.bias).float()


def row_scales(matrix: torch.Tensor, largest: int) -> torch.Tensor:
    """matrix: (R, K) float32 -> (R, 1) float32, max|row| / largest: the scale that maps a row's largest
    entry to +-largest. An all-zero row gets 1e-12 instead of 0, so that dividing by it stays finite."""
    return matrix.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(largest)


def quantize_rows(matrix: torch.Tensor, largest: int = INT8_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation of each row. matrix: (R, K) float32.

    Returns (int8 values (R, K) in -largest..largest, float32 scales (R, 1), see row_scales) with
    matrix ~= values * scales.
    """
    scales = row_scales(matrix, largest)
    values = (matrix / scales).round_().to(torch.int8)
    return values, scales


def quantize_weight_rows(weight: torch.Tensor, largest: int = INT8_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows of a layer's weight (N, K) float32, WEIGHT_BLOCK_ROWS rows at a time.

    Returns the same (int8 values (N, K), float32 scales (N, 1)) as quantize_rows (each row is quantised
    on its own), with float32 temporaries the size of one block instead of two of the whole matrix
    (2 x 119 MB for a 58k-entry output layer of d_model 512, at the top of a model load).
    """
    values = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty((weight.size(0), 1), dtype=torch.float32)
    for start in range(0, weight.size(0), WEIGHT_BLOCK_ROWS):
        end = start + WEIGHT_BLOCK_ROWS
        values[start:end], scales[start:end] = quantize_rows(weight[start:end], largest)
    return values, scales


def quantize_rows_unsigned(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows' values shifted by +128 into unsigned bytes. matrix: (R, K) float32.

    Returns (uint8 values (R, K) in 1..255, float32 scales (R, 1)) with matrix ~= (values - 128) * scales.
    """
    scales = row_scales(matrix, INT8_MAX)
    values = (matrix / scales).round_().add_(128).to(torch.uint8)
    return values, scales


# What decoding.products_need_padding asks of a layer. Both int8 layers give a row the same bits in a call
# of any size by construction: the row's scale is its own maximum, the integer sums are exact (int32, and
# 16-bit pair sums that cannot overflow without VNNI), and what follows is element by element.
ROWS_INDEPENDENT = True


class Int8Linear(nn.Module):
    """x @ W.T + b with W quantised per output feature and x quantised per row at each call.

    Holds W as int8 (in_features, out_features), its scales (out_features,) and a float32 bias.
    """

    rows_independent = ROWS_INDEPENDENT

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        values, scales = quantize_weight_rows(linear.weight.detach().float())  # (N, K), (N, 1)
        self.weight_t = values.t().contiguous()  # (K, N): the layout torch._int_mm is fastest with
        self.weight_scales = scales.view(-1)  # (N,)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.product_threads: int | None = None  # see kernels.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) float32 -> (..., out_features) float32."""
        rows = x.reshape(-1, x.size(-1))  # (R, K)
        values, row_scales = quantize_rows(rows)
        products = on_threads(self.product_threads, torch._int_mm, values, self.weight_t)  # (R, N) int32, exact
        # In place, starting with the int32 products themselves (float32 of the same size, written element
        # by element): the (R, N) product is the step's largest tensor for the output projection.
        scaled = torch.mul(products, row_scales, out=products.view(torch.float32))
        if self.bias is None:
            output = scaled.mul_(self.weight_scales)
        else:
            output = torch.addcmul(self.bias, scaled, self.weight_scales, out=scaled)
        return output.view(*x.shape[:-1], -1)


# Weights of Int8LinearWithoutVnni: at most 63 in magnitude, so that two products of an unsigned
# input byte and a weight always fit a 16-bit sum (255 * 63 * 2 = 32,130 <= 32,767).
WEIGHT_MAX_WITHOUT_VNNI = 63


class Int8LinearWithoutVnni(nn.Module):
    """x @ W.T + b for CPUs without AVX512-VNNI: oneDNN's u8 x s8 product with 7-bit weights.

    Holds W quantised per output feature to +-63 and packed by oneDNN, its scales (out_features,)
    and a float32 bias. Each input row is quantised as Int8Linear's (max|row| / 127) and shifted by
    +128 into unsigned bytes, which oneDNN takes with the zero point 128; its int32 sums are exact.
    """

    rows_independent = ROWS_INDEPENDENT

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        values, scales = quantize_weight_rows(linear.weight.detach().float(), WEIGHT_MAX_WITHOUT_VNNI)  # (N, K), (N, 1)
        self.packed_weight = torch.ops.onednn.qlinear_prepack(values, None)
        self.weight_scales = scales.view(-1)  # (N,)
        self.weight_zero_points = torch.zeros(values.size(0), dtype=torch.int64)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.product_threads: int | None = None  # see kernels.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) float32 -> (..., out_features) float32."""
        rows = x.reshape(-1, x.size(-1))  # (R, K)
        values, row_scales = quantize_rows_unsigned(rows)
        # (values - 128) @ W_q.T, each column times its weight scale: (R, N) float32
        scaled = on_threads(self.product_threads, self.product, values)
        # In place: the (R, N) product is the step's largest tensor for the output projection.
        if self.bias is None:
            output = scaled.mul_(row_scales)
        else:
            output = torch.addcmul(self.bias, scaled, row_scales, out=scaled)
        return output.view(*x.shape[:-1], -1)

    def product(self, values: torch.Tensor) -> torch.Tensor:
        """values: (R, K) uint8 -> (R, N) float32, ((values - 128) @ W_q.T) * weight scales.

        The rows are padded with zeros (bytes of 128) to int8_row_bucket(R) for the call: oneDNN
        compiles and keeps kernels for every distinct row count (~0.5-1 MiB each), and a beam search
        whose finished sentences drop out meets a new count nearly every step. Each row's int32 sums
        are exact, so the padding changes no result.
        """
        count = values.size(0)
        missing = int8_row_bucket(count) - count
        if missing:
            values = torch.cat([values, values.new_full((missing, values.size(1)), 128)])
        output = torch.ops.onednn.qlinear_pointwise(
            values, 1.0, 128, self.packed_weight, self.weight_scales, self.weight_zero_points, None, 1.0, 0,
            torch.float32, "none", [], "",
        )
        return output[:count]


def int8_row_bucket(count: int) -> int:
    """The row count an int8 product runs with: `count` rounded up to a multiple of 8 up to 64, above
    that to a multiple of a quarter of the power of two below it (80..128 by 16, 160..256 by 32, ...).

    At most 4 counts per doubling, so a search meets a few dozen; the padding costs at most 7 rows
    of a small product and under a quarter of a large one (float32 products use kernels.row_bucket,
    which keeps multiples of 32 above 32 rows: finer buckets there measured slower).
    """
    if count <= 64:
        return -(-count // 8) * 8
    step = 1 << ((count - 1).bit_length() - 3)
    return -(-count // step) * step


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """Every linear layer of `model` in any precision (kernels.Linear, BFloat16Linear, the int8 ones), in module order."""
    kinds = (Linear, BFloat16Linear, Int8Linear, Int8LinearWithoutVnni)
    return [module for module in model.modules() if isinstance(module, kinds)]


def convert_linear_layers(model: nn.Module, dtype: str, support: CpuSupport | None = None) -> None:
    """Run every linear layer of `model` in `dtype` ("float32", "bf16" or "int8"), for inference only.

    float32 packs tfm's Linear layers for oneDNN and keeps only the packed copies (kernels.pack_weights
    with keep_plain=False; a tied output projection keeps the embedding's weight). bf16 and int8 replace each
    nn.Linear by a BFloat16Linear, or by the int8 layer for the CPU's `support` (default
    cpu_support(); see int8_layer_class), made from its weights; a weight shared with an embedding
    (a tied output projection) stays float32 in the embedding. Returns nothing; the model is changed
    in place (its `inference_dtype` says to what) and must not be trained afterwards.
    """
    if any(isinstance(module, Linear) and module.plain_weight_freed for module in model.modules()):
        raise RuntimeError("convert_linear_layers: this model was converted already (its plain weights are freed)")
    model.inference_dtype = dtype
    if dtype == "float32":
        pack_weights(model, keep_plain=False)
        return
    if dtype == "bf16":
        replacement = BFloat16Linear
    else:
        replacement = int8_layer_class(cpu_support() if support is None else support)
        if replacement is None:
            raise TfmError("--dtype int8: this torch build has no fast CPU int8 matrix product; use --dtype float32")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):  # tfm's kernels.Linear included
                setattr(module, name, replacement(child))
