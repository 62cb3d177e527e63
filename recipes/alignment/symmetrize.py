"""Combine two Pharaoh files of the same corpus (forward and reverse, both in source-target order, as
eflomal writes them) with one of tfm's symmetrization heuristics, optionally transposing the result.

Usage: python symmetrize.py FWD REV [--method grow-diag-final-and] [--transpose] > OUT
"""

from __future__ import annotations

import argparse
import sys

from tfm_cli.inference.alignment import parse_pharaoh, pharaoh, transpose_pairs
from tfm_cli.inference.symmetrization import SYMMETRIZATIONS, ordered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("forward")
    parser.add_argument("reverse")
    parser.add_argument("--method", choices=sorted(SYMMETRIZATIONS), default="grow-diag-final-and")
    parser.add_argument("--transpose", action="store_true", help="write target-source pairs (for the reverse direction's training)")
    args = parser.parse_args()
    combine = SYMMETRIZATIONS[args.method]
    with open(args.forward, encoding="utf-8") as forward, open(args.reverse, encoding="utf-8") as reverse:
        for number, (fwd, rev) in enumerate(zip(forward, reverse, strict=True), start=1):
            try:
                pairs = combine(parse_pharaoh(fwd), parse_pharaoh(rev))
            except ValueError as error:
                sys.exit(f"line {number}: {error}")
            sys.stdout.write(pharaoh(ordered(set(transpose_pairs(pairs))) if args.transpose else pairs) + "\n")


if __name__ == "__main__":
    main()
