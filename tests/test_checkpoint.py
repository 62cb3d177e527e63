"""The checkpoint contract: bit-exact round trip, a fixed key list, and one clear error per bad file."""

from __future__ import annotations

import json
import pickle
import shlex
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import REPO_ROOT, rewritten_checkpoint, run_cli, tiny_config
from tfm_cli.model.kernels import packed_weights
from tfm_cli.checkpoints.format import (
    Checkpoint,
    encode_checkpoint,
    load_model,
    loaded_model,
    model_weights,
    read_checkpoint,
    save_model,
    write_checkpoint,
)
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer
from tfm_cli.tokenization.tokenizer import Tokenizer


@pytest.fixture
def tokenizer(small_spm) -> Tokenizer:
    return Tokenizer.from_file(small_spm)


@pytest.fixture
def saved(tmp_path, tokenizer):
    """A checkpoint of a tiny shared-embedding model; returns (path, model)."""
    torch.manual_seed(0)
    config = tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, share_embeddings=True)
    model = Transformer(config)
    path = tmp_path / "model.safetensors"
    save_model(path, model, tokenizer, tokenizer, provenance={"step": 7})
    return path, model


def test_round_trip_is_bit_exact_and_self_contained(saved, tokenizer):
    path, model = saved
    stored = read_checkpoint(path).weights
    for name, tensor in model_weights(model).items():
        assert torch.equal(stored[name], tensor), name
    loaded = load_model(path)
    assert loaded.model.output_proj.weight is loaded.model.src_embed.weight  # re-tied on load
    assert torch.equal(loaded.model.src_embed.weight, model.src_embed.weight)
    assert loaded.config == model.config
    assert loaded.provenance == {"step": 7}
    assert loaded.src_tokenizer.model_bytes == tokenizer.model_bytes
    assert loaded.tgt_tokenizer.encode_ids("the dog sees my cat") == tokenizer.encode_ids("the dog sees my cat")
    src = torch.tensor([[5, 6, 7, 3]])
    tgt = torch.tensor([[2, 8, 9]])
    with packed_weights(model.eval()), torch.no_grad():  # a loaded model runs on packed weights
        assert torch.equal(loaded.model(src, tgt), model(src, tgt))


def test_weights_read_are_memory_of_their_own_not_the_files_pages(saved):
    """A model takes read_checkpoint's tensors without a copy (load_model), so they must not be a mapping of
    the file: bytes of the file changed in place afterwards (a tool that rewrites it without a rename)
    must not change them, and they must be writable."""
    path, model = saved
    checkpoint = read_checkpoint(path)
    name = "src_embed.weight"
    before = checkpoint.weights[name].clone()
    header_size = struct.unpack("<Q", path.read_bytes()[:8])[0]
    start, end = json.loads(path.read_bytes()[8 : 8 + header_size])[name]["data_offsets"]
    with open(path, "r+b") as f:  # in place: the same inode, as a mapping would see it
        f.seek(8 + header_size + start)
        f.write(bytes(end - start))
    assert torch.equal(checkpoint.weights[name], before)
    checkpoint.weights[name].add_(1.0)  # writable: a mapping of the file would be read-only


def test_load_model_takes_the_weights_it_reads_and_loaded_model_copies_them(saved):
    path, model = saved
    checkpoint = read_checkpoint(path)
    given = {name: tensor.data_ptr() for name, tensor in checkpoint.weights.items()}
    taken = loaded_model(path, checkpoint, take_weights=True).model
    assert checkpoint.weights == {}
    assert taken.src_embed.weight.data_ptr() == given["src_embed.weight"]  # the tensor read, not a copy
    checkpoint = read_checkpoint(path)
    given = {name: tensor.data_ptr() for name, tensor in checkpoint.weights.items()}
    copied = loaded_model(path, checkpoint).model
    assert checkpoint.weights.keys() == given.keys()  # the command that rewrites the file still has them
    assert copied.src_embed.weight.data_ptr() != given["src_embed.weight"]
    src, tgt = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    with torch.no_grad():
        assert torch.equal(taken(src, tgt), copied(src, tgt))
        assert torch.equal(taken(src, tgt), load_model(path).model(src, tgt))


