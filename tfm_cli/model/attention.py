"""Multi-head attention (section 3.2): fused projections, SDPA fast path, a weights-returning path.

Mask convention, used everywhere in tfm: masks are bool and True means "may attend"
(the convention of torch.nn.functional.scaled_dot_product_attention). A key padding mask has
shape (B, S) and is True at real tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfm_cli.model.kernels import Linear


@dataclass
class KeyValueCache:
    """Cross-attention keys/values of the encoder memory, (G, H, S, Dh) each: one entry per group of
    decoder rows (see DecoderState), computed once per sentence (Transformer.start_decoding)."""

    keys: torch.Tensor
    values: torch.Tensor

    def select(self, indices: torch.Tensor) -> None:
        """Keep entries `indices` (G',) in this order: drops finished sentences, copies a sentence's entry."""
        self.keys = self.keys.index_select(0, indices)
        self.values = self.values.index_select(0, indices)


class SelfAttentionCache:
    """The self-attention keys/values of the steps decoded so far, in one buffer with room to grow.

    The buffer is (2, B, H, capacity, Dh): keys at [0], values at [1]; the first `length` positions
    are filled. Keys and values live in one tensor so that a step appends them with one copy and a
    beam reorder gathers them with one index_select: decoding does this for every layer at every
    step, where the number of operations counts as much as their size. Appending writes in place
    (no copy of the earlier steps), and `select` gathers only the filled part.
    """

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.length = 0

    def append(self, keys_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add new keys/values (2, B, H, T, Dh) after the cached ones.

        Returns all keys and all values so far, (B, H, length, Dh) each (views of the buffer).
        """
        new_length = self.length + keys_values.size(3)
        if self.buffer is None or new_length > self.buffer.size(3):
            self.grow(keys_values, max(new_length, 2 * self.length, 16))
        self.buffer[:, :, :, self.length : new_length] = keys_values
        self.length = new_length
        return self.buffer[0, :, :, :new_length], self.buffer[1, :, :, :new_length]

    def grow(self, like: torch.Tensor, capacity: int) -> None:
        """Move the filled part into a new buffer of `capacity` positions shaped like `like` (2, B, H, *, Dh)."""
        two, batch, n_heads, _, head_dim = like.shape
        buffer = like.new_empty((two, batch, n_heads, capacity, head_dim))
        if self.buffer is not None:
            buffer[:, :, :, : self.length] = self.buffer[:, :, :, : self.length]
        self.buffer = buffer

    def select(self, indices: torch.Tensor) -> None:
        """Keep batch rows `indices` (B',) in this order (beam reordering, dropping finished rows).

        The new buffer has room for exactly one more step: a beam search reorders its rows before
        nearly every step, so its caches hold almost no unused positions, where buffers that double
        when full hold up to half. A step with no select in between grows the buffer (`append`).
        """
        if self.buffer is None:
            return
        two, _, n_heads, _, head_dim = self.buffer.shape
        selected = self.buffer.new_empty((two, indices.numel(), n_heads, self.length + 1, head_dim))
        torch.index_select(self.buffer[:, :, :, : self.length], 1, indices, out=selected[:, :, :, : self.length])
        self.buffer = selected


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, Dh)."""
    batch, length, d_model = x.shape
    # (B, T, D) -> (B, T, H, Dh) -> (B, H, T, Dh)
    return x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, Dh) -> (B, T, D): the concatenation of the heads before W^O."""
    batch, n_heads, length, head_dim = x.shape
    # (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D)
    return x.transpose(1, 2).reshape(batch, length, n_heads * head_dim)


