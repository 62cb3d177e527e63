"""The linear layers' product in CPU inference: oneDNN with each weight packed once, not MKL.

Every linear layer of the model is a `Linear`. At inference each decoding step multiplies a few
dozen to a few hundred rows by every weight; oneDNN (shipped inside torch; CTranslate2 uses it on
AMD CPUs) can pack a weight once into its blocked layout, while torch's default F.linear (MKL's
sgemm) re-packs it on every call, so the packed products are faster per call and make whole beam
searches faster (less so on AVX2-capped kernels). oneDNN keeps resources for every distinct row
count it has multiplied, and a beam search meets hundreds; so the rows are padded with zeros to one
of a few counts (`row_bucket`), which lowers the peak memory of `tfm translate` at the same speed.
Figures: see bench/RESULTS.md, section "Packed oneDNN products". A row's result from the packed
product does not depend on how many rows share the call (tests/test_kernels.py), which both the
padding and the batch-invariant searches (inference/decoding.py) rely on.

Training (autograd), GPUs, non-float32 tensors and torch builds without oneDNN use F.linear.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tfm_cli.model.step_threads import on_threads

ROW_BUCKET = 32
SMALL_ROW_BUCKET = 8


@functools.cache
def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN's linear operators (torch.ops.mkldnn._linear_pointwise)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def row_bucket(count: int) -> int:
    """The row count a packed product of `count` rows runs with: 1 for one row, else the next multiple
    of SMALL_ROW_BUCKET up to ROW_BUCKET rows, of ROW_BUCKET above.

    One row is a greedy search of one sentence (a served request, a pipeline's line), which multiplies
    one row by every weight at every step. The small buckets serve the few rows of greedy steps, whose
    time grows with the rows; above them finer buckets made whole searches slower (a new oneDNN
    primitive per count and weight; bench/RESULTS.md, section "Row buckets and the cost of one product call").
    """
    if count == 1:
        return 1
    bucket = SMALL_ROW_BUCKET if count <= ROW_BUCKET else ROW_BUCKET
    return -(-count // bucket) * bucket


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

    @property
    def rows_independent(self) -> bool:
        """True when a row's result does not depend on how many rows share the call: with a packed copy
        (tests/test_kernels.py). MKL's F.linear multiplies fewer than ~12 rows with another kernel."""
        return self.packed_weight is not None

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
        return self.product(x, "none")

    def forward_relu(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) -> (..., out_features), max(0, x @ weight.T + bias).

        On the packed path oneDNN applies the ReLU to the product before writing it (one pass over
        the output instead of two); the result is the same bits as F.relu after forward.
        """
        return self.product(x, "relu")

    def product(self, x: torch.Tensor, activation: str) -> torch.Tensor:
        """forward ("none") or forward_relu ("relu"). A decoding step calls this for every layer, so the
        packed path's test reads only x's flags: the packed weight exists only for a CPU float32 weight."""
        if self.packed_weight is not None and x.is_cpu and x.dtype is torch.float32 and not torch.is_grad_enabled():
            if self.product_threads is None:
                return packed_linear(x, self.packed_weight, self.bias, activation)
            return on_threads(self.product_threads, packed_linear, x, self.packed_weight, self.bias, activation)
        self.require_plain_weight()
        output = on_threads(self.product_threads, F.linear, x, self.weight, self.bias)
        return F.relu(output) if activation == "relu" else output


def packed_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none"
) -> torch.Tensor:
    """x: (..., in_features) -> (..., out_features) by oneDNN with a weight from _reorder_linear_weight.

    activation: "none", or "relu" applied by oneDNN to the result before it is written. The rows are
    padded with zeros to row_bucket(rows) for the call (see the module docstring); the padding rows
    are dropped from the result. x and the weight share a dtype.
    """
    rows = x if x.dim() == 2 else x.reshape(-1, x.size(-1))
    count = rows.size(0)
    missing = row_bucket(count) - count
    if missing:
        rows = torch.cat([rows, rows.new_zeros(missing, rows.size(1))])
    output = torch.ops.mkldnn._linear_pointwise(rows, packed_weight, bias, activation, [], "")
    if missing:
        output = output[:count]
    return output if x.dim() == 2 else output.view(*x.shape[:-1], output.size(-1))


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
