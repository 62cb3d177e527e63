"""A trained word aligner on top of a translation model (`tfm train-aligner`).

It reads what the model already computes for a teacher-forced pair, every decoder layer's output
and the encoder's output, and scores each (target position, source position) with one attention
whose queries and keys are small two-layer networks of those states. Trained with the translation
model frozen, toward a statistical aligner's links, it aligns far better than any cross-attention
head of the model, and it leaves translation untouched: nothing of the model changes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tfm_cli.config import ModelConfig

ALIGNER_PREFIX = "aligner."  # the aligner's tensors in a checkpoint, next to the model's


def two_layer_network(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    """Linear -> GELU -> Linear."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, out_features))


class Aligner(nn.Module):
    """Attention from target positions (queries: the decoder layers' outputs, concatenated) over source
    positions (keys: the encoder's output), each through its own two-layer network."""

    def __init__(self, config: ModelConfig, hidden: int, dim: int) -> None:
        super().__init__()
        self.query = two_layer_network(config.n_dec_layers * config.d_model, hidden, dim)
        self.key = two_layer_network(config.d_model, hidden, dim)
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, decoder_states: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """decoder_states (B, T, L * D), memory (B, S, D), src_mask (B, S) bool (True at real tokens)
        -> log-probabilities (B, T, S) over the source positions of each target position (padding -inf)."""
        scores = self.query(decoder_states) @ self.key(memory).transpose(1, 2) * self.scale  # (B, T, S)
        return scores.masked_fill(~src_mask[:, None, :], float("-inf")).log_softmax(dim=-1)


def aligner_shapes(config: ModelConfig, hidden: int, dim: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint name (with ALIGNER_PREFIX) -> shape of every aligner tensor, from the sizes alone (as
    Aligner.named_parameters() lists them; tests/test_aligner.py compares the two)."""
    shapes = {}
    for network, in_features in (("query", config.n_dec_layers * config.d_model), ("key", config.d_model)):
        for index, (out_size, in_size) in ((0, (hidden, in_features)), (2, (dim, hidden))):
            shapes[f"{ALIGNER_PREFIX}{network}.{index}.weight"] = (out_size, in_size)
            shapes[f"{ALIGNER_PREFIX}{network}.{index}.bias"] = (out_size,)
    return shapes
