"""Dropout (section 5.4: on every sublayer output and on the embedding sums), with a faster CPU mask.

torch's CPU dropout draws its mask with `bernoulli_`, a visible share of a training step; drawing
64 random bits at a time and cutting them into 15-bit numbers gives a Bernoulli mask in less time
(figures: see bench/RESULTS.md, section "Other modules"). On other devices `F.dropout` is used
unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Each mask entry compares a uniform 15-bit number with round(p * 2^15): p is rounded to a multiple
# of 2^-15 (0.1 becomes 0.100006), and kept entries are scaled by the exact inverse keep rate.
MASK_LEVELS = 2**15


def dropout_scale(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of `shape` holding 0 (probability ~p) or 1 / keep rate, from torch's default generator.

    random_() on int64 fills the low 63 bits uniformly (the sign bit stays 0), so each 16-bit piece
    of it, masked to its low 15 bits, is a uniform number in [0, 2^15).
    """
    count = shape.numel()
    bits = torch.empty((count + 3) // 4, dtype=torch.int64).random_().view(torch.int16)[:count].view(shape)
    threshold = round(p * MASK_LEVELS)
    keep = (bits & (MASK_LEVELS - 1)) >= threshold  # (shape) bool, True with probability 1 - threshold / 2^15
    return keep.to(dtype).mul_(MASK_LEVELS / (MASK_LEVELS - threshold))


class Dropout(nn.Module):
    """Zeroes each element with probability p in training and scales the rest by 1 / (1 - p); identity in eval."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: any shape -> the same shape."""
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or round(self.p * MASK_LEVELS) >= MASK_LEVELS:
            return F.dropout(x, self.p, training=True)
        return x * dropout_scale(x.shape, self.p, x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
