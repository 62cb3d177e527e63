"""The running sums of one log interval: losses of the applied updates, throughput, padding."""

from __future__ import annotations

import time
from typing import Any

import torch

from tfm_cli import distributed
from tfm_cli.corpus.batching import Batch
from tfm_cli.distributed import World
from tfm_cli.training.step import StepStats


class LogWindow:
    """Running sums over one log interval; converted to host numbers only when logged."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.excluded = 0.0
        self.steps = 0
        self.applied_steps = 0  # updates not skipped for inf/nan: only their losses are averaged
        self.loss_sum: torch.Tensor | float = 0.0
        self.nll_sum: torch.Tensor | float = 0.0
        self.loss_tokens = 0  # target tokens of the applied updates
        self.grad_norm_sum: torch.Tensor | float | None = None
        self.tgt_tokens = self.src_tokens = self.padded = 0
        self.alignment_sum: torch.Tensor | float = 0.0  # guided alignment: loss sum over supervised rows
        self.aligned_rows = 0

    def add(self, stats: StepStats, batches: list[Batch]) -> None:
        """Add one update's token counts, and its losses and gradient norm unless it was skipped."""
        self.steps += 1
        tgt_tokens = sum(batch.n_tgt_tokens for batch in batches)
        if not (stats.skipped or stats.nonfinite):
            self.applied_steps += 1
            self.loss_sum = self.loss_sum + stats.loss_sum
            self.nll_sum = self.nll_sum + stats.nll_sum
            self.loss_tokens += tgt_tokens
            if stats.grad_norm is not None:
                self.grad_norm_sum = (self.grad_norm_sum or 0.0) + stats.grad_norm
            if stats.alignment_sum is not None:
                self.alignment_sum = self.alignment_sum + stats.alignment_sum
                self.aligned_rows += sum(batch.n_aligned_rows for batch in batches)
        self.tgt_tokens += tgt_tokens
        for batch in batches:
            self.src_tokens += batch.n_src_tokens
            self.padded += batch.n_padded_tokens

    def reduce(self, world: World, device: torch.device) -> None:
        """Sum the losses and token counts over all ranks (tokens/s becomes the whole run's throughput)."""
        if not world.distributed:
            return
        sums = torch.tensor(
            [float(self.loss_sum), float(self.nll_sum), self.loss_tokens, self.tgt_tokens, self.src_tokens, self.padded,
             float(self.alignment_sum), self.aligned_rows],
            dtype=torch.float64, device=device,
        )
        (loss_sum, nll_sum, loss_tokens, tgt_tokens, src_tokens, padded, alignment_sum,
         aligned_rows) = distributed.all_reduce_sum(sums, world).tolist()
        self.alignment_sum, self.aligned_rows = alignment_sum, int(aligned_rows)
        self.loss_sum, self.nll_sum, self.loss_tokens = loss_sum, nll_sum, int(loss_tokens)
        self.tgt_tokens, self.src_tokens, self.padded = int(tgt_tokens), int(src_tokens), int(padded)

    def exclude(self, seconds: float) -> None:
        """Do not count `seconds` (validation, saving) as training time."""
        self.excluded += seconds

    def figures(self) -> dict[str, Any]:
        """Per-token losses and mean gradient norm of the applied updates (None if every update was
        skipped), throughput and padding share of the interval."""
        seconds = max(time.monotonic() - self.started - self.excluded, 1e-9)
        applied = self.loss_tokens > 0
        grad_norm = None if self.grad_norm_sum is None else float(self.grad_norm_sum) / self.applied_steps
        return {
            "loss": float(self.loss_sum) / self.loss_tokens if applied else None,
            "nll_loss": float(self.nll_sum) / self.loss_tokens if applied else None,
            "grad_norm": grad_norm,
            # Guided alignment: the cross-entropy per supervised decoder row (None in unguided runs).
            "alignment_loss": float(self.alignment_sum) / self.aligned_rows if self.aligned_rows else None,
            "tgt_tokens_per_s": self.tgt_tokens / seconds,
            "tokens_per_s": (self.tgt_tokens + self.src_tokens) / seconds,
            "padding": 1.0 - (self.tgt_tokens + self.src_tokens) / max(self.padded, 1),
            "seconds": seconds,
        }
