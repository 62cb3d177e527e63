"""Before/after of DecoderState.select skipping cross-attention cache copies on beam reorders.

"before" restores the old select (every cache re-gathered on every call) by patching the class in
this process; "after" is the code as it is. Same batches, beam 5, alternating, median of rounds.
Usage: python bench/cross_cache_ab.py [--batches 0,10,20,30] [--rounds 3]
(after bench/translate_vs_peers.py has written /tmp/tfm-bench-translate/batches.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tfm_cli.checkpoint import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.model import DecoderState, KeyValueCache
from tfm_cli.search import beam_search


def select_before(self: DecoderState, indices: torch.Tensor) -> None:
    """The select of commit 43ea653: every cache, cross-attention included, gathered on every call."""
    self.memory_mask = self.memory_mask.index_select(0, indices)
    for cache in (*self.self_caches, *self.cross_caches):
        cache.select(indices)
    self.memory_rows = self.memory_rows.index_select(0, indices)


def select_cost(model, src: torch.Tensor, variants: dict) -> str:
    """Milliseconds per beam-reorder select on a beam-5 state of `src` after 12 steps (min of 50 calls)."""
    beam = 5
    with torch.inference_mode():
        state = model.start_decoding(model.encode(src))
        state.select(torch.arange(src.size(0)).repeat_interleave(beam))
        tokens = torch.full((state.batch_size,), model.config.bos_id)
        for _ in range(12):
            model.decode_step(tokens, state)
        # A within-sentence reorder: every row takes the first beam of its sentence.
        order = torch.arange(state.batch_size) // beam * beam
        costs = {}
        for name, select in variants.items():
            best = float("inf")
            for _ in range(50):
                copy = dataclasses.replace(
                    state,
                    self_caches=[KeyValueCache(c.keys, c.values) for c in state.self_caches],
                    cross_caches=[KeyValueCache(c.keys, c.values) for c in state.cross_caches],
                )
                start = time.perf_counter()
                select(copy, order)
                best = min(best, time.perf_counter() - start)
            costs[name] = 1000 * best
    return (f"one select on {state.batch_size} rows, source length {src.size(1)}, 12 steps decoded: "
            f"before {costs['before']:.2f} ms, after {costs['after']:.2f} ms")


def main() -> None:
    """Print seconds per variant and the speed-up."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-translate"))
    parser.add_argument("--batches", default="0,10,20,30")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    all_batches = json.loads((args.workdir / "batches.json").read_text())
    model = load_model(args.workdir / "random.safetensors").model
    config = DecodeConfig(beam_size=5, length_penalty=0.0, max_len_a=0.0, max_len_b=args.max_steps - 1)
    sources = []
    for index in (int(i) for i in args.batches.split(",")):
        rows = [ids for _, ids in all_batches[index]]
        width = max(map(len, rows))
        sources.append(torch.tensor([r + [0] * (width - len(r)) for r in rows]))
    after = DecoderState.select
    variants = {"before": select_before, "after": after}
    print(select_cost(model, sources[0], variants), flush=True)
    seconds = {name: [] for name in variants}
    outputs = {}
    for round_index in range(args.rounds + 1):  # round 0 is a warm-up
        for name, select in variants.items():
            DecoderState.select = select
            start = time.perf_counter()
            outputs[name] = [[h[0].tokens for h in beam_search(model, src, config)] for src in sources]
            if round_index:
                seconds[name].append(time.perf_counter() - start)
    DecoderState.select = after
    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"seconds per round {seconds}", file=sys.stderr)
    print(f"beam 5, {sum(len(s) for s in sources)} sentences, {args.threads} threads: before {median['before']:.2f} s, "
          f"after {median['after']:.2f} s, speed-up {median['before'] / median['after']:.2f}x; "
          f"identical outputs: {outputs['before'] == outputs['after']}")


if __name__ == "__main__":
    main()
