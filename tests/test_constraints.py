"""Lexical constraints: the tracker's state machine and dynamic beam allocation, worked out by hand.

Like fairseq's constraint tests, each case spells out the state after every token. The searches run
on test_search_scripted's ScriptedDecoder, whose next-token tables make every score known in advance.
Ids: 0 pad, 1 unk, 2 BOS, 3 EOS, 4 a, 5 b, 6 c, 7 d.
"""

from __future__ import annotations

import math

import pytest
import torch

from test_search_scripted import ScriptedDecoder, raw
from tfm_cli.config import DecodeConfig
from tfm_cli.inference.constraints import (
    NO_TOKEN,
    ConstraintTracker,
    count_occurrences,
    phrases_met,
    word_continuation_ids,
)
from tfm_cli.inference.search import search_beams

PAD, UNK, BOS, EOS, A, B, C, D = range(8)
INF = math.inf


def tracker_after(phrases: list[list[int]], tokens: list[int]) -> ConstraintTracker:
    """A one-row tracker for one sentence with `phrases`, after the output `tokens`."""
    tracker = ConstraintTracker([phrases], EOS)
    tracker.start(1)
    for token in tokens:
        tracker.select(torch.tensor([0]), torch.tensor([token]))
    return tracker


def test_two_phrases_are_met_token_by_token():
    # Phrases "a b" and "c": 3 constraint tokens.
    tracker = tracker_after([[A, B], [C]], [])
    assert tracker.unmet_tokens().tolist() == [3]
    assert tracker.next_tokens().tolist() == [[A, C]]
    tracker = tracker_after([[A, B], [C]], [A])  # "a" starts "a b"
    assert tracker.progress.tolist() == [[1, 0]] and tracker.unmet_tokens().tolist() == [2]
    assert tracker.next_tokens().tolist() == [[B, C]]
    tracker = tracker_after([[A, B], [C]], [A, B])  # "a b" is in
    assert tracker.count.tolist() == [[1, 0]] and tracker.unmet_tokens().tolist() == [1]
    assert tracker.next_tokens().tolist() == [[NO_TOKEN, C]]
    tracker = tracker_after([[A, B], [C]], [A, B, D, C])
    assert tracker.unmet_tokens().tolist() == [0]
    assert tracker.next_tokens().tolist() == [[NO_TOKEN, NO_TOKEN]]


def test_a_broken_phrase_starts_again():
    # "a" then "c" breaks "a b": progress back to 0; "a a" restarts it at 1, not 2.
    assert tracker_after([[A, B]], [A, C]).progress.tolist() == [[0]]
    assert tracker_after([[A, B]], [A, C]).unmet_tokens().tolist() == [2]
    assert tracker_after([[A, B]], [A, A]).progress.tolist() == [[1]]
    assert tracker_after([[A, B]], [A, A, B]).unmet_tokens().tolist() == [0]


def test_a_phrase_overlapping_itself_is_found():
    # "a a b" inside "a a a b": after "a a a" the longest prefix ending the output is "a a" (2),
    # so "b" completes it. A tracker that only counts matched tokens would restart and miss it.
    assert tracker_after([[A, A, B]], [A, A, A]).progress.tolist() == [[2]]
    assert tracker_after([[A, A, B]], [A, A, A, B]).unmet_tokens().tolist() == [0]


def test_a_phrase_listed_twice_must_appear_twice():
    tracker = tracker_after([[C], [C]], [C])
    assert tracker.needed.tolist() == [[2]] and tracker.unmet_tokens().tolist() == [1]
    assert tracker.next_tokens().tolist() == [[C]]
    assert tracker_after([[C], [C]], [C, A, C]).unmet_tokens().tolist() == [0]


def test_rows_follow_select_and_sentences_keep_their_own_phrases():
    # Sentence 0 needs "a", sentence 1 needs "b d"; two rows each.
    tracker = ConstraintTracker([[[A]], [[B, D]]], EOS)
    tracker.start(2)
    tracker.select(torch.tensor([0, 1, 2, 3]), torch.tensor([A, C, B, B]))
    assert tracker.unmet_tokens().tolist() == [0, 1, 1, 1]
    # Keep sentence 0's second row and sentence 1's first, in that order.
    tracker.select(torch.tensor([1, 2]), torch.tensor([A, D]))
    assert tracker.unmet_tokens().tolist() == [0, 0]


