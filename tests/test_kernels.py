"""The oneDNN output projection: the same product as F.linear, and a row's result independent of its batch."""

from __future__ import annotations

import torch

from tfm_cli.model.kernels import inference_linear, onednn_linear_available


def test_inference_linear_is_x_times_weight_transposed():
    torch.manual_seed(0)
    x, weight = torch.randn(3, 7, 64), torch.randn(500, 64)
    with torch.no_grad():
        torch.testing.assert_close(inference_linear(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # training takes F.linear, with autograd
        x.requires_grad_(True)
        inference_linear(x, weight).sum().backward()
        torch.testing.assert_close(x.grad, weight.sum(0).expand_as(x))


def test_a_row_gets_the_same_bits_in_any_batch():
    # What batch-invariant beam search needs from the product: row i of a B-row call equals the
    # same row computed first in a 16-row call (searches never go below 16 rows), for every B.
    assert onednn_linear_available(), "this torch build has no oneDNN linear: tfm falls back to F.linear"
    torch.manual_seed(1)
    x, weight = torch.randn(200, 256), torch.randn(8000, 256)
    with torch.inference_mode():
        for rows in (16, 17, 33, 100, 160, 200):
            batch = inference_linear(x[:rows], weight)
            for i in (0, rows // 2, rows - 1):
                alone = inference_linear(torch.cat([x[i : i + 1], x[:15]]), weight)[0]
                assert torch.equal(batch[i], alone), (rows, i)
