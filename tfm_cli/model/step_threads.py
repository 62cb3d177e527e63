"""How many CPU threads one decoding step gets: all of torch's, one, or all for its matrix products only.

With OMP_WAIT_POLICY=PASSIVE, OpenMP's threads sleep as soon as a parallel region ends, and every
region wakes them again, at many times the cost of spinning (ACTIVE or unset) threads (figures: see
bench/RESULTS.md, section "Step threads"). A decoding step runs dozens of regions (every matrix
product, and every element-wise operation over more than 32,768 values), most of them only tens of
microseconds of work. So under PASSIVE a step picks one of three modes by its work, rows x d_model
x d_ff (the feed-forward product's multiply-adds) weighted by how fast the precision multiplies and
doubled where torch's kernels are narrower than AVX-512 (an AVX2 CPU multiplies half as much per
instruction):
- below ONE_THREAD_WORK, everything on one thread;
- below PRODUCTS_ONLY_WORK, the linear layers' matrix products on all threads and everything else
  (attention, LayerNorm, softmax, the cache copies) on one: the products are worth a wake-up, the
  element-wise operations of such a step are not;
- above it, everything on all threads.
The encoder and the searches' operations over the whole vocabulary keep every thread. ACTIVE and
unset policies always use every thread.

The two thresholds come from timing Multi30k beam and greedy steps in each mode, float32 and int8,
on AVX-512 and AVX2-capped kernels: see bench/RESULTS.md, section "Step threads".

A step's results are the same bits on one thread as on two, in every precision
(tests/test_step_threads.py checks that whole translations are).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from tfm_cli.config import ModelConfig

ONE_THREAD_WORK = 15_000_000
PRODUCTS_ONLY_WORK = 150_000_000
# Time per multiply-add relative to float32 (int8 dot products do 4 per lane, bf16 2).
RELATIVE_COST = {"float32": 1.0, "bf16": 0.5, "int8": 0.25}


def kernel_width_factor(capability: str | None = None) -> float:
    """1 where torch's CPU kernels use AVX-512 (capability "AVX512..."), 2 where they are narrower.

    capability: torch.backends.cpu.get_cpu_capability() by default.
    """
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    return 1.0 if capability.upper().startswith("AVX512") else 2.0


def threads_sleep(environ: Mapping[str, str] | None = None) -> bool:
    """True when OpenMP's threads sleep between parallel regions: OMP_WAIT_POLICY=PASSIVE (any case)."""
    environ = os.environ if environ is None else environ
    return environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


class StepMode(enum.Enum):
    """Which of a decoding step's operations run on all of torch's threads."""

    ALL_THREADS = "every operation on all threads"
    PRODUCTS_ONLY = "the linear layers' products on all threads, everything else on one"
    ONE_THREAD = "every operation on one thread"


@dataclass(frozen=True)
class StepThreads:
    """The decision for one model: which mode each decoding step runs in."""

    threads_sleep: bool
    work_per_row: float  # d_model x d_ff x the precision's relative cost x kernel_width_factor

    @classmethod
    def for_model(
        cls, config: ModelConfig, dtype: str, environ: Mapping[str, str] | None = None, capability: str | None = None
    ) -> StepThreads:
        """The decision for a model of `config` running in `dtype`, under the environment's OpenMP
        policy, on kernels of torch's `capability` (both default to this process's)."""
        cost = RELATIVE_COST.get(dtype, 1.0) * kernel_width_factor(capability)
        return cls(threads_sleep(environ), config.d_model * config.d_ff * cost)

    def mode(self, rows: int) -> StepMode:
        """The mode of a step over `rows` decoder rows (ALL_THREADS unless threads sleep)."""
        work = rows * self.work_per_row
        if not self.threads_sleep or work >= PRODUCTS_ONLY_WORK:
            return StepMode.ALL_THREADS
        return StepMode.ONE_THREAD if work < ONE_THREAD_WORK else StepMode.PRODUCTS_ONLY


@contextlib.contextmanager
def one_thread(enabled: bool = True) -> Iterator[None]:
    """Within the block torch runs on one CPU thread (when `enabled`); the count comes back after it."""
    previous = torch.get_num_threads()
    if not enabled or previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def step_mode(mode: StepMode, linear_layers: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Within the block torch runs in `mode`: for PRODUCTS_ONLY, on one thread except for the
    products of `linear_layers` (modules with a `product_threads` attribute, see kernels.Linear),
    which get the thread count torch had before the block. Everything comes back after it."""
    previous = torch.get_num_threads()
    if mode is StepMode.ALL_THREADS or previous == 1:
        yield
        return
    products_on_all = mode is StepMode.PRODUCTS_ONLY
    if products_on_all:
        for layer in linear_layers:
            layer.product_threads = previous
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
        if products_on_all:
            for layer in linear_layers:
                layer.product_threads = None


def on_threads(count: int | None, function: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
    """function(*args), run on `count` torch threads when a count is given (the previous count comes back)."""
    if count is None:
        return function(*args)
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return function(*args)
    finally:
        torch.set_num_threads(previous)
