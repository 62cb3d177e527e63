"""Paragraphs on one line: `tfm translate --split-sentences` against translating the sentences one by one.

The test set's lines are joined GROUP (3) at a time with a space into paragraphs, then translated
three ways through `tfm translate` as a user runs it (model defaults, --threads 2):
  lines      the original lines one by one (the reference point)
  split      the paragraphs with --split-sentences
  whole      the paragraphs as they are (one long sentence each, no splitting)
Scored with sacrebleu (i) per paragraph: each system's paragraph output (for `lines`, its GROUP
outputs joined with a space) against the joined references; (ii) per line after re-splitting: a
paragraph's output is cut back into GROUP sentences by sentencex; where it does not give exactly
GROUP sentences, the whole output goes to the first line and the others get ""; (iii) per line after
re-segmenting to the references: each paragraph output cut into GROUP pieces at the word boundaries
that minimise the word edit distance to its GROUP reference lines (mwerSegmenter's method, used by
the IWSLT evaluations for output whose segmentation differs from the reference's; resegment.py). The
joined line-by-line outputs are re-split both ways too, so the systems can be compared after the
same re-splitting.

Usage: python bench/paragraphs.py -m MODEL --src test.en --ref test.fr [--source-lang en --target-lang fr]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import date

import sacrebleu

from prepare_corpus import cpu_flags
from resegment import resegment
from tfm_cli.inference.sentence_splitting import SentenceSplitter

GROUP = 3


def translate(model: str, lines: list[str], flags: list[str]) -> list[str]:
    """`tfm translate` output lines for `lines` (one per line, checked)."""
    result = subprocess.run(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", model, "-q", "--threads", "2", *flags],
        input="".join(line + "\n" for line in lines), capture_output=True, text=True,
    )
    if result.returncode != 0:
        sys.exit(result.stderr)
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == len(lines), "one output line per input line"
    return outputs


def grouped(lines: list[str]) -> list[str]:
    """Lines joined GROUP at a time with one space."""
    return [" ".join(lines[i : i + GROUP]) for i in range(0, len(lines), GROUP)]


def resplit(paragraphs: list[str], sizes: list[int], splitter: SentenceSplitter) -> tuple[list[str], int]:
    """Each paragraph cut back into its number of lines; returns the lines and how many paragraphs split right."""
    lines, right = [], 0
    for paragraph, size in zip(paragraphs, sizes):
        parts = [paragraph[start:end] for start, end in splitter.spans(paragraph)]
        if len(parts) == size:
            lines += parts
            right += 1
        else:
            lines += [paragraph] + [""] * (size - 1)
    return lines, right


def resegmented(paragraphs: list[str], references: list[str], sizes: list[int]) -> list[str]:
    """Each paragraph cut into its number of lines by minimum word error against those lines' references."""
    lines, offset = [], 0
    for paragraph, size in zip(paragraphs, sizes):
        lines += resegment(paragraph, references[offset : offset + size])
        offset += size
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="fr")
    args = parser.parse_args()
    sources = open(args.src, encoding="utf-8").read().splitlines()
    references = open(args.ref, encoding="utf-8").read().splitlines()
    paragraphs = grouped(sources)
    sizes = [len(sources[i : i + GROUP]) for i in range(0, len(sources), GROUP)]
    by_line = translate(args.model, sources, [])
    split = translate(args.model, paragraphs, ["--split-sentences", "--source-lang", args.source_lang])
    whole = translate(args.model, paragraphs, [])
    splitter = SentenceSplitter(args.target_lang)
    metric = sacrebleu.BLEU(force=True)  # tokenized test sets (Multi30k's lower-cased one) are scored as they are
    joined_refs = grouped(references)
    print(f"# bench/paragraphs.py, {date.today()}, {cpu_flags()}")
    print(f"# model {args.model}; {len(sources)} lines -> {len(paragraphs)} paragraphs of {GROUP}")
    print("\n| system | BLEU per paragraph | BLEU per line, as translated | per line, sentencex re-split "
          "| per line, min-WER re-segmented | paragraphs sentencex re-split into their lines |")
    print("|---|---:|---:|---:|---:|---:|")
    # The second row re-splits the joined line-by-line outputs exactly as the paragraph outputs are
    # re-split, so that the re-splitter's own misses count on both sides of the comparison.
    rows = [("lines one by one", grouped(by_line), by_line),
            ("lines one by one, joined and re-split", grouped(by_line), None),
            ("--split-sentences", split, None), ("whole paragraphs", whole, None)]
    for name, paragraph_outputs, line_outputs in rows:
        paragraph_bleu = metric.corpus_score(paragraph_outputs, [joined_refs]).score
        if line_outputs is not None:
            line_bleu = metric.corpus_score(line_outputs, [references]).score
            print(f"| {name} | {paragraph_bleu:.2f} | {line_bleu:.2f} | - | - | - |")
            continue
        split_lines, count = resplit(paragraph_outputs, sizes, splitter)
        split_bleu = metric.corpus_score(split_lines, [references]).score
        mwer_bleu = metric.corpus_score(resegmented(paragraph_outputs, references, sizes), [references]).score
        print(f"| {name} | {paragraph_bleu:.2f} | - | {split_bleu:.2f} | {mwer_bleu:.2f} | {count}/{len(paragraphs)} |")
    # Where a line has no sentence-final punctuation no splitter can find its end: the paragraphs
    # whose lines all end with one show what splitting itself costs.
    punctuated = [k for k in range(len(paragraphs))
                  if all(line.rstrip().endswith((".", "!", "?")) for line in sources[k * GROUP : (k + 1) * GROUP])]
    pick = lambda outputs: [outputs[k] for k in punctuated]  # noqa: E731
    print(f"\non the {len(punctuated)} paragraphs whose lines all end with . ! or ?: BLEU per paragraph "
          f"lines one by one {metric.corpus_score(pick(grouped(by_line)), [pick(joined_refs)]).score:.2f}, "
          f"--split-sentences {metric.corpus_score(pick(split), [pick(joined_refs)]).score:.2f}")
    print(f"\nBLEU signature: {metric.get_signature()}")
    identical = sum(a == b for a, b in zip(grouped(by_line), split))
    print(f"paragraphs whose --split-sentences output equals the joined line-by-line outputs: {identical}/{len(paragraphs)}")


if __name__ == "__main__":
    main()
