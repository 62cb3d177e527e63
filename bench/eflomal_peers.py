"""eflomal as the peer of an aligner, on a gold set whose sentences are the last lines of eflomal's corpus:
AER of single runs in every mode (median and range over the runs) and of the K-of-N intersection vote.

eflomal aligns only the corpus it is trained on, so to align new sentences they are appended to its
corpus. Give the runs' files and the number of lines that follow the gold sentences in the corpus:

  cat train.en test.en trial.en > all.en      # the same for .fr
  for run in $(seq 12); do eflomal-align -s all.en -t all.fr -f ef$run.fwd -r ef$run.rev; done
  python bench/eflomal_peers.py --gold test.talp --lines-after 37 --at-least 3 \\
      $(for run in $(seq 12); do echo ef$run.fwd ef$run.rev; done)

Prints a Markdown table: mode, median AER % of the single runs, their range, and the vote's AER %.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from alignment_aer import aer, read_gold

from tfm_cli.inference.alignment import AlignmentPair, parse_pharaoh
from tfm_cli.inference.symmetrization import grow_diag_final_and, intersection, voted

Sentences = list[list[AlignmentPair]]


def gold_lines(path: Path, first: int, count: int) -> Sentences:
    """Lines first .. first + count - 1 (0-based) of a Pharaoh file, parsed."""
    return [parse_pharaoh(line) for line in path.read_text(encoding="utf-8").splitlines()[first : first + count]]


def run_modes(forward: Sentences, reverse: Sentences) -> dict[str, Sentences]:
    """One run's links in each mode: its two directions and two symmetrizations, English-French order."""
    return {
        "forward (en-fr)": forward,
        "reverse (fr-en)": reverse,
        "grow-diag-final-and": [grow_diag_final_and(f, r) for f, r in zip(forward, reverse, strict=True)],
        "intersection": [intersection(f, r) for f, r in zip(forward, reverse, strict=True)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="FWD REV", help="each run's forward and reverse file")
    parser.add_argument("--gold", type=Path, required=True, help="the gold set (talp)")
    parser.add_argument("--lines-after", type=int, default=0, help="corpus lines after the gold sentences")
    parser.add_argument("--at-least", type=int, default=3, help="runs whose intersection must have a link")
    args = parser.parse_args()
    if len(args.files) % 2:
        parser.error(f"give a forward and a reverse file for each run (got {len(args.files)} files)")
    runs_given = len(args.files) // 2
    if not 1 <= args.at_least <= runs_given:
        parser.error(f"--at-least must be between 1 and the number of runs, {runs_given} (got {args.at_least})")
    sure, possible = read_gold(args.gold)
    runs = list(zip(map(Path, args.files[::2]), map(Path, args.files[1::2])))
    corpus_lines = len(runs[0][0].read_text(encoding="utf-8").splitlines())
    first = corpus_lines - args.lines_after - len(sure)
    per_run = [run_modes(gold_lines(fwd, first, len(sure)), gold_lines(rev, first, len(sure))) for fwd, rev in runs]
    vote = [voted(list(votes), args.at_least) for votes in zip(*(modes["intersection"] for modes in per_run))]
    print(f"| eflomal mode | median AER % of {len(runs)} runs | range | {len(runs)}-run intersection vote "
          f"(at least {args.at_least}) AER % |")
    print("|---|---:|---|---:|")
    for mode in per_run[0]:
        scores = [100 * aer(modes[mode], sure, possible).aer for modes in per_run]
        vote_cell = f"{100 * aer(vote, sure, possible).aer:.2f}" if mode == "intersection" else ""
        print(f"| {mode} | {statistics.median(scores):.2f} | {min(scores):.2f}-{max(scores):.2f} | {vote_cell} |")
    print(f"\ngold: {args.gold}, {len(sure)} sentences, lines {first + 1}-{first + len(sure)} of the corpus")


if __name__ == "__main__":
    main()
