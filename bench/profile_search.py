"""Where tfm's beam search spends its time: torch.profiler over a few batches, top operators by self CPU.

Usage: python bench/profile_search.py --model CKPT [--source FILE] [--lines 256] [--beam 5]
       [--batch-size 32] [--threads 2] [--top 15] [--dtype float32|int8|bf16] [--shortlist FILE]
       [--length N (every output exactly N tokens: equal work with and without a shortlist)]
Prints a Markdown table (operator, self CPU ms, share, calls) and the wall time with and without
the profiler attached, so the profiler's own overhead is visible.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.inference.decoding import TransformerDecoder, source_batch
from tfm_cli.inference.search import search_beams
from tfm_cli.inference.shortlist import batch_shortlist, load_shortlist

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def make_batches(loaded, source: Path, lines: int, batch_size: int) -> list[list[list[int]]]:
    """The first `lines` sources' ids in batches of `batch_size`, sorted by length, longest first."""
    text = source.read_text(encoding="utf-8").splitlines()[:lines]
    ids = sorted((loaded.src_tokenizer.encode_ids(line) for line in text), key=len, reverse=True)
    return [ids[start : start + batch_size] for start in range(0, len(ids), batch_size)]


def main() -> None:
    """Profile one pass over the batches and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--lines", type=int, default=256)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--dtype", default="float32", help="the linear layers' precision, as translate --dtype")
    parser.add_argument("--shortlist", type=Path, help="restrict the output layer as translate --shortlist does")
    parser.add_argument("--length", type=int, default=0, help="every output exactly this many tokens (0: free)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    shortlist = load_shortlist(args.shortlist) if args.shortlist else None
    batches = make_batches(loaded, args.source, args.lines, args.batch_size)
    limits = dict(min_len=args.length, max_len_a=0.0, max_len_b=args.length) if args.length else {}
    decode_config = DecodeConfig(beam_size=args.beam, length_penalty=0.0, **limits)
    eos = loaded.config.eos_id

    def run_all() -> None:
        for ids in batches:
            restricted = batch_shortlist(shortlist, ids, [[eos]] * len(ids)) if shortlist else None
            decoder = TransformerDecoder(loaded.model, source_batch(ids, loaded.config), shortlist=restricted)
            with torch.inference_mode():
                search_beams(decoder, decode_config)

    run_all()  # warm-up
    start = time.perf_counter()
    run_all()
    plain = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        run_all()
        profiled = time.perf_counter() - start
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"# {args.lines} lines, beam {args.beam}, batch {args.batch_size}, {args.threads} threads, {args.dtype}, "
          f"{'shortlist ' + args.shortlist.name if args.shortlist else 'full output layer'}, "
          f"{f'{args.length} tokens each' if args.length else 'free length'}: "
          f"{plain:.2f} s without the profiler, {profiled:.2f} s with it")
    print("| operator | self CPU ms | share | calls |")
    print("|---|---:|---:|---:|")
    for event in events[: args.top]:
        print(f"| `{event.key}` | {event.self_cpu_time_total / 1000:.0f} | {100 * event.self_cpu_time_total / total:.1f}% "
              f"| {event.count} |")


if __name__ == "__main__":
    main()
