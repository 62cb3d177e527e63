"""Re-evaluate a run's saved checkpoints in this fresh process and compare with what training logged.

For every validation in RUN/metrics.jsonl whose checkpoint is still in the run folder
(checkpoint_STEP, checkpoint_best, checkpoint_last), this runs `tfm translate -b 1` (greedy, with
the run's valid_max_len_a/b, as validation decodes) and `tfm score -m` on the run's validation
files, and prints logged vs fresh BLEU and per-token nll side by side.

    python bench/fresh_validation.py runs/de-en/train [--device cpu] [--bleu-tolerance 0.05] [--last N]

Exits 1 when a BLEU differs by more than --bleu-tolerance or an nll by more than --nll-tolerance
(relative). A run validated under bf16 autocast is compared with float32 evaluation, so give it
wider tolerances.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import sacrebleu
from safetensors import safe_open


def checkpoint_step(path: Path) -> int:
    """The training step recorded in a checkpoint's provenance."""
    with safe_open(str(path), framework="pt") as f:
        return int(json.loads(f.metadata()["provenance"])["step"])


def tfm(*args: object) -> str:
    """stdout of `python -m tfm_cli ARGS` (a fresh process each time); raises on failure."""
    result = subprocess.run([sys.executable, "-m", "tfm_cli", *map(str, args)], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"tfm {' '.join(map(str, args))} failed:\n{result.stderr}")
    return result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bleu-tolerance", type=float, default=0.05)
    parser.add_argument("--nll-tolerance", type=float, default=1e-3)
    parser.add_argument("--last", type=int, default=0, help="check only the last N validated checkpoints (0 = all)")
    args = parser.parse_args()
    recipe = json.loads((args.run / "config.json").read_text())["recipe"]
    data, train = recipe["data"], recipe["train"]
    references = Path(data["valid_tgt"]).read_text(encoding="utf-8").splitlines()
    logged = {}
    for line in (args.run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "valid":
            logged[record["step"]] = record
    checkpoints = {}
    for path in sorted(args.run.glob("checkpoint_*.safetensors")):
        step = checkpoint_step(path)
        if step in logged:
            checkpoints.setdefault(step, path)
    if not checkpoints:
        print("no saved checkpoint matches a logged validation", file=sys.stderr)
        return 1
    if args.last > 0:
        checkpoints = dict(sorted(checkpoints.items())[-args.last :])
    print(f"{'step':>6} {'checkpoint':<34} {'logged BLEU':>11} {'fresh BLEU':>10} {'logged nll':>10} {'fresh nll':>9}")
    bad = 0
    for step, path in sorted(checkpoints.items()):
        hypotheses = tfm(
            "translate", "-m", path, "-i", data["valid_src"], "-b", 1, "--max-len-a", train["valid_max_len_a"],
            "--max-len-b", train["valid_max_len_b"], "--device", args.device, "--threads", args.threads, "-q",
        ).splitlines()
        bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
        scored = tfm(
            "score", "-m", path, "--src", data["valid_src"], "--tgt", data["valid_tgt"], "--normalize", "none",
            "--json", "--device", args.device, "--threads", args.threads, "-q",
        ).splitlines()
        records = [json.loads(line) for line in scored]
        nll = -sum(r["score"] for r in records) / sum(len(r["token_log_probs"]) for r in records)
        record = logged[step]
        print(f"{step:>6} {path.name:<34} {record['bleu']:>11.2f} {bleu:>10.2f} {record['nll_loss']:>10.4f} {nll:>9.4f}")
        bad += abs(bleu - record["bleu"]) > args.bleu_tolerance
        bad += abs(nll - record["nll_loss"]) > args.nll_tolerance * nll
    print(f"{bad} figure(s) outside the tolerances (BLEU {args.bleu_tolerance}, nll {args.nll_tolerance:.0e} relative)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
