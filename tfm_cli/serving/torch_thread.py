"""The one thread of a `tfm serve` process that runs torch, for every served model's engine.

With libgomp (torch's OpenMP on Linux) every thread that runs a parallel region keeps a team of
OpenMP threads for itself. Once the teams of a process hold more threads than the machine has
cores, libgomp stops letting idle team threads spin, and then every parallel region (every matrix
product, and many small operations of a decoding step) waits for a sleeping thread to wake. On a
2-core VM that made a one-sentence request 2.2x slower (bench/RESULTS.md, "tfm serve: torch in one
thread"). So the engines gather their requests in threads of their own but hand every translation
to this thread, whose team is then the only one: the main thread loads the models on one torch
thread (commands/serve.py, keep_main_thread_single) and so never starts a team either.

Translations of different models take turns here; on a machine with cores to spare for models side
by side, `--workers` gives each process its own thread.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")


def set_torch_threads(count: int) -> None:
    """Give the calling thread `count` torch CPU threads (OpenMP's thread count is per calling thread)."""
    import torch

    torch.set_num_threads(count)


class TorchThread:
    """One thread, started on first use, that runs the functions handed to `run` one at a time."""

    def __init__(self, threads: int) -> None:
        """threads: the torch CPU threads this thread's work gets (>= 1)."""
        self.threads = threads
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tfm-torch", initializer=set_torch_threads, initargs=(threads,)
        )

    def run(self, function: Callable[..., Result], *args: object) -> Result:
        """function(*args) run in this thread; returns its result (or raises its exception) once it is done."""
        return self.executor.submit(function, *args).result()

    def stop(self) -> None:
        """End the thread once what was handed to it is done (waits for it)."""
        self.executor.shutdown(wait=True)
