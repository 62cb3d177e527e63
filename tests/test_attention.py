"""Attention against independent references: the seed document's worked example, nn.MultiheadAttention."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tfm_cli.model.attention import CrossAttention, SelfAttention, attend, split_heads

# The seed document's "I love your dog" example (shared/seed/README.md); x W convention.
SEED_X = [[0.12, -0.5, 1.0, 0.0, 0.45, -0.1],
          [0.0, 0.88, 0.1, 1.2, -0.3, 0.5],
          [-0.2, 0.1, 0.95, -0.1, 1.1, 0.0],
          [0.05, -0.1, 0.0, 0.8, 0.3, 1.5]]
SEED_WQ = [[1, 0, 0], [0, 1, 0], [0.5, 0.5, 0], [0, 0, 1], [0, 0.5, 0.5], [1, 0, 1]]
SEED_WK = [[0.6, 0.1, 0.0], [0.0, 0.8, 0.2], [0.4, 0.3, 0.1], [0.1, 0.0, 0.9], [0.0, 0.7, 0.4], [0.5, 0.0, 0.8]]
SEED_WV = [[0.9, 0, 0.1, 0, 0.2, 0], [0, 0.8, 0, 0.2, 0, 0.1], [0.2, 0.1, 0.9, 0, 0.3, 0],
           [0, 0.2, 0, 0.8, 0.1, 0.4], [0.1, 0, 0.3, 0.1, 0.9, 0], [0, 0.1, 0, 0.4, 0, 0.9]]
SEED_Q = [[0.520, 0.225, 0.125], [0.550, 0.780, 1.550], [0.275, 1.125, 0.450], [1.550, 0.050, 2.450]]
SEED_K = [[0.422, 0.227, 0.100], [0.410, 0.524, 1.546], [0.250, 1.115, 0.465], [0.860, 0.135, 2.020]]
SEED_V = [[0.353, -0.310, 1.047, -0.095, 0.729, -0.140], [-0.010, 1.004, 0.000, 1.306, -0.120, 1.018],
          [0.120, 0.155, 1.165, 0.050, 1.225, -0.030], [0.075, 0.230, 0.095, 1.250, 0.360, 1.660]]
SEED_SCORE_LOVE_I = 0.564
SEED_SOFTMAX_LOVE = [0.0754, 0.3133, 0.1477, 0.4636]


def seed_attention() -> SelfAttention:
    """d_model 6 with 2 heads gives d_k = 3: head 0 carries the document's W^Q and W^K; V is all of W^V."""
    attention = SelfAttention(d_model=6, n_heads=2, dropout=0.0)
    weight = torch.zeros(18, 6)
    # nn.Linear computes x @ weight.T, so the document's W (x W) goes in transposed.
    weight[0:3] = torch.tensor(SEED_WQ).T
    weight[6:9] = torch.tensor(SEED_WK).T
    weight[12:18] = torch.tensor(SEED_WV).T
    with torch.no_grad():
        attention.qkv_proj.weight.copy_(weight)
        attention.qkv_proj.bias.zero_()
    return attention


def test_seed_example_reproduces_q_k_v_score_and_softmax():
    attention = seed_attention()
    x = torch.tensor(SEED_X)[None]  # (1, 4, 6)
    q, k, v = attention.qkv_proj(x).chunk(3, dim=-1)
    q_head0 = split_heads(q, 2)[0, 0]  # (4, 3)
    k_head0 = split_heads(k, 2)[0, 0]
    torch.testing.assert_close(q_head0, torch.tensor(SEED_Q), atol=1e-3, rtol=0)
    torch.testing.assert_close(k_head0, torch.tensor(SEED_K), atol=1e-3, rtol=0)
    torch.testing.assert_close(v[0], torch.tensor(SEED_V), atol=1e-3, rtol=0)
    score = (q_head0[1] @ k_head0[0]).item()  # love -> I
    assert score == pytest.approx(SEED_SCORE_LOVE_I, abs=1e-3)
    _, weights = attention(x, need_weights=True)  # (1, 2, 4, 4)
    torch.testing.assert_close(weights[0, 0, 1], torch.tensor(SEED_SOFTMAX_LOVE), atol=1e-3, rtol=0)
    assert math.isclose(weights[0, 0, 1].sum().item(), 1.0, abs_tol=1e-6)


