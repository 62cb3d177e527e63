"""Learning-rate schedules: one class per kind, found by name in SCHEDULES.

`tfm train` follows the kind its recipe names (train.lr_schedule: inverse_sqrt, linear or cosine);
`tfm train-aligner` follows one_cycle over its known number of updates. A schedule gives the rate of
update `step` (1-based) from the fraction of the training budget (steps, epochs or time, whichever
runs out first) spent before it, so a time-budgeted run anneals too and a resumed run goes on exactly.

Adding a kind: a class here with its `name` and `rate`, its entry in SCHEDULES, and its values worked
out by hand in tests/test_lr_schedule.py (which also checks that every name a recipe may choose,
config.LR_SCHEDULES, has its class).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from tfm_cli.config import TrainConfig


@dataclass(frozen=True)
class ScheduleSettings:
    """What the schedules are built from; each kind reads the fields it needs."""

    peak_lr: float  # the rate at the end of warm-up; 0 with inverse_sqrt: the paper's d_model ** -0.5 scale
    warmup_steps: int
    d_model: int = 0  # inverse_sqrt with peak_lr 0
    total_steps: int = 0  # one_cycle: the number of updates, known in advance


@dataclass(frozen=True)
class LearningRateSchedule(ABC):
    """A learning-rate schedule of one kind with its settings."""

    name: ClassVar[str]
    settings: ScheduleSettings

    @abstractmethod
    def rate(self, step: int, budget_used: float = 0.0) -> float:
        """The learning rate of update `step` (1-based), `budget_used` in [0, 1] of the budget spent before it."""

    def warmup(self, step: int) -> float:
        """The linear warm-up factor of update `step`: step / warmup_steps up to 1 (1 without warm-up)."""
        warmup_steps = self.settings.warmup_steps
        return min(max(step, 1) / warmup_steps, 1.0) if warmup_steps else 1.0


class InverseSqrt(LearningRateSchedule):
    """Section 5.3: linear warm-up, then inverse square root decay.

    lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) when peak_lr = 0. With peak_lr > 0, the same
    shape scaled to reach peak_lr at step = warmup (warmup 0: pure decay from step 1). The budget is not used.
    """

    name = "inverse_sqrt"

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        step, warmup_steps, peak_lr = max(step, 1), self.settings.warmup_steps, self.settings.peak_lr
        if peak_lr == 0:
            return self.settings.d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
        if warmup_steps == 0:
            return peak_lr * step**-0.5
        return peak_lr * min(step / warmup_steps, (warmup_steps / step) ** 0.5)


class LinearDecay(LearningRateSchedule):
    """Linear warm-up to peak_lr, times a decay from 1 to 0 over the budget."""

    name = "linear"

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        return self.settings.peak_lr * self.warmup(step) * (1.0 - min(max(budget_used, 0.0), 1.0))


class CosineDecay(LearningRateSchedule):
    """Linear warm-up to peak_lr, times half a cosine from 1 to 0 over the budget."""

    name = "cosine"

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        used = min(max(budget_used, 0.0), 1.0)
        return self.settings.peak_lr * self.warmup(step) * (0.5 * (1.0 + math.cos(math.pi * used)))


class OneCycle(LearningRateSchedule):
    """Linear warm-up over warmup_steps, then half a cosine to zero at total_steps (a known number of
    updates; the budget is not used)."""

    name = "one_cycle"

    def rate(self, step: int, budget_used: float = 0.0) -> float:
        done, warmup_steps = step - 1, self.settings.warmup_steps  # updates before this one
        if done < warmup_steps:
            return self.settings.peak_lr * ((done + 1) / warmup_steps)
        cycle = max(1, self.settings.total_steps - warmup_steps)
        return self.settings.peak_lr * (0.5 * (1 + math.cos(math.pi * (done - warmup_steps) / cycle)))


SCHEDULES: dict[str, type[LearningRateSchedule]] = {
    kind.name: kind for kind in (InverseSqrt, LinearDecay, CosineDecay, OneCycle)
}


def make_schedule(name: str, settings: ScheduleSettings) -> LearningRateSchedule:
    """The schedule of kind `name` (a key of SCHEDULES) with `settings`."""
    return SCHEDULES[name](settings)


def train_schedule(config: TrainConfig, d_model: int) -> LearningRateSchedule:
    """The schedule `tfm train` follows: train.lr_schedule, warming up over train.warmup_steps to train.lr."""
    return make_schedule(config.lr_schedule, ScheduleSettings(config.lr, config.warmup_steps, d_model))