def test_key_list_is_the_format(saved):
    """Parameter names are part of the file format: changing them breaks every saved model."""
    path, _ = saved
    keys = set(read_checkpoint(path).weights)
    layer0_encoder = {
        "encoder_layers.0.self_attn.qkv_proj.weight", "encoder_layers.0.self_attn.qkv_proj.bias",
        "encoder_layers.0.self_attn.out_proj.weight", "encoder_layers.0.self_attn.out_proj.bias",
        "encoder_layers.0.self_attn_sublayer.norm.weight", "encoder_layers.0.self_attn_sublayer.norm.bias",
        "encoder_layers.0.ffn.linear1.weight", "encoder_layers.0.ffn.linear1.bias",
        "encoder_layers.0.ffn.linear2.weight", "encoder_layers.0.ffn.linear2.bias",
        "encoder_layers.0.ffn_sublayer.norm.weight", "encoder_layers.0.ffn_sublayer.norm.bias",
    }
    layer0_decoder_extra = {
        "decoder_layers.0.cross_attn.q_proj.weight", "decoder_layers.0.cross_attn.q_proj.bias",
        "decoder_layers.0.cross_attn.kv_proj.weight", "decoder_layers.0.cross_attn.kv_proj.bias",
        "decoder_layers.0.cross_attn.out_proj.weight", "decoder_layers.0.cross_attn.out_proj.bias",
        "decoder_layers.0.cross_attn_sublayer.norm.weight", "decoder_layers.0.cross_attn_sublayer.norm.bias",
    }
    assert "src_embed.weight" in keys
    assert layer0_encoder <= keys and layer0_decoder_extra <= keys
    # 2 + 2 layers of 12 / 20 tensors, plus the one shared embedding.
    assert len(keys) == 2 * 12 + 2 * 20 + 1


