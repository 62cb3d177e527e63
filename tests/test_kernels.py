"""tfm's Linear: the same product as F.linear, repacked when its weight changes, batch-invariant rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_cli.model.kernels import Linear, onednn_linear_available


def make_linear(in_features: int, out_features: int, bias: bool = True) -> Linear:
    torch.manual_seed(0)
    linear = Linear(in_features, out_features, bias=bias)
    if bias:
        torch.nn.init.normal_(linear.bias)  # nn.Linear's init is small; make the bias matter
    return linear


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_f_linear_in_inference_and_training(bias):
    linear = make_linear(64, 500, bias=bias)
    x = torch.randn(3, 7, 64)
    expected = F.linear(x, linear.weight, linear.bias)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            torch.testing.assert_close(linear(x), expected, rtol=1e-5, atol=1e-5)
    # Training takes F.linear, with autograd.
    x.requires_grad_(True)
    linear(x).sum().backward()
    assert x.grad is not None and linear.weight.grad is not None


def test_linear_repacks_after_an_in_place_weight_change():
    # An optimizer step changes the weight in place; inference must then use the new weight, not
    # a packed copy of the old one (validation during training runs on the updated model).
    linear = make_linear(32, 40)
    x = torch.randn(5, 32)
    with torch.no_grad():
        before = linear(x)
        linear.weight.mul_(2.0)
        after = linear(x)
        torch.testing.assert_close(after, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


def test_linear_repacks_after_load_state_dict():
    linear = make_linear(32, 40)
    other = Linear(32, 40)
    x = torch.randn(5, 32)
    with torch.no_grad():
        linear(x)  # packs the old weight
        linear.load_state_dict(other.state_dict())
        torch.testing.assert_close(linear(x), other(x), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(256, 8000), (256, 768), (1024, 256)])
def test_a_row_gets_the_same_bits_in_any_batch(shape):
    # What batch-invariant search needs from every product: row i of a B-row call equals the same
    # row computed in a call of any other size, down to one row.
    assert onednn_linear_available(), "this torch build has no oneDNN linear: tfm falls back to F.linear"
    in_features, out_features = shape
    linear = make_linear(in_features, out_features, bias=out_features != 8000)
    x = torch.randn(200, in_features)
    with torch.inference_mode():
        for rows in (1, 2, 3, 5, 7, 16, 33, 100, 160, 200):
            batch = linear(x[:rows])
            for i in sorted({0, rows // 2, rows - 1}):
                alone = linear(x[i : i + 1])[0]
                assert torch.equal(batch[i], alone), (rows, i)
