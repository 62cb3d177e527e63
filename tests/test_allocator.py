"""keep_freed_memory and keep_all_freed_memory: blocks then come from malloc's heap (reused) instead of fresh mmaps."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

# Run in a fresh interpreter: the setting changes the whole process's allocator, and glibc's
# default threshold moves with what the process freed before. In a fresh process glibc serves a
# 1 MiB block with its own mmap (given back to the kernel on free, page-faulted again next time);
# with the setting it comes from the heap, whose freed blocks are reused.
HEAP_PROBE = """
import json, sys, torch
from tfm_cli.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
address = torch.empty(1 << 18).data_ptr()  # 1 MiB, the size of a beam-search step's reordered cache
heap = [line.split()[0] for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
start, end = (int(bound, 16) for bound in heap[0].split("-"))
print(json.dumps({"applied": applied, "in_heap": start <= address < end}))
"""


def probe(mode: str, script: str = HEAP_PROBE) -> dict:
    done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="the setting exists only in glibc's malloc"
)
def test_keep_freed_memory_serves_megabyte_blocks_from_the_heap():
    default, kept = probe("default"), probe("keep")
    assert default["in_heap"] is False, default  # glibc's default: a fresh mmap
    assert kept["applied"] is True
    assert kept["in_heap"] is True, kept


# keep_all_freed_memory: blocks far above glibc's largest mmap threshold (a training step's
# (tokens x vocabulary) logits, their log-probabilities and gradients, ~100 MB each) come from the heap
# too, so once the heap has grown, later steps reuse pages that are already there instead of
# page-faulting fresh zeroed ones. The probe runs eight such "steps" and counts the last four's faults.
REUSE_PROBE = """
import json, resource, sys, torch
from tfm_cli.allocator import keep_all_freed_memory
applied = keep_all_freed_memory() if sys.argv[1] == "keep-all" else None
faults = []
for step in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    logits = torch.randn(3000 + 100 * (step % 3), 8000)
    log_probs = logits.log_softmax(-1)
    grad = log_probs.exp() - 1.0
    del logits, log_probs, grad
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "late_faults": sum(faults[4:])}))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="the setting exists only in glibc's malloc"
)
def test_keep_all_freed_memory_reuses_blocks_above_the_mmap_threshold():
    default, kept = probe("default", REUSE_PROBE), probe("keep-all", REUSE_PROBE)
    step_pages = 3 * 3000 * 8000 * 4 // 4096  # three ~100 MB blocks per step
    assert default["late_faults"] > 2 * step_pages, default  # glibc's default: fresh mmaps, faulted every step
    assert kept["applied"] is True
    assert kept["late_faults"] < default["late_faults"] / 3, (kept, default)  # the heap's pages are reused
