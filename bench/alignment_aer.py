"""Word-alignment quality: alignment error rate (AER, Och & Ney 2003) against a hand-aligned gold
standard with sure and possible links, with precision and recall, one row per hypothesis file.

The gold file is one line per sentence of Pharaoh links, "e-f" sure and "e?f" possible (the talp
convention of fairseq and lilt), 0-based, English index first; hypotheses are plain Pharaoh files in
the same English-French order, line for line. See bench/README.md for the Hansards gold set and the
eflomal anchor.

Usage: python bench/alignment_aer.py --gold GOLD.talp NAME=FILE [NAME=FILE ...]
       python bench/alignment_aer.py --gold GOLD.talp --symmetrize NAME=FWD,REV
       python bench/alignment_aer.py --convert-naacl test.wa.nonullalign > GOLD.talp
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tfm_cli.inference.alignment import AlignmentPair, parse_pharaoh
from tfm_cli.inference.symmetrization import SYMMETRIZATIONS

Sentences = list[list[AlignmentPair]]


@dataclass(frozen=True)
class AlignmentScore:
    """Corpus-level scores of one hypothesis; `links` is the number of hypothesis links |A|."""

    aer: float
    precision: float
    recall: float
    links: int


def aer(hypotheses: Sentences, sure: Sentences, possible: Sentences) -> AlignmentScore:
    """Corpus-level AER = 1 - (|A&S| + |A&P|) / (|A| + |S|), with P taken to include S.

    Precision is |A&P| / |A| (0.0 for an empty hypothesis), recall |A&S| / |S|. All three lists
    hold one list of (src, tgt) pairs per sentence, in the same order. Counts are summed over the
    corpus before dividing (Och & Ney 2003, section 5), not averaged per sentence.
    """
    if not len(hypotheses) == len(sure) == len(possible):
        raise ValueError(
            f"sentence counts differ: {len(hypotheses)} hypotheses, {len(sure)} sure, {len(possible)} possible"
        )
    a_size = s_size = a_and_s = a_and_p = 0
    for hyp_pairs, sure_pairs, possible_pairs in zip(hypotheses, sure, possible):
        hyp, s = set(hyp_pairs), set(sure_pairs)
        p = s | set(possible_pairs)  # a sure link is also a possible one: S is a subset of P
        a_size += len(hyp)
        s_size += len(s)
        a_and_s += len(hyp & s)
        a_and_p += len(hyp & p)
    if s_size == 0:
        raise ValueError("the gold standard has no sure links: recall and AER are undefined")
    return AlignmentScore(
        aer=1.0 - (a_and_s + a_and_p) / (a_size + s_size),
        precision=a_and_p / a_size if a_size else 0.0,
        recall=a_and_s / s_size,
        links=a_size,
    )


def read_gold(path: Path) -> tuple[Sentences, Sentences]:
    """The sure ("a-b") and possible ("a?b") links of a talp file, one list per line each."""
    sure, possible = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        sure.append([])
        possible.append([])
        for item in line.split():
            (sure if "-" in item else possible)[-1].extend(parse_pharaoh(item))
    return sure, possible


def naacl_to_talp(lines: list[str]) -> list[str]:
    """WPT-03 (NAACL 2003) links "sentno e f [S|P]", 1-based, into talp lines, one per sentence.

    Sentences run from 1 to the largest number seen; links to NULL (position 0) are dropped; a
    link without a sure/possible mark is sure, as in the workshop's format.
    """
    links: dict[int, list[str]] = {}
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        sentence, e, f = (int(field) for field in fields[:3])
        kind = fields[3] if len(fields) > 3 else "S"
        if kind not in ("S", "P"):
            raise ValueError(f"not a WPT-03 alignment line: {line!r}")
        entry = links.setdefault(sentence, [])
        if e > 0 and f > 0:
            entry.append(f"{e - 1}{'-' if kind == 'S' else '?'}{f - 1}")
    return [" ".join(links.get(sentence, [])) for sentence in range(1, max(links, default=0) + 1)]


def read_pharaoh(path: Path) -> Sentences:
    """The (src, tgt) pairs of every line of a Pharaoh file."""
    return [parse_pharaoh(line) for line in path.read_text(encoding="utf-8").splitlines()]


def named(spec: str) -> tuple[str, str]:
    """Split "NAME=VALUE" (argparse type)."""
    name, sep, value = spec.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {spec!r}")
    return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gold", type=Path, help="talp file: 'e-f' sure, 'e?f' possible, 0-based")
    parser.add_argument("hypotheses", nargs="*", type=named, metavar="NAME=FILE",
                        help="a Pharaoh file in English-French order, one line per gold sentence")
    parser.add_argument("--symmetrize", action="append", type=named, default=[], metavar="NAME=FWD,REV",
                        help="two directions, both in English-French order (as eflomal writes them): adds a "
                             "row per direction and per symmetrization heuristic")
    parser.add_argument("--convert-naacl", type=Path, metavar="WA_FILE",
                        help="print a WPT-03 'sentno e f S|P' file (1-based) as talp lines, and exit")
    args = parser.parse_args()

    if args.convert_naacl:
        for line in naacl_to_talp(args.convert_naacl.read_text(encoding="utf-8").splitlines()):
            print(line)
        return
    if args.gold is None:
        parser.error("--gold is required")

    sure, possible = read_gold(args.gold)
    rows: list[tuple[str, Sentences]] = [(name, read_pharaoh(Path(file))) for name, file in args.hypotheses]
    for name, files in args.symmetrize:
        fwd_file, sep, rev_file = files.partition(",")
        if not sep:
            parser.error(f"--symmetrize {name}: expected FWD,REV, got {files!r}")
        forward, backward = read_pharaoh(Path(fwd_file)), read_pharaoh(Path(rev_file))
        rows += [(f"{name}-fwd", forward), (f"{name}-rev", backward)]
        rows += [(f"{name}-{heuristic}", [combine(f, b) for f, b in zip(forward, backward)])
                 for heuristic, combine in SYMMETRIZATIONS.items()]
    if not rows:
        parser.error("give at least one NAME=FILE or --symmetrize NAME=FWD,REV")

    print("| name | AER % | precision % | recall % | links |")
    print("|---|---:|---:|---:|---:|")
    for name, hypotheses in rows:
        if len(hypotheses) != len(sure):
            parser.error(f"{name}: {len(hypotheses)} lines, the gold standard has {len(sure)}")
        score = aer(hypotheses, sure, possible)
        print(f"| {name} | {100 * score.aer:.1f} | {100 * score.precision:.1f} | {100 * score.recall:.1f} "
              f"| {score.links} |")
    sure_count = sum(map(len, sure))
    possible_count = sum(len(set(p) - set(s)) for s, p in zip(sure, possible))
    print(f"\ngold: {args.gold.name}, {len(sure)} sentences, {sure_count} sure + {possible_count} possible-only links")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # `| head` closed stdout: stop quietly, as a data-on-stdout tool should
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
