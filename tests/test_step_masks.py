"""Step masks over the scripted decoder of test_search_scripted.py: expected beams worked out by hand.

Ids: 0 pad, 1 unk, 2 BOS, 3 EOS, 4 a, 5 b, 6 c, 7 d. Both searches call step_masks.mask_step, so
each mask is checked in beam search and, where it matters, in sampling.
"""

from __future__ import annotations

import math

import pytest
import torch

from test_search_scripted import SCRIPTS, ScriptedDecoder, raw
from tfm_cli.config import DecodeConfig
from tfm_cli.inference.search import search_beams, search_samples
from tfm_cli.inference.step_masks import BannedTokens, LengthLimit, MinLength, StepMasks, mask_step

pytestmark = pytest.mark.unit

PAD, UNK, BOS, EOS, A, B, C, D = range(8)


def test_min_length_keeps_eos_out_until_enough_tokens():
    # Greedy (beam 1), alpha 0. Sentence 1 would end at once (EOS .9); with min_len 1 EOS is banned
    # at step 0, so "d" (.1), then its unscripted prefix ends with EOS (1.0): "d", log .1.
    # Sentence 0 with min_len 3: a (.3), c (.9), then EOS (.6) is banned at step 2: b (.4), then EOS
    # (1.0): "a c b", log(.3 * .9 * .4).
    config = DecodeConfig(beam_size=1, length_penalty=0.0, min_len=1)
    (sentence0,), (sentence1,) = search_beams(ScriptedDecoder(SCRIPTS), config)
    assert (sentence1.tokens, sentence1.score) == ([D], pytest.approx(math.log(0.1)))
    assert sentence0.tokens == [A, C]  # min_len 1 changes nothing from step 1 on
    (sentence0,), _ = search_beams(ScriptedDecoder(SCRIPTS), DecodeConfig(beam_size=1, length_penalty=0.0, min_len=3))
    assert (sentence0.tokens, sentence0.score) == ([A, C, B], pytest.approx(raw(0.3, 0.9, 0.4)))


def test_the_length_limit_wins_over_min_len():
    # min_len 3 but at most 1 output token: step 0 bans EOS (sentence 0: a .3; sentence 1: d .1), and
    # at step 1 the limit closes both rows with EOS at its own log-prob (.1 after a; 1.0 after d).
    config = DecodeConfig(beam_size=1, length_penalty=0.0, min_len=3)
    (sentence0,), (sentence1,) = search_beams(ScriptedDecoder(SCRIPTS, max_length=1), config)
    assert (sentence0.tokens, sentence0.score) == ([A], pytest.approx(raw(0.3, 0.1)))
    assert (sentence1.tokens, sentence1.score) == ([D], pytest.approx(raw(0.1, 1.0)))
    assert not sentence0.finished and not sentence1.finished


def test_min_length_in_sampling():
    # top-k 1 makes sampling greedy: the same "d" for sentence 1 as beam 1 above.
    config = DecodeConfig(sample=True, nbest=2, sample_top_k=1, length_penalty=0.0, min_len=1)
    _, samples = search_samples(ScriptedDecoder(SCRIPTS), config, seeds=[1, 2])
    assert [(h.tokens, h.score) for h in samples] == [([D], pytest.approx(math.log(0.1)))] * 2


@pytest.mark.parametrize("forced", [False, True])
def test_the_length_limit_forces_eos_with_its_own_score_or_zero(forced):
    # Limit 1 token, beam 1: sentence 0 takes a (.3); at step 1 only EOS may follow. Its score is
    # the model's log .1 (tfm's) or 0 with forced_eos (generate's forced_eos_token_id): log .3.
    config = DecodeConfig(beam_size=1, length_penalty=0.0, forced_eos=forced)
    (sentence0,), _ = search_beams(ScriptedDecoder(SCRIPTS, max_length=1), config)
    assert sentence0.tokens == [A] and not sentence0.finished
    assert sentence0.score == pytest.approx(raw(0.3) if forced else raw(0.3, 0.1))
    sampled = DecodeConfig(sample=True, nbest=1, sample_top_k=1, length_penalty=0.0, forced_eos=forced)
    (sample0,), _ = search_samples(ScriptedDecoder(SCRIPTS, max_length=1), sampled, seeds=[1, 2])
    assert (sample0.tokens, sample0.score) == (sentence0.tokens, pytest.approx(sentence0.score))


def test_mask_step_bans_then_renormalizes_then_closes_rows_at_their_limit():
    # Two rows over 8 ids, uniform: pad and BOS are banned, the rest renormalised to log(1/6);
    # row 1 is at its limit (0 tokens allowed): only EOS stays, with its renormalised score.
    decoder = ScriptedDecoder(SCRIPTS)
    masks = StepMasks([BannedTokens(decoder)], renormalize=True, limit=LengthLimit(EOS))
    log_probs = torch.full((2, 8), math.log(1 / 8))
    closing = mask_step(log_probs, masks, step=0, row_limits=torch.tensor([5, 0]))
    assert closing.tolist() == [False, True]
    uniform = math.log(1 / 6)
    assert log_probs[0].tolist() == pytest.approx([-math.inf, uniform, -math.inf] + [uniform] * 5)
    assert log_probs[1].tolist() == pytest.approx([-math.inf] * 3 + [uniform] + [-math.inf] * 4)


def test_each_mask_alone():
    decoder = ScriptedDecoder(SCRIPTS)
    log_probs = torch.zeros(2, 8)
    open_rows = torch.tensor([False, False])
    BannedTokens(decoder, no_unk=True, banned_ids=(D,)).apply(log_probs, step=0, closing=open_rows)
    assert torch.isinf(log_probs[:, [PAD, UNK, BOS, D]]).all() and log_probs[:, [EOS, A, B, C]].eq(0).all()
    log_probs = torch.zeros(2, 8)
    MinLength(EOS, 2).apply(log_probs, step=1, closing=open_rows)
    assert torch.isinf(log_probs[:, EOS]).all() and log_probs.isfinite().sum() == 14
    MinLength(EOS, 2).apply(log_probs := torch.zeros(2, 8), step=2, closing=open_rows)
    assert log_probs.eq(0).all()
    MinLength(EOS, 2).apply(log_probs := torch.zeros(2, 8), step=1, closing=torch.tensor([True, False]))
    assert log_probs[0].eq(0).all() and torch.isinf(log_probs[1, EOS])  # the length limit wins on row 0
    log_probs = torch.full((2, 8), -1.0)
    LengthLimit(EOS, forced_eos=True).apply(log_probs, torch.tensor([True, False]))
    assert log_probs[0].tolist() == [-math.inf] * 3 + [0.0] + [-math.inf] * 4 and log_probs[1].eq(-1).all()
