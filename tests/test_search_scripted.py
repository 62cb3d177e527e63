"""The searches over a scripted step decoder: expected beams worked out by hand in the comments.

The decoder below plays the model: for each hypothesis it looks up the next-token distribution
of its prefix in a table, so every number a search sees is known in advance (as fairseq's
sequence-generator tests do). Ids: 0 pad, 1 unk, 2 BOS, 3 EOS, 4 a, 5 b, 6 c, 7 d.
"""

from __future__ import annotations

import math

import pytest
import torch

from tfm_cli.config import DecodeConfig
from tfm_cli.inference.search import search_beams, search_samples
from tfm_cli.length_penalty import GnmtPenalty

PAD, UNK, BOS, EOS, A, B, C, D = range(8)

# Sentence 0: from the empty prefix, pad 0.5 (never to be taken: scores keep the model's own
# probabilities, so a stays .3 and b .2), a 0.3, b 0.2. Sentence 1 ends at once with probability 0.9
# (where a search lets EOS come first: min_len 0; tests/test_step_masks.py covers min_len).
SCRIPTS = [
    {
        (): {PAD: 0.5, A: 0.3, B: 0.2},
        (A,): {EOS: 0.1, C: 0.9},
        (B,): {EOS: 0.9, A: 0.1},
        (A, C): {EOS: 0.6, B: 0.4},
    },
    {
        (): {EOS: 0.9, D: 0.1},
    },
]


class ScriptedDecoder:
    """A StepDecoder whose next-token distribution is SCRIPTS[sentence][prefix] (EOS if unscripted)."""

    vocab_size, pad_id, unk_id, bos_id, eos_id = 8, PAD, UNK, BOS, EOS

    def __init__(self, scripts: list[dict], max_length: int = 10) -> None:
        self.scripts = scripts
        self.n_sentences = len(scripts)
        self.limit = max_length
        self.rows: list[tuple[int, tuple[int, ...]]] = []  # (sentence, prefix) of each row
        self.steps = 0

    def max_lengths(self, max_len_a: float, max_len_b: int) -> list[int]:
        return [self.limit] * self.n_sentences

    def start(self, rows_per_sentence: int, grouped: bool) -> None:
        self.rows = [(s, ()) for s in range(self.n_sentences) for _ in range(rows_per_sentence)]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        log_probs = torch.full((len(self.rows), self.vocab_size), -math.inf)
        for r, ((sentence, prefix), token) in enumerate(zip(self.rows, tokens.tolist())):
            prefix = prefix if token == BOS else prefix + (token,)
            self.rows[r] = (sentence, prefix)
            table = self.scripts[sentence].get(prefix, {EOS: 1.0})
            total = sum(table.values())
            for t, p in table.items():
                log_probs[r, t] = math.log(p / total)
        return log_probs

    def select(self, rows: torch.Tensor, group_width: int = 1) -> None:
        self.rows = [self.rows[r] for r in rows.tolist()]


def raw(*probabilities: float) -> float:
    return sum(math.log(p) for p in probabilities)


def test_beam_2_finds_the_hand_computed_beams():
    # Sentence 0, step 0: a .3, b .2 (pad banned).
    # Step 1 candidates: a c .3*.9 = .27, b EOS .2*.9 = .18, a EOS .03, b a .02.
    #   Top 2: "a c" continues, "b" finishes (.18); the other live beam is "b a" (.02).
    # Step 2: a c EOS .27*.6 = .162, a c b .108, b a EOS .02.
    #   Top 2: "a c" finishes (.162): sentence 0 has 2 finished, and stops.
    # Sentence 1: step 0 "EOS" .9 finishes, "d" .1 continues; step 1: "d EOS" finishes (.1): done.
    decoder = ScriptedDecoder(SCRIPTS)
    results = search_beams(decoder, DecodeConfig(beam_size=2, nbest=2, length_penalty=0.0, min_len=0))
    assert [(h.tokens, h.finished) for h in results[0]] == [([B], True), ([A, C], True)]
    assert [h.score for h in results[0]] == pytest.approx([raw(0.2, 0.9), raw(0.3, 0.9, 0.6)])
    assert [h.tokens for h in results[1]] == [[], [D]]
    assert [h.score for h in results[1]] == pytest.approx([raw(0.9), raw(0.1, 1.0)])
    assert decoder.steps == 3