def test_eos_waits_for_the_phrases_and_a_full_row_may_only_advance_them():
    # Row 0 has met "c"; row 1 has not. Limits 5: at step 1, row 1 has 4 steps left for 1 token.
    tracker = ConstraintTracker([[[C]]], EOS)
    tracker.start(2)
    tracker.select(torch.tensor([0, 1]), torch.tensor([C, A]))
    log_probs = torch.zeros(2, 8)
    tracker.apply(log_probs, 1, torch.tensor([5, 5]), closing=torch.tensor([False, False]))
    assert log_probs[0].isfinite().all()
    assert log_probs[1].isinf().tolist() == [False, False, False, True, False, False, False, False]
    # Limit 2 at step 1: one step left for row 1's one token, so only "c" may follow.
    log_probs = torch.zeros(2, 8)
    tracker.apply(log_probs, 1, torch.tensor([2, 2]), closing=torch.tensor([False, False]))
    assert log_probs[1].isfinite().nonzero().view(-1).tolist() == [C]
    assert log_probs[0].isfinite().all()
    # A row closing at its limit is left alone: the length limit gives it EOS.
    log_probs = torch.zeros(2, 8)
    tracker.apply(log_probs, 2, torch.tensor([2, 2]), closing=torch.tensor([True, True]))
    assert log_probs.isfinite().all()


# () -> a .6, b .3, c .1; "a" wants to end (.9), "b" is undecided, "c" goes on with "a".
SCRIPT = {
    (): {A: 0.6, B: 0.3, C: 0.1},
    (A,): {EOS: 0.9, C: 0.1},
    (B,): {EOS: 0.6, C: 0.4},
    (C,): {EOS: 0.2, A: 0.8},
    (A, C): {EOS: 1.0},
    (B, C): {EOS: 1.0},
    (C, A): {EOS: 1.0},
}


def test_without_constraints_the_script_gives_a():
    # Step 0: a .6, b .3. Step 1: "a EOS" .54 and "b EOS" .18 are the top two: both finish.
    best = search_beams(ScriptedDecoder([SCRIPT]), DecodeConfig(beam_size=2, nbest=2))[0]
    assert [h.tokens for h in best] == [[A], [B]]


def test_beam_allocation_places_the_phrase_by_hand():
    # Constraint "c": 1 token, banks 0 and 1. Beam 2.
    # Step 0 candidates by score: a .6 (bank 0), b .3 (bank 0), c .1 (bank 1; also the phrase's token,
    #   offered once). Rank in bank: a 0, b 1, c 0. Round-robin, most-met bank first: c, a, b.
    #   Continuing: "c" and "a" ("b" loses its place to the bank-1 candidate).
    # Step 1: "c" may end (.1 * .2 = .02) or go on with a (.08); "a" may not end (c unmet): "a c" .06.
    #   All in bank 1: "c a" .08, "a c" .06, "c EOS" .02: "c EOS" is third, not in the top 2.
    # Step 2: both live beams must end: "c a" .08 and "a c" .06 finish; two finished = beam: done.
    best = search_beams(ScriptedDecoder([SCRIPT]), DecodeConfig(beam_size=2, nbest=2), ConstraintTracker([[[C]]], EOS))[0]
    assert [h.tokens for h in best] == [[C, A], [A, C]]
    assert [h.score for h in best] == pytest.approx([raw(0.1, 0.8, 1.0), raw(0.6, 0.1, 1.0)])
    assert all(h.finished and h.unmet == 0 for h in best)


def test_greedy_takes_the_most_met_bank():
    # Beam 1, constraint "c d". Step 0: a .9 (bank 0), c .1 (bank 1): c. Step 1: "c a" .9 is bank 0
    # (the phrase broken), "c d" .1 bank 2: d. Step 2: EOS.
    script = {(): {A: 0.9, C: 0.1}, (C,): {A: 0.9, D: 0.1}, (C, D): {EOS: 1.0}}
    [[best]] = search_beams(ScriptedDecoder([script]), DecodeConfig(beam_size=1), ConstraintTracker([[[C, D]]], EOS))
    assert best.tokens == [C, D] and best.score == pytest.approx(raw(0.1, 0.1, 1.0))


def test_a_phrase_longer_than_the_limit_still_gives_an_output():
    # Limit 2 output tokens, phrase "c d c" (3). The rows are forced along the phrase ("c", "d"),
    # then the limit closes them with EOS: not finished, one constraint token short.
    script = {(): {A: 0.9, C: 0.1}, (C,): {A: 0.9, D: 0.1}, (C, D): {EOS: 0.5, C: 0.5}}
    tracker = ConstraintTracker([[[C, D, C]]], EOS)
    [[best]] = search_beams(ScriptedDecoder([script], max_length=2), DecodeConfig(beam_size=2), tracker)
    assert best.tokens == [C, D] and not best.finished and best.unmet == 1


