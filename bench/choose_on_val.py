"""Choose checkpoint averaging and the length penalty on validation, never on a test set.

For a finished `tfm train` run, this averages the last k step checkpoints (`tfm average --run
--last k`) for every k in --last, translates the run's validation source with every length penalty
in --alphas at the given beam (`tfm translate`), and prints the cased sacreBLEU of each against the
validation references as a markdown table, best first. `--ema` adds the run's moving average of the
weights (checkpoint_ema.safetensors, written with train.ema_decay) as one more candidate. Each row is
a fresh `tfm` process, so the figures are what a user's commands give.

    python bench/choose_on_val.py runs/multi30k-de-en/train [--last 1,2,3,5] [--alphas 1.0,2.0] [--ema]

The run's own config.json names the validation files; the averaged checkpoints are written into
--workdir (default: the run folder's parent).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import sacrebleu

from fresh_validation import tfm


def main() -> int:
    """Print one table row per (k, alpha), best validation BLEU first; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the `tfm train` run folder (holds config.json and checkpoints)")
    parser.add_argument("--last", default="1,2,3,5", help="numbers of latest step checkpoints to average")
    parser.add_argument("--alphas", default="1.0,1.5,2.0", help="length penalties (the model's kind: GNMT)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--ema", action="store_true", help="also the run's checkpoint_ema.safetensors")
    args = parser.parse_args()
    workdir = args.workdir or args.run.parent
    data = json.loads((args.run / "config.json").read_text())["recipe"]["data"]
    references = Path(data["valid_tgt"]).read_text(encoding="utf-8").splitlines()
    candidates = []
    for k in (int(value) for value in args.last.split(",")):
        averaged = workdir / f"val-average-last{k}.safetensors"
        tfm("average", "--run", args.run, "--last", k, "-o", averaged, "-q")
        candidates.append((f"last {k} averaged", averaged))
    if args.ema:
        candidates.append(("moving average (checkpoint_ema)", args.run / "checkpoint_ema.safetensors"))
    rows = []
    for name, model in candidates:
        for alpha in (float(value) for value in args.alphas.split(",")):
            hypotheses = tfm(
                "translate", "-m", model, "-i", data["valid_src"], "-b", args.beam, "--length-penalty", alpha,
                "--threads", args.threads, "-q",
            ).splitlines()
            bleu = sacrebleu.corpus_bleu(hypotheses, [references])
            rows.append((bleu.score, name, alpha, bleu))
            print(f"  {name}, alpha {alpha}: {bleu.score:.2f}", file=sys.stderr, flush=True)
    print(f"| weights | beam | length penalty | val BLEU | {'BP':>5} |")
    print("|---|---:|---:|---:|---:|")
    for score, name, alpha, bleu in sorted(rows, key=lambda row: -row[0]):
        print(f"| {name} | {args.beam} | {alpha} | {score:.2f} | {bleu.bp:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
