"""Peak resident memory (RSS) of `tfm translate` on Multi30k test_2016_flickr.de, beside two baselines.

Each row is one fresh process whose peak RSS is read from getrusage(RUSAGE_CHILDREN) in a
dedicated parent (so only that one child counts):
  python + torch import     the floor every torch program pays
  tfm translate --beam B    the real CLI: -i the 1000-line file, -o /dev/null, --threads 2
The checkpoint file size is printed for scale.

Usage: python bench/translate_memory.py [--model CKPT] [--beams 1,5]
Without --model, the random Multi30k-size model of bench/bench_model.py, which decodes every line
to the length limit; the limit is fixed at --max-len-b 23 tokens + EOS (--max-len-a 0), as in
translate_vs_peers.py, so that the run ends in minutes on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MULTI30K = BENCH_DIR.parents[1] / "shared" / "data" / "multi30k"

MEASURE = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
seconds = time.perf_counter() - start
if done.returncode != 0:
    sys.exit(done.stderr.decode(errors="replace"))
print(json.dumps({"max_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "seconds": seconds}))
"""


def peak_rss(command: list[str]) -> dict:
    """Run `command` as the only child of a fresh measuring process; returns {max_rss_kib, seconds}."""
    result = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def main() -> None:
    """Print a markdown table of peak RSS per command."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="tfm checkpoint; default: a random Multi30k-size model")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--max-len-b", type=int, default=23, help="output length limit (as translate_vs_peers: 24 steps)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-translate"))
    args = parser.parse_args()
    checkpoint = args.model
    if checkpoint is None:
        sys.path.insert(0, str(BENCH_DIR))
        from bench_model import make_bench_checkpoint

        checkpoint = args.workdir / "random.safetensors"
        if not checkpoint.is_file():
            make_bench_checkpoint(checkpoint)
    tfm = [
        sys.executable, "-m", "tfm_cli", "translate", "-m", str(checkpoint), "-i", str(args.source), "-o", "/dev/null",
        "--threads", "2", "--max-len-a", "0", "--max-len-b", str(args.max_len_b),
    ]
    rows = [("python + `import torch`", [sys.executable, "-c", "import torch"])]
    rows += [(f"tfm translate --beam {beam}", [*tfm, "--beam", beam]) for beam in args.beams.split(",")]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; model {checkpoint} "
          f"({checkpoint.stat().st_size / 2**20:.1f} MiB); input {args.source}")
    print("| process | peak RSS (MiB) | wall time (s) |")
    print("|---|---|---|")
    for name, command in rows:
        measured = peak_rss(command)
        print(f"| {name} | {measured['max_rss_kib'] / 1024:.0f} | {measured['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
