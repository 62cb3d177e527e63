"""The output projection's product in CPU inference: oneDNN with its weight packed once, not MKL.

Each decoding step multiplies a few dozen to a few hundred rows by the d_model x vocabulary output
weight. oneDNN (shipped inside torch; CTranslate2 uses it on AMD CPUs) can pack that weight once
into its blocked layout; torch's default F.linear (MKL's sgemm) re-packs it on every call. On the
benchmark machine the 256 x 8000 projection ran 1.4-3x faster per call than F.linear at 30-160
rows. A row's result from the packed product does not depend on how many rows share the call
(tests/test_kernels.py), which the batch-invariant searches need (search.py).

Only the output projection uses it: packing every linear layer measured no clear speed-up in
whole beam searches (1.00-1.05x, within the machine's noise) and raised the peak memory of
`tfm translate -b 5` from 861 to 1,044 MiB (oneDNN keeps resources per distinct row count).
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
    changed since (an optimizer step, a load_state_dict, a move to another device).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.packed_weight: torch.Tensor | None = None
        self.packed_from: tuple[int, int] | None = None  # (data_ptr, version) of the weight it was packed from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) -> (..., out_features), x @ weight.T + bias."""
        if not uses_packed_path(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        weight_id = (self.weight.data_ptr(), self.weight._version)
        if self.packed_from != weight_id:
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
            self.packed_from = weight_id
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
