"""Linear layers whose CPU inference runs through oneDNN with weights packed once, instead of MKL.

Decoding multiplies a few dozen to a few hundred rows by each weight matrix per step. torch's
default CPU path (MKL's sgemm via F.linear) re-packs the weight on every call; oneDNN (shipped
inside torch, and what CTranslate2 uses on AMD CPUs) can pack a weight once into its blocked
layout and reuse it. Measured on the benchmark machine at 30-160 rows per call: the 256 x 8000
output projection 1.4-3x faster than F.linear, the 1024 x 256 feed-forward layer 1.0-1.6x, the
others about as fast; whole beam searches 1.00-1.04x faster than with only the projection through
oneDNN, unpacked (bench/RESULTS.md). The second reason: a row's result from the packed product
does not depend on how many rows share the call, for any count, while F.linear's differs below 12
rows (tests/test_kernels.py), and searches must not depend on the composition of their batch
(search.py).

Training (autograd), GPUs, non-float32 tensors and torch builds without oneDNN use F.linear.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN's linear operators (torch.ops.mkldnn._linear_pointwise)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def uses_packed_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x @ weight.T should run through the packed oneDNN product: CPU float32 inference only.

    Inference tensors (made under torch.inference_mode) have no version counter to tell when they
    change, so weights made that way keep F.linear.
    """
    return (
        not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not weight.is_inference()
        and onednn_linear_available()
    )


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) that packs its weight for oneDNN in CPU inference.

    The packed copy is made on the first inference call and made again whenever the weight has
    changed since (an optimizer step, a load_state_dict, a move to another device). With `relu`,
    the layer computes max(0, x W^T + b), fused into the product on the packed path.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, relu: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.relu = relu
        self.packed_weight: torch.Tensor | None = None
        self.packed_from: tuple[int, int] | None = None  # (data_ptr, version) of the weight it was packed from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) -> (..., out_features), x @ weight.T + bias (then ReLU, if asked)."""
        if not uses_packed_path(x, self.weight):
            output = F.linear(x, self.weight, self.bias)
            return F.relu(output) if self.relu else output
        weight_id = (self.weight.data_ptr(), self.weight._version)
        if self.packed_from != weight_id:
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
            self.packed_from = weight_id
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "relu" if self.relu else "none", [], "")
