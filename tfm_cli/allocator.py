"""Let glibc's malloc keep freed memory for reuse, for commands that decode step by step and for
training; or give a burst of freed memory back at once, for training after it builds an epoch and for
the commands that run a model after they load it.

Every decoding step allocates and frees tensors of a few megabytes (the logits, the reordered
self-attention caches, the layers' outputs), most of them the same size as the step before.
By default glibc serves a block of that size with a fresh mmap and gives it back to the kernel
on free, and it returns the top of its heap to the kernel when a lot is free there; each new block
is then page-faulted and zeroed again, a measurable share of a beam search's time (see
bench/RESULTS.md, section "Other modules"). The settings below
keep blocks up to 32 MiB in the heap and never shrink it: the peak memory stays the same, but the
process keeps it until it exits.

torch's CPU allocator calls malloc directly and keeps no cache of its own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# glibc's <malloc.h>: parameter numbers for mallopt().
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
# The largest M_MMAP_THRESHOLD glibc accepts on 64-bit systems (HEAP_MAX_SIZE / 2).
LARGEST_MMAP_THRESHOLD = 32 * 1024 * 1024
NEVER_TRIM = 2**31 - 1  # mallopt takes a C int


def glibc_mallopt() -> Callable[[int, int], int] | None:
    """The C library's mallopt(parameter, value), or None where there is none (macOS)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Ask the C library's malloc to reuse freed blocks instead of returning them to the kernel.

    Changes the whole process's allocator; call it once from a command, not from library code.
    Returns True when glibc accepted both settings; False elsewhere (macOS has no `mallopt`,
    musl's rejects them), and then nothing changed.
    """
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


def keep_all_freed_memory() -> bool:
    """Serve every block, however large, from malloc's heap and never shrink it: for training.

    A training step allocates and frees blocks of tens to hundreds of megabytes (the (tokens x
    vocabulary) logits, their log-probabilities and gradients), above the largest mmap threshold glibc
    accepts, so with keep_freed_memory they would still come from fresh mmaps, page-faulted and zeroed
    again every step (~350 MB per update for the Multi30k model; bench/RESULTS.md, "Training and the
    allocator"). With mmap switched off they are reused from the heap. return_freed_memory still
    gives the heap's free pages back after an epoch is built. Changes the whole process's allocator;
    returns True when glibc accepted both settings, False where there is no glibc (nothing changed).
    """
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


def return_freed_memory() -> bool:
    """Give the free memory at the top and inside glibc's heap back to the kernel (malloc_trim).

    Building an epoch's batches of a large corpus sorts and gathers several (N,) tensors that are
    freed at once; glibc keeps such memory in its heap (hundreds of MiB for millions of pairs, see
    bench/RESULTS.md, section "Other modules"), where every torchrun rank would hold it for the whole
    run. Loading a model in int8 or bf16 frees its float32 weights the same way. Returns False where
    there is no glibc (nothing done).
    """
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True
