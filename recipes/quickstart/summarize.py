"""Print the quickstart's summary: test BLEU (from `tfm score --json`) and alignment agreement.

Alignment agreement = the share of gold (source word, target word) links that `tfm translate
--alignment` predicts, counted over test sentences whose translation equals the reference (on the
others the target words differ, so links cannot be compared).
Usage: python recipes/quickstart/summarize.py SCORE_JSON HYP_ALIGNED REF GOLD_ALIGN
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def parse_pairs(text: str) -> set[tuple[int, int]]:
    """Pharaoh "s-t s-t" -> {(s, t), ...}."""
    return {tuple(map(int, link.split("-"))) for link in text.split()}


def main() -> None:
    """Read the four files and print the summary lines on stdout."""
    score_json, hyp_aligned, ref, gold = map(Path, sys.argv[1:5])
    scores = json.loads(score_json.read_text())
    hyp_lines = hyp_aligned.read_text(encoding="utf-8").splitlines()
    ref_lines = ref.read_text(encoding="utf-8").splitlines()
    gold_lines = gold.read_text(encoding="utf-8").splitlines()
    matched = correct = compared = 0
    for hyp_line, ref_line, gold_line in zip(hyp_lines, ref_lines, gold_lines):
        translation, _, alignment = hyp_line.partition("\t")
        if translation != ref_line:
            continue
        matched += 1
        gold_links = parse_pairs(gold_line)
        correct += len(gold_links & parse_pairs(alignment))
        compared += len(gold_links)
    bleu = next(m for m in scores if m["name"] == "BLEU")
    print(f"test BLEU {bleu['score']:.1f}   ({bleu['signature']})")
    print(f"exact translations: {matched}/{len(ref_lines)}")
    if compared:
        print(f"alignment agreement with gold: {correct / compared:.1%} of {compared} links "
              f"(cross-attention, word level, on the {matched} exact translations)")


if __name__ == "__main__":
    main()
