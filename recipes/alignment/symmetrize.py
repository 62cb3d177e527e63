"""Combine two Pharaoh files of the same corpus (forward and reverse, both in source-target order, as
eflomal writes them) with one of tfm's symmetrization heuristics, optionally transposing the result.
Given several runs (FWD REV pairs), each run is symmetrized and a link is kept when at least
--at-least of the runs have it.

Usage: python symmetrize.py FWD REV [FWD REV ...] [--method grow-diag-final-and] [--at-least K] [--transpose] > OUT
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

from tfm_cli.inference.alignment import parse_pharaoh, pharaoh, transpose_pairs
from tfm_cli.inference.symmetrization import SYMMETRIZATIONS, ordered, voted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="FWD REV", help="the forward and reverse file of each run")
    parser.add_argument("--method", choices=sorted(SYMMETRIZATIONS), default="grow-diag-final-and")
    parser.add_argument("--at-least", type=int, default=1, help="runs that must have a link (default 1)")
    parser.add_argument("--transpose", action="store_true", help="write target-source pairs (for the reverse direction's training)")
    args = parser.parse_args()
    if len(args.files) % 2:
        parser.error(f"give a forward and a reverse file for each run (got {len(args.files)} files, an odd number)")
    if not 1 <= args.at_least <= len(args.files) // 2:
        parser.error(f"--at-least must be between 1 and the number of runs ({len(args.files) // 2}), not {args.at_least}")
    combine = SYMMETRIZATIONS[args.method]
    with ExitStack() as stack:
        files = [stack.enter_context(open(path, encoding="utf-8")) for path in args.files]
        number = 0
        try:
            for number, lines in enumerate(zip(*files, strict=True), start=1):
                try:
                    runs = [combine(parse_pharaoh(fwd), parse_pharaoh(rev)) for fwd, rev in zip(lines[::2], lines[1::2])]
                except ValueError as error:
                    sys.exit(f"line {number}: {error}")
                pairs = voted(runs, args.at_least)
                sys.stdout.write(pharaoh(ordered(set(transpose_pairs(pairs))) if args.transpose else pairs) + "\n")
        except ValueError as error:  # from zip(strict=True): one file ended before the others
            sys.exit(f"after line {number}: the files differ in length ({error}); give files of the same corpus")


if __name__ == "__main__":
    main()
