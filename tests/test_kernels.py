"""tfm's Linear: the same product as F.linear, packed only inside explicit scopes, batch-invariant rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from tfm_cli.model import Transformer
from tfm_cli.model.kernels import Linear, onednn_linear_available, pack_weights, packed_weights, row_bucket


def make_linear(in_features: int, out_features: int, bias: bool = True) -> Linear:
    torch.manual_seed(0)
    linear = Linear(in_features, out_features, bias=bias)
    if bias:
        torch.nn.init.normal_(linear.bias)  # nn.Linear's init is small; make the bias matter
    return linear


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_f_linear_packed_and_unpacked(bias):
    linear = make_linear(64, 500, bias=bias)
    x = torch.randn(3, 7, 64)
    expected = F.linear(x, linear.weight, linear.bias)
    with torch.no_grad():
        assert torch.equal(linear(x), expected)  # unpacked: F.linear itself
    for context in (torch.no_grad, torch.inference_mode):
        with packed_weights(linear), context():
            assert linear.packed_weight is not None
            torch.testing.assert_close(linear(x), expected, rtol=1e-5, atol=1e-5)
    assert linear.packed_weight is None
    # Training takes F.linear, with autograd, even while packed.
    with packed_weights(linear):
        x.requires_grad_(True)
        linear(x).sum().backward()
    assert x.grad is not None and linear.weight.grad is not None


def test_each_packed_scope_uses_the_weight_as_it_is_then():
    # Fused AdamW changes weights in place without bumping their version counter: validation after
    # an optimizer step must still see the new weight (tests/test_train_validation.py end to end).
    linear = make_linear(32, 40)
    optimizer = torch.optim.AdamW(linear.parameters(), lr=0.1, fused=True)
    x = torch.randn(5, 32)
    with packed_weights(linear), torch.no_grad():
        before = linear(x)
    linear(x).pow(2).sum().backward()
    optimizer.step()
    with packed_weights(linear), torch.no_grad():
        after = linear(x)
        torch.testing.assert_close(after, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


@pytest.mark.parametrize("shape", [(256, 8000), (256, 768), (1024, 256)])
def test_a_row_gets_the_same_bits_in_any_batch(shape):
    # What batch-invariant search needs from every product: row i of a B-row call equals the same
    # row computed in a call of any other size, down to one row.
    assert onednn_linear_available(), "this torch build has no oneDNN linear: tfm falls back to F.linear"
    in_features, out_features = shape
    linear = make_linear(in_features, out_features, bias=out_features != 8000)
    x = torch.randn(200, in_features)
    pack_weights(linear)
    with torch.inference_mode():
        for rows in (1, 2, 3, 5, 7, 9, 16, 17, 24, 25, 33, 100, 160, 200):  # every row bucket up to 32
            batch = linear(x[:rows])
            for i in sorted({0, rows // 2, rows - 1}):
                alone = linear(x[i : i + 1])[0]
                assert torch.equal(batch[i], alone), (rows, i)


def test_row_buckets_pad_little_and_stay_few():
    buckets = {count: row_bucket(count) for count in range(1, 1025)}
    assert all(count <= bucket < count + 32 for count, bucket in buckets.items())
    assert all(bucket - count < 8 for count, bucket in buckets.items() if count <= 32)  # greedy steps' rows
    assert buckets[1] == 1  # one sentence's greedy steps
    assert len(set(buckets.values())) == 5 + (1024 - 32) // 32  # 1, 8, 16, 24, then every multiple of 32


def test_a_model_that_only_translates_keeps_one_copy_of_each_weight():
    # pack_weights(keep_plain=False), as load_model does: the same outputs bit for bit, the plain
    # weights of the packed layers gone (the tied output projection keeps the embedding's), and a
    # call that would need a freed weight (autograd on) refuses instead of multiplying by zeros.
    assert onednn_linear_available(), "this torch build has no oneDNN linear: tfm falls back to F.linear"
    torch.manual_seed(0)
    model = Transformer(tiny_config(share_embeddings=True)).eval()
    src, tgt = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    with packed_weights(model), torch.inference_mode():
        expected = model(src, tgt)
    pack_weights(model, keep_plain=False)
    layers = [module for module in model.modules() if isinstance(module, Linear)]
    freed = [layer for layer in layers if layer.plain_weight_freed]
    assert len(freed) == len(layers) - 1 and not model.output_proj.plain_weight_freed
    assert all(layer.weight.untyped_storage().nbytes() == 4 for layer in freed)
    assert model.output_proj.weight is model.src_embed.weight
    with torch.inference_mode():
        assert torch.equal(model(src, tgt), expected)
    with pytest.raises(RuntimeError, match="kept only its packed weight"):
        model(src, tgt)
