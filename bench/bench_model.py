"""The benchmark's stand-in model when no trained one is given: Multi30k size, random weights.

d_model 256, 4 heads, d_ff 1024, 3+3 layers, an 8k joint sentencepiece vocabulary trained on the
Multi30k training text, shared embeddings tied to the output projection. With `never_eos`, the EOS
embedding row (which is also its output row) is zeroed: EOS's logit is then exactly 0 while ~half
of 8k random logits are positive, so no engine ever picks it and every output runs to the length
limit. That makes all engines do the same number of decoder steps, which a random model otherwise
would not guarantee.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tfm_cli.checkpoints.format import save_model
from tfm_cli.config import ModelConfig
from tfm_cli.model import Transformer
from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def bench_config(vocab_size: int) -> ModelConfig:
    """The Multi30k-size model config with a joint vocabulary of `vocab_size` pieces."""
    return ModelConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=256, n_heads=4, d_ff=1024,
        n_enc_layers=3, n_dec_layers=3, dropout=0.1, share_embeddings=True, max_positions=1024,
    )


def make_bench_checkpoint(path: Path, data_dir: Path = MULTI30K, vocab_size: int = 8000, never_eos: bool = True) -> Path:
    """Write a random-weight checkpoint (seed 0) with an 8k joint spm on Multi30k train; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    spm_path = train_sentencepiece(
        [data_dir / "train.de", data_dir / "train.en"], path.parent / "bench-spm", TokenizerTrainConfig(vocab_size=vocab_size)
    )
    tokenizer = Tokenizer.from_file(spm_path)
    torch.manual_seed(0)
    model = Transformer(bench_config(tokenizer.vocab_size))
    if never_eos:
        with torch.no_grad():
            model.tgt_embed.weight[model.config.eos_id].zero_()
    save_model(path, model, tokenizer, tokenizer, provenance={"bench": "random weights", "never_eos": never_eos})
    return path
