"""The length penalty rules: their formulas, and the beam stop each owns, over the scripted decoder."""

from __future__ import annotations

import math

import pytest

from test_search_scripted import SCRIPTS, ScriptedDecoder, raw
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.search import search_beams
from tfm_cli.length_penalty import GnmtPenalty, HfPenalty, NoPenalty, decode_length_penalty, length_penalty_of

pytestmark = pytest.mark.unit

A, B, C, D = 4, 5, 6, 7


def test_the_formulas():
    assert GnmtPenalty(0.6).divisor(7) == pytest.approx(2**0.6)  # ((5 + 7) / 6) ** 0.6
    assert HfPenalty(0.6).divisor(7) == pytest.approx(7**0.6)
    assert NoPenalty(0.6).divisor(7) == 1.0 and NoPenalty(0.6).generate_length_penalty() == 0.0
    assert HfPenalty(2.0).normalise(-8.0, 2) == -2.0
    assert HfPenalty(1.0).formula() == "n ** 1.0" and GnmtPenalty(0.6).formula() == "((5 + n) / 6) ** 0.6"


def test_kinds_and_the_default():
    # A checkpoint without length_penalty_kind (every tfm-trained one) keeps GNMT's rule.
    assert decode_length_penalty(DecodeConfig()) == GnmtPenalty(0.6)
    assert decode_length_penalty(DecodeConfig(length_penalty_kind="hf", length_penalty=1.0)) == HfPenalty(1.0)
    with pytest.raises(TfmError, match="length penalty kind must be one of gnmt, hf, none, got 'x'"):
        length_penalty_of("x", 1.0)


def test_hf_keeps_searching_after_beam_finished_hypotheses_while_a_live_one_may_beat_them():
    # Beam 2, alpha 1. Sentence 0:
    #   step 1: "b" finishes: log .18 / 2 = -0.857; live "a c" (.27) and "b a" (.02).
    #   step 2: "a c" finishes: log .162 / 3 = -0.607; live "a c b" (.108), "b a EOS" is not in the top 2.
    #     GNMT stops here (2 finished). HF's heuristic: the best live raw score over its 3 tokens so
    #     far, log .108 / 3 = -0.742, beats the worst finished (-0.857): go on.
    #   step 3: "a c b" finishes (EOS 1.0): log .108 / 4 = -0.556, now the best; nothing is live: done.
    # Sentence 1 (min_len 0, as generate): "" finishes at step 0 (log .9 / 1 = -0.105), "d" at step 1 (log .1 / 2 = -1.151).
    results = search_beams(ScriptedDecoder(SCRIPTS), DecodeConfig(beam_size=2, nbest=2, length_penalty=1.0,
                                                                  length_penalty_kind="hf", min_len=0))
    rule = HfPenalty(1.0)
    assert [h.tokens for h in results[0]] == [[A, C, B], [A, C]]
    assert [h.normalised_score(rule) for h in results[0]] == pytest.approx([raw(0.3, 0.9, 0.4) / 4, raw(0.3, 0.9, 0.6) / 3])
    assert [h.tokens for h in results[1]] == [[], [D]]
    assert [h.normalised_score(rule) for h in results[1]] == pytest.approx([math.log(0.9), math.log(0.1) / 2])
    # GNMT, same alpha: stops at 2 finished; "a c" (log .162 / (8/6)) before "b" (log .18 / (7/6)).
    gnmt = search_beams(ScriptedDecoder(SCRIPTS), DecodeConfig(beam_size=2, nbest=2, length_penalty=1.0))
    assert [h.tokens for h in gnmt[0]] == [[A, C], [B]]


def test_none_ranks_by_the_raw_score():
    # Beam 2, kind none: "b" (.18) before "a c" (.162), as alpha 0 under GNMT.
    results = search_beams(ScriptedDecoder(SCRIPTS), DecodeConfig(beam_size=2, nbest=2, length_penalty=1.0,
                                                                  length_penalty_kind="none"))
    assert [h.tokens for h in results[0]] == [[B], [A, C]]
