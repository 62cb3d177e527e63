"""Training steps with glibc's default malloc settings against `tfm train`'s (allocator.keep_all_freed_memory).

The allocator is a whole-process setting, so the two settings run in separate child processes,
alternating (default, kept, default, kept, ...). Every child builds the Multi30k model twice from the
same seed and runs tfm's training step (tfm_cli.training.step.train_step, fused AdamW as `tfm train`
uses, clipping 1.0, label smoothing 0.1) over the same --steps batches of <= 4096 tokens per side, in
float32 and under bf16 autocast, batch by batch in turn. Reported per setting and precision: the
median over rounds of the seconds for all batches, the minor page faults per update, and the child's
peak RSS; then the ratios default / kept (above 1: the kept setting is faster).

Usage: python bench/train_allocator.py [--rounds 2] [--steps 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def child(setting: str, steps: int, threads: int, workdir: Path) -> dict:
    """Run the steps in this process with `setting` ("default" or "kept"); the figures as a dict."""
    from tfm_cli.allocator import keep_all_freed_memory

    if setting == "kept" and not keep_all_freed_memory():
        raise SystemExit("keep_all_freed_memory had no effect here (no glibc)")
    sys.path.insert(0, str(BENCH_DIR))
    from train_vs_reference import MULTI30K, load_batches

    from tfm_cli.config import ModelConfig
    from tfm_cli.model import Transformer
    from tfm_cli.training.step import StepSettings, train_step

    torch.set_num_threads(threads)
    tokenizer, batches = load_batches(MULTI30K, workdir, 8000, 4096, steps)
    config = ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=256, n_heads=4,
        d_ff=1024, n_enc_layers=3, n_dec_layers=3, dropout=0.1, share_embeddings=True, max_positions=256,
    )
    engines = {}
    for name, dtype in PRECISIONS.items():
        torch.manual_seed(0)
        model = Transformer(config).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        engines[name] = (model, optimizer, StepSettings(0.1, 1.0, dtype, "cpu"))
    seconds = dict.fromkeys(engines, 0.0)
    faults = dict.fromkeys(engines, 0)
    for batch in batches:
        for name, (model, optimizer, settings) in engines.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            train_step(model, optimizer, None, [batch], settings)
            seconds[name] += time.perf_counter() - start
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "faults_per_step": {k: v / len(batches) for k, v in faults.items()}, "peak_mib": peak_mib}


def main() -> None:
    """Alternate child processes of both settings; print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="batches (updates per precision) per child")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-train"))
    parser.add_argument("--child", choices=["default", "kept"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.threads, args.workdir)))
        return
    results: dict[str, list[dict]] = {"default": [], "kept": []}
    for round_index in range(args.rounds):
        for setting in ("default", "kept"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", setting, "--steps", str(args.steps), "--threads",
                 str(args.threads), "--workdir", str(args.workdir)],
                capture_output=True, text=True, check=True,
            )
            results[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"# round {round_index + 1} {setting}: {results[setting][-1]}", file=sys.stderr, flush=True)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; {args.threads} threads; "
          f"{args.steps} batches per child, {args.rounds} rounds (median)")
    print("| precision | malloc settings | seconds | page faults per update | peak RSS MiB (child) | default / kept |")
    print("|---|---|---:|---:|---:|---:|")
    for precision in PRECISIONS:
        median = {s: statistics.median(r["seconds"][precision] for r in results[s]) for s in results}
        for setting in ("default", "kept"):
            faults = statistics.median(r["faults_per_step"][precision] for r in results[setting])
            peak = statistics.median(r["peak_mib"] for r in results[setting])
            ratio = f"**{median['default'] / median['kept']:.2f}x**" if setting == "kept" else ""
            print(f"| {precision} | {setting} | {median[setting]:.1f} | {faults:,.0f} | {peak:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
