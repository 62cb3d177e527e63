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

from tfm_cli.config import TARGET_CONTEXT_HEADS, ModelConfig

ALIGNER_PREFIX = "aligner."  # the aligner's tensors in a checkpoint, next to the model's


def two_layer_network(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    """Linear -> GELU -> Linear."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, out_features))


class TargetContext(nn.Module):
    """One pre-norm self-attention layer over the target positions (TARGET_CONTEXT_HEADS heads, no causal
    mask), on the decoder states projected to `width`: the decoder's states are causal, so without it
    the aligner could not see the target words after the one it links."""

    def __init__(self, in_features: int, width: int) -> None:
        super().__init__()
        self.project = nn.Linear(in_features, width)
        self.layer = nn.TransformerEncoderLayer(
            width, TARGET_CONTEXT_HEADS, 2 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )

    def forward(self, decoder_states: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
        """decoder_states (B, T, F), tgt_mask (B, T) bool (True at real positions) -> (B, T, width)."""
        return self.layer(self.project(decoder_states), src_key_padding_mask=~tgt_mask)


class Aligner(nn.Module):
    """Attention from target positions (queries: the decoder layers' outputs, concatenated, optionally
    through a TargetContext of width `dim`) over source positions (keys: the encoder's output), each
    through its own two-layer network."""

    def __init__(self, config: ModelConfig, hidden: int, dim: int, context: bool = False) -> None:
        super().__init__()
        states = config.n_dec_layers * config.d_model
        self.context = TargetContext(states, dim) if context else None
        self.query = two_layer_network(dim if context else states, hidden, dim)
        self.key = two_layer_network(config.d_model, hidden, dim)
        self.scale = 1.0 / math.sqrt(dim)

    def forward(
        self, decoder_states: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        """decoder_states (B, T, L * D), memory (B, S, D), src_mask (B, S) and tgt_mask (B, T) bool (True
        at real tokens) -> log-probabilities (B, T, S) over the source positions of each target position
        (padding -inf)."""
        if self.context is not None:
            decoder_states = self.context(decoder_states, tgt_mask)
        scores = self.query(decoder_states) @ self.key(memory).transpose(1, 2) * self.scale  # (B, T, S)
        return scores.masked_fill(~src_mask[:, None, :], float("-inf")).log_softmax(dim=-1)


def aligner_shapes(config: ModelConfig, hidden: int, dim: int, context: bool = False) -> dict[str, tuple[int, ...]]:
    """Checkpoint name (with ALIGNER_PREFIX) -> shape of every aligner tensor, from the sizes alone (as
    Aligner.named_parameters() lists them; tests/test_aligner.py compares the two)."""
    states = config.n_dec_layers * config.d_model
    shapes = {}
    if context:
        layer = {
            "self_attn.in_proj_weight": (3 * dim, dim), "self_attn.in_proj_bias": (3 * dim,),
            "self_attn.out_proj.weight": (dim, dim), "self_attn.out_proj.bias": (dim,),
            "linear1.weight": (2 * dim, dim), "linear1.bias": (2 * dim,),
            "linear2.weight": (dim, 2 * dim), "linear2.bias": (dim,),
            "norm1.weight": (dim,), "norm1.bias": (dim,), "norm2.weight": (dim,), "norm2.bias": (dim,),
        }
        shapes[f"{ALIGNER_PREFIX}context.project.weight"] = (dim, states)
        shapes[f"{ALIGNER_PREFIX}context.project.bias"] = (dim,)
        shapes.update({f"{ALIGNER_PREFIX}context.layer.{name}": shape for name, shape in layer.items()})
    for network, in_features in (("query", dim if context else states), ("key", config.d_model)):
        for index, (out_size, in_size) in ((0, (hidden, in_features)), (2, (dim, hidden))):
            shapes[f"{ALIGNER_PREFIX}{network}.{index}.weight"] = (out_size, in_size)
            shapes[f"{ALIGNER_PREFIX}{network}.{index}.bias"] = (out_size,)
    return shapes
