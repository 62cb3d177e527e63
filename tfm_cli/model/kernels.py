"""The output projection's matrix product in CPU inference, through oneDNN instead of torch's default (MKL).

On the AVX2 CPUs tfm was benchmarked on, oneDNN (shipped inside torch; CTranslate2 picks it on such
CPUs) multiplies the decoder's rows x d_model by d_model x vocab product faster than MKL: in beam
search with the Multi30k model it took 1.22 s instead of 1.52 s (bench/profile_search.py). The same
switch for every other linear layer made beam search slower (0.86x), so only the output projection
uses it. Training (autograd), GPUs and torch builds without oneDNN keep F.linear.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN and its linear operator (torch.ops.mkldnn._linear_pointwise)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def inference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T, like F.linear without a bias: x (..., in), weight (out, in) -> (..., out).

    Without autograd, on CPU float32 tensors, the product runs through oneDNN. Its rounding of a row
    does not depend on how many rows share the call (checked from 2 to 1,300 rows), which the
    batch-invariant searches rely on (search.py).
    """
    if (
        torch.is_grad_enabled()
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or not onednn_linear_available()
    ):
        return F.linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
