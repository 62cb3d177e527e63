"""Small batches with and without the steps padded to MIN_STEP_ROWS: one process, the two alternating.

`inference/decoding.py` pads every decoding step to MIN_STEP_ROWS (16) rows where a product needs it
for batch invariance (MKL's F.linear, bf16), and runs a step on its real rows when every product gives
a row the same bits in a call of any size (oneDNN's packed float32, the int8 layers: `products_need_padding`). This script measures what that is worth where it
matters, translations of one sentence (a served request at one client; beam 8 is 8 rows, greedy 1):
the same model and lines, in one process, with the padding forced back on and off in turn
(`--rounds` times each, interleaved), per torch thread count. Prints the median seconds per sentence
of each round, the ratio padded / real rows, and whether every output (tokens and score) was identical.
Nothing here is a test.

    python bench/step_padding.py --model runs/multi30k-de-en/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de [--lines 60] [--threads 1,2] [--beam 1,8]
        [--dtype float32|int8|bf16]
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import lscpu_model, table  # noqa: E402

from tfm_cli.checkpoints.format import load_model  # noqa: E402
from tfm_cli.inference import decoding  # noqa: E402
from tfm_cli.inference.settings import resolve_decode  # noqa: E402
from tfm_cli.inference.translation import BatchingConfig, Translator, TranslationStats  # noqa: E402


def one_at_a_time(translator: Translator, lines: list[str], padded: bool) -> tuple[list[float], list[str]]:
    """Translate each line alone; returns (seconds per line, repr of each line's outputs)."""
    real_rule = decoding.products_need_padding
    decoding.products_need_padding = (lambda layers: True) if padded else real_rule
    try:
        seconds, outputs = [], []
        for line in lines:
            started = time.perf_counter()
            answer = translator.translate_chunk([line], 0, TranslationStats())[0]
            seconds.append(time.perf_counter() - started)
            outputs.append(repr(answer.outputs))
        return seconds, outputs
    finally:
        decoding.products_need_padding = real_rule


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a tfm checkpoint")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--lines", type=int, default=60)
    parser.add_argument("--threads", default="1,2", help="torch threads, comma-separated")
    parser.add_argument("--beam", default="", help="beams, comma-separated (default: the model's own)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each setting, interleaved")
    parser.add_argument("--dtype", default="float32", help="the linear layers' precision, as translate --dtype")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    lines = [line.rstrip("\n") for line in open(args.source, encoding="utf-8")][: args.lines]
    loaded = load_model(args.model, device=torch.device("cpu"), dtype=args.dtype)
    beams = [int(b) for b in args.beam.split(",")] if args.beam else [resolve_decode({}, loaded.decode_defaults).beam_size]
    rows = []
    for beam in beams:
        decode = resolve_decode({"beam_size": beam}, loaded.decode_defaults)
        translator = Translator(loaded, decode, BatchingConfig())
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            one_at_a_time(translator, lines[:10], padded=False)  # warm-up
            medians: dict[bool, list[float]] = {True: [], False: []}
            outputs: dict[bool, list[str]] = {}
            for _ in range(args.rounds):
                for padded in (True, False):
                    seconds, outputs[padded] = one_at_a_time(translator, lines, padded)
                    medians[padded].append(statistics.median(seconds))
            ratio = statistics.median(medians[True]) / statistics.median(medians[False])
            rows.append([beam, threads, " / ".join(f"{s * 1000:.1f}" for s in medians[True]),
                         " / ".join(f"{s * 1000:.1f}" for s in medians[False]), f"{ratio:.2f}x",
                         "yes" if outputs[True] == outputs[False] else "NO"])
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/step_padding.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {cpu_flags()}")
    print(f"{len(lines)} sentences, each translated alone, {args.dtype}; medians of each round, in order\n")
    print(table(["beam", "threads", f"padded to {decoding.MIN_STEP_ROWS} rows: ms per sentence",
                 "real rows: ms per sentence", "speed-up", "identical outputs"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
