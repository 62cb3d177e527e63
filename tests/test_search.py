"""Search invariants: exact search on a tiny vocabulary, beam 1 = greedy, scores = forced decoding, sampling."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from conftest import tiny_config
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer
from tfm_cli.inference.search import beam_search, filter_logits, greedy_search, sample_search
from tfm_cli.length_penalty import GnmtPenalty, MonotonePenalty
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)


def forced_log_prob(model: Transformer, src_row: list[int], tokens: list[int]) -> float:
    """log p(tokens + [EOS] | src) by one teacher-forced forward pass: the independent reference."""
    config = model.config
    with torch.no_grad():
        logits = model(torch.tensor([src_row]), torch.tensor([[config.bos_id] + tokens]))  # (1, T, V)
        log_probs = torch.log_softmax(logits.double(), dim=-1)[0]  # (T, V)
    targets = tokens + [config.eos_id]
    return sum(float(log_probs[t, target]) for t, target in enumerate(targets))


@pytest.fixture(scope="module")
def trained():
    """The briefly trained synthetic-pair model and 40 held-out test sentences (source ids + EOS)."""
    loaded = load_model(trained_checkpoint())
    lines = held_out_sources()[:40]
    return loaded, [ids + [loaded.config.eos_id] for ids in loaded.src_tokenizer.encode_ids_batch(lines)]


def test_length_penalty_is_the_gnmt_formula():
    # ((5 + 7) / 6) ** 0.6 = 2 ** 0.6
    assert GnmtPenalty(0.6).divisor(7) == pytest.approx(2**0.6)
    assert GnmtPenalty(0.0).divisor(123) == 1.0


def test_beam_search_with_a_wide_beam_is_exact_search_over_a_tiny_vocabulary():
    # 8 ids, of which 5 can be output before EOS (pad and BOS never are); with at most 2 tokens
    # there are 1 + 5 + 25 = 31 outputs (30 without the empty one). A beam of 60 keeps every prefix, so
    # beam search must rank them exactly as enumerating them and scoring each by forced decoding does.
    torch.manual_seed(3)
    model = Transformer(tiny_config(src_vocab_size=8, tgt_vocab_size=8)).eval()
    src = [5, 6, 7, 3]
    alpha = 0.8
    outputs = [list(seq) for n in range(3) for seq in itertools.product([1, 4, 5, 6, 7], repeat=n)]
    expected = sorted(
        ((forced_log_prob(model, src, out) / GnmtPenalty(alpha).divisor(len(out) + 1), out) for out in outputs),
        key=lambda item: -item[0],
    )
    assert expected[0][1] == []  # this model's best output is the empty one
    # min_len 0: the empty output competes (as in generate); min_len 1 (the default): it never does.
    for min_len, ranked in ((0, expected), (1, [item for item in expected if item[1]])):
        config = DecodeConfig(beam_size=60, nbest=10, length_penalty=alpha, max_len_a=0.0, max_len_b=2, min_len=min_len)
        hyps = beam_search(model, torch.tensor([src]), config)[0]
        assert [h.tokens for h in hyps] == [out for _, out in ranked[:10]]
        for hyp, (score, _) in zip(hyps, ranked):
            assert hyp.normalised_score(GnmtPenalty(alpha)) == pytest.approx(score, abs=1e-4)
    assert DecodeConfig().min_len == 1


def test_beam_1_equals_greedy_search(trained):
    loaded, sources = trained
    for length in sorted({len(s) for s in sources})[:6]:
        rows = [s for s in sources if len(s) == length]
        src = torch.tensor(rows)
        greedy = greedy_search(loaded.model, src)
        beam = beam_search(loaded.model, src, DecodeConfig(beam_size=1))
        for g, (b,) in zip(greedy, beam):
            assert b.tokens == g.tokens
            assert b.score == pytest.approx(g.score, abs=1e-4)
            assert b.finished == g.finished


def test_beam_hypotheses_are_sorted_and_scores_are_forced_decoding_log_probs(trained):
    loaded, sources = trained
    model = loaded.model
    alpha = 0.6
    checked = 0
    for src_row in sources[:8]:
        hyps = beam_search(model, torch.tensor([src_row]), DecodeConfig(beam_size=5, nbest=5, length_penalty=alpha))[0]
        assert len(hyps) == 5
        normalised = [h.normalised_score(GnmtPenalty(alpha)) for h in hyps]
        assert normalised == sorted(normalised, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5, "n-best holds duplicates"
        for hyp in hyps:
            assert hyp.score == pytest.approx(forced_log_prob(model, src_row, hyp.tokens), abs=1e-4)
            checked += 1
    assert checked == 40
    assert any(h.finished for h in hyps), "the trained model should end some outputs with EOS itself"


def test_length_limit_closes_every_beam_with_eos():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src = torch.tensor([[5, 6, 7, 8, 3]])
    hyps = beam_search(model, src, DecodeConfig(beam_size=3, nbest=3, max_len_a=0.0, max_len_b=4))[0]
    assert all(len(h.tokens) <= 4 for h in hyps)
    for hyp in hyps:
        assert hyp.score == pytest.approx(forced_log_prob(model, src[0].tolist(), hyp.tokens), abs=1e-4)


def test_beam_search_is_batch_invariant_bit_for_bit(trained):
    # The same sentence, alone or among others of its length (any batch size), gets identical
    # tokens AND identical float scores: the searches never let batch size change the arithmetic.
    # Bit-exactness rests on three kernel facts (decoding.py): MKL's sgemm rounds a row the same for
    # any row count >= MIN_STEP_ROWS (16), the packed oneDNN products round a row the same for any row
    # count (test_kernels.py; this model's, so its steps run on their real rows, 4 alone), and the
    # explicit attention formula has no batch-size dependent split. Checked on AVX2 and AVX-512
    # (VNNI/BF16) CPUs with torch 2.13.
    loaded, sources = trained
    length = max({len(s) for s in sources}, key=lambda n: sum(len(s) == n for s in sources))
    rows = [s for s in sources if len(s) == length]
    assert len(rows) >= 3
    config = DecodeConfig(beam_size=4, nbest=2)
    together = beam_search(loaded.model, torch.tensor(rows), config)
    for row, hyps in zip(rows, together):
        alone = beam_search(loaded.model, torch.tensor([row]), config)[0]
        assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in hyps]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_among_sources_of_other_widths_gets_the_bits_it_gets_alone(trained, beam):
    # A batch of several padded source widths encodes and attends each width apart (decoding.source_runs,
    # transformer.SourcePart): every sentence gets the tokens and float scores it gets alone.
    from tfm_cli.inference.decoding import TransformerDecoder, padded_length, source_batch
    from tfm_cli.inference.search import search_beams

    loaded, sources = trained
    by_width: dict[int, list[list[int]]] = {}
    for ids in sources:
        by_width.setdefault(padded_length(len(ids)), []).append(ids[:-1])  # the fixture's rows end in EOS
    assert len(by_width) >= 2
    rows = sorted((ids for group in by_width.values() for ids in group[:3]), key=len)
    config = DecodeConfig(beam_size=beam, nbest=min(beam, 2))
    with torch.inference_mode():
        decoder = TransformerDecoder(loaded.model, source_batch(rows, loaded.config))
        assert len(decoder.source_runs()) == len(by_width)
        together = search_beams(decoder, config)
        for ids, hyps in zip(rows, together):
            alone = search_beams(TransformerDecoder(loaded.model, source_batch([ids], loaded.config)), config)[0]
            assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in hyps]


@pytest.mark.parametrize(
    "lengths", [(3, 5, 9, 12, 20), (3, 12, 20), (12, 3, 20), (12, 20, 3)],
    ids=["no-padding", "width-8-alone-first", "width-8-alone-between", "width-8-alone-last"],
)
@pytest.mark.parametrize("beam", [1, 3])
def test_several_source_widths_on_padded_products_give_each_sentence_its_own_result(lengths, beam):
    # The same with plain F.linear products, whose steps are padded to MIN_STEP_ROWS with copies of the
    # last group (the groups of a state of several widths stay in order). The encoder, too, pads a run
    # of fewer than MIN_STEP_ROWS token rows with copies of its first sentence: a width-8 source alone
    # (8 token rows) is such a run, wherever it stands among the other widths.
    from tfm_cli.inference.decoding import TransformerDecoder, source_batch
    from tfm_cli.inference.search import search_beams

    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    rows = [[int(t) for t in torch.randint(4, 40, (length,))] for length in lengths]
    config = DecodeConfig(beam_size=beam, nbest=min(beam, 2), max_len_a=0.0, max_len_b=8)
    with torch.inference_mode():
        decoder = TransformerDecoder(model, source_batch(rows, model.config))
        assert len(decoder.source_runs()) == 3
        together = search_beams(decoder, config)
        for ids, hyps in zip(rows, together):
            alone = search_beams(TransformerDecoder(model, source_batch([ids], model.config)), config)[0]
            assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in hyps]


def test_steps_are_padded_to_min_step_rows_only_where_a_product_needs_it():
    # Packed oneDNN float32 products and the int8 layers give a row the same bits in a call of any size:
    # a sentence alone with beam 4 steps on its 4 rows. Plain F.linear (MKL) and bf16 do not: their
    # state is padded to MIN_STEP_ROWS.
    from tfm_cli.inference.decoding import MIN_STEP_ROWS, TransformerDecoder
    from tfm_cli.model.kernels import pack_weights
    from tfm_cli.model.precision import convert_linear_layers, cpu_support, int8_layer_class

    torch.manual_seed(0)
    plain, packed, bf16 = (Transformer(tiny_config()).eval() for _ in range(3))
    pack_weights(packed)
    convert_linear_layers(bf16, "bf16")
    cases = [(packed, 4), (plain, MIN_STEP_ROWS), (bf16, MIN_STEP_ROWS)]
    if int8_layer_class(cpu_support()) is not None:  # a torch build with an int8 kernel for this CPU
        int8 = Transformer(tiny_config()).eval()
        convert_linear_layers(int8, "int8")
        cases.append((int8, 4))
    src = torch.tensor([[5, 6, 7, 8, 3]])
    with torch.inference_mode():
        for model, rows in cases:
            decoder = TransformerDecoder(model, src)
            decoder.start(4, grouped=True)
            assert decoder.state.batch_size == rows
            assert decoder.step(torch.full((4,), model.config.bos_id)).shape == (4, model.config.tgt_vocab_size)
            assert decoder.state.batch_size == rows


def test_top_k_and_top_p_filtering_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # top-k 2 keeps 0.5 and 0.3.
    assert filter_logits(logits, 2, 1.0).isfinite().tolist() == [[True, True, False, False]]
    # top-p 0.7: 0.5 < 0.7, so 0.3 is still needed; 0.5 + 0.3 = 0.8 >= 0.7, so 0.15 and 0.05 go.
    assert filter_logits(logits, 0, 0.7).isfinite().tolist() == [[True, True, False, False]]
    # top-p 0.4: the first token alone reaches it.
    assert filter_logits(logits, 0, 0.4).isfinite().tolist() == [[True, False, False, False]]


def test_sampling_is_seeded_per_sentence_and_scored_by_the_model(trained):
    loaded, sources = trained
    model = loaded.model
    length = max({len(s) for s in sources}, key=lambda n: sum(len(s) == n for s in sources))
    rows = [s for s in sources if len(s) == length][:3]
    config = DecodeConfig(sample=True, nbest=3, sample_top_k=20, temperature=1.5, seed=0)
    first = sample_search(model, torch.tensor(rows), config, seeds=[7, 8, 9])
    again = sample_search(model, torch.tensor(rows), config, seeds=[7, 8, 9])
    alone = sample_search(model, torch.tensor(rows[1:2]), config, seeds=[8])
    assert [[h.tokens for h in s] for s in first] == [[h.tokens for h in s] for s in again]
    assert [h.tokens for h in alone[0]] == [h.tokens for h in first[1]]
    other_seed = sample_search(model, torch.tensor(rows), config, seeds=[1, 2, 3])
    assert [[h.tokens for h in s] for s in other_seed] != [[h.tokens for h in s] for s in first]
    for row, samples in zip(rows, first):
        for hyp in samples:
            # The score is the model's own log-prob (temperature 1, unfiltered), as `score -m` gives.
            assert hyp.score == pytest.approx(forced_log_prob(model, row, hyp.tokens), abs=1e-4)


def test_sampling_with_top_k_1_is_greedy(trained):
    loaded, sources = trained
    src = torch.tensor(sources[:1])
    sampled = sample_search(loaded.model, src, DecodeConfig(sample=True, sample_top_k=1), seeds=[0])[0][0]
    assert sampled.tokens == greedy_search(loaded.model, src)[0].tokens
    assert math.isfinite(sampled.score)


def test_decode_config_names_bad_values():
    with pytest.raises(TfmError, match="nbest"):
        DecodeConfig(beam_size=2, nbest=3)
    with pytest.raises(TfmError, match="top-p"):
        DecodeConfig(sample=True, sample_top_p=0.0)
    with pytest.raises(TfmError, match="temperature"):
        DecodeConfig(temperature=0.0)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_stopping_a_sentence_early_changes_no_result(trained, monkeypatch, alpha):
    # beam_search stops a sentence once no live beam can reach its n best (the GNMT rule's bound);
    # without that rule it runs until `beam` hypotheses are finished, as fairseq. Both must
    # return the same n-best lists, tokens and float scores alike.
    loaded, sources = trained
    length = max({len(s) for s in sources}, key=lambda n: sum(len(s) == n for s in sources))
    src = torch.tensor([s for s in sources if len(s) == length])
    for nbest in (1, 3):
        config = DecodeConfig(beam_size=5, nbest=nbest, length_penalty=alpha)
        early = beam_search(loaded.model, src, config)
        with monkeypatch.context() as patch:
            patch.setattr(MonotonePenalty, "best_possible_score", lambda *args: float("inf"))
            full = beam_search(loaded.model, src, config)
        assert [[(h.tokens, h.score) for h in hyps] for hyps in early] == [[(h.tokens, h.score) for h in hyps] for hyps in full]


@pytest.mark.parametrize("no_unk", [False, True])
def test_no_search_outputs_padding_or_bos_and_no_unk_bans_unk(no_unk):
    # An all-zero output projection makes every next token equally likely: an unbanned search then
    # picks pad (id 0, argmax of a tie), BOS or UNK as readily as any other token.
    torch.manual_seed(0)
    model = Transformer(tiny_config(tie_output=False, share_embeddings=False)).eval()
    with torch.no_grad():
        model.output_proj.weight.zero_()
    config = model.config
    banned = {config.pad_id, config.bos_id} | ({config.unk_id} if no_unk else set())
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 11, 12, 3]])
    outputs = [h.tokens for h in greedy_search(model, src, max_len_a=0.0, max_len_b=6, no_unk=no_unk)]
    beam = DecodeConfig(beam_size=4, nbest=4, max_len_a=0.0, max_len_b=6, no_unk=no_unk)
    outputs += [h.tokens for nbest in beam_search(model, src, beam) for h in nbest]
    sampling = DecodeConfig(sample=True, nbest=20, max_len_a=0.0, max_len_b=6, no_unk=no_unk)
    outputs += [h.tokens for samples in sample_search(model, src, sampling, [1, 2]) for h in samples]
    assert sum(map(len, outputs)) > 100  # enough tokens drawn for a banned one to show up otherwise
    assert not any(token in banned for tokens in outputs for token in tokens)


def test_the_batch_invariance_switch_changes_the_arithmetic_not_the_results(trained):
    # decoding.TransformerDecoder(batch_invariant=False) skips the row padding and uses torch's fused
    # attention: faster kernels, rounding that may depend on the batch. The searches must give the
    # same translations either way (scores equal up to float32 rounding).
    from tfm_cli.inference.decoding import TransformerDecoder, source_batch
    from tfm_cli.inference.search import search_beams

    loaded, sources = trained
    rows = sorted(sources, key=len)[:12]
    src = source_batch([row[:-1] for row in rows], loaded.config)  # the fixture's rows end in EOS
    config = DecodeConfig(beam_size=4, nbest=1)
    with torch.inference_mode():
        exact = search_beams(TransformerDecoder(loaded.model, src, batch_invariant=True), config)
        fast = search_beams(TransformerDecoder(loaded.model, src, batch_invariant=False), config)
    assert [h[0].tokens for h in fast] == [h[0].tokens for h in exact]
    assert [h[0].score for h in fast] == pytest.approx([h[0].score for h in exact], abs=1e-4)


def test_a_decoding_step_gives_exactly_torchs_log_softmax_of_the_model_logits(trained):
    # TransformerDecoder.step normalises the logits in place; a second, untouched decoding state
    # gives the reference logits, which torch's own log_softmax normalises out of place.
    from tfm_cli.inference.decoding import TransformerDecoder, source_batch

    loaded, sources = trained
    src = source_batch([row[:-1] for row in sources[:5]], loaded.config)
    with torch.inference_mode():
        decoder = TransformerDecoder(loaded.model, src, batch_invariant=False)
        decoder.start(1, grouped=True)
        reference_state = loaded.model.start_decoding(loaded.model.encode(src))
        tokens = torch.full((5,), loaded.config.bos_id)
        for _ in range(3):
            log_probs = decoder.step(tokens)
            reference = torch.log_softmax(loaded.model.decode_step(tokens, reference_state).logits, dim=-1)
            assert torch.equal(log_probs, reference)
            tokens = log_probs.argmax(-1)