def copy_self_attention(ours: SelfAttention, reference: nn.MultiheadAttention) -> None:
    """Our fused qkv layout [W_q; W_k; W_v] is the same as nn.MultiheadAttention's in_proj_weight."""
    with torch.no_grad():
        reference.in_proj_weight.copy_(ours.qkv_proj.weight)
        reference.in_proj_bias.copy_(ours.qkv_proj.bias)
        reference.out_proj.weight.copy_(ours.out_proj.weight)
        reference.out_proj.bias.copy_(ours.out_proj.bias)


def randomize(module: nn.Module) -> None:
    """Give every parameter (biases too) random values so no term can hide behind a zero."""
    with torch.no_grad():
        for param in module.parameters():
            param.normal_(0, 0.3)


@pytest.fixture
def padded_batch():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16)
    lengths = torch.tensor([7, 4, 1])
    key_mask = torch.arange(7)[None, :] < lengths[:, None]  # (B, S) True = real
    return x, key_mask


def test_self_attention_with_padding_equals_multihead_attention(padded_batch):
    x, key_mask = padded_batch
    ours = SelfAttention(16, 4, 0.0).eval()
    randomize(ours)
    reference = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    copy_self_attention(ours, reference)
    expected, expected_weights = reference(x, x, x, key_padding_mask=~key_mask, average_attn_weights=False)
    fast, none = ours(x, mask=key_mask[:, None, None, :])
    slow, weights = ours(x, mask=key_mask[:, None, None, :], need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(slow, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=0)
    assert torch.all(weights.masked_select(~key_mask[:, None, None, :].expand_as(weights)) == 0)


def test_causal_self_attention_equals_multihead_attention(padded_batch):
    x, _ = padded_batch
    ours = SelfAttention(16, 4, 0.0).eval()
    randomize(ours)
    reference = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    copy_self_attention(ours, reference)
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)  # MHA convention: True = blocked
    expected, expected_weights = reference(x, x, x, attn_mask=future, average_attn_weights=False)
    fast, _ = ours(x, is_causal=True)
    slow, weights = ours(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(slow, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=0)
    assert torch.all(weights[..., future] == 0)


def test_cross_attention_with_padding_equals_multihead_attention(padded_batch):
    memory, key_mask = padded_batch
    torch.manual_seed(1)
    queries = torch.randn(3, 5, 16)
    ours = CrossAttention(16, 4, 0.0).eval()
    randomize(ours)
    reference = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
        reference.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        reference.out_proj.weight.copy_(ours.out_proj.weight)
        reference.out_proj.bias.copy_(ours.out_proj.bias)
    expected, expected_weights = reference(
        queries, memory, memory, key_padding_mask=~key_mask, average_attn_weights=False
    )
    mask = key_mask[:, None, None, :]
    fast, _ = ours(queries, memory, mask)
    slow, weights = ours(queries, memory, mask, need_weights=True)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(slow, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 5), atol=1e-6, rtol=0)


def test_explicit_attention_rounds_a_row_the_same_in_any_batch():
    # The searches ask for the explicit formula (decode_step's explicit_attention) because torch's
    # fused CPU kernel, for one query per sequence on two threads, rounds a row differently with
    # the batch size (seen with torch 2.13 on AVX2 at 160 rows). The explicit one must not.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        queries, keys, values = torch.randn(160, 4, 1, 64), torch.randn(160, 4, 12, 64), torch.randn(160, 4, 12, 64)
        batch, weights = attend(queries, keys, values, None, False, 0.0, need_weights=False, explicit=True)
        assert weights is None
        for start in range(0, 160, 16):
            rows = slice(start, start + 16)
            alone, _ = attend(
                queries[rows], keys[rows], values[rows], None, False, 0.0, need_weights=False, explicit=True
            )
            assert torch.equal(alone, batch[rows])
        # The same output as the fused kernel, up to rounding.
        fused, _ = attend(queries, keys, values, None, False, 0.0, need_weights=False)
        torch.testing.assert_close(batch, fused)
    finally:
        torch.set_num_threads(threads)
