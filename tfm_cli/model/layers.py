"""The building blocks of section 3: positional encoding, position-wise FFN, encoder and decoder layers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tfm_cli.config import ModelConfig
from tfm_cli.model.attention import (
    CrossAttention,
    KeyValueCache,
    SelfAttention,
    SelfAttentionCache,
)
from tfm_cli.model.dropout import Dropout
from tfm_cli.model.kernels import Linear


def sinusoidal_table(max_positions: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...). Returns (P, D) float32.

    layout "halves" holds the same values with the sines in the first ceil(D/2) dimensions and the
    cosines after them (Marian's table, see halves_sinusoidal_table).
    """
    if layout == "halves":
        return halves_sinusoidal_table(max_positions, d_model)
    positions = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    frequencies = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )  # (D/2,)
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(positions * frequencies)
    table[:, 1::2] = torch.cos(positions * frequencies[: d_model // 2])
    return table


def halves_sinusoidal_table(max_positions: int, d_model: int) -> torch.Tensor:
    """Marian's layout: sin(pos / 10000^(2i/d)) in dims [0, ceil(D/2)), the cosines in the rest. Returns (P, D).

    Computed in float64 and rounded once to float32, as Hugging Face's MarianMT builds it, so an
    imported model sees the very same positional encodings.
    """
    positions = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    exponents = 2 * (torch.arange(d_model, dtype=torch.float64) // 2) / d_model  # (D,): 2i/d for dims 2i, 2i+1
    angles = positions / torch.pow(10000.0, exponents)  # (P, D)
    sines = torch.sin(angles[:, 0::2])  # (P, ceil(D/2))
    cosines = torch.cos(angles[:, 1::2])  # (P, floor(D/2))
    return torch.cat([sines, cosines], dim=1).to(torch.float32)


ACTIVATION_FUNCTIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """Section 3.3: max(0, x W1 + b1) W2 + b2 (or GELU, or swish), the same weights at every position."""

    def __init__(self, d_model: int, d_ff: int, activation: str, activation_dropout: float) -> None:
        super().__init__()
        self.linear1 = Linear(d_model, d_ff)
        self.linear2 = Linear(d_ff, d_model)
        self.activation = ACTIVATION_FUNCTIONS[activation]
        self.activation_dropout = Dropout(activation_dropout)
        for linear in (self.linear1, self.linear2):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, D) -> (B, T, D)."""
        if self.activation is F.relu and isinstance(self.linear1, Linear):
            hidden = self.linear1.forward_relu(x)  # fused where the weight is packed (kernels.py)
        else:  # GELU or swish, or a linear layer converted to bf16/int8 (precision.py)
            hidden = self.activation(self.linear1(x))
        return self.linear2(self.activation_dropout(hidden))


class Sublayer(nn.Module):
    """Residual connection with LayerNorm around one sublayer (section 3.1's "Add & Norm").

    Post-norm (the paper): LayerNorm(x + Dropout(f(x))). Pre-norm: x + Dropout(f(LayerNorm(x))).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)
        self.norm_first = config.norm_first

    def before(self, x: torch.Tensor) -> torch.Tensor:
        """The sublayer's input: normalised first in pre-norm, unchanged in post-norm."""
        return self.norm(x) if self.norm_first else x

    def after(self, x: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        """Add the residual (and normalise, in post-norm)."""
        y = x + self.dropout(sublayer_output)
        return y if self.norm_first else self.norm(y)


class EncoderLayer(nn.Module):
    """Self-attention -> Add & Norm -> FFN -> Add & Norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.self_attn_sublayer = Sublayer(config)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.activation, config.activation_dropout)
        self.ffn_sublayer = Sublayer(config)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, S, D), mask: (B, 1, 1, S). Returns ((B, S, D), self-attention (B, H, S, S) or None)."""
        attended, weights = self.self_attn(self.self_attn_sublayer.before(x), mask=mask, need_weights=need_weights)
        x = self.self_attn_sublayer.after(x, attended)
        x = self.ffn_sublayer.after(x, self.ffn(self.ffn_sublayer.before(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Causal self-attention -> Add & Norm -> cross-attention -> Add & Norm -> FFN -> Add & Norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.self_attn_sublayer = Sublayer(config)
        self.cross_attn = CrossAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.cross_attn_sublayer = Sublayer(config)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.activation, config.activation_dropout)
        self.ffn_sublayer = Sublayer(config)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        need_weights: bool = False,
        need_cross_weights: bool = False,
        target_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x: (B, T, D), the whole target prefix, memory: (B, S, D), memory_mask: (B, 1, 1, S).

        Returns (output (B, T, D), self-attention (B, H, T, T) or None, cross-attention (B, H, T, S)
        or None). The self-attention is causal over x. `need_cross_weights` asks for the
        cross-attention weights only (guided-alignment training). `target_mask` (B, 1, 1, T), True at
        real target positions, replaces the causal mask: every position then sees the whole target
        (full-context alignment).
        """
        is_causal = target_mask is None and x.size(1) > 1
        attended, self_weights = self.self_attn(
            self.self_attn_sublayer.before(x), mask=target_mask, is_causal=is_causal, need_weights=need_weights
        )
        x = self.self_attn_sublayer.after(x, attended)
        attended, cross_weights = self.cross_attn(
            self.cross_attn_sublayer.before(x), memory, memory_mask, need_weights=need_weights or need_cross_weights
        )
        x = self.cross_attn_sublayer.after(x, attended)
        x = self.ffn_sublayer.after(x, self.ffn(self.ffn_sublayer.before(x)))
        return x, self_weights, cross_weights

    def step(
        self,
        x: torch.Tensor,
        memory_mask: torch.Tensor | list[torch.Tensor],
        self_cache: SelfAttentionCache,
        cross_cache: KeyValueCache | list[KeyValueCache],
        explicit_attention: bool = False,
    ) -> torch.Tensor:
        """One new target position per row (incremental decoding): x (B, D) -> (B, D), the same
        computation as `forward` at that position, with the earlier positions' keys/values in
        `self_cache` (this step's are appended) and the memory's in `cross_cache` (see
        CrossAttention.step for groups and lists). `explicit_attention` computes both attentions by
        their explicit formula (see attention.attend).
        """
        attended = self.self_attn.step(self.self_attn_sublayer.before(x), self_cache, explicit_attention)
        x = self.self_attn_sublayer.after(x, attended)
        attended = self.cross_attn.step(self.cross_attn_sublayer.before(x), memory_mask, cross_cache, explicit_attention)
        x = self.cross_attn_sublayer.after(x, attended)
        return self.ffn_sublayer.after(x, self.ffn(self.ffn_sublayer.before(x)))
