"""Print a training run's validation curve as a Markdown table (for recipes/multi30k/RESULTS.md).

Usage: python recipes/multi30k/summarize.py RUN_DIR
Reads RUN_DIR/metrics.jsonl (written by `tfm train`): one row per validation with the update, epoch,
minutes of training so far, validation loss/perplexity and greedy BLEU; then the training speed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read_records(run_dir: Path) -> list[dict]:
    """Returns the metrics.jsonl records of `run_dir`, in file order."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def curve_table(records: list[dict]) -> list[str]:
    """Returns Markdown table lines, one row per validation record."""
    rows = ["| update | epoch | minutes | val loss | val ppl | val BLEU (greedy) | best |",
            "|---:|---:|---:|---:|---:|---:|:---:|"]
    elapsed = 0.0
    for record in records:
        if record["kind"] == "train":
            elapsed = record["elapsed"]
        elif record["kind"] == "valid":
            bleu = "" if record["bleu"] is None else f"{record['bleu']:.2f}"
            rows.append(f"| {record['step']} | {record['epoch']} | {elapsed / 60:.1f} | {record['loss']:.3f} "
                        f"| {record['ppl']:.2f} | {bleu} | {'*' if record['best'] else ''} |")
    return rows


def speed_line(records: list[dict]) -> str:
    """Returns one sentence with the mean training speed over all logged intervals."""
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        return "no training records"
    mean_tgt = sum(r["tgt_tokens_per_s"] for r in train) / len(train)
    mean_all = sum(r["tokens_per_s"] for r in train) / len(train)
    last = train[-1]
    return (f"last logged: update {last['step']}, epoch {last['epoch']}, {last['elapsed'] / 60:.1f} minutes of "
            f"training; mean {mean_tgt:,.0f} target tokens/s ({mean_all:,.0f} source+target)")


def main() -> None:
    """Print the table and the speed line on stdout."""
    records = read_records(Path(sys.argv[1]))
    print("\n".join(curve_table(records)))
    print()
    print(speed_line(records))


if __name__ == "__main__":
    main()
