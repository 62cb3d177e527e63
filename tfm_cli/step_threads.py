"""How many CPU threads one decoding step gets: all of torch's, or one where waking the others costs more.

With OMP_WAIT_POLICY=PASSIVE, OpenMP's threads sleep as soon as a parallel region ends, and every
region wakes them again: 30-100 us per region on a 2-core VM, against ~5 us with spinning (ACTIVE or
unset) threads. A decoding step runs dozens of regions (every matrix product, and every element-wise
operation over more than 32,768 values), most of them only tens of microseconds of work. So under
PASSIVE a step whose work is small runs on one thread; the encoder, the searches' operations over
the whole vocabulary and larger steps keep every thread. The work measure is rows x d_model x d_ff
(the feed-forward product's multiply-adds) weighted by how fast the precision multiplies, and
doubled where torch's kernels are narrower than AVX-512 (an AVX2 CPU multiplies half as much per
instruction, so the same step is twice the work).

Measured on the 2-core VM (bench/RESULTS.md), beam 5, 160 rows, PASSIVE: one thread per step made
the Multi30k model (d_model 256, d_ff 1024) 1.3x faster in float32 and 1.9x in int8, and a d_model
512 / d_ff 2048 model 1.35x faster in int8 (work 42M); two threads stayed faster for that model in
bf16 (84M) and float32 (63M with 60 rows, 168M with 160). Hence the limit of 50M. With every
kernel capped at AVX2, the Multi30k model in float32 (84M) was 1.12x faster on two threads.

A step's results were the same bits on one thread as on two, in every precision, for the Multi30k
model; tests/test_step_threads.py checks that whole translations are.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from tfm_cli.config import ModelConfig

PASSIVE_SINGLE_THREAD_WORK = 50_000_000
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


@dataclass(frozen=True)
class StepThreads:
    """The decision for one model: which steps run on a single thread."""

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

    def single_thread(self, rows: int) -> bool:
        """Whether a step over `rows` decoder rows should run on one thread."""
        return self.threads_sleep and rows * self.work_per_row < PASSIVE_SINGLE_THREAD_WORK


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
