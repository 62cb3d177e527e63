"""On the synthetic language pair with gold alignments, a briefly trained tiny model's attention aligns words.

Training is a plain teacher-forced Adam loop (no label smoothing, no schedule), so this test depends
only on the model, the synthetic data and inspect-attention. 200 steps of batch 32 take about 5-15 s
on 2 CPU threads; on held-out sentences the last layer's head-mean alignment then matched about 89%
of the gold links when written (threshold below: 70%).
"""

from __future__ import annotations

import pytest
import torch

from conftest import run_cli

# Tiny models: one thread is as fast on an idle machine and far faster on a busy one (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

THRESHOLD = 0.70
STEPS = 200


@pytest.fixture(scope="module")
def trained_synthetic(tmp_path_factory):
    """(checkpoint path, test source file, test target file, gold Pharaoh lines)."""
    from tfm_cli.checkpoints.format import save_model
    from tfm_cli.config import ModelConfig
    from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID
    from tfm_cli.model import Transformer
    from tfm_cli.synthetic import generate_pairs
    from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece

    folder = tmp_path_factory.mktemp("synthetic")
    pairs = generate_pairs(3000, seed=1)
    train, test = pairs[:2900], pairs[2900:]
    text = folder / "train.txt"
    text.write_text("".join(f"{p.source}\n{p.target}\n" for p in train), encoding="utf-8")
    # A BPE vocabulary this size keeps most words whole: short sequences, quick to learn.
    tokenizer = Tokenizer.from_file(
        train_sentencepiece([text], folder / "spm", TokenizerTrainConfig(vocab_size=420, model_type="bpe"))
    )
    config = ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=64, n_heads=4, d_ff=128,
        n_enc_layers=2, n_dec_layers=2, dropout=0.0, max_positions=64, share_embeddings=True,
    )
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see conftest.one_torch_thread (a module fixture cannot use that one)
    torch.manual_seed(0)
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    src_ids = [tokenizer.encode_ids(p.source) + [EOS_ID] for p in train]
    tgt_ids = [tokenizer.encode_ids(p.target) for p in train]

    def pad(rows: list[list[int]]) -> torch.Tensor:
        width = max(map(len, rows))
        return torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows])

    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        batch = torch.randint(len(train), (32,), generator=generator).tolist()
        logits = model(pad([src_ids[i] for i in batch]), pad([[BOS_ID] + tgt_ids[i] for i in batch]))
        gold = pad([tgt_ids[i] + [EOS_ID] for i in batch])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), gold.flatten(), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(previous_threads)
    checkpoint = folder / "model.safetensors"
    save_model(checkpoint, model.eval(), tokenizer, tokenizer)
    (folder / "test.src").write_text("".join(p.source + "\n" for p in test), encoding="utf-8")
    (folder / "test.tgt").write_text("".join(p.target + "\n" for p in test), encoding="utf-8")
    return checkpoint, folder / "test.src", folder / "test.tgt", [p.pharaoh() for p in test]


def test_trained_attention_matches_gold_alignment_for_most_words(trained_synthetic):
    checkpoint, sources, targets, gold = trained_synthetic
    result = run_cli(["inspect-attention", "-m", checkpoint, "-i", sources, "--target-file", targets,
                      "--words", "--format", "pharaoh"])
    assert result.exit_code == 0, result.stderr
    predicted = result.stdout.splitlines()
    assert len(predicted) == len(gold)
    matched = total = 0
    for line, gold_line in zip(predicted, gold):
        gold_pairs = set(gold_line.split())
        # Every target word gets exactly one link, and the gold alignment is one-to-one.
        assert len(line.split()) == len(gold_pairs)
        matched += len(set(line.split()) & gold_pairs)
        total += len(gold_pairs)
    accuracy = matched / total
    print(f"alignment accuracy on {len(gold)} held-out sentences: {accuracy:.3f} ({matched}/{total})")
    assert accuracy >= THRESHOLD
