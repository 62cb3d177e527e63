"""bench/alignment_aer.py: corpus-level AER, precision and recall on hand-computed cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "alignment_aer.py"
spec = importlib.util.spec_from_file_location("alignment_aer", SCRIPT)
alignment_aer = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = alignment_aer  # dataclasses look their module up while the script loads
spec.loader.exec_module(alignment_aer)


def test_the_sure_links_alone_score_zero():
    score = alignment_aer.aer([[(0, 0), (1, 1)]], sure=[[(0, 0), (1, 1)]], possible=[[(1, 2)]])
    assert (score.aer, score.precision, score.recall, score.links) == (0.0, 1.0, 1.0, 2)


def test_a_possible_link_counts_for_precision_not_recall():
    # S = {0-0, 1-1}, P = S + {1-2}; A = {0-0, 1-2}: |A&S| = 1, |A&P| = 2.
    # AER = 1 - (1 + 2) / (2 + 2) = 0.25; precision 2/2; recall 1/2.
    score = alignment_aer.aer([[(0, 0), (1, 2)]], sure=[[(0, 0), (1, 1)]], possible=[[(1, 2)]])
    assert score.aer == pytest.approx(0.25)
    assert score.precision == pytest.approx(1.0)
    assert score.recall == pytest.approx(0.5)


def test_a_wrong_link_lowers_precision():
    # S = {0-0}, A = {0-0, 0-1}: AER = 1 - (1 + 1) / (2 + 1) = 1/3; precision 1/2; recall 1.
    score = alignment_aer.aer([[(0, 0), (0, 1)]], sure=[[(0, 0)]], possible=[[]])
    assert score.aer == pytest.approx(1 / 3)
    assert score.precision == pytest.approx(0.5)
    assert score.recall == pytest.approx(1.0)


def test_the_empty_hypothesis_scores_one():
    score = alignment_aer.aer([[], []], sure=[[(0, 0)], [(0, 0), (1, 1)]], possible=[[], [(2, 1)]])
    assert (score.aer, score.precision, score.recall, score.links) == (1.0, 0.0, 0.0, 0)


def test_counts_are_summed_over_the_corpus_not_averaged_per_sentence():
    # Sentence 1: A = S = {0-0} (AER 0). Sentence 2: S = {0-0, 1-1, 2-2}, A = {} (AER 1).
    # Corpus: |A&S| = |A&P| = 1, |A| = 1, |S| = 4: AER = 1 - 2/5 = 0.6, not the mean 0.5.
    score = alignment_aer.aer([[(0, 0)], []], sure=[[(0, 0)], [(0, 0), (1, 1), (2, 2)]], possible=[[], []])
    assert score.aer == pytest.approx(0.6)
    assert score.recall == pytest.approx(0.25)


def test_a_link_given_both_sure_and_possible_is_counted_once():
    score = alignment_aer.aer([[(0, 0)]], sure=[[(0, 0)]], possible=[[(0, 0)]])
    assert score.aer == 0.0


def test_mismatched_sentence_counts_are_refused():
    with pytest.raises(ValueError, match="sentence counts differ"):
        alignment_aer.aer([[]], sure=[[(0, 0)], [(0, 0)]], possible=[[], []])


def test_read_gold_splits_sure_and_possible(tmp_path):
    gold = tmp_path / "gold.talp"
    gold.write_text("0-0 1?2 2-1\n\n3?3\n", encoding="utf-8")
    sure, possible = alignment_aer.read_gold(gold)
    assert sure == [[(0, 0), (2, 1)], [], []]
    assert possible == [[(1, 2)], [], [(3, 3)]]


def test_naacl_links_become_0_based_talp_lines_without_null():
    # 1-based "sentno e f S|P"; sentence 2 has only a NULL link, so its line is empty.
    lines = ["0001 1 1 S", "0001 2 3 P", "0001 0 2 S", "0002 0 1 P", "0003 2 1"]
    assert alignment_aer.naacl_to_talp(lines) == ["0-0 1?2", "", "1-0"]
