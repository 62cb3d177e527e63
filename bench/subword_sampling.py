"""What subword regularization (data.subword_nbest) costs per epoch: drawing one epoch's segmentations
of a corpus, against tokenizing it once with the best segmentation.

    python bench/subword_sampling.py --spm runs/de-en/train/spm.model \
        --src ../shared/data/multi30k/train.de --tgt ../shared/data/multi30k/train.en [--nbest 8,16,64]

Prints a markdown table: seconds per epoch (both sides), microseconds per sentence and side, and the
mean sentence length drawn (tokens with EOS) against the best segmentation's. Run it with the machine
to itself; the per-epoch seconds compare with the epoch's training time in the run's log.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from tfm_cli.corpus.subword_sampling import SamplingSettings, sample_segmentations
from tfm_cli.corpus.tokenized import flatten
from tfm_cli.special_ids import EOS_ID
from tfm_cli.tokenization.tokenizer import Tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spm", type=Path, required=True, help="a unigram sentencepiece .model")
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--tgt", type=Path, required=True)
    parser.add_argument("--nbest", default="8,16,64", help="comma-separated n-best sizes")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_file(args.spm)
    sides = [path.read_text(encoding="utf-8").splitlines() for path in (args.src, args.tgt)]
    sentences = sum(len(lines) for lines in sides)

    start = time.perf_counter()
    encoded = [flatten(tokenizer.encode_ids_batch(lines), EOS_ID) for lines in sides]
    plain = time.perf_counter() - start
    best_length = sum(int(offsets[-1]) for _, offsets in encoded) / sentences
    print(f"{sentences:,} sentences ({len(sides[0]):,} pairs); torch threads 1", flush=True)
    print("| segmentation | s per epoch | us per sentence | mean length with EOS |")
    print("|---|---:|---:|---:|")
    print(f"| best (tokenize once) | {plain:.2f} | {plain / sentences * 1e6:.0f} | {best_length:.2f} |")
    for nbest in (int(value) for value in args.nbest.split(",")):
        settings = SamplingSettings(nbest=nbest, alpha=args.alpha, max_length=args.max_length)
        generator = torch.Generator().manual_seed(1)
        start = time.perf_counter()
        drawn = [sample_segmentations(tokenizer, tokens, offsets, settings, generator, EOS_ID)
                 for tokens, offsets in encoded]
        seconds = time.perf_counter() - start
        length = sum(int(offsets[-1]) for _, offsets in drawn) / sentences
        print(f"| drawn from the {nbest} best, alpha {args.alpha:g} | {seconds:.2f} | "
              f"{seconds / sentences * 1e6:.0f} | {length:.2f} |", flush=True)


if __name__ == "__main__":
    main()
