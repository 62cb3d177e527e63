"""How many eflomal runs, and how many of them agreeing, make the best links to teach an aligner:
AER of the links that at least K of the first N runs' intersections have, on a trial gold set
(where the choice is made) and on the test gold set (reported, never chosen on).

The runs' files cover one corpus whose last lines are the test gold sentences followed by the trial
gold sentences (e.g. Multi30k train + the 447 Hansards test sentences + the 37 trial sentences):

  for run in $(seq 12); do eflomal-align -s all.en -t all.fr -f ef$run.fwd -r ef$run.rev; done
  python bench/eflomal_votes.py --gold gold.talp --trial trial.talp --sizes 6,12 \\
      $(for run in $(seq 12); do echo ef$run.fwd ef$run.rev; done)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from alignment_aer import aer, read_gold

from tfm_cli.inference.alignment import AlignmentPair, parse_pharaoh
from tfm_cli.inference.symmetrization import intersection, voted

Sentences = list[list[AlignmentPair]]


def tail_intersections(forward: Path, reverse: Path, first: int, count: int) -> Sentences:
    """The intersections of lines first .. first + count - 1 (0-based) of a run's two files."""
    forward_lines = forward.read_text(encoding="utf-8").splitlines()[first : first + count]
    reverse_lines = reverse.read_text(encoding="utf-8").splitlines()[first : first + count]
    return [intersection(parse_pharaoh(f), parse_pharaoh(r)) for f, r in zip(forward_lines, reverse_lines, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="FWD REV", help="each run's forward and reverse file")
    parser.add_argument("--gold", type=Path, required=True, help="the test gold set (talp)")
    parser.add_argument("--trial", type=Path, required=True, help="the trial gold set (talp), the corpus's last lines")
    parser.add_argument("--sizes", default="", help="numbers of runs N to vote over (default: all of them)")
    args = parser.parse_args()
    if len(args.files) % 2:
        parser.error(f"give a forward and a reverse file for each run (got {len(args.files)} files)")
    runs = list(zip(map(Path, args.files[::2]), map(Path, args.files[1::2])))
    sizes = [int(size) for size in args.sizes.split(",")] if args.sizes else [len(runs)]
    gold = {"trial": read_gold(args.trial), "test": read_gold(args.gold)}
    corpus_lines = len(runs[0][0].read_text(encoding="utf-8").splitlines())
    first = {"trial": corpus_lines - len(gold["trial"][0])}
    first["test"] = first["trial"] - len(gold["test"][0])
    links = {
        part: [tail_intersections(fwd, rev, first[part], len(gold[part][0])) for fwd, rev in runs] for part in gold
    }

    def score(part: str, sentences: Sentences) -> float:
        return 100 * aer(sentences, *gold[part]).aer

    singles = {part: [score(part, run) for run in links[part]] for part in gold}
    print("| runs N | at least K | trial AER % | test AER % |")
    print("|---:|---:|---:|---:|")
    print(f"| 1 (median of {len(runs)}) | 1 | {statistics.median(singles['trial']):.2f} | "
          f"{statistics.median(singles['test']):.2f} |")
    for size in sizes:
        for at_least in range(1, size + 1):
            row = [score(part, [voted(list(votes), at_least) for votes in zip(*links[part][:size])]) for part in ("trial", "test")]
            print(f"| {size} | {at_least} | {row[0]:.2f} | {row[1]:.2f} |")


if __name__ == "__main__":
    main()
