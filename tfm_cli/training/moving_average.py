"""An exponential moving average of the model's weights kept during training (train.ema_decay).

Marian's --exponential-smoothing and TensorFlow's ExponentialMovingAverage: after every update
    average = d * average + (1 - d) * weights,   d = min(ema_decay, (1 + step) / (10 + step)).
The step-dependent cap lets the average forget its random start: early on it follows the weights
closely, and in a short run (d capped for step < 10 / (1 - ema_decay)) it spans about the last
step / 9 updates. The average never feeds back into training; it is written as its own checkpoint.
"""

from __future__ import annotations

import torch

from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer

STATE_PREFIX = "ema."  # the average's tensors in the training state: ema.<parameter name>


def moving_average_decay(ema_decay: float, step: int) -> float:
    """The decay d of update `step` (1-based): min(ema_decay, (1 + step) / (10 + step))."""
    return min(ema_decay, (1 + step) / (10 + step))


class WeightMovingAverage:
    """float32 copies of a model's parameters, moved towards the weights after every update."""

    def __init__(self, model: Transformer, ema_decay: float) -> None:
        self.ema_decay = ema_decay
        # named_parameters gives tied weights once, as checkpoints store them.
        self.averages = {name: param.detach().float().clone() for name, param in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: Transformer, step: int) -> None:
        """Move every average towards the model's current weights, after update `step` (1-based)."""
        weight = 1.0 - moving_average_decay(self.ema_decay, step)
        for name, param in model.named_parameters():
            self.averages[name].lerp_(param.detach().float(), weight)

    def weights(self) -> dict[str, torch.Tensor]:
        """The averages by parameter name, float32 (the dtype of a training model's weights), contiguous
        on the CPU (checkpoint.model_weights's form)."""
        return {name: average.cpu().contiguous() for name, average in self.averages.items()}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The averages as training-state tensors, named ema.<parameter name>."""
        return {STATE_PREFIX + name: average for name, average in self.weights().items()}

    @torch.no_grad()
    def restore(self, tensors: dict[str, torch.Tensor], path: str) -> None:
        """Load the averages from a training state's tensors; TfmError if the state has none or they do not fit."""
        for name, average in self.averages.items():
            saved = tensors.get(STATE_PREFIX + name)
            if saved is None:
                raise TfmError(
                    f"{path}: the training state has no moving average of the weights ({name}); it was saved by a "
                    "run without train.ema_decay, which cannot be turned on when resuming: start a new --run"
                )
            if saved.shape != average.shape or saved.dtype != torch.float32 or not bool(torch.isfinite(saved).all()):
                raise TfmError(f"{path}: damaged training state ({STATE_PREFIX}{name} has shape "
                               f"{tuple(saved.shape)}, dtype {saved.dtype} or non-finite values); start a new --run")
            average.copy_(saved)