def attention_weights(
    queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) with masked positions set to exactly 0.

    queries: (B, H, T, Dh), keys: (B, H, S, Dh), mask: broadcastable to (B, H, T, S), True = attend.
    Returns (B, H, T, S) float weights; each unmasked row sums to 1.
    """
    # Section 3.2.1: scale by 1/sqrt(d_k) so large d_k does not push softmax into tiny gradients.
    # The scaling and masking work in place: `scores` is a fresh tensor that autograd does not keep,
    # and decoding runs this once per layer and step, where every allocation shows.
    scores = (queries @ keys.transpose(-2, -1)).div_(math.sqrt(queries.size(-1)))  # (B, H, T, S)
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout: float,
    need_weights: bool,
    *,
    explicit: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention over heads.

    queries (B, H, T, Dh), keys/values (B, H, S, Dh), mask broadcastable to (B, H, T, S).
    Returns (output (B, H, T, Dh), weights (B, H, T, S) if `need_weights` else None). It runs
    torch's fused kernel unless `need_weights` or `explicit` asks for the explicit formula
    softmax(QK^T / sqrt(d_k)) V, which gives the same output up to rounding; unlike the fused
    kernel, its rounding of a row does not depend on how many rows share the call.
    """
    if not (need_weights or explicit):
        output = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, dropout_p=dropout, is_causal=is_causal
        )
        return output, None
    weights = attention_weights(queries, keys, mask, is_causal)
    output = (F.dropout(weights, dropout) if dropout > 0 else weights) @ values
    return output, weights if need_weights else None


def init_fused_projection(linear: nn.Linear, n_parts: int) -> None:
    """Xavier-uniform init of a fused projection as if its n_parts (D, D) slices were separate layers."""
    for part in linear.weight.chunk(n_parts, dim=0):
        nn.init.xavier_uniform_(part)
    nn.init.zeros_(linear.bias)


