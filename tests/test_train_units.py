"""Training pieces against independent references: the schedule by hand, the loss against torch's, accumulation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from tfm_cli.corpus.batching import collate
from tfm_cli.corpus.tokenized import FilterStats, TokenizedCorpus, flatten
from tfm_cli.model import Transformer
from tfm_cli.training.lr_schedules import InverseSqrt, ScheduleSettings
from tfm_cli.training.objective import label_smoothed_loss
from tfm_cli.training.step import StepSettings, train_step


def learning_rate(step: int, d_model: int, warmup_steps: int, peak_lr: float) -> float:
    return InverseSqrt(ScheduleSettings(peak_lr, warmup_steps, d_model)).rate(step)


def test_paper_schedule_by_hand():
    # d_model 512, warmup 4000 (section 5.3): step 1 -> 512^-0.5 * 4000^-1.5; peak at 4000 -> 512^-0.5 * 4000^-0.5.
    assert learning_rate(1, 512, 4000, 0.0) == pytest.approx(0.04419417 * 3.9528471e-6, rel=1e-6)
    assert learning_rate(4000, 512, 4000, 0.0) == pytest.approx(0.04419417 * 0.015811388, rel=1e-6)
    assert learning_rate(16000, 512, 4000, 0.0) == pytest.approx(0.04419417 / 126.49111, rel=1e-6)
    # Linear before the peak, inverse square root after it.
    assert learning_rate(2000, 512, 4000, 0.0) == pytest.approx(learning_rate(4000, 512, 4000, 0.0) / 2)


def test_peak_lr_schedule_by_hand():
    assert learning_rate(100, 256, 1000, 1e-3) == pytest.approx(1e-4)
    assert learning_rate(1000, 256, 1000, 1e-3) == pytest.approx(1e-3)
    assert learning_rate(4000, 256, 1000, 1e-3) == pytest.approx(5e-4)
    assert learning_rate(9, 256, 0, 1e-3) == pytest.approx(1e-3 / 3)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_torch_cross_entropy_ignoring_padding(epsilon):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator)  # (B, T, V)
    targets = torch.randint(1, 11, (3, 5), generator=generator)
    targets[1, 3:] = 0  # padding
    targets[2, 1:] = 0
    real = targets.view(-1) != 0
    loss, nll = label_smoothed_loss(logits.view(-1, 11)[real], targets.view(-1)[real], epsilon)
    reference = F.cross_entropy(logits.view(-1, 11), targets.view(-1), ignore_index=0, label_smoothing=epsilon, reduction="sum")
    reference_nll = F.cross_entropy(logits.view(-1, 11), targets.view(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(nll, reference_nll)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_label_smoothed_loss_gradient_equals_autograd_of_the_formula(epsilon):
    # The loss writes its backward by hand; autograd through log_softmax, gather and mean is the reference.
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(13, 17, generator=generator, dtype=torch.float64).mul(3).requires_grad_(True)
    targets = torch.randint(0, 17, (13,), generator=generator)
    loss, nll = label_smoothed_loss(logits, targets, epsilon)
    (0.37 * loss).backward()
    reference_logits = logits.detach().clone().requires_grad_(True)
    log_probs = torch.log_softmax(reference_logits, dim=-1)
    reference = ((1 - epsilon) * -log_probs.gather(1, targets[:, None]).squeeze(1) - epsilon * log_probs.mean(-1)).sum()
    (0.37 * reference).backward()
    torch.testing.assert_close(loss.double(), reference.detach())
    torch.testing.assert_close(logits.grad, reference_logits.grad)
    assert not nll.requires_grad


def corpus_of(pairs: list[tuple[list[int], list[int]]]) -> TokenizedCorpus:
    """A TokenizedCorpus built directly from id lists (EOS appended by flatten)."""
    src_tokens, src_offsets = flatten([s for s, _ in pairs])
    tgt_tokens, tgt_offsets = flatten([t for _, t in pairs])
    stats = FilterStats(len(pairs), len(pairs))
    return TokenizedCorpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets, torch.arange(len(pairs)), stats)


def test_update_freq_accumulation_equals_one_big_batch():
    generator = torch.Generator().manual_seed(1)
    lengths = [(3, 4), (7, 2), (5, 6), (2, 8), (6, 6)]
    pairs = [(torch.randint(4, 40, (s,), generator=generator).tolist(), torch.randint(4, 40, (t,), generator=generator).tolist())
             for s, t in lengths]
    corpus = corpus_of(pairs)
    settings = StepSettings(label_smoothing=0.1, clip_norm=0.0, autocast_dtype=None, device_type="cpu")
    results = []
    for groups in ([torch.tensor([0, 1]), torch.tensor([2, 3, 4])], [torch.arange(5)]):
        torch.manual_seed(0)
        model = Transformer(tiny_config(dropout=0.0)).train()
        # Plain SGD: the weight change is the gradient itself (Adam's first step would be ~sign(gradient)).
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        stats = train_step(model, optimizer, None, [collate(corpus, g) for g in groups], settings)
        results.append((model, float(stats.loss_sum)))
    (accumulated, loss_a), (single, loss_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for (name, a), (_, b) in zip(accumulated.named_parameters(), single.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert not math.isnan(loss_a)


def test_fp16_loss_scaler_skips_and_reports_an_overflowing_update():
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
    batch = collate(corpus_of(pairs), torch.arange(2))
    settings = StepSettings(label_smoothing=0.1, clip_norm=0.0, autocast_dtype=None, device_type="cpu")
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0)).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    healthy = train_step(model, optimizer, scaler, [batch], settings)
    assert not healthy.skipped and scaler.get_scale() == 2.0**16
    # An fp16 overflow, as the scaler sees it: one parameter's gradient turns inf.
    first = next(model.parameters())
    first.register_hook(lambda grad: grad + math.inf)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    overflow = train_step(model, optimizer, scaler, [batch], settings)
    assert overflow.skipped and scaler.get_scale() == 2.0**15  # halved (backoff_factor 0.5)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name  # the whole update was skipped


def test_an_inf_nan_loss_skips_the_update_in_fp32():
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
    batch = collate(corpus_of(pairs), torch.arange(2))
    settings = StepSettings(label_smoothing=0.1, clip_norm=1.0, autocast_dtype=None, device_type="cpu")
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert not train_step(model, optimizer, None, [batch], settings).nonfinite
    moments = {id(p): optimizer.state[p]["exp_avg"].clone() for p in model.parameters()}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        model.src_embed.weight[5] = math.nan  # token 5 is in the batch: the loss turns NaN
    stats = train_step(model, optimizer, None, [batch], settings)
    assert stats.nonfinite and not torch.isfinite(stats.loss_sum)
    for name, p in model.named_parameters():
        if name != "src_embed.weight":
            assert torch.equal(p, before[name]), name  # the update was skipped
    assert all(torch.equal(optimizer.state[p]["exp_avg"], moments[id(p)]) for p in model.parameters())


@pytest.mark.parametrize("tying", [{"share_embeddings": True}, {"tie_output": True}, {"tie_output": False}])
def test_the_padding_row_stays_zero_through_training(tying):
    # With a tied output projection, the softmax over the vocabulary gives the pad logit (and so the
    # pad row) a gradient at every position; the padding row must still stay zero, as at initialisation.
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14]), ([20, 21, 22, 23], [24])]
    settings = StepSettings(label_smoothing=0.1, clip_norm=1.0, autocast_dtype=None, device_type="cpu")
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0, **tying)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, fused=True)
    for _ in range(3):
        train_step(model, optimizer, None, [collate(corpus_of(pairs), torch.arange(3))], settings)
    pad = model.config.pad_id
    for embedding in (model.src_embed, model.tgt_embed):
        assert torch.count_nonzero(embedding.weight[pad]) == 0
        assert torch.count_nonzero(embedding.weight[pad + 4]) > 0  # other rows did train
