"""A briefly trained small model for the translate/search tests (outputs vary and end with EOS).

It translates the synthetic language pair (tfm_cli/synthetic.py, English-like -> verb-final
"Verbish"), trained here with a minimal teacher-forced loop (not `tfm train`), so these tests depend
neither on the training code nor on data outside the repository; cached per test process so every
test module shares one model. Its corpus's held-out test sentences are `held_out_sources()`.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from conftest import tiny_config, train_joint_spm, write_synthetic_corpus

TRAIN_STEPS = 150
BATCH_SENTENCES = 48


@functools.lru_cache(maxsize=1)
def trained_checkpoint() -> Path:
    """Train a d_model=64 model on the synthetic train split (2000 pairs) for TRAIN_STEPS steps; returns its checkpoint.

    The corpus lies beside the checkpoint (train/valid/test .src/.tgt), its tokenizer is conftest's
    200-piece joint model trained the same way as the small_spm fixture.
    """
    from tfm_cli.checkpoints.format import save_model
    from tfm_cli.model import Transformer
    from tfm_cli.tokenization.tokenizer import Tokenizer

    folder = Path(tempfile.mkdtemp(prefix="tfm-translate-tests-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    corpus = write_synthetic_corpus(folder)
    tokenizer = Tokenizer.from_file(train_joint_spm(corpus, folder / "joint"))
    src_lines = corpus["train.src"].read_text(encoding="utf-8").splitlines()
    tgt_lines = corpus["train.tgt"].read_text(encoding="utf-8").splitlines()
    pairs = sorted(
        zip(tokenizer.encode_ids_batch(src_lines), tokenizer.encode_ids_batch(tgt_lines)),
        key=lambda pair: len(pair[0]),
    )
    batches = [pairs[i : i + BATCH_SENTENCES] for i in range(0, len(pairs), BATCH_SENTENCES)]
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = tiny_config(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=64, d_ff=128,
        share_embeddings=True,
    )
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    model.train()
    # One thread: these small matrices gain little from two, and on a shared machine far less.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_steps(model, optimizer, batches, generator)
    finally:
        torch.set_num_threads(threads)
    path = folder / "model.safetensors"
    save_model(path, model.eval(), tokenizer, tokenizer, provenance={"step": TRAIN_STEPS})
    return path


def held_out_sources() -> list[str]:
    """The 200 source sentences of the trained model's test split (none of them seen in training)."""
    return (trained_checkpoint().parent / "test.src").read_text(encoding="utf-8").splitlines()


def train_steps(model, optimizer, batches, generator) -> None:
    """TRAIN_STEPS teacher-forced cross-entropy steps on randomly drawn batches of (src, tgt) id pairs."""
    config = model.config
    for _ in range(TRAIN_STEPS):
        batch = batches[int(torch.randint(len(batches), (1,), generator=generator))]
        src = pad([s + [config.eos_id] for s, _ in batch])
        tgt_in = pad([[config.bos_id] + t for _, t in batch])
        tgt_out = pad([t + [config.eos_id] for _, t in batch])
        logits = model(src, tgt_in)  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), tgt_out.flatten(), ignore_index=config.pad_id
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def pad(rows: list[list[int]]) -> torch.Tensor:
    """Right-pad id lists with 0 into a (B, T) int64 tensor."""
    batch = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row)
    return batch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run a module's tests on one CPU thread: a d_model=64 model gains nothing from two, and on a
    busy machine two OpenMP threads wait on each other many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