class SelfAttention(nn.Module):
    """Multi-head self-attention with ONE fused Q, K, V projection (sliced after one matmul)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv_proj = Linear(d_model, 3 * d_model)
        self.out_proj = Linear(d_model, d_model)
        init_fused_projection(self.qkv_proj, 3)
        init_fused_projection(self.out_proj, 1)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        explicit: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, D), the whole sequence. Returns (output (B, T, D), weights (B, H, T, T) or None).

        `explicit`: see `attend`.
        """
        projected = self.qkv_proj(x)  # (B, T, 3D): queries, keys, values side by side
        batch, length, d_model = x.shape
        queries = split_heads(projected[..., :d_model], self.n_heads)  # (B, H, T, Dh)
        # (B, T, 2D) -> (B, T, 2, H, Dh) -> (2, B, H, T, Dh) -> keys, values (B, H, T, Dh) each
        keys, values = projected[..., d_model:].view(batch, length, 2, self.n_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        dropout = self.dropout if self.training else 0.0
        output, weights = attend(queries, keys, values, mask, is_causal, dropout, need_weights, explicit=explicit)
        return self.out_proj(merge_heads(output)), weights

    def step(self, x: torch.Tensor, cache: SelfAttentionCache, explicit: bool = False) -> torch.Tensor:
        """One new position per row: x (B, D) -> (B, D). Its keys/values are appended to `cache`, and its
        query attends to everything cached (no causal mask needed). The same products as `forward` on the
        rows; the step works on (B, D) so that it reshapes nothing per product. `explicit`: see `attend`."""
        projected = self.qkv_proj(x)  # (B, 3D)
        batch, d_model = x.shape
        queries = projected[:, :d_model].view(batch, 1, self.n_heads, -1).transpose(1, 2)  # (B, H, 1, Dh)
        # (B, 2D) -> (B, 1, 2, H, Dh) -> (2, B, H, 1, Dh): keys at [0], values at [1]
        keys_values = projected[:, d_model:].view(batch, 1, 2, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        keys, values = cache.append(keys_values)  # (B, H, t + 1, Dh) each
        dropout = self.dropout if self.training else 0.0
        output, _ = attend(queries, keys, values, None, False, dropout, False, explicit=explicit)  # (B, H, 1, Dh)
        return self.out_proj(output.view(batch, d_model))


class CrossAttention(nn.Module):
    """Encoder-decoder attention: Q from the decoder, K and V from ONE fused projection of the memory."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.q_proj = Linear(d_model, d_model)
        self.kv_proj = Linear(d_model, 2 * d_model)
        self.out_proj = Linear(d_model, d_model)
        init_fused_projection(self.q_proj, 1)
        init_fused_projection(self.kv_proj, 2)
        init_fused_projection(self.out_proj, 1)

    def project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """memory: (B, S, D) -> keys, values: (B, H, S, Dh) each (computed once per sentence)."""
        keys, values = self.kv_proj(memory).chunk(2, dim=-1)  # 2 x (B, S, D)
        return split_heads(keys, self.n_heads), split_heads(values, self.n_heads)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor, need_weights: bool = False, explicit: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, D), memory: (B, S, D), mask: (B, 1, 1, S). Returns ((B, T, D), (B, H, T, S) or None).

        `explicit`: see `attend`.
        """
        keys, values = self.project_memory(memory)
        queries = split_heads(self.q_proj(x), self.n_heads)  # (B, H, T, Dh)
        attended, weights = self.attend_groups(queries, keys, values, mask, need_weights, explicit)
        return self.out_proj(attended), weights

    def step(
        self, x: torch.Tensor, mask: torch.Tensor | list[torch.Tensor], cache: KeyValueCache | list[KeyValueCache],
        explicit: bool = False,
    ) -> torch.Tensor:
        """One new position per row: x (B, D) -> (B, D), attending to the memory's keys/values in `cache`.

        The cache may hold G = B / w entries, one per group of w consecutive rows (the beams of one
        sentence share their source): `mask` is then (G, 1, 1, S) and each group's w rows are multiplied
        with their keys in one product, so the cache is neither copied per row nor read w times. A list
        of caches with a list of masks (decoding sources of several widths, one cache per width:
        transformer.SourcePart) splits the rows in that order, each run attending to its own cache; the
        projections still run on all rows at once. `explicit`: see `attend`.
        """
        batch, d_model = x.shape
        queries = self.q_proj(x).view(batch, 1, self.n_heads, -1).transpose(1, 2)  # (B, H, 1, Dh)
        if isinstance(cache, KeyValueCache):
            attended, _ = self.attend_groups(queries, cache.keys, cache.values, mask, False, explicit)
        else:
            group_width = batch // sum(part.keys.size(0) for part in cache)
            outputs, start = [], 0
            for part_mask, part in zip(mask, cache):
                rows = part.keys.size(0) * group_width
                part_attended, _ = self.attend_groups(
                    queries[start : start + rows], part.keys, part.values, part_mask, False, explicit
                )
                outputs.append(part_attended)
                start += rows
            attended = torch.cat(outputs)
        return self.out_proj(attended.view(batch, d_model))

    def attend_groups(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
        need_weights: bool, explicit: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """queries (B, H, T, Dh) of G groups of B / G rows, keys/values (G, H, S, Dh), mask (G, 1, 1, S)
        -> (the heads merged (B, T, D), weights (B, H, T, S) or None)."""
        batch, _, length, _ = queries.shape
        d_model = self.n_heads * queries.size(-1)
        groups = keys.size(0)
        group_width = batch // groups
        if group_width > 1:
            # (B, H, T, Dh) -> (G, w, H, T, Dh) -> (G, H, w, T, Dh) -> (G, H, w*T, Dh)
            queries = queries.view(groups, group_width, self.n_heads, length, -1).transpose(1, 2)
            queries = queries.reshape(groups, self.n_heads, group_width * length, -1)
        dropout = self.dropout if self.training else 0.0
        output, weights = attend(queries, keys, values, mask, False, dropout, need_weights, explicit=explicit)
        if group_width > 1:
            # (G, H, w*T, Dh) -> (G, H, w, T, Dh) -> (G, w, T, H, Dh) -> (B, T, D)
            output = output.view(groups, self.n_heads, group_width, length, -1).permute(0, 2, 3, 1, 4)
            attended = output.reshape(batch, length, d_model)
            if weights is not None:
                # (G, H, w*T, S) -> (G, w, H, T, S) -> (B, H, T, S)
                weights = weights.view(groups, self.n_heads, group_width, length, -1).transpose(1, 2)
                weights = weights.reshape(batch, self.n_heads, length, -1)
        else:
            attended = merge_heads(output)
        return attended, weights