def test_write_is_atomic_no_temp_files_left(saved, tmp_path):
    path, _ = saved
    write_checkpoint(path, read_checkpoint(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def tokenize_with(path: Path):
    """Any command that loads a checkpoint; tokenize encode reads its embedded tokenizer."""
    return run_cli(["tokenize", "encode", "-m", path], input="the dog sees my cat\n")


def assert_one_clear_error(result, *fragments):
    assert result.exit_code == 1, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_good_checkpoint_works_through_the_cli(saved, tokenizer):
    path, _ = saved
    result = tokenize_with(path)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == " ".join(tokenizer.encode_pieces("the dog sees my cat")) + "\n"


def test_missing_file(tmp_path):
    assert_one_clear_error(tokenize_with(tmp_path / "nope.safetensors"), "no such file")


def test_directory_instead_of_file(tmp_path):
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    assert_one_clear_error(tokenize_with(folder), "is a directory")


def test_truncated(saved, tmp_path):
    path, _ = saved
    data = path.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_clear_error(tokenize_with(cut), "truncated", str(cut))


def test_not_safetensors_and_empty(tmp_path):
    text = tmp_path / "text.safetensors"
    text.write_text("hello, I am not a checkpoint at all\n")
    assert_one_clear_error(tokenize_with(text), "not a safetensors file")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    assert_one_clear_error(tokenize_with(empty), "not a safetensors file")


def test_pickle_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.safetensors"
    evil.write_bytes(pickle.dumps({"weights": Payload()}))
    assert_one_clear_error(tokenize_with(evil), "not a safetensors file")
    assert not marker.exists()


def test_plain_safetensors_is_not_a_tfm_checkpoint(tmp_path):
    plain = tmp_path / "plain.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, str(plain))
    assert_one_clear_error(tokenize_with(plain), "not a tfm checkpoint")


def test_unknown_format_version(saved, tmp_path):
    path, _ = saved
    bad = rewritten_checkpoint(path, tmp_path / "v99.safetensors", metadata=lambda m: m.update(format_version="99"))
    assert_one_clear_error(tokenize_with(bad), "format version '99'")


def test_missing_extra_and_misshaped_tensors(saved, tmp_path):
    path, _ = saved
    name = "decoder_layers.1.ffn.linear2.weight"
    missing = rewritten_checkpoint(path, tmp_path / "missing.safetensors", tensors=lambda t: t.pop(name))
    assert_one_clear_error(tokenize_with(missing), "lacks tensor", name)
    extra = rewritten_checkpoint(path, tmp_path / "extra.safetensors", tensors=lambda t: t.update(bogus=torch.zeros(1)))
    assert_one_clear_error(tokenize_with(extra), "unexpected tensor 'bogus'")

    def reshape(tensors):
        tensors[name] = torch.zeros(3, 3)

    misshaped = rewritten_checkpoint(path, tmp_path / "shape.safetensors", tensors=reshape)
    assert_one_clear_error(tokenize_with(misshaped), "has shape (3, 3)", name)


def test_bad_config_in_metadata(saved, tmp_path):
    path, _ = saved

    def break_config(metadata):
        config = json.loads(metadata["model_config"])
        config["n_heads"] = 5
        metadata["model_config"] = json.dumps(config)

    bad = rewritten_checkpoint(path, tmp_path / "config.safetensors", metadata=break_config)
    assert_one_clear_error(tokenize_with(bad), "bad model config", "divisible")


def test_header_length_larger_than_file(tmp_path):
    bad = tmp_path / "huge.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    assert_one_clear_error(tokenize_with(bad), "not a safetensors file")


def test_separate_target_tokenizer_is_kept(saved, tmp_path, tokenizer, synthetic):
    from tfm_cli.tokenization.tokenizer import TokenizerTrainConfig, train_sentencepiece

    # A target-only model (the synthetic target side), smaller than the joint one.
    other = Tokenizer.from_file(
        train_sentencepiece([synthetic["train.tgt"]], tmp_path / "tgt", TokenizerTrainConfig(vocab_size=100))
    )
    checkpoint = Checkpoint(
        tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=100),
        {}, tokenizer.model_bytes, other.model_bytes,
    )
    checkpoint.weights = model_weights(Transformer(checkpoint.config))
    path = tmp_path / "two.safetensors"
    path.write_bytes(encode_checkpoint(checkpoint))
    loaded = load_model(path)
    assert loaded.tgt_tokenizer.vocab_size == 100 and loaded.src_tokenizer.vocab_size == tokenizer.vocab_size
    assert loaded.tgt_tokenizer.model_bytes == other.model_bytes != tokenizer.model_bytes


def test_checkpoint_gets_normal_file_permissions(saved):
    import os

    path, _ = saved
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# Every file a checkpoint embeds is a (N,) uint8 tensor; a crafted one of another dtype or shape is
# one error naming the file and the tensor, whichever blob it is and whichever command reads it.
EMBEDDED_FILES = ["tokenizer.src", "tokenizer.tgt", "tokenizer.src_vocab", "tokenizer.tgt_vocab"]
BAD_BLOBS = [
    ("bf16", lambda data: data.to(torch.bfloat16), "has dtype torch.bfloat16, expected torch.uint8"),
    ("float32", lambda data: data.to(torch.float32), "has dtype torch.float32, expected torch.uint8"),
    ("int8 (the same bytes)", lambda data: data.view(torch.int8), "has dtype torch.int8, expected torch.uint8"),
    ("int64", lambda data: data.to(torch.int64), "has dtype torch.int64, expected torch.uint8"),
    ("bool", lambda data: data.to(torch.bool), "has dtype torch.bool, expected torch.uint8"),
    ("2-D uint8", lambda data: data[: 2 * (len(data) // 2)].reshape(2, -1), "expected one dimension"),
    ("0-D uint8", lambda data: data[0], "has shape (), expected one dimension"),
]


def with_blob(source: Path, target: Path, key: str, make) -> Path:
    """A copy of checkpoint `source` whose tensor `key` is `make(the source tokenizer's bytes)`."""
    def edit(tensors):
        tensors[key] = make(tensors["tokenizer.src"].clone()).clone().contiguous()
    return rewritten_checkpoint(source, target, tensors=edit)


@pytest.mark.parametrize("key", EMBEDDED_FILES)
@pytest.mark.parametrize("name, make, message", BAD_BLOBS, ids=[case[0] for case in BAD_BLOBS])
def test_an_embedded_file_of_another_dtype_or_shape_is_refused_naming_it(
    saved, tmp_path, key, name, make, message
):
    path, _ = saved
    bad = with_blob(path, tmp_path / "crafted.safetensors", key, make)
    with pytest.raises(TfmError) as caught:
        read_checkpoint(bad)
    assert str(caught.value).startswith(f"{bad}: tensor {key!r} ") and message in str(caught.value)


@pytest.mark.parametrize("command", [
    "tokenize encode -m {bad}",
    "translate -m {bad} -o {folder}/out.txt",
    "score -m {bad} --src {folder}/text.txt --tgt {folder}/text.txt",
    "inspect-attention -m {bad} 'a b' --target 'c d'",
    "average {bad} {good} -o {folder}/average.safetensors",
    "export -m {bad} --to marian {folder}/exported",
    "train {repo}/recipes/tiny.toml --init {bad} --run {folder}/run",
])
def test_every_command_that_reads_a_checkpoint_refuses_a_bf16_tokenizer_in_one_line(saved, tmp_path, command):
    path, _ = saved
    bad = with_blob(path, tmp_path / "crafted.safetensors", "tokenizer.src", lambda data: data.to(torch.bfloat16))
    (tmp_path / "text.txt").write_text("the dog\n")
    args = [part.format(bad=bad, good=path, folder=tmp_path, repo=REPO_ROOT) for part in shlex.split(command)]
    result = run_cli(args, input="the dog sees my cat\n")
    assert_one_clear_error(result, str(bad), "'tokenizer.src'", "torch.bfloat16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted.safetensors", "model.safetensors", "text.txt"]
