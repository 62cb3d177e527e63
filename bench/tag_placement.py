"""Tag placement on a real model's own output: does `translate --markup` put a tag around the right words?

One element per line, `<b>` around one German noun (a capitalised word that does not start the
sentence), chosen with a seeded draw; the lines are the first --lines of the source file that have
one. The references are the target words of the model's own translation that render the tagged
noun, written by a person into the file `prepare` makes (column `reference`: 0-based word indices
of the plain translation, e.g. `5` or `4 5`; `-` when the noun is not translated). `score` then
translates the tagged lines with each alignment source and counts an element right when it encloses
exactly the reference words, overlapping when it encloses some of them; it also scores the links of
`translate --alignment` for the tagged word (the same model output, plain text). A line whose
translation differs from the one annotated is left out and counted, so the file stays tied to the
model it was made with.

Usage:
  python bench/tag_placement.py prepare -m MODEL --src test_2016_flickr.de --lines 150 -o refs.tsv
  (fill the reference column by hand)
  python bench/tag_placement.py score -m MODEL --refs refs.tsv [--attention MODEL] [--guided MODEL] [--aligner NAME=MODEL ...]
      [--misses misses.tsv]
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from markup_transfer import element_words, translate_json  # noqa: E402
from prepare_corpus import cpu_flags  # noqa: E402
from tfm_cli.inference.alignment import parse_pharaoh  # noqa: E402
from tfm_cli.tokenization.words import split_words  # noqa: E402

COLUMNS = ["line", "word", "noun", "tagged_source", "translation", "reference"]


def noun_to_tag(words: list[str], rng: random.Random) -> int | None:
    """A seeded choice among the capitalised words that do not start the sentence (German nouns), or None.

    Only words of letters alone, so that the element never encloses punctuation stuck to a noun.
    """
    candidates = [k for k, word in enumerate(words) if k > 0 and word[:1].isupper() and word.isalpha()]
    return rng.choice(candidates) if candidates else None


def tagged(words: list[str], index: int) -> str:
    """The words joined by spaces, word `index` wrapped in <b>...</b>."""
    return " ".join(f"<b>{word}</b>" if k == index else word for k, word in enumerate(words))


def prepare(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    rows = []
    for number, line in enumerate(Path(args.src).read_text(encoding="utf-8").splitlines(), start=1):
        words = split_words(line)
        index = noun_to_tag(words, rng)
        if index is not None:
            rows.append({"line": number, "word": index, "noun": words[index], "tagged_source": tagged(words, index)})
        if len(rows) == args.lines:
            break
    sources = [" ".join(split_words(line)) for line in Path(args.src).read_text(encoding="utf-8").splitlines()]
    records = translate_json(args.model, [sources[row["line"] - 1] for row in rows], options=())
    with open(args.output, "w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, COLUMNS, delimiter="\t")
        writer.writeheader()
        for row, record in zip(rows, records):
            writer.writerow({**row, "translation": record["translation"], "reference": ""})
    print(f"wrote {len(rows)} lines to {args.output}; fill the reference column", file=sys.stderr)


@dataclass
class Tally:
    """Elements (or links) judged, right and overlapping; `rendered_*` over the nouns the translation renders
    (a reference other than `-`), where a right answer exists to be found."""

    judged: int = 0
    right: int = 0
    overlapping: int = 0
    rendered_judged: int = 0
    rendered_right: int = 0

    def add(self, found: set[int], reference: set[int]) -> None:
        self.judged += 1
        self.right += found == reference
        self.overlapping += bool(found & reference)
        if reference:
            self.rendered_judged += 1
            self.rendered_right += found == reference

    def row(self, name: str) -> str:
        share = lambda n, d: f"{100 * n / max(d, 1):.1f}%"  # noqa: E731
        return (f"| {name} | {self.judged} | **{share(self.right, self.judged)}** ({self.right}) "
                f"| {share(self.overlapping, self.judged)} "
                f"| {share(self.rendered_right, self.rendered_judged)} ({self.rendered_right} of {self.rendered_judged}) |")


def read_references(path: str) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    missing = [row["line"] for row in rows if not row["reference"].strip()]
    if missing:
        sys.exit(f"{path}: {len(missing)} lines have no reference (first: line {missing[0]}); fill them first")
    return rows


def score_variant(model: str, rows: list[dict], options: list[str]) -> tuple[Tally, Tally, int, list[list[str]]]:
    """(tag placement, the tagged word's --alignment links, lines whose translation changed, the misses of
    tag placement as rows [line, tagged translation, words enclosed, reference]) of one variant."""
    marked = translate_json(model, [row["tagged_source"] for row in rows], ["--markup", "html", *options])
    plain = translate_json(model, [row["tagged_source"].replace("<b>", "").replace("</b>", "") for row in rows],
                           ["--alignment", *options])
    tags, links, changed, misses = Tally(), Tally(), 0, []
    for row, tagged_record, plain_record in zip(rows, marked, plain):
        if tagged_record["plain_translation"] != row["translation"] or plain_record["translation"] != row["translation"]:
            changed += 1
            continue
        reference = set() if row["reference"].strip() == "-" else {int(k) for k in row["reference"].split()}
        found = enclosed(tagged_record)
        tags.add(found, reference)
        if found != reference:
            misses.append([row["line"], tagged_record["translation"], " ".join(map(str, sorted(found))) or "-",
                           row["reference"]])
        word = int(row["word"])
        links.add({t for s, t in parse_pharaoh(plain_record["alignment"]) if s == word}, reference)
    return tags, links, changed, misses


def enclosed(record: dict) -> set[int]:
    """The target words the one <b> element of a tagged translation encloses (empty when it was dropped)."""
    found = element_words(record["translation"].replace("<b>", '<b id="e0">', 1))
    return found.get("e0", set())


def score(args: argparse.Namespace) -> None:
    rows = read_references(args.refs)
    variants = [("trained aligner (the checkpoint's)", args.model, [])]
    if args.attention:
        variants.append(("cross-attention (the model without its aligner, its own settings)", args.attention, []))
    if args.guided:
        variants.append(("guided head (the guided checkpoint's)", args.guided, []))
    for given in args.aligner:
        name, _, path = given.partition("=")
        if not path:
            sys.exit(f"--aligner {given}: give NAME=CHECKPOINT")
        variants.append((name, path, []))
    print(f"tag placement on {len(rows)} lines of {args.refs}, {date.today()}, CPU flags: {cpu_flags()}\n")
    print("| alignment source | elements judged | tag encloses exactly the reference | overlaps it "
          "| exactly, nouns the translation renders |")
    print("|---|---:|---:|---:|---:|")
    link_rows, all_misses = [], []
    for name, model, options in variants:
        tags, links, changed, misses = score_variant(model, rows, options)
        all_misses += [[name, *miss] for miss in misses]
        print(tags.row(name) + (f" ({changed} lines translated otherwise, left out)" if changed else ""))
        link_rows.append(links.row(name))
    print("\n| `--alignment` links of the tagged word | words judged | links = the reference words | overlap "
          "| exactly, nouns the translation renders |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(link_rows))
    if args.misses:
        with open(args.misses, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(["source", "line", "tagged_translation", "enclosed", "reference"])
            writer.writerows(all_misses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="pick and tag the lines, translate them, write the file to annotate")
    make.add_argument("-m", "--model", required=True)
    make.add_argument("--src", required=True)
    make.add_argument("--lines", type=int, default=150)
    make.add_argument("--seed", type=int, default=1)
    make.add_argument("-o", "--output", required=True)
    judge = commands.add_parser("score", help="translate the tagged lines with each alignment source and score them")
    judge.add_argument("-m", "--model", required=True, help="the checkpoint the references were made with (with its aligner)")
    judge.add_argument("--refs", required=True)
    judge.add_argument("--attention", help="the same weights without the aligner (e.g. the run's average.safetensors): "
                       "links from cross-attention with that checkpoint's own alignment settings")
    judge.add_argument("--guided", help="a guided-alignment checkpoint that translates the same (optional)")
    judge.add_argument("--misses", help="write the misplaced tags of every variant to this TSV file")
    judge.add_argument("--aligner", action="append", default=[], metavar="NAME=CHECKPOINT",
                       help="another aligner of the same weights (e.g. taught other links), a row named NAME; repeatable")
    args = parser.parse_args()
    prepare(args) if args.command == "prepare" else score(args)


if __name__ == "__main__":
    main()
