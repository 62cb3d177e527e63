"""What one batch across source widths would be worth to a round of a few dozen one-sentence requests.

Batch invariance (inference/decoding.py) puts only sources of one padded width in a batch, so a round
of `tfm serve` that gathers 64 one-sentence requests is searched as one batch per width present (4-5 on
Multi30k), one after another, each step reading every decoder weight again. This script takes
--rounds random draws of --sentences test sentences and searches each draw both ways, alternating, in
one process: one batch per padded width (what tfm does) and one batch padded to the widest source (not
batch invariant: every sentence's keys are padded to the widest, so its rounding may change; the upper
bound of a batch that mixed widths and kept each width's attention apart). Prints seconds per draw, the
ratio, and how many outputs the two ways share. Nothing here is a test.

    python bench/width_batches.py --model runs/multi30k-de-en/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de [--sentences 64] [--rounds 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import lscpu_flags, lscpu_model, table  # noqa: E402

from tfm_cli.checkpoints.format import load_model  # noqa: E402
from tfm_cli.config import DecodeConfig  # noqa: E402
from tfm_cli.inference.decoding import TransformerDecoder, padded_length, source_batch  # noqa: E402
from tfm_cli.inference.search import search_beams  # noqa: E402
from tfm_cli.inference.settings import resolve_decode  # noqa: E402


def per_width(model, config, draw: list[list[int]], decode: DecodeConfig) -> tuple[float, dict[int, list[int]]]:
    """Search `draw` as one batch per padded width; returns (seconds, best tokens per draw index)."""
    groups: dict[int, list[int]] = collections.defaultdict(list)
    for index, ids in enumerate(draw):
        groups[padded_length(len(ids) + 1)].append(index)
    started = time.perf_counter()
    tokens = {}
    for width in sorted(groups):
        members = groups[width]
        found = search_beams(TransformerDecoder(model, source_batch([draw[i] for i in members], config)), decode)
        tokens.update({i: nbest[0].tokens for i, nbest in zip(members, found)})
    return time.perf_counter() - started, tokens


def one_batch(model, config, draw: list[list[int]], decode: DecodeConfig) -> tuple[float, dict[int, list[int]]]:
    """Search `draw` as one batch padded to its widest source; returns (seconds, best tokens per draw index)."""
    started = time.perf_counter()
    found = search_beams(TransformerDecoder(model, source_batch(draw, config)), decode)
    return time.perf_counter() - started, {i: nbest[0].tokens for i, nbest in enumerate(found)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a tfm checkpoint")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--sentences", type=int, default=64, help="sentences per draw (a round of one-sentence requests)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=torch.device("cpu"), dtype="float32")
    decode = resolve_decode({}, loaded.decode_defaults)
    lines = [line.strip() for line in open(args.source, encoding="utf-8") if line.strip()]
    sources = [loaded.src_tokenizer.encode_ids(line) for line in lines]
    draws = random.Random(args.seed)
    rows, ratios = [], []
    with torch.inference_mode():
        one_batch(loaded.model, loaded.config, sources[:16], decode)  # warm-up
        for round_number in range(1, args.rounds + 1):
            draw = draws.sample(sources, args.sentences)
            widths = collections.Counter(padded_length(len(ids) + 1) for ids in draw)
            # Alternate which goes first, so that a drift in the machine's speed hits both alike.
            if round_number % 2:
                split_s, split_tokens = per_width(loaded.model, loaded.config, draw, decode)
                whole_s, whole_tokens = one_batch(loaded.model, loaded.config, draw, decode)
            else:
                whole_s, whole_tokens = one_batch(loaded.model, loaded.config, draw, decode)
                split_s, split_tokens = per_width(loaded.model, loaded.config, draw, decode)
            same = sum(split_tokens[i] == whole_tokens[i] for i in range(len(draw)))
            ratios.append(split_s / whole_s)
            rows.append([round_number, " ".join(f"{w}:{n}" for w, n in sorted(widths.items())), f"{split_s:.2f}",
                         f"{whole_s:.2f}", f"{split_s / whole_s:.2f}x", f"{same} of {len(draw)}"])
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/width_batches.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {lscpu_flags()}")
    print(f"Decoding: the model's own (beam {decode.beam_size}), float32, {args.threads} threads\n")
    print(table(["draw", "padded widths (width:sentences)", "one batch per width s", "one batch, widest width s",
                 "per width / one batch", "same best output"], rows))
    print(f"\nmedian ratio {statistics.median(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
