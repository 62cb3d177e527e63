"""keep_freed_memory: megabyte blocks then come from malloc's heap (reused) instead of fresh mmaps."""

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


def probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", HEAP_PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="the setting exists only in glibc's malloc"
)
def test_keep_freed_memory_serves_megabyte_blocks_from_the_heap():
    default, kept = probe("default"), probe("keep")
    assert default["in_heap"] is False, default  # glibc's default: a fresh mmap
    assert kept["applied"] is True
    assert kept["in_heap"] is True, kept