def test_sentences_without_phrases_decode_as_without_constraints():
    # Sentence 1 ("d" .1 or EOS .9) has no phrase in a batch where sentence 0 has one.
    other = {(): {EOS: 0.9, D: 0.1}}
    config = DecodeConfig(beam_size=2, nbest=2)
    alone = search_beams(ScriptedDecoder([other]), config)[0]
    batched = search_beams(ScriptedDecoder([SCRIPT, other]), config, ConstraintTracker([[[C]], []], EOS))[1]
    assert [(h.tokens, h.score) for h in batched] == [(h.tokens, h.score) for h in alone]


def test_a_row_that_needs_every_step_left_takes_the_phrase():
    # Limit 2, phrase "c d" (2 tokens): from step 0 every step is needed, so only "c" then "d" may
    # follow although the model prefers "a" (.9) both times; the limit then closes it with EOS.
    script = {(): {A: 0.9, C: 0.1}, (C,): {A: 0.9, D: 0.1}, (C, D): {EOS: 1.0}}
    tracker = ConstraintTracker([[[C, D]]], EOS)
    best = search_beams(ScriptedDecoder([script], max_length=2), DecodeConfig(beam_size=2, nbest=2), tracker)[0]
    assert [h.tokens for h in best] == [[C, D]] and best[0].unmet == 0
    assert best[0].score == pytest.approx(raw(0.1, 0.1, 1.0))


def test_phrases_met_counts_repeats_without_overlap():
    assert phrases_met([A, B, C], [[B, C], [A], [D]]) == [True, True, False]
    assert phrases_met([C, A, C], [[C], [C]]) == [True, True]
    assert phrases_met([C, A], [[C], [C]]) == [True, False]
    assert count_occurrences([A, A, A], [A, A]) == 1


def test_no_word_continuation_may_follow_a_completed_phrase():
    # Say "d" is a piece that continues a word (the "e" of "Red Crosse"). Row 0 ends with the phrase
    # "a b"; row 1 ("a c") does not, and has the phrase still to produce (so no EOS yet).
    tracker = ConstraintTracker([[[A, B]]], EOS, continuation_ids=(D,))
    tracker.start(2)
    for tokens in ([A, A], [B, C]):
        tracker.select(torch.tensor([0, 1]), torch.tensor(tokens))
    log_probs = torch.zeros(2, 8)
    tracker.apply(log_probs, 2, torch.tensor([9, 9]), closing=torch.tensor([False, False]))
    assert log_probs[0].isinf().nonzero().view(-1).tolist() == [D]
    assert log_probs[1].isinf().nonzero().view(-1).tolist() == [EOS]
    # Without continuation ids (the default) nothing follows from the phrase's end.
    plain = tracker_after([[A, B]], [A, B])
    log_probs = torch.zeros(1, 8)
    plain.apply(log_probs, 2, torch.tensor([9]), closing=torch.tensor([False]))
    assert log_probs.isfinite().all()


def test_a_search_does_not_extend_a_phrase_into_a_longer_word():
    # The model wants "c" then the continuation "d" ("Red Cross" + "e"), then EOS; with "d" banned
    # after the phrase it must end the word there.
    script = {(): {C: 1.0}, (C,): {D: 0.9, EOS: 0.1}, (C, D): {EOS: 1.0}}
    glued = search_beams(ScriptedDecoder([script]), DecodeConfig(beam_size=2), ConstraintTracker([[[C]]], EOS))[0]
    assert glued[0].tokens == [C, D]
    tracker = ConstraintTracker([[[C]]], EOS, continuation_ids=(D,))
    whole = search_beams(ScriptedDecoder([script]), DecodeConfig(beam_size=2), tracker)[0]
    assert whole[0].tokens == [C] and whole[0].finished


def test_a_phrase_glued_to_a_longer_word_is_not_met():
    assert phrases_met([A, B, D], [[A, B]], frozenset({D})) == [False]
    assert phrases_met([A, B, C], [[A, B]], frozenset({D})) == [True]
    assert phrases_met([A, B, D, A, B], [[A, B]], frozenset({D})) == [True]  # the second one ends the output
    assert word_continuation_ids(["<unk>", "<s>", "</s>", "▁Red", "▁C", "ro", "s", ".", "7", "<0x41>"]) == (5, 6, 8)


def test_a_continuation_that_advances_another_phrase_is_allowed():
    # Phrases "a" and "a d" ("in" and "into", where "d" is the continuation "to"): after "a" the
    # output ends with the phrase "a", but "d" is what "a d" needs next.
    tracker = ConstraintTracker([[[A], [A, D]]], EOS, continuation_ids=(C, D))
    tracker.start(1)
    tracker.select(torch.tensor([0]), torch.tensor([A]))
    log_probs = torch.zeros(1, 8)
    tracker.apply(log_probs, 1, torch.tensor([9]), closing=torch.tensor([False]))
    assert log_probs[0].isinf().nonzero().view(-1).tolist() == [EOS, C]
