"""Aligning a corpus: `tfm align` against eflomal, whole processes as a user runs them, side by side.

Each repeat runs, in alternating order, on the same --src/--tgt corpus:
  tfm-align        `tfm align -m MODEL --src --tgt` (one direction; the model is already trained)
  tfm-align-sym    `tfm align -m MODEL --reverse-model REVERSE --symmetrize grow-diag-final-and`
                   (both directions; only with --reverse-model)
  eflomal          `eflomal-align -s -t -f -r` (it trains its model on the corpus itself, then writes both
                   directions: for a statistical aligner, training is part of aligning)
Prints pairs per second (median of the repeats) and tfm's ratio to eflomal. Threads: tfm --threads 2;
eflomal's default of samplers (3 processes on a 2-core machine). Run it on a machine of its own.

Usage: python bench/align_speed.py -m MODEL [--reverse-model REVERSE] --src SRC --tgt TGT [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prepare_corpus import cpu_flags


def timed(command: list[str]) -> float:
    """Run `command` (output discarded) and return its wall-clock seconds; exits if it fails."""
    start = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--reverse-model")
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pairs = sum(1 for _ in open(args.src, encoding="utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        engines = {
            "tfm-align": [sys.executable, "-m", "tfm_cli", "align", "-m", args.model, "--src", args.src,
                          "--tgt", args.tgt, "--threads", "2", "-q", "-o", str(out / "tfm")],
            "eflomal": ["eflomal-align", "-s", args.src, "-t", args.tgt, "-f", str(out / "fwd"),
                        "-r", str(out / "rev"), "--overwrite"],
        }
        if args.reverse_model:
            engines["tfm-align-sym"] = [*engines["tfm-align"][:-2], "--reverse-model", args.reverse_model,
                                        "--symmetrize", "grow-diag-final-and", "-o", str(out / "sym")]
        seconds: dict[str, list[float]] = {name: [] for name in engines}
        for repeat in range(args.repeats):
            order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
            for name in order:
                seconds[name].append(timed(engines[name]))
                print(f"repeat {repeat + 1}: {name} {seconds[name][-1]:.1f} s", file=sys.stderr)
    eflomal = statistics.median(seconds["eflomal"])
    print(f"corpus: {args.src} / {args.tgt}, {pairs} pairs; cpu flags: {cpu_flags()}")
    print(f"{'engine':<14} {'median s':>9} {'pairs/s':>9} {'vs eflomal':>11}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:<14} {median:9.1f} {pairs / median:9.0f} {eflomal / median:10.2f}x")


if __name__ == "__main__":
    main()
