"""Does CTranslate2 decode slower in a process that has also loaded torch (and a tfm model)?

Why it matters: a decoder-only comparison that runs CTranslate2 inside a process which imported
torch gives it two OpenMP runtimes (torch's and CTranslate2's, separate libraries with their own
threads) on the same cores. bench/translate_vs_peers.py therefore runs CTranslate2 in workers that
import neither; this script measures what sharing the process would cost.

Each run is a fresh process that translates the same lines with the same CTranslate2 float32 model
(`tfm export --to ctranslate2`), batches of 32, beam --beam, length penalty 0, 2 intra threads,
timed after one warm-up batch (model load and tokenization excluded), in one of three setups:
  alone        imports ctranslate2 and sentencepiece only (what a CTranslate2 user runs)
  torch        also imports torch, sets 2 threads and runs one product first (its threads exist)
  torch+tfm    also loads the tfm checkpoint with tfm_cli.checkpoint.load_model (packs its weights)
The setups alternate run by run; the table gives median seconds and each setup / alone.

Usage: python bench/ct2_beside_torch.py --model CKPT [--source FILE] [--runs 3] [--beam 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MULTI30K = BENCH_DIR.parents[1] / "shared" / "data" / "multi30k"
SETUPS = ("alone", "torch", "torch+tfm")


def run_worker(setup: str, folder: str, spm_model: str, source: str, beam: int, checkpoint: str) -> float:
    """Worker: translate `source` in the given setup; returns the decoding seconds."""
    if setup != "alone":
        import torch

        torch.set_num_threads(2)
        torch.set_num_interop_threads(1)
        (torch.randn(256, 256) @ torch.randn(256, 256)).sum()
        if setup == "torch+tfm":
            from tfm_cli.checkpoint import load_model

            load_model(checkpoint)
    import ctranslate2
    import sentencepiece

    tokenizer = sentencepiece.SentencePieceProcessor(model_file=spm_model)
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    pieces = sorted((tokens + ["</s>"] for tokens in tokenizer.encode(lines, out_type=str)), key=len, reverse=True)
    batches = [pieces[start : start + 32] for start in range(0, len(pieces), 32)]
    translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=2)
    options = dict(beam_size=beam, length_penalty=0.0, max_decoding_length=80)
    translator.translate_batch(batches[0], **options)  # warm-up
    start = time.perf_counter()
    for batch in batches:
        translator.translate_batch(batch, **options)
    return time.perf_counter() - start


def main() -> None:
    """Export once, run the setups interleaved, print a markdown table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        setup, folder, spm_model, source, beam, checkpoint = sys.argv[2:]
        print(json.dumps(run_worker(setup, folder, spm_model, source, int(beam), checkpoint)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="tfm checkpoint")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-ct2-beside-torch"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--beam", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(BENCH_DIR))
    from translate_memory import export_ctranslate2

    folder = export_ctranslate2(args.model, args.workdir)["float32"]
    seconds: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    for repeat in range(args.runs):
        for setup in SETUPS if repeat % 2 == 0 else SETUPS[::-1]:
            command = [sys.executable, __file__, "--worker", setup, str(folder), str(args.workdir / "spm.model"),
                       str(args.source), str(args.beam), str(args.model)]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            seconds[setup].append(float(result.stdout.strip().splitlines()[-1]))
            print(f"  run {repeat + 1} {setup}: {seconds[setup][-1]:.2f} s", file=sys.stderr)
    alone = statistics.median(seconds["alone"])
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.source.name}, beam {args.beam}, "
          f"CTranslate2 float32, 2 intra threads, median of {args.runs}")
    print("| setup | decoding s, median | per run | / alone |")
    print("|---|---:|---|---:|")
    for setup in SETUPS:
        runs = seconds[setup]
        print(f"| {setup} | {statistics.median(runs):.2f} | {min(runs):.2f}-{max(runs):.2f} | "
              f"{statistics.median(runs) / alone:.2f}x |")


if __name__ == "__main__":
    main()
