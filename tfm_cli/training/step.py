"""One optimizer update: gradient accumulation over batches (and ranks), clipping, skipping inf/nan
updates, mixed precision, and the optional torch.compile of the loss module."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tfm_cli import distributed
from tfm_cli.config import AlignmentConfig
from tfm_cli.corpus.batching import Batch
from tfm_cli.distributed import World
from tfm_cli.model import Transformer
from tfm_cli.model.precision import cpu_support
from tfm_cli.training.events import Event, PhaseEvent
from tfm_cli.training.objective import LossModule


@dataclass
class StepSettings:
    """What a training step needs besides the model, optimizer and data."""

    label_smoothing: float
    clip_norm: float
    autocast_dtype: torch.dtype | None  # None: run in float32
    device_type: str
    # Guided alignment: the supervised head and the weight of its loss (batches then carry a reference).
    alignment: AlignmentConfig | None = None
    alignment_weight: float = 0.0


@dataclass
class StepStats:
    """Sums over one update (tensors stay on the device: no host sync per step)."""

    loss_sum: torch.Tensor
    nll_sum: torch.Tensor
    grad_norm: torch.Tensor | None
    skipped: bool = False  # fp16: the loss scaler found inf/nan gradients and skipped the update
    nonfinite: bool = False  # fp32/bf16: the loss or a gradient was inf/nan, so the update was skipped
    alignment_sum: torch.Tensor | None = None  # guided alignment: the (unweighted) alignment loss sum


def autocast(settings: StepSettings) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass, or a no-op in float32."""
    if settings.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(settings.device_type, dtype=settings.autocast_dtype)


def train_step(
    loss_module: Transformer | torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    batches: list[Batch],
    settings: StepSettings,
    world: World = World(),
) -> StepStats:
    """One optimizer update over `batches` (update_freq accumulation): gradients of the mean token loss.

    `loss_module` is a LossModule, one wrapped in DistributedDataParallel when world.distributed, or a
    bare Transformer (wrapped here in a LossModule with settings.label_smoothing).
    The loss of every batch is divided by the target tokens of the whole update on all ranks, so
    accumulating k batches, or k ranks, equals one batch k times larger. Batches with a reference
    alignment add settings.alignment_weight times their alignment loss sum before that division (so
    the weight is per target token, as Marian's). Returns this rank's loss sums and the gradient norm.
    """
    if isinstance(loss_module, Transformer):
        loss_module = LossModule(loss_module, settings.label_smoothing, settings.alignment)
    device = batches[0].src.device
    local_tokens = torch.tensor([sum(batch.n_tgt_tokens for batch in batches)], device=device)
    n_tokens = int(distributed.all_reduce_sum(local_tokens, world).item()) if world.distributed else int(local_tokens)
    loss_total = torch.zeros((), device=device)
    nll_total = torch.zeros((), device=device)
    alignment_total = None
    for index, batch in enumerate(batches):
        # Gradients are all-reduced once per update, after the last micro-batch (DDP no_sync before it).
        last = index == len(batches) - 1
        sync = contextlib.nullcontext() if last or not world.distributed else loss_module.no_sync()
        with sync:
            with autocast(settings):
                if batch.alignment is None:
                    loss, nll, _ = loss_module(batch.src, batch.tgt_in, batch.target_index, batch.targets)
                    objective = loss
                else:
                    loss, nll, alignment = loss_module(
                        batch.src, batch.tgt_in, batch.target_index, batch.targets, batch.alignment
                    )
                    objective = loss + settings.alignment_weight * alignment
                    alignment_total = alignment.detach() + (0.0 if alignment_total is None else alignment_total)
            scaled = objective / n_tokens
            if world.distributed:
                # DDP averages gradients over ranks; times world_size makes it the sum over all tokens / n_tokens.
                scaled = scaled * world.world_size
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_total += loss.detach()
        nll_total += nll.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    # The norm is needed anyway to detect inf/nan; max_norm=inf computes it without clipping. After
    # DDP's all-reduce every rank holds the same gradients, so all ranks agree on skipping.
    grad_norm = torch.nn.utils.clip_grad_norm_(
        loss_module.parameters(), settings.clip_norm if settings.clip_norm > 0 else math.inf
    )
    skipped = nonfinite = False
    if scaler is not None:
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        # The dynamic scaler lowers its scale exactly when it skipped the step for inf/nan gradients.
        skipped = scaler.get_scale() < scale
    elif torch.isfinite(grad_norm):
        optimizer.step()
    else:
        nonfinite = True  # a NaN/inf loss gives non-finite gradients: leave weights and moments as they are
    optimizer.zero_grad(set_to_none=True)
    return StepStats(loss_total, nll_total, grad_norm, skipped, nonfinite, alignment_total)


def resolve_precision(precision: str, device: torch.device) -> str:
    """train.precision with `auto` made concrete: "bf16" on a CUDA device that supports it, else "fp32".

    On a CPU `auto` is fp32 even with native bfloat16 (AVX512-BF16, AMX): for the Multi30k model on
    2 cores, bf16 autocast made fewer updates in the same wall time, and reached a lower validation
    BLEU, than fp32 (recipes/multi30k/RESULTS.md); `precision = "bf16"` still asks for it.
    """
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def cpu_bf16_notice(precision: str, device: torch.device) -> str | None:
    """The message a run under bf16 autocast on the CPU starts with (None for any other run): what
    stays float32, and a warning where the CPU has no native bfloat16."""
    if device.type != "cpu" or precision != "bf16":
        return None
    notice = "training under bf16 autocast (float32 weights, optimizer and loss); validation in float32"
    if not cpu_support().native_bf16:
        notice += ": this CPU has no native bfloat16 (AVX512-BF16 or AMX), so it is slower than fp32"
    return notice


def compile_module(module: torch.nn.Module, on_event: Callable[[Event], None]) -> torch.nn.Module:
    """torch.compile(module), or `module` itself (with a PhaseEvent saying why) where it is not supported."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        on_event(PhaseEvent("torch.compile is not supported on this Python/platform; training without it"))
        return module
    try:
        return torch.compile(module)
    except RuntimeError as error:
        on_event(PhaseEvent(f"torch.compile failed ({error}); training without it"))
        return module
