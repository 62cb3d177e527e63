"""tfm's CPU dropout mask: the right drop rate, exact scaling, independent entries, seeded, and its gradient."""

from __future__ import annotations

import math

import torch

from tfm_cli.model.dropout import MASK_LEVELS, Dropout


def test_eval_mode_and_p_zero_are_the_identity():
    x = torch.randn(8, 16)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


def test_drop_rate_and_scale_match_p():
    # 2^22 entries: the drop rate's standard error is ~1.5e-4, so 8 standard errors is a loose, safe bound.
    torch.manual_seed(0)
    p = 0.1
    x = torch.rand(2**22) + 1.0  # never 0, so y == 0 means dropped
    y = Dropout(p).train()(x)
    dropped = y == 0
    threshold = round(p * MASK_LEVELS)
    assert abs(float(dropped.float().mean()) - threshold / MASK_LEVELS) < 8 * math.sqrt(p * (1 - p) / x.numel())
    scale = MASK_LEVELS / (MASK_LEVELS - threshold)  # the exact inverse keep rate: E[y] = x
    torch.testing.assert_close(y[~dropped], x[~dropped] * scale, rtol=1e-6, atol=0)


def test_every_position_of_a_random_word_is_dropped_alike():
    # The mask cuts each 64-bit random draw into 4 pieces; the draw's sign bit is always 0, so a
    # piece that used it would be dropped at a different rate. Also: the pieces are independent.
    torch.manual_seed(1)
    p = 0.5
    kept = Dropout(p).train()(torch.ones(2**22)).view(-1, 4) != 0  # (N/4, 4)
    rates = kept.float().mean(0)
    bound = 8 * math.sqrt(p * (1 - p) / kept.size(0))
    assert torch.all((rates - (1 - p)).abs() < bound), rates
    for i in range(4):
        for j in range(i + 1, 4):
            both = (kept[:, i] & kept[:, j]).float().mean()  # (1 - p)^2 if independent
            assert abs(float(both) - (1 - p) ** 2) < bound, (i, j)


def test_masks_follow_the_seed_and_differ_between_calls():
    dropout = Dropout(0.2).train()
    x = torch.ones(4096)
    torch.manual_seed(7)
    first, second = dropout(x), dropout(x)
    torch.manual_seed(7)
    again = dropout(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 32, requires_grad=True)
    y = Dropout(0.25).train()(x)
    y.sum().backward()
    # y = x * scale_mask elementwise, so dy/dx is y / x wherever x != 0.
    torch.testing.assert_close(x.grad, (y / x).detach())
