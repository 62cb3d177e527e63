"""The training objective: label-smoothed cross-entropy (section 5.4), plus guided alignment if asked.
The learning-rate schedules (5.3, budgeted) are lr_schedules.py's."""

from __future__ import annotations

import torch

from tfm_cli.config import AlignmentConfig
from tfm_cli.corpus.batching import Batch
from tfm_cli.model import Transformer
from tfm_cli.training.guided_alignment import alignment_loss


def label_smoothed_loss(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy (section 5.4) over real target positions only.

    logits: (N, V), targets: (N,) int64. The smoothed target puts 1 - epsilon on the reference and
    epsilon spread uniformly over all V classes (torch's `label_smoothing` convention).
    Returns (smoothed loss sum, plain negative log-likelihood sum), both float32 scalars; only the
    first carries a gradient (LabelSmoothedCrossEntropy).
    """
    return LabelSmoothedCrossEntropy.apply(logits, targets, epsilon)


class LabelSmoothedCrossEntropy(torch.autograd.Function):
    """`label_smoothed_loss` with its gradient written out: softmax - smoothed target, in one pass.

    Left to autograd, the loss's backward walks the (N, V) logits' size six times (mean, gather,
    their sum, log_softmax), a visible share of a CPU training step with an 8k vocabulary (see
    bench/RESULTS.md, section "Other modules").
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        nll = -log_probs.gather(1, targets[:, None]).squeeze(1)  # (N,)
        uniform = -log_probs.mean(dim=-1)  # (N,)
        ctx.save_for_backward(log_probs, targets)
        ctx.epsilon = epsilon
        ctx.logits_dtype = logits.dtype
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return ((1.0 - epsilon) * nll + epsilon * uniform).sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        log_probs, targets = ctx.saved_tensors
        epsilon, vocab = ctx.epsilon, log_probs.size(1)
        # d loss / d logits = softmax - ((1 - epsilon) * onehot(target) + epsilon / V), row by row.
        grad = torch.exp(log_probs).sub_(epsilon / vocab).mul_(grad_loss)  # (N, V)
        grad.scatter_add_(1, targets[:, None], (-(1.0 - epsilon) * grad_loss).expand(targets.size(0), 1))
        return grad.to(ctx.logits_dtype), None, None


def batch_loss(model: Transformer, batch: Batch, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced loss of one batch: (smoothed loss sum, nll sum) over its real target tokens.

    The output projection and softmax, the costliest part with a large vocabulary, run only on the
    rows of real target tokens (padding rows are dropped before projecting).
    """
    loss, nll, _ = LossModule(model, epsilon)(batch.src, batch.tgt_in, batch.target_index, batch.targets)
    return loss, nll


class LossModule(torch.nn.Module):
    """The model and its training loss as one module, so DistributedDataParallel sees the whole step.

    DDP syncs gradients only for computations that go through the wrapped module's forward; the
    Transformer's own forward returns logits of every position, while training projects real rows only.
    `alignment` names the cross-attention head that guided-alignment training supervises.
    """

    def __init__(self, model: Transformer, epsilon: float, alignment: AlignmentConfig | None = None) -> None:
        super().__init__()
        self.model = model
        self.epsilon = epsilon
        self.alignment = alignment

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, target_index: torch.Tensor, targets: torch.Tensor,
        alignment: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(smoothed loss sum, nll sum, alignment loss sum or None) of a batch: src (B, S), tgt_in (B, T),
        target_index and targets (N,), and with guided alignment its reference attention (B, T, S).

        Without a reference no attention weights are computed (every layer keeps the fused kernel).
        """
        encoded = self.model.encode(src)
        if alignment is None:
            hidden, alignment_sum = self.model.decode(tgt_in, encoded).hidden, None  # (B, T, D)
        else:
            if self.alignment is None or self.alignment.head is None:
                raise ValueError("a batch with a reference alignment needs LossModule(alignment=...) with a head")
            if self.alignment.full_context:
                hidden = self.model.decode(tgt_in, encoded).hidden  # (B, T, D)
                decoded = self.model.decode(tgt_in, encoded, attention_layer=self.alignment.layer, full_context=True)
            else:
                decoded = self.model.decode(tgt_in, encoded, attention_layer=self.alignment.layer)
                hidden = decoded.hidden  # (B, T, D)
            attention = decoded.layer_cross_attention[:, self.alignment.head]  # (B, H, T, S) -> (B, T, S)
            alignment_sum = alignment_loss(attention, alignment)
        rows = hidden.reshape(-1, hidden.size(-1)).index_select(0, target_index)  # (N, D)
        loss, nll = label_smoothed_loss(self.model.project(rows), targets, self.epsilon)
        return loss, nll, alignment_sum
