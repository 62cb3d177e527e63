"""DecoderState.select skips re-copying cross-attention caches on beam reorders, without changing results.

Reference: full teacher-forced decoding (Transformer.decode) of each reordered prefix, which never
touches the incremental state.
"""

from __future__ import annotations

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
                cross_keys_before = state.cross_caches[0].keys
            state.select(order)
            if step == 1:
                # Within-sentence reorders left the cross caches untouched (the point of the check).
                assert state.cross_caches[0].keys is cross_keys_before
            prefixes = [prefixes[i] for i in order.tolist()]
            sentence_of_row = [sentence_of_row[i] for i in order.tolist()]
            tokens = chosen[order]
        logits = model.decode_step(tokens, state).logits  # (2, V) after the shrinking select
        rows_src = src[torch.tensor(sentence_of_row)]
        full = model.project(model.decode(torch.tensor(prefixes), model.encode(rows_src)).hidden[:, -1])
    assert state.cross_caches[0].keys.size(0) == 2
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)
