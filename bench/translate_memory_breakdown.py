"""Where the peak memory of `tfm translate` goes: model load, oneDNN's primitive cache, live tensors, malloc's free space.

Each row is a fresh child process that does what `tfm translate` does (glibc's malloc settings of
`allocator.keep_freed_memory`, `load_model` in the given precision, sentences sorted by length in
batches, beam search) and reports, at four moments, the process's resident memory split into
anonymous and file-backed pages (/proc/self/status) and glibc's own account of its heap
(mallinfo2, all arenas): bytes in live blocks (including mmapped ones) and bytes free inside the
heap. The moments: after the imports, after the model load, at the decoder step where the resident
memory was highest, and after the last batch. Peak RSS is the kernel's high-water mark (VmHWM).

Each configuration runs twice, with oneDNN's primitive cache at its default capacity and at 0
(ONEDNN_PRIMITIVE_CACHE_CAPACITY); each distinct row count of a packed product compiles and keeps
its own kernels. The difference between the two runs is what keeping them costs: float32 kernels
sit mostly in malloc's heap, int8 ones mostly outside it (anonymous memory that malloc does not
count), and both split the heap's free space. Translations are the same either way. glibc only
(mallinfo2).

--mmap-thresholds adds, per configuration, children whose malloc serves every block of at least that
many KiB with its own mmap, given back to the kernel when freed (M_MMAP_THRESHOLD, and M_TRIM_THRESHOLD
at four times it), instead of `tfm translate`'s settings: less free space kept inside the heap, more
page faults. The decoding time column (the batches only, one run each) is for comparing those rows
with the default row of the same configuration; read it as a rough ratio, not a benchmark.

Usage: python bench/translate_memory_breakdown.py --model CKPT [--source FILE] [--batch-sizes 32,128]
       [--dtypes float32,int8] [--mmap-thresholds 1024,4096] [--max-len-b 23]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from profile_search import MULTI30K  # noqa: E402  (bench/ is on sys.path when run as a script)

CHILD = r"""
import ctypes, json, sys

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2

def snapshot():
    status = open("/proc/self/status").read()
    kib = lambda key: int(status.split(key + ":")[1].split()[0])
    info = libc.mallinfo2()
    return {"rss": kib("VmRSS") / 1024, "anon": kib("RssAnon") / 1024, "file": kib("RssFile") / 1024,
            "peak": kib("VmHWM") / 1024, "in_use": (info.uordblks + info.hblkhd) / 2**20,
            "free": info.fordblks / 2**20}

model, source, batch_size, beam, dtype, threads, mmap_threshold_kib, bench_folder, max_len_b = sys.argv[1:]
import time
import torch
torch.set_num_threads(int(threads))
from tfm_cli import allocator
if mmap_threshold_kib == "-":
    allocator.keep_freed_memory()
else:
    mallopt = allocator.glibc_mallopt()
    mallopt(allocator.M_MMAP_THRESHOLD, int(mmap_threshold_kib) * 1024)
    mallopt(allocator.M_TRIM_THRESHOLD, 4 * int(mmap_threshold_kib) * 1024)
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.inference.decoding import source_batch
from tfm_cli.inference.search import beam_search
from tfm_cli.model.transformer import Transformer
sys.path.insert(0, bench_folder)
from pathlib import Path
from profile_search import make_batches
moments = {"imports": snapshot()}
loaded = load_model(model, dtype=dtype)
moments["model loaded"] = snapshot()
batches = make_batches(loaded, Path(source), 10**9, int(batch_size))
highest = {"rss": 0.0}
step = Transformer.decode_step

def measured_step(self, *args, **kwargs):
    output = step(self, *args, **kwargs)
    now = snapshot()
    if now["rss"] > highest["rss"]:
        highest.update(now)
    return output

Transformer.decode_step = measured_step
limits = {} if max_len_b == "-" else {"max_len_a": 0.0, "max_len_b": int(max_len_b)}
settings = DecodeConfig(beam_size=int(beam), length_penalty=0.0, **limits)
started = time.perf_counter()
for batch in batches:
    beam_search(loaded.model, source_batch(batch, loaded.config), settings)
moments["highest step"] = highest
moments["after the last batch"] = snapshot()
moments["after the last batch"]["seconds"] = time.perf_counter() - started
print(json.dumps(moments))
"""


def run_child(
    model: Path, source: Path, batch_size: str, beam: str, dtype: str, capacity: str | None, mmap_threshold_kib: str = "-",
    max_len_b: int | None = None,
) -> dict:
    """One child process; returns {moment: {rss, anon, file, peak, in_use, free}} in MiB (and decoding seconds)."""
    env = dict(os.environ)
    if capacity is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(source), batch_size, beam, dtype, "2", mmap_threshold_kib,
         str(Path(__file__).resolve().parent), "-" if max_len_b is None else str(max_len_b)],
        capture_output=True, text=True, env=env,
    )
    if result.returncode != 0:
        sys.exit(f"bench/translate_memory_breakdown.py: child failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def main() -> None:
    """Print a markdown table: memory at each moment per configuration and malloc setting; the primitive cache's share."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="tfm checkpoint (.safetensors)")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--batch-sizes", default="32,128")
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--beam", default="5")
    parser.add_argument("--mmap-thresholds", default="", help="KiB values, e.g. 1024,4096 (default: none)")
    parser.add_argument("--max-len-b", type=int, help="every output at most this many tokens + EOS (a random model's "
                        "outputs run to the limit; default: the model's own limits)")
    args = parser.parse_args()
    print(f"Model {args.model}, source {args.source}, beam {args.beam}, 2 threads; MiB.\n")
    print("| batch | precision | malloc | primitive cache | moment | RSS | anonymous | file-backed | malloc live |"
          " malloc free | peak RSS | decoding s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    thresholds = [value for value in args.mmap_thresholds.split(",") if value]
    for batch_size in args.batch_sizes.split(","):
        for dtype in args.dtypes.split(","):
            runs = [("tfm translate's", "default", None, "-"), ("tfm translate's", "0", "0", "-")]
            runs += [(f"mmap >= {value} KiB", "default", None, value) for value in thresholds]
            after = {}
            for malloc, label, capacity, threshold in runs:
                moments = run_child(args.model, args.source, batch_size, args.beam, dtype, capacity, threshold, args.max_len_b)
                after[(malloc, label)] = moments["after the last batch"]
                for moment, m in moments.items():
                    seconds = f"{m['seconds']:.1f}" if "seconds" in m else ""
                    print(f"| {batch_size} | {dtype} | {malloc} | {label} | {moment} | {m['rss']:.0f} | {m['anon']:.0f} | "
                          f"{m['file']:.0f} | {m['in_use']:.0f} | {m['free']:.0f} | {m['peak']:.0f} | {seconds} |", flush=True)
            cached, uncached = after[("tfm translate's", "default")], after[("tfm translate's", "0")]
            print(f"| {batch_size} | {dtype} | | | primitive cache default minus 0, after the last batch | "
                  f"{cached['rss'] - uncached['rss']:.0f} | {cached['anon'] - uncached['anon']:.0f} | | "
                  f"{cached['in_use'] - uncached['in_use']:.0f} | | {cached['peak'] - uncached['peak']:.0f} | |", flush=True)


if __name__ == "__main__":
    main()