def test_the_length_penalty_reorders_the_n_best():
    # alpha 1: "b" = log .18 / (7/6) = -1.470; "a c" = log .162 / (8/6) = -1.365: "a c" now wins.
    results = search_beams(ScriptedDecoder(SCRIPTS), DecodeConfig(beam_size=2, nbest=2, length_penalty=1.0))
    assert [h.tokens for h in results[0]] == [[A, C], [B]]
    assert results[0][0].normalised_score(GnmtPenalty(1.0)) == pytest.approx(raw(0.3, 0.9, 0.6) / GnmtPenalty(1.0).divisor(3))


def test_beam_1_is_greedy():
    # a (.3) -> c (.9) -> EOS (.6); sentence 1: EOS (.9).
    results = search_beams(ScriptedDecoder(SCRIPTS), DecodeConfig(beam_size=1, length_penalty=0.0, min_len=0))
    assert [h.tokens for h in results[0]] == [[A, C]] and [h.tokens for h in results[1]] == [[]]
    assert results[0][0].score == pytest.approx(raw(0.3, 0.9, 0.6))


def test_the_length_limit_closes_every_beam_with_eos():
    # With at most 1 output token, step 1 may only emit EOS: "b EOS" (.2*.9 = .18) and "a EOS"
    # (.3*.1 = .03) are both closed by the limit, so both count as unfinished.
    results = search_beams(ScriptedDecoder(SCRIPTS, max_length=1), DecodeConfig(beam_size=2, nbest=2, length_penalty=0.0))
    assert [(h.tokens, h.finished) for h in results[0]] == [([B], False), ([A], False)]
    assert [h.score for h in results[0]] == pytest.approx([raw(0.2, 0.9), raw(0.3, 0.1)])


def test_no_unk_and_banned_ids_are_never_chosen():
    # Only unk and pad are likely from the empty prefix; without them, a (and then EOS) remains.
    scripts = [{(): {PAD: 0.5, UNK: 0.45, A: 0.05}}]
    plain = search_beams(ScriptedDecoder(scripts), DecodeConfig(beam_size=1))
    assert plain[0][0].tokens == [UNK]
    banned = search_beams(ScriptedDecoder(scripts), DecodeConfig(beam_size=1, no_unk=True))
    assert banned[0][0].tokens == [A]


def test_sampling_with_top_k_1_follows_the_greedy_path():
    config = DecodeConfig(sample=True, nbest=3, sample_top_k=1, length_penalty=0.0, min_len=0)
    samples = search_samples(ScriptedDecoder(SCRIPTS), config, seeds=[1, 2])
    assert [h.tokens for h in samples[0]] == [[A, C]] * 3
    assert [h.tokens for h in samples[1]] == [[]] * 3
    assert samples[0][0].score == pytest.approx(raw(0.3, 0.9, 0.6))  # the model's own probability


def test_renormalize_scores_over_the_tokens_that_may_be_generated():
    # Sentence 0's empty prefix gives pad .5: renormalised without pad (and BOS), a is .3/.5 = .6 and b .4.
    # Beam 2: "b EOS" .4 * .9 = .36 and "a c EOS" .6 * .9 * .6 = .324 (not renormalised: .18 and .162).
    config = DecodeConfig(beam_size=2, nbest=2, length_penalty=0.0, renormalize=True)
    results = search_beams(ScriptedDecoder(SCRIPTS), config)
    assert [h.tokens for h in results[0]] == [[B], [A, C]]
    assert [h.score for h in results[0]] == pytest.approx([raw(0.4, 0.9), raw(0.6, 0.9, 0.6)])
    # Sampling with top-k 1 follows greedy: a (.6) -> c (.9) -> EOS (.6), scored renormalised too.
    sampled = search_samples(ScriptedDecoder(SCRIPTS), DecodeConfig(sample=True, nbest=2, sample_top_k=1,
                                                                    length_penalty=0.0, renormalize=True), seeds=[1, 2])
    assert [h.tokens for h in sampled[0]] == [[A, C]] * 2
    assert sampled[0][0].score == pytest.approx(raw(0.6, 0.9, 0.6))
