"""A round of a few dozen one-sentence requests searched three ways: what one batch across source widths is worth.

A `tfm serve` round of 64 one-sentence requests holds sources of 4-6 padded widths (Multi30k). This
script takes --rounds random draws of --sentences test sentences and searches each draw three ways,
rotating the order, in one process:
- one batch per padded width, one after another (batch invariant; every step of every batch reads all
  the decoder weights again);
- one batch of every width, each width encoded and attended apart (what tfm does:
  decoding.TransformerDecoder.source_runs; batch invariant);
- one batch padded to the widest source (not batch invariant: every sentence's keys are padded to the
  widest, so its rounding may change; the bound for the second way, which adds a few small operations
  per width).
Prints seconds per draw, the ratios, and how many best outputs the per-width way shares with each
other way. Nothing here is a test.

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
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import lscpu_model, table  # noqa: E402

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


def one_batch(model, config, draw: list[list[int]], decode: DecodeConfig, widest: bool) -> tuple[float, dict[int, list[int]]]:
    """Search `draw` as one batch, each width apart (tfm) or, with `widest`, every source encoded and
    attended at the widest width; returns (seconds, best tokens per draw index)."""
    started = time.perf_counter()
    decoder = TransformerDecoder(model, source_batch(draw, config))
    if widest:
        decoder.source_runs = lambda: [(0, len(draw), decoder.src.size(1))]
    found = search_beams(decoder, decode)
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
    ways = {
        "per width": lambda draw: per_width(loaded.model, loaded.config, draw, decode),
        "one batch": lambda draw: one_batch(loaded.model, loaded.config, draw, decode, widest=False),
        "widest": lambda draw: one_batch(loaded.model, loaded.config, draw, decode, widest=True),
    }
    with torch.inference_mode():
        ways["one batch"](sources[:16])  # warm-up
        for round_number in range(1, args.rounds + 1):
            draw = sorted(draws.sample(sources, args.sentences), key=len)  # as tfm's batches are (length_sorted_batches)
            widths = collections.Counter(padded_length(len(ids) + 1) for ids in draw)
            # Rotate which goes first, so that a drift in the machine's speed hits every way alike.
            names = list(ways)
            names = names[round_number % 3 :] + names[: round_number % 3]
            results = {name: ways[name](draw) for name in names}
            split_s, split_tokens = results["per width"]
            one_s, one_tokens = results["one batch"]
            widest_s, widest_tokens = results["widest"]
            ratios.append(split_s / one_s)
            rows.append([
                round_number, " ".join(f"{w}:{n}" for w, n in sorted(widths.items())), f"{split_s:.2f}", f"{one_s:.2f}",
                f"{widest_s:.2f}", f"{split_s / one_s:.2f}x", f"{split_s / widest_s:.2f}x",
                f"{sum(split_tokens[i] == one_tokens[i] for i in range(len(draw)))} / "
                f"{sum(split_tokens[i] == widest_tokens[i] for i in range(len(draw)))} of {len(draw)}",
            ])
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/width_batches.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {cpu_flags()}")
    print(f"Decoding: the model's own (beam {decode.beam_size}), float32, {args.threads} threads\n")
    print(table(["draw", "padded widths (width:sentences)", "one batch per width s", "one batch, widths apart (tfm) s",
                 "one batch at the widest s", "per width / tfm", "per width / widest", "best outputs as per width: tfm / widest"],
                rows))
    print(f"\nmedian per width / tfm: {statistics.median(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
