"""Before/after of beam search keeping one cross-attention cache entry per sentence (grouped rows).

"per-row" forces DecoderState.select's group width to 1, so every beam row holds its own copy of
its sentence's memory keys/values (the layout before the change; within-sentence reorders still
copy nothing). "grouped" is the code as it is: a sentence's beams form one group, and each
group's queries meet their keys in one product. Both run in this one process on the same
batches; the variants alternate batch by batch (and swap order every batch), so a change in
machine load hits both alike. Prints seconds per round and the median ratio per-row / grouped,
and whether the outputs (tokens, and tokens with scores) are identical.

Usage: python bench/cross_cache_ab.py --model CKPT [--workdir /tmp/tfm-bench-trained]
       [--batches 16] [--rounds 3] [--threads 2] [--max-steps 80]
(after bench/translate_vs_peers.py has written WORKDIR/batches.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tfm_cli.allocator import keep_freed_memory
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.model import DecoderState
from tfm_cli.inference.search import beam_search
from translate_vs_peers import padded

GROUPED_SELECT = DecoderState.select


def per_row_select(self: DecoderState, indices: torch.Tensor, group_width: int = 1) -> None:
    """DecoderState.select with every group one row wide: the cross caches are copied per beam."""
    GROUPED_SELECT(self, indices, 1)


def main() -> None:
    """Print seconds per round for both variants, the median ratio and whether outputs agree."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-trained"))
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=80)
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    model = load_model(args.model).model
    config = DecodeConfig(beam_size=5, length_penalty=0.0, max_len_a=0.0, max_len_b=args.max_steps - 1)
    batches = json.loads((args.workdir / "batches.json").read_text())[: args.batches]
    sources = [padded([ids for _, ids in batch], model.config.pad_id) for batch in batches]
    variants = {"per-row": per_row_select, "grouped": GROUPED_SELECT}
    seconds = {name: [] for name in variants}
    outputs = {name: [] for name in variants}
    for round_index in range(args.rounds + 1):  # round 0 is a warm-up and records the outputs
        spent = dict.fromkeys(variants, 0.0)
        for batch_index, src in enumerate(sources):
            names = list(variants) if (batch_index + round_index) % 2 == 0 else list(variants)[::-1]
            for name in names:
                DecoderState.select = variants[name]
                start = time.perf_counter()
                results = beam_search(model, src, config)
                spent[name] += time.perf_counter() - start
                if round_index == 0:
                    outputs[name] += [(hyps[0].tokens, hyps[0].score) for hyps in results]
        DecoderState.select = GROUPED_SELECT
        if round_index:
            for name in variants:
                seconds[name].append(spent[name])
            print(f"round {round_index}: per-row {spent['per-row']:.2f} s, grouped {spent['grouped']:.2f} s", flush=True)
    ratio = statistics.median(a / b for a, b in zip(seconds["per-row"], seconds["grouped"]))
    pairs = list(zip(outputs["per-row"], outputs["grouped"]))
    print(f"beam 5, {len(pairs)} sentences, {args.threads} threads: median ratio per-row / grouped {ratio:.3f}; "
          f"identical tokens {sum(a[0] == b[0] for a, b in pairs)}/{len(pairs)}, "
          f"identical tokens and scores {sum(a == b for a, b in pairs)}/{len(pairs)}")


if __name__ == "__main__":
    main()
