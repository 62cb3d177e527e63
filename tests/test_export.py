"""`tfm export --to marian|ctranslate2`: the exported model computes what tfm computes.

References are the other engines themselves: Hugging Face's MarianMTModel and MarianTokenizer
(loading the folder with nothing of tfm's) and CTranslate2's Translator. They belong to the `bench`
extra, which CI installs; without it these tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import run_cli, tiny_config
from translate_support import held_out_sources, trained_checkpoint

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")


def random_checkpoint(spm_path: Path, folder: Path, seed: int, **overrides) -> Path:
    """A random-weight tiny checkpoint file (LayerNorms and biases not at their initial values)."""
    from tfm_cli.checkpoints.format import save_model
    from tfm_cli.model import Transformer
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(spm_path)
    config = tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, **overrides)
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed" not in name:
                param.add_(0.1 * torch.randn_like(param))
    path = folder / f"random-{seed}.safetensors"
    save_model(path, model.eval(), tokenizer, tokenizer)
    return path


def export(model: Path, target: str, folder: Path, *options: str) -> None:
    result = run_cli(["export", "-m", model, "--to", target, folder, "-q", *options])
    assert result.exit_code == 0, result.stderr


def hf_marian(folder: Path):
    """MarianMTModel and MarianTokenizer loaded from `folder`; fails if any weight is missing or extra."""
    model, info = transformers.MarianMTModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval(), transformers.MarianTokenizer.from_pretrained(folder)


def tfm_logits(model_path: Path, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    from tfm_cli.checkpoints.format import load_model

    with torch.inference_mode():
        return load_model(model_path).model(src, tgt_in)


SENTENCES = ["the dog sees my cat", "two old birds open your six rivers", "my cat"]


@pytest.mark.parametrize("overrides", [
    {"share_embeddings": True},
    {"share_embeddings": False, "tie_output": False},
    {"share_embeddings": False, "tie_output": True, "activation": "gelu"},
    {"share_embeddings": True, "activation": "swish", "sinusoid_layout": "halves", "output_bias": True},
    {"share_embeddings": True, "n_enc_layers": 3, "n_dec_layers": 1},
], ids=["shared", "separate-untied", "separate-tied-gelu", "swish-halves-bias", "student-3-1"])
def test_marian_folder_gives_tfm_logits(small_spm, tmp_path, overrides):
    model = random_checkpoint(small_spm, tmp_path, seed=1, **overrides)
    export(model, "marian", tmp_path / "marian")
    marian, tokenizer = hf_marian(tmp_path / "marian")
    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    from tfm_cli.checkpoints.format import load_model

    loaded = load_model(model)
    eos = loaded.config.eos_id
    for row, mask, text in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), SENTENCES):
        assert row[: sum(mask)] == loaded.src_tokenizer.encode_ids(text) + [eos]  # same ids from the same text
    tgt_in = torch.tensor([[loaded.config.bos_id, 5, 9, 12, 40], [loaded.config.bos_id, 7, 8, 30, 31],
                           [loaded.config.bos_id, 6, 6, 6, 6]])
    with torch.inference_mode():
        theirs = marian(**batch, decoder_input_ids=tgt_in).logits
    ours = tfm_logits(model, batch["input_ids"], tgt_in)
    assert float((ours - theirs).abs().max()) < 1e-4


def test_marian_greedy_and_ctranslate2_greedy_equal_tfm_translate(tmp_path):
    model = trained_checkpoint()
    sources = held_out_sources()[:40]
    source_file = tmp_path / "test.src"
    source_file.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    translated = run_cli(["translate", "-m", model, "-i", source_file, "-b", "1", "--max-len-a", "0",
                          "--max-len-b", "30", "-q"])
    assert translated.exit_code == 0, translated.stderr
    expected = translated.stdout.splitlines()
    assert sum(bool(line) for line in expected) > 30  # the model translates

    export(model, "marian", tmp_path / "marian")
    marian, tokenizer = hf_marian(tmp_path / "marian")
    with torch.inference_mode():
        generated = marian.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=1,
                                    do_sample=False, max_new_tokens=30)  # tfm: 30 tokens, then EOS
    assert tokenizer.batch_decode(generated, skip_special_tokens=True) == expected

    export(model, "ctranslate2", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    pieces = [tokenizer.convert_ids_to_tokens(tokenizer(line)["input_ids"]) for line in sources]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=30)
    decoded = [tokenizer.convert_tokens_to_string(result.hypotheses[0]) for result in results]
    assert decoded == expected


def test_ctranslate2_int8_scores_close_to_float32_and_leaves_the_checkpoint_alone(tmp_path):
    import sacrebleu

    from tfm_cli.checkpoints.format import checkpoint_tokenizers, read_checkpoint
    from tfm_cli.interop.exporting import export_model

    model = trained_checkpoint()
    checkpoint = read_checkpoint(model)
    src, tgt = checkpoint_tokenizers(model, checkpoint)
    # int8 first: CTranslate2 quantizes the arrays it is handed in place, which must not reach the checkpoint.
    export_model(checkpoint, src, tgt, "ctranslate2", tmp_path / "ct2-int8", "int8")
    export_model(checkpoint, src, tgt, "ctranslate2", tmp_path / "ct2-float32", "float32")
    sources = held_out_sources()
    pieces = [[src.id_to_piece(i) for i in src.encode_ids(line)] + [src.id_to_piece(checkpoint.config.eos_id)]
              for line in sources]
    outputs = {}
    for name in ("ct2-int8", "ct2-float32"):
        translator = ctranslate2.Translator(str(tmp_path / name), device="cpu", intra_threads=1)
        results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=30)
        outputs[name] = [tgt.decode_pieces(result.hypotheses[0]) for result in results]
    translated = run_cli(["translate", "-m", model, "-b", "1", "--max-len-a", "0", "--max-len-b", "30", "-q"],
                         input="".join(line + "\n" for line in sources))
    assert outputs["ct2-float32"] == translated.stdout.splitlines()
    references = [(model.parent / "test.tgt").read_text(encoding="utf-8").splitlines()]
    bleu = {name: sacrebleu.corpus_bleu(lines, references).score for name, lines in outputs.items()}
    # int8 kernels differ by CPU (VNNI or not): measured 0.9-1.1 BLEU apart on this small model.
    assert abs(bleu["ct2-int8"] - bleu["ct2-float32"]) <= 4.0, bleu
    assert sacrebleu.corpus_chrf(outputs["ct2-int8"], [outputs["ct2-float32"]]).score >= 50


@pytest.mark.parametrize("case", ["not empty", "a file", "pre-norm to marian", "unknown target", "bad quantization"])
def test_refusals_are_one_line_and_write_nothing(small_spm, tmp_path, case):
    model = random_checkpoint(small_spm, tmp_path, seed=2, norm_first=case == "pre-norm to marian")
    folder = tmp_path / "out"
    target, options, message = "marian", [], ""
    if case == "not empty":
        folder.mkdir()
        (folder / "keep.txt").write_text("mine\n")
        message = "the folder is not empty"
    elif case == "a file":
        folder.write_text("mine\n")
        message = "is a file; export writes a folder"
    elif case == "pre-norm to marian":
        message = "MarianMT is post-norm only"
    elif case == "unknown target":
        target, message = "onnx", "--to must be marian or ctranslate2"
    else:
        target, options, message = "ctranslate2", ["--quantization", "int3"], "--quantization must be one of"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli(["export", "-m", model, "--to", target, folder, *options])
    assert result.exit_code == 1 and result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no folder, no temp folder
    if case == "not empty":
        assert [p.name for p in folder.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("layout, layers", [("halves", (2, 2)), ("interleaved", (2, 2)), ("halves", (3, 1))],
                         ids=["halves", "interleaved", "student-3-1"])
def test_export_then_import_gives_the_same_model(small_spm, tmp_path, layout, layers):
    from safetensors.torch import load_file

    model = random_checkpoint(small_spm, tmp_path, seed=3, sinusoid_layout=layout, activation="swish",
                              n_enc_layers=layers[0], n_dec_layers=layers[1])
    export(model, "marian", tmp_path / "marian")
    imported = tmp_path / "imported.safetensors"
    result = run_cli(["import", tmp_path / "marian", "-o", imported, "-q"])
    assert result.exit_code == 0, result.stderr
    original = {k: v for k, v in load_file(str(model)).items() if not k.startswith("tokenizer.")}
    again = {k: v for k, v in load_file(str(imported)).items() if not k.startswith("tokenizer.")}
    assert set(again) == set(original)
    if layout == "halves":  # Marian's own layout: the weights come back bit for bit
        assert all(torch.equal(original[name], again[name]) for name in original)
    text = "".join(line + "\n" for line in SENTENCES)
    options = ["-b", "2", "--max-len-a", "0", "--max-len-b", "8", "--scores", "-q"]  # scores: the same length penalty rule
    first, second = run_cli(["translate", "-m", model, *options], input=text), run_cli(["translate", "-m", imported, *options], input=text)
    assert first.exit_code == 0 and second.exit_code == 0, first.stderr + second.stderr
    assert first.stdout.count("\n") == len(SENTENCES)
    ours = [line.split("\t") for line in first.stdout.splitlines()]
    theirs = [line.split("\t") for line in second.stdout.splitlines()]
    assert [text for text, _ in theirs] == [text for text, _ in ours]
    # The permuted basis of the interleaved layout changes float rounding; the scores' rule must not change.
    assert [float(score) for _, score in theirs] == pytest.approx([float(score) for _, score in ours], abs=1e-4)


def test_a_second_export_of_the_imported_model_writes_the_same_folder(small_spm, tmp_path):
    import json

    from tfm_cli.checkpoints.format import read_checkpoint

    model = random_checkpoint(small_spm, tmp_path, seed=4, sinusoid_layout="halves")
    export(model, "marian", tmp_path / "first")
    imported = tmp_path / "imported.safetensors"
    assert run_cli(["import", tmp_path / "first", "-o", imported, "-q"]).exit_code == 0
    export(imported, "marian", tmp_path / "second")
    for name in ("config.json", "generation_config.json", "vocab.json", "tokenizer_config.json"):
        first = json.loads((tmp_path / "first" / name).read_text())
        assert json.loads((tmp_path / "second" / name).read_text()) == first, name
    generation = json.loads((tmp_path / "first" / "generation_config.json").read_text())
    assert generation["num_beams"] == 5 and generation["length_penalty"] == 0.6  # tfm's defaults travel
    assert generation["min_length"] == 2  # tfm's min_len 1 as generate counts it (with the decoder start token)
    assert read_checkpoint(imported).decode_defaults["min_len"] == 1
    # tfm's length limit grows with the source (1.5 * source tokens + 10): generate cannot state it,
    # so it travels under tfm_max_len and the imported model stops where the exported one did.
    assert generation["tfm_max_len"] == {"a": 1.5, "b": 10}
    assert {k: read_checkpoint(imported).decode_defaults[k] for k in ("max_len_a", "max_len_b")} == {"max_len_a": 1.5, "max_len_b": 10}
    assert (tmp_path / "first" / "model.safetensors").read_bytes() == (tmp_path / "second" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("target", ["marian", "ctranslate2"])
def test_an_exported_folder_has_the_permissions_of_a_folder_made_by_hand(small_spm, tmp_path, target):
    import os
    import stat

    model = random_checkpoint(small_spm, tmp_path, seed=5)
    old_umask = os.umask(0o022)
    try:
        export(model, target, tmp_path / "new")
        (tmp_path / "empty").mkdir(mode=0o750)
        export(model, target, tmp_path / "empty")
    finally:
        os.umask(old_umask)
    # A serving user or container must be able to read what was exported (not the temp folder's 0700).
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "empty").stat().st_mode) == 0o750  # the user's own folder keeps its mode
    for path in (tmp_path / "new").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name
