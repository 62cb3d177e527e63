"""The linear layers' product in CPU inference: oneDNN with each weight packed once, not MKL.

Every linear layer of the model is a `Linear`. At inference each decoding step multiplies a few
dozen to a few hundred rows by every weight; oneDNN (shipped inside torch; CTranslate2 uses it on
AMD CPUs) can pack a weight once into its blocked layout, while torch's default F.linear (MKL's
sgemm) re-packs it on every call, so the packed products are faster per call and make whole beam
searches faster (less so on AVX2-capped kernels). oneDNN keeps resources for every distinct row
count it has multiplied, and a beam search meets hundreds; so the rows are padded with zeros to a
multiple of ROW_BUCKET, which lowers the peak memory of `tfm translate` at the same speed. Larger
products (the encoder's sentences x source length, a wide beam's rows) run MAX_CALL_ROWS rows per
call into one output, so they add no row counts beyond MAX_CALL_ROWS / ROW_BUCKET per weight
either (and their calls' working memory is that of MAX_CALL_ROWS rows). Figures: see
bench/RESULTS.md, sections "Packed oneDNN products" and "Where the peak memory of `tfm translate`
goes". A row's result from the packed
product does not depend on how many rows share the call (tests/test_kernels.py), which both the
padding and the batch-invariant searches (inference/decoding.py) rely on.

Training (autograd), GPUs, non-float32 tensors and torch builds without oneDNN use F.linear.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tfm_cli.model.step_threads import on_threads

ROW_BUCKET = 32
MAX_CALL_ROWS = 256


@functools.cache
def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN's linear operators (torch.ops.mkldnn._linear_pointwise)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def uses_packed_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x @ weight.T may run through a packed oneDNN product: CPU float32, autograd off."""
    return (
        not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
    )


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) that can run on a oneDNN-packed copy of its weight.

    Packing is explicit and scoped: `packed_weights(model)` packs every such layer for a stretch of
    inference (a validation pass) and drops the copies at its end; `pack_weights(model)` packs a model
    that is never trained again (one loaded for translate, score, inspect-attention). Nothing is
    cached implicitly: an optimizer can change a weight in place without telling anyone (fused AdamW
    leaves the tensor's version counter alone), so a cache keyed on the weight's identity goes stale.
    Without a packed copy, and whenever autograd records, the layer is plain F.linear.
    `product_threads`, when set (by step_threads.step_mode, for one decoding step), is the number of
    torch threads the product runs on.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.packed_weight: torch.Tensor | None = None
        self.product_threads: int | None = None
        self.plain_weight_freed = False  # set by free_plain_weight: only the packed copy is left

    def pack(self) -> None:
        """Make the packed copy of the current weight (only for CPU float32 weights with oneDNN)."""
        weight = self.weight.detach()
        usable = weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_linear_available()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight) if usable else None

    def release(self) -> None:
        """Drop the packed copy: the layer is plain F.linear again."""
        if self.plain_weight_freed:
            raise RuntimeError("this Linear kept only its packed weight; it cannot go back to F.linear")
        self.packed_weight = None

    def free_plain_weight(self) -> None:
        """Keep only the packed copy (after pack): the plain weight's memory is given up.

        `weight` stays a parameter of the same shape, dtype and device, but a zero-stride view of one
        value, so the layer then runs only through its packed product: on the CPU, in float32, with
        autograd off (anything else raises). For models that only ever translate.
        """
        if self.packed_weight is None:
            raise RuntimeError("free_plain_weight needs a packed weight first (pack)")
        self.weight = nn.Parameter(self.weight.detach().new_zeros(()).expand(self.weight.shape), requires_grad=False)
        self.plain_weight_freed = True

    def require_plain_weight(self) -> None:
        """Raise RuntimeError when the plain F.linear path is needed but the plain weight was freed."""
        if self.plain_weight_freed:
            raise RuntimeError(
                "this Linear kept only its packed weight (free_plain_weight): it runs on the CPU, in float32, "
                "under torch.inference_mode or torch.no_grad"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) -> (..., out_features), x @ weight.T + bias."""
        if self.packed_weight is None or not uses_packed_path(x, self.weight):
            self.require_plain_weight()
            return on_threads(self.product_threads, F.linear, x, self.weight, self.bias)
        return on_threads(self.product_threads, packed_linear, x, self.packed_weight, self.bias)

    def forward_relu(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) -> (..., out_features), max(0, x @ weight.T + bias).

        On the packed path oneDNN applies the ReLU to the product before writing it (one pass over
        the output instead of two); the result is the same bits as F.relu after forward.
        """
        if self.packed_weight is None or not uses_packed_path(x, self.weight):
            self.require_plain_weight()
            return F.relu(on_threads(self.product_threads, F.linear, x, self.weight, self.bias))
        return on_threads(self.product_threads, packed_linear, x, self.packed_weight, self.bias, "relu")


