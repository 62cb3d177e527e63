"""Searches over a step decoder (greedy, beam, sampling), and the one score.

Search code keeps scores, top-k and finish bookkeeping only: it sees the model through
decoding.StepDecoder (one step to log-probs, reorder rows), so it can be tested with a scripted
decoder. `beam_search`, `greedy_search` and `sample_search` run it on a Transformer through
decoding.TransformerDecoder, which also makes every result batch-invariant.

Score convention, shared by `translate`, `score -m` and the tests:
  raw score   = sum of log p(y_t | y_<t, x) over the output tokens, EOS included (natural log);
  normalised  = raw / divisor(len), len = number of output tokens including EOS, divisor the
                length penalty's (length_penalty.LengthPenalty: GNMT's for tfm's models, n ** alpha
                for imported ones). Token constraints are step_masks'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfm_cli.config import DecodeConfig
from tfm_cli.inference.decoding import StepDecoder, TransformerDecoder
from tfm_cli.inference.search_state import PlainBeams, SearchState
from tfm_cli.inference.step_masks import mask_step, step_masks
from tfm_cli.length_penalty import LengthPenalty, decode_length_penalty
from tfm_cli.model import Transformer


@dataclass
class Hypothesis:
    """One decoded output for one source sentence."""

    tokens: list[int]  # output ids, EOS excluded
    score: float  # raw score: sum of token log-probs, EOS included when the output ended with it
    finished: bool  # True if the model chose EOS; False if EOS was forced at the length limit
    unmet: int = 0  # what the search state says it lacks (constraint tokens; only an output closed at its limit)

    def normalised_score(self, rule: LengthPenalty) -> float:
        """The raw score normalised by `rule` at len(tokens) + 1: EOS counts in the length."""
        return rule.normalise(self.score, len(self.tokens) + 1)


@torch.inference_mode()
def beam_search(model: Transformer, src: torch.Tensor, config: DecodeConfig) -> list[list[Hypothesis]]:
    """Beam search on `model` for src: (N, S) int64 padded with pad_id, each row ending in EOS.

    Returns per sentence its `config.nbest` best hypotheses (see `search_beams`), batch-invariant.
    """
    return search_beams(TransformerDecoder(model, src), config)


@torch.inference_mode()
def greedy_search(
    model: Transformer, src: torch.Tensor, max_len_a: float | None = None, max_len_b: int | None = None,
    no_unk: bool = False,
) -> list[Hypothesis]:
    """Greedy decoding: beam search with a beam of 1 (the same path as `tfm translate -b 1`).

    src: (N, S) int64 padded with pad_id (each row ending in EOS). Length limits not given are
    DecodeConfig's defaults. Returns N hypotheses in input order.
    """
    limits = {name: value for name, value in (("max_len_a", max_len_a), ("max_len_b", max_len_b)) if value is not None}
    config = DecodeConfig(beam_size=1, no_unk=no_unk, **limits)
    return [nbest[0] for nbest in search_beams(TransformerDecoder(model, src), config)]


def search_beams(decoder: StepDecoder, config: DecodeConfig, state: SearchState | None = None) -> list[list[Hypothesis]]:
    """Beam search scored by `config`'s length penalty rule; finished sentences leave the batch.

    Returns per sentence its `config.nbest` best hypotheses, best first by normalised score (see
    the module docstring). Each step extends every live beam by every token (beam * vocab
    candidates), keeps the top 2 * beam; EOS candidates among the top `beam` become finished
    hypotheses, the best `beam` others continue. The first step runs one row per sentence (all
    beams would be the same). The rule says when a sentence stops (LengthPenalty.sentence_is_done:
    GNMT's once it has `beam` finished hypotheses, as fairseq, or earlier once no live beam can
    reach its `nbest` best; Hugging Face's heuristic for `hf`); at the length limit
    a * src_len + b every beam is closed with EOS (finished=False). The step masks
    (step_masks.mask_step) say what may follow. With beam 1 this is greedy search.

    state: a policy with state per row (search_state.SearchState, e.g. constraints.ConstraintTracker
    for target phrases every output must hold), called at the points its contract names: it masks
    each step, picks the candidates, and says what a finished output lacks (those that lack more rank
    after). None: plain beams.
    """
    eos = decoder.eos_id
    beam, rule = config.beam_size, decode_length_penalty(config)
    state = state if state is not None else PlainBeams()
    masks = step_masks(decoder, config, state)
    n_sentences = decoder.n_sentences
    # The first step needs one row per sentence (all beams would be equal), unless the vocabulary
    # is too small to offer 2 * beam candidates from one row.
    width = 1 if decoder.vocab_size >= 2 * beam else beam  # live rows per sentence; `beam` after step 1
    decoder.start(width, grouped=True)
    state.start(width)
    max_lengths = decoder.max_lengths(config.max_len_a, config.max_len_b)
    alive = list(range(n_sentences))  # original sentence of each live sentence, in row order
    alive_limits = torch.tensor(max_lengths, dtype=torch.long)  # (n,) limit of each live sentence
    finished: list[list[Hypothesis]] = [[] for _ in range(n_sentences)]
    finished_scores: list[list[float]] = [[] for _ in range(n_sentences)]  # their normalised scores
    # (n, width) raw scores of the live rows; only row 0 is live at the start, so the first step
    # does not pick the same token `width` times.
    scores = torch.full((n_sentences, width), float("-inf"))
    scores[:, 0] = 0.0
    tokens = torch.full((n_sentences * width,), decoder.bos_id, dtype=torch.long)
    history = torch.empty((n_sentences * width, 0), dtype=torch.long)  # (R, t) outputs so far
    step = 0
    while alive:
        n_alive = len(alive)
        log_probs = decoder.step(tokens)  # (R, V), a new tensor, masked in place
        closing = mask_step(log_probs, masks, step, alive_limits.repeat_interleave(width))  # (R,)
        at_limit = closing.view(n_alive, width)[:, 0].tolist()  # a sentence's rows share its limit
        top_scores, top_beams, top_tokens = state.candidates(log_probs, scores, beam)  # (n, 2k) each
        del log_probs  # the step's largest tensor (rows x vocabulary): freed before the next step makes another
        is_eos = top_tokens == eos
        closing_eos = is_eos[:, :beam] & top_scores[:, :beam].isfinite()  # (n, k)
        if bool(closing_eos.any()):
            unmet = state.unmet_tokens().tolist()
            for index, rank in closing_eos.nonzero().tolist():
                row = index * width + int(top_beams[index, rank])
                hypothesis = Hypothesis(
                    tokens=history[row].tolist(), score=float(top_scores[index, rank]), finished=not at_limit[index],
                    unmet=unmet[row],
                )
                finished[alive[index]].append(hypothesis)
                finished_scores[alive[index]].append(hypothesis.normalised_score(rule))
        # The best `beam` non-EOS candidates continue: a stable sort puts EOS ones last.
        order = is_eos.to(torch.int8).argsort(dim=1, stable=True)[:, :beam]  # (n, k)
        next_scores = top_scores.gather(1, order)
        best_live = next_scores.max(dim=1).values.tolist()  # (with a search state not always the first)
        # At the limit every beam has just been closed (beams stuck at -inf leave with nothing).
        done = [
            at_limit[index] or rule.sentence_is_done(
                finished_scores[sentence], beam, config.nbest, best_live[index], step, max_lengths[sentence]
            )
            for index, sentence in enumerate(alive)
        ]
        sentence_offsets = torch.arange(n_alive)[:, None] * width  # (n, 1)
        next_rows = (sentence_offsets + top_beams.gather(1, order)).view(-1)  # (n * beam,)
        next_tokens = top_tokens.gather(1, order).view(-1)
        if any(done):
            keep = [i for i, d in enumerate(done) if not d]
            alive = [alive[i] for i in keep]
            if not alive:
                break
            keep_index = torch.tensor(keep, dtype=torch.long)
            alive_limits = alive_limits.index_select(0, keep_index)
            next_scores = next_scores.index_select(0, keep_index)
            next_rows = next_rows.view(n_alive, beam).index_select(0, keep_index).view(-1)
            next_tokens = next_tokens.view(n_alive, beam).index_select(0, keep_index).view(-1)
        decoder.select(next_rows, beam)  # a sentence's beams stay together
        state.select(next_rows, next_tokens)
        history = torch.cat([history.index_select(0, next_rows), next_tokens[:, None]], dim=1)
        scores, tokens, width = next_scores, next_tokens, beam
        step += 1
    return [sorted(hyps, key=lambda h: (h.unmet, -h.normalised_score(rule)))[: config.nbest] for hyps in finished]


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top-k tokens and the top-p nucleus (Holtzman et al. 2020); the rest get -inf.

    logits: (R, V) float. Returns (R, V); at least the most likely token of each row survives.
    """
    if 0 < top_k < logits.size(1):
        kth = logits.topk(top_k, dim=1).values[:, -1:]  # (R, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_ids = logits.sort(dim=1, descending=True)
        probs = torch.softmax(sorted_logits, dim=1)
        # Drop a token when the tokens before it already reach p (so the first one always stays).
        drop_sorted = (probs.cumsum(dim=1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, sorted_ids, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.inference_mode()
def sample_search(
    model: Transformer, src: torch.Tensor, config: DecodeConfig, seeds: list[int]
) -> list[list[Hypothesis]]:
    """Ancestral sampling on `model` for src: (N, S) int64 (see `search_samples`), batch-invariant."""
    return search_samples(TransformerDecoder(model, src), config, seeds)


def search_samples(decoder: StepDecoder, config: DecodeConfig, seeds: list[int]) -> list[list[Hypothesis]]:
    """Ancestral sampling: `config.nbest` independent samples per sentence, best first.

    seeds: one per sentence, each sentence with its own random generator, so its samples depend on
    its seed only (not on its batch). Tokens are drawn from softmax(log-probs / temperature)
    restricted to top-k / top-p; the reported score is the model's own log-probability (temperature 1,
    unfiltered), as `score -m` computes it. The step masks (step_masks.mask_step) say what may be
    drawn. Returns per sentence its samples sorted by normalised score.
    """
    eos = decoder.eos_id
    per_sentence = config.nbest
    masks = step_masks(decoder, config)
    decoder.start(per_sentence, grouped=False)  # samples end one by one
    max_lengths = torch.tensor(decoder.max_lengths(config.max_len_a, config.max_len_b))
    n_rows = decoder.n_sentences * per_sentence
    generators = []
    for seed in seeds:
        generator = torch.Generator()
        generator.manual_seed(seed)
        generators.extend([generator] * per_sentence)
    active = torch.arange(n_rows)  # original row of each live sample
    row_limits = max_lengths.repeat_interleave(per_sentence)
    tokens = torch.full((n_rows,), decoder.bos_id, dtype=torch.long)
    outputs: list[list[int]] = [[] for _ in range(n_rows)]
    scores = [0.0] * n_rows
    ended = [False] * n_rows
    for step in range(int(max_lengths.max()) + 1):
        log_probs = decoder.step(tokens).cpu()  # (b, V), masked in place: with renormalize the scores
        # too are over what may be drawn; the masks change no drawn token's own score otherwise.
        at_limit = mask_step(log_probs, masks, step, row_limits[active]).tolist()
        probs = torch.softmax(filter_logits(log_probs / config.temperature, config.sample_top_k, config.sample_top_p), -1)
        choices = []
        for i, row in enumerate(active.tolist()):
            if at_limit[i]:  # no draw: the sentence's generator stays where its other samples expect it
                choices.append(eos)
            else:
                choices.append(int(torch.multinomial(probs[i], 1, generator=generators[row])))
        chosen = torch.tensor(choices, dtype=torch.long)
        chosen_scores = log_probs.gather(1, chosen[:, None])[:, 0].tolist()
        keep = []
        for i, (row, token) in enumerate(zip(active.tolist(), choices)):
            scores[row] += chosen_scores[i]
            if token == eos:
                ended[row] = not at_limit[i]
            else:
                outputs[row].append(token)
                keep.append(i)
        if not keep:
            break
        if len(keep) < active.numel():
            keep_index = torch.tensor(keep, dtype=torch.long)
            decoder.select(keep_index)
            active, chosen = active[keep_index], chosen[keep_index]
        tokens = chosen
    samples = [Hypothesis(tokens=out, score=s, finished=f) for out, s, f in zip(outputs, scores, ended)]
    rule = decode_length_penalty(config)
    return [
        sorted(samples[i * per_sentence : (i + 1) * per_sentence], key=lambda h: -h.normalised_score(rule))
        for i in range(decoder.n_sentences)
    ]
