"""Linear layers that multiply through oneDNN when running inference on a CPU, and through torch's default otherwise.

torch multiplies float32 matrices on the CPU with MKL. For the decoder's small-row products, on the
AVX2 machines tfm was benchmarked on, oneDNN (which torch also ships, and which CTranslate2 uses on
such CPUs) is faster: the output projection (rows x d_model times d_model x vocab, a quarter of
beam search) ran ~20% faster in beam search (bench/RESULTS.md). Training keeps torch's own path
(autograd), as do GPUs and any torch build without oneDNN.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN and its linear operator (torch.ops.mkldnn._linear_pointwise)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, like F.linear: x (..., in), weight (out, in), bias (out,) -> (..., out).

    Without autograd, on CPU float32 tensors, the product runs through oneDNN. Its rounding does not
    depend on the number of rows from 2 rows on, which batch-invariant search relies on (search.py).
    """
    if (
        torch.is_grad_enabled()
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or not onednn_linear_available()
    ):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict names) whose forward is `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) -> (..., out_features)."""
        return linear(x, self.weight, self.bias)
