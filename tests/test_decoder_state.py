"""DecoderState.select skips re-copying cross-attention caches on beam reorders, without changing results.

Reference: full teacher-forced decoding (Transformer.decode) of each reordered prefix, which never
touches the incremental state.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from tfm_cli.model import Transformer


def test_reorders_within_and_across_sentences_match_full_decoding():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src = torch.randint(4, 40, (2, 6))
    src[1, 4:] = 0  # the second sentence is shorter: its memory mask matters
    beam = 3
    with torch.inference_mode():
        encoded = model.encode(src)
        state = model.start_decoding(encoded)
        state.select(torch.arange(2).repeat_interleave(beam))  # 3 rows per sentence
        sentence_of_row = [0, 0, 0, 1, 1, 1]
        prefixes = [[model.config.bos_id] for _ in range(6)]
        tokens = torch.full((6,), model.config.bos_id)
        cross_keys_before = None
        # Step 1 and 2: reorders within each sentence; step 3: drop sentence 0 and a beam of sentence 1.
        reorders = [torch.tensor([2, 0, 0, 4, 5, 3]), torch.tensor([1, 1, 2, 3, 3, 5]), torch.tensor([5, 3])]
        for step, order in enumerate(reorders):
            logits = model.decode_step(tokens, state).logits
            chosen = logits.argmax(-1)
            for row in range(len(prefixes)):
                prefixes[row] = prefixes[row] + [int(chosen[row])]
            if step == 0:
                cross_keys_before = state.parts[0].cross_caches[0].keys
            state.select(order)
            if step == 1:
                # Within-sentence reorders left the cross caches untouched (the point of the check).
                assert state.parts[0].cross_caches[0].keys is cross_keys_before
            prefixes = [prefixes[i] for i in order.tolist()]
            sentence_of_row = [sentence_of_row[i] for i in order.tolist()]
            tokens = chosen[order]
        logits = model.decode_step(tokens, state).logits  # (2, V) after the shrinking select
        rows_src = src[torch.tensor(sentence_of_row)]
        full = model.project(model.decode(torch.tensor(prefixes), model.encode(rows_src)).hidden[:, -1])
    assert state.parts[0].cross_caches[0].keys.size(0) == 2
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_grouped_rows_share_one_cross_cache_per_sentence_and_match_full_decoding():
    """Beam search keeps a sentence's beams as one group: one cross-attention cache entry per sentence."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src = torch.randint(4, 40, (3, 6))
    src[1, 3:] = 0  # padding in one sentence: its memory mask must follow its group
    beam = 2
    with torch.inference_mode():
        state = model.start_decoding(model.encode(src))
        state.select(torch.arange(3).repeat_interleave(beam), group_width=beam)  # rows 0-1, 2-3, 4-5
        cross_keys = state.parts[0].cross_caches[0].keys
        assert cross_keys.size(0) == 3  # not copied per row
        sentence_of_row = [0, 0, 1, 1, 2, 2]
        prefixes = [[model.config.bos_id] for _ in range(6)]
        tokens = torch.full((6,), model.config.bos_id)
        # Steps 1-2: beams move within their sentence; step 3: sentence 0 leaves; step 4: the last
        # sentence is padded with a copy of its group, as decoding.padded_rows does.
        reorders = [
            torch.tensor([1, 1, 2, 3, 5, 4]), torch.tensor([0, 1, 3, 3, 4, 4]),
            torch.tensor([2, 3, 4, 5]), torch.tensor([2, 3, 2, 3]),
        ]
        for step, order in enumerate(reorders):
            logits = model.decode_step(tokens, state).logits
            chosen = logits.argmax(-1)
            prefixes = [prefixes[row] + [int(chosen[row])] for row in range(len(prefixes))]
            state.select(order, group_width=beam)
            if step < 2:
                assert state.parts[0].cross_caches[0].keys is cross_keys  # within-sentence moves copy nothing
            prefixes = [prefixes[i] for i in order.tolist()]
            sentence_of_row = [sentence_of_row[i] for i in order.tolist()]
            tokens = chosen[order]
        logits = model.decode_step(tokens, state).logits  # (4, V): sentence 2's two beams, twice
        assert state.parts[0].cross_caches[0].keys.size(0) == 2
        full = model.project(model.decode(torch.tensor(prefixes), model.encode(src[torch.tensor(sentence_of_row)])).hidden[:, -1])
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_a_group_that_mixes_sentences_is_refused():
    model = Transformer(tiny_config()).eval()
    with torch.inference_mode():
        state = model.start_decoding(model.encode(torch.randint(4, 40, (2, 5))))
        state.select(torch.arange(2).repeat_interleave(2), group_width=2)
        with pytest.raises(ValueError, match="mixes sentences"):
            state.select(torch.tensor([1, 2, 0, 3]), group_width=2)
        with pytest.raises(ValueError, match="groups of 2"):
            state.select(torch.tensor([0, 1, 2]), group_width=2)


def test_select_leaves_room_for_one_step_and_later_steps_still_grow_the_cache():
    """After a reorder each self-attention cache holds no unused positions beyond the next step's;
    steps without a reorder in between (greedy, sampling) grow it again, with the same results."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src = torch.randint(4, 40, (2, 5))
    with torch.inference_mode():
        state = model.start_decoding(model.encode(src))
        state.select(torch.tensor([0, 0, 1, 1]), group_width=2)
        prefixes = [[model.config.bos_id] for _ in range(4)]
        tokens = torch.full((4,), model.config.bos_id)
        for step in range(5):
            chosen = model.decode_step(tokens, state).logits.argmax(-1)
            prefixes = [prefix + [int(token)] for prefix, token in zip(prefixes, chosen)]
            tokens = chosen
            if step < 2:  # reorders within each sentence, then three steps with no select at all
                order = torch.tensor([1, 0, 3, 2])
                state.select(order, group_width=2)
                prefixes = [prefixes[i] for i in order.tolist()]
                tokens = chosen[order]
                for cache in state.self_caches:
                    assert cache.buffer.size(3) == cache.length + 1
        logits = model.decode_step(tokens, state).logits
        full = model.project(model.decode(torch.tensor(prefixes), model.encode(src.repeat_interleave(2, 0))).hidden[:, -1])
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_a_state_of_several_source_widths_drops_and_keeps_its_parts_in_order():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    with torch.inference_mode():
        encoded = [model.encode(torch.randint(4, 40, (2, 8))), model.encode(torch.randint(4, 40, (3, 16)))]
        state = model.start_decoding(encoded)
        assert [part.groups for part in state.parts] == [2, 3]
        state.select(torch.tensor([1, 3, 4]))  # sentences 0 and 2 finished
        assert [(part.groups, part.mask.size(-1)) for part in state.parts] == [(1, 8), (2, 16)]
        state.select(torch.tensor([1, 2]))  # the last sentence of width 8 finished
        assert [(part.groups, part.mask.size(-1)) for part in state.parts] == [(2, 16)]
        unordered = model.start_decoding(encoded)
        with pytest.raises(ValueError, match="in order"):
            unordered.select(torch.tensor([3, 0]))
