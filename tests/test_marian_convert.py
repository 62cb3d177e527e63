"""The benchmark's tfm -> MarianMT -> CTranslate2 converter (bench/marian_convert.py) keeps the function.

transformers and ctranslate2 belong to the optional `bench` extra, so these tests skip where it is
not installed (CI installs only `test`). That is acceptable only because the converter is used by
the benchmarks alone; nothing in tfm_cli depends on it. References are independent of tfm's own
decoding code paths: Hugging Face's MarianMTModel forward/generate and CTranslate2's translator.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, tiny_config
from tfm_cli.checkpoint import Checkpoint, model_weights
from tfm_cli.model import Transformer
from tfm_cli.search import greedy_search
from tfm_cli.tokenizer import Tokenizer

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")


def load_converter():
    """Import bench/marian_convert.py (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("marian_convert", REPO_ROOT / "bench" / "marian_convert.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["marian_convert"] = module
    spec.loader.exec_module(module)
    return module


convert = load_converter()


def random_checkpoint(spm_path: Path, seed: int, **overrides) -> Checkpoint:
    """A random-weight tiny checkpoint whose vocabulary is the given sentencepiece model's."""
    tokenizer = Tokenizer.from_file(spm_path)
    config = tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, **overrides)
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for param in model.parameters():  # non-trivial LayerNorm and bias values too
            param.add_(0.1 * torch.randn_like(param))
    return Checkpoint(config, model_weights(model), tokenizer.model_bytes, tokenizer.model_bytes, {})


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_marian_logits_equal_tfm_logits(small_spm, tmp_path, share_embeddings):
    checkpoint = random_checkpoint(small_spm, seed=1, share_embeddings=share_embeddings)
    convert.save_marian(checkpoint, tmp_path / "marian")
    marian = convert.load_marian(tmp_path / "marian")
    assert convert.max_logit_difference(checkpoint, marian) < 1e-4


def test_marian_without_tfm_positions_differs(small_spm, tmp_path):
    # The check above can fail: Marian's own (non-interleaved) sin/cos table gives other logits.
    from transformers import MarianMTModel

    checkpoint = random_checkpoint(small_spm, seed=2, share_embeddings=True)
    convert.save_marian(checkpoint, tmp_path / "marian")
    plain = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    assert convert.max_logit_difference(checkpoint, plain) > 1e-2


def test_greedy_outputs_agree_across_tfm_marian_and_ctranslate2(small_spm, tmp_path, synthetic):
    import ctranslate2

    from tfm_cli.checkpoint import build_model

    checkpoint = random_checkpoint(small_spm, seed=3, share_embeddings=True)
    marian = convert.save_marian(checkpoint, tmp_path / "marian")
    convert.convert_to_ctranslate2(tmp_path / "marian", tmp_path / "ct2", None)
    tokenizer = Tokenizer(checkpoint.src_tokenizer_bytes)
    lines = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:8]
    rows = [tokenizer.encode_ids(line) + [checkpoint.config.eos_id] for line in lines]
    width = max(map(len, rows))
    src = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    max_steps = 12

    expected = [h.tokens for h in greedy_search(build_model(checkpoint), src, 0.0, max_steps - 1)]
    with torch.inference_mode():
        generated = marian.generate(
            input_ids=src, attention_mask=(src != 0).long(), num_beams=1, do_sample=False, max_new_tokens=max_steps
        )
    eos = checkpoint.config.eos_id
    hf = [row[1:][: row[1:].index(eos)] if eos in row[1:] else [t for t in row[1:] if t != 0] for row in generated.tolist()]
    vocab = convert.read_vocabularies(tmp_path / "marian")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        [[vocab.src[i] for i in row] for row in rows], beam_size=1, max_decoding_length=max_steps
    )
    ct2 = [[tokenizer.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    # tfm's last step is its forced EOS, so compare the first max_steps - 1 tokens.
    assert [t[: max_steps - 1] for t in hf] == expected
    assert [t[: max_steps - 1] for t in ct2] == expected
    assert any(len(t) > 2 for t in expected)
