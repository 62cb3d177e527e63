"""An ensemble against one model: whole `tfm translate` processes, side by side in one run.

Rows: `tfm translate -m A` and `tfm translate -m A -m B [...]`, each a fresh process on the same
source file with the same flags (beam 5 by default, the checkpoints' other [decode] settings), timed
from start to exit; the engines alternate run by run and the table shows medians, lines/s and the
ensemble's time as a multiple of one model's. With --reference, each output's BLEU (sacrebleu, cased,
13a) is shown too.

Usage: python bench/ensemble_speed.py -m A -m B [-m C] --src test.de [--reference test.en] [--runs 3]
       [--beam 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prepare_corpus import cpu_flags  # noqa: E402
from whole_process import bleu  # noqa: E402


def timed_translate(models: list[str], source: Path, output: Path, beam: int, threads: int) -> float:
    """Seconds one `tfm translate` process takes, start to exit."""
    command = [sys.executable, "-m", "tfm_cli", "translate", *[arg for m in models for arg in ("-m", m)],
               "-i", str(source), "-o", str(output), "--beam", str(beam), "--threads", str(threads), "-q"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(result.stderr)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", action="append", required=True, help="two or more checkpoints; the first alone is the baseline")
    parser.add_argument("--src", required=True, type=Path)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if len(args.model) < 2:
        sys.exit("give two or more -m")
    rows = {"one model (the first)": args.model[:1], f"ensemble of {len(args.model)}": args.model}
    lines = len(args.src.read_text(encoding="utf-8").splitlines())
    times: dict[str, list[float]] = {name: [] for name in rows}
    with tempfile.TemporaryDirectory() as folder:
        outputs = {name: Path(folder) / f"{k}.txt" for k, name in enumerate(rows)}
        for _ in range(args.runs):
            for name, models in rows.items():
                times[name].append(timed_translate(models, args.src, outputs[name], args.beam, args.threads))
        scores = {name: bleu(outputs[name], args.reference) if args.reference else None for name in rows}
    base = statistics.median(times["one model (the first)"])
    print(f"{lines} lines of {args.src.name}, beam {args.beam}, --threads {args.threads}, median of {args.runs} "
          f"whole processes, {date.today()}, CPU flags: {cpu_flags()}\n")
    print("| row | seconds | lines/s | x one model's time |" + (" BLEU |" if args.reference else ""))
    print("|---|---:|---:|---:|" + ("---:|" if args.reference else ""))
    for name in rows:
        seconds = statistics.median(times[name])
        score = f" {scores[name]:.2f} |" if args.reference else ""
        print(f"| {name} | {seconds:.1f} | {lines / seconds:.1f} | {seconds / base:.2f} |{score}")


if __name__ == "__main__":
    main()