def packed_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none"
) -> torch.Tensor:
    """x: (..., in_features) -> (..., out_features) by oneDNN with a weight from _reorder_linear_weight.

    activation: "none", or "relu" applied by oneDNN to the result before it is written. Each call
    takes at most MAX_CALL_ROWS rows, padded to a multiple of ROW_BUCKET (see the module docstring).
    x and the weight share a dtype.
    """
    call = functools.partial(padded_call, packed_weight=packed_weight, bias=bias, activation=activation)
    output = by_row_blocks(x.reshape(-1, x.size(-1)), call)
    return output.view(*x.shape[:-1], output.size(-1))


def padded_call(
    rows: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """rows: (R, in_features) -> (R, out_features), one oneDNN call on rows padded to a multiple of ROW_BUCKET.

    The padding rows (zeros) are dropped from the result, which may be a view of a larger tensor.
    """
    count = rows.size(0)
    missing = -count % ROW_BUCKET
    if missing:
        rows = torch.cat([rows, rows.new_zeros(missing, rows.size(1))])
    return torch.ops.mkldnn._linear_pointwise(rows, packed_weight, bias, activation, [], "")[:count]


def by_row_blocks(
    rows: torch.Tensor, product: Callable[[torch.Tensor], torch.Tensor], max_rows: int = MAX_CALL_ROWS
) -> torch.Tensor:
    """rows: (R, K) -> product(rows), (R, N), with `product` called on at most `max_rows` rows at a time.

    For products whose rows are independent (each output row depends on its input row only): the
    blocks' results are written into one (R, N) output, so no more than one block's result exists
    beside it. Returns product(rows) itself when R <= max_rows.
    """
    count = rows.size(0)
    if count <= max_rows:
        return product(rows)
    first = product(rows[:max_rows])
    output = first.new_empty(count, first.size(1))
    output[:max_rows] = first
    del first
    for start in range(max_rows, count, max_rows):
        block = rows[start : start + max_rows]
        output[start : start + block.size(0)] = product(block)
    return output


def pack_weights(model: nn.Module, keep_plain: bool = True) -> None:
    """Pack every tfm Linear of `model` for CPU inference; the weights must not change afterwards.

    keep_plain=False frees the plain weight of every layer whose packed copy was made and whose
    weight no other module uses (a tied output projection keeps the embedding's): one copy of the
    linear layers' weights instead of two, for a model that only translates (free_plain_weight).
    """
    uses = Counter() if keep_plain else Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    for module in model.modules():
        if isinstance(module, Linear):
            module.pack()
            if not keep_plain and module.packed_weight is not None and uses[id(module.weight)] == 1:
                module.free_plain_weight()


@contextlib.contextmanager
def packed_weights(model: nn.Module) -> Iterator[None]:
    """Within the block, every tfm Linear of `model` runs on a packed copy of its current weight.

    For inference between optimizer steps (validation): the copies are made on entry and dropped
    on exit, so the next block packs the weights as they are then.
    """
    pack_weights(model)
    try:
        yield
    finally:
        for module in model.modules():
            if isinstance(module, Linear):
                module.release()
