"""Crafted or damaged checkpoint metadata: refused with one line naming the file, before anything is built.

The checkpoints here are written byte by byte (safetensors' own writer refuses most of these),
from a real tiny checkpoint's tensors and metadata with one thing changed.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import run_cli
from tfm_cli.checkpoints.format import read_checkpoint
from tfm_cli.errors import TfmError


def crafted(source: Path, target: Path, edit) -> Path:
    """A copy of `source` whose parsed header dict `edit(header)` changed (tensor bytes kept)."""
    data = source.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    edit(header)
    encoded = json.dumps(header).encode()
    target.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size :])
    return target


def set_config(**changes):
    """An edit that changes keys of the metadata's model_config JSON."""
    def edit(header: dict) -> None:
        config = json.loads(header["__metadata__"]["model_config"])
        config.update(changes)
        header["__metadata__"]["model_config"] = json.dumps(config)
    return edit


def set_metadata(key: str, value):
    """An edit that sets one metadata value (any JSON value, even the non-strings safetensors forbids)."""
    def edit(header: dict) -> None:
        header["__metadata__"][key] = value
    return edit


CASES = [
    ("metadata a list", lambda h: h.update({"__metadata__": ["format", "tfm-checkpoint"]}), "metadata (not a JSON object)"),
    ("metadata a string", lambda h: h.update({"__metadata__": "tfm"}), "metadata (not a JSON object)"),
    ("model_config null", set_metadata("model_config", "null"), "model_config is not a JSON object"),
    ("model_config a number", set_metadata("model_config", "3"), "model_config is not a JSON object"),
    ("model_config a JSON number, not a string", set_metadata("model_config", 3), "model_config is not a JSON object"),
    ("provenance a list", set_metadata("provenance", "[1, 2]"), "provenance is not a JSON object"),
    ("format_version a number", set_metadata("format_version", 1), "format_version is 1, not a string"),
    ("max_positions 10**12", set_config(max_positions=10**12), "max_positions must be at most"),
    ("20,000 decoder layers", set_config(n_dec_layers=20000), "names 20000 decoder layers, the file holds tensors for 2"),
    ("negative layer-norm epsilon", set_config(layer_norm_eps=-1e-5), "layer_norm_eps must be in (0, 1)"),
    ("d_model a string", set_config(d_model="32"), "model.d_model must be"),
]


@pytest.mark.parametrize("name, edit, message", CASES, ids=[case[0] for case in CASES])
def test_crafted_metadata_is_refused_naming_the_problem(tmp_path, random_checkpoint, name, edit, message):
    path = crafted(random_checkpoint, tmp_path / "crafted.safetensors", edit)
    with pytest.raises(TfmError, match="crafted.safetensors") as caught:
        read_checkpoint(path)
    assert message in str(caught.value)


@pytest.mark.parametrize("name, edit, message", CASES[:3] + CASES[7:9], ids=[c[0] for c in CASES[:3] + CASES[7:9]])
def test_translate_refuses_them_in_one_line(tmp_path, random_checkpoint, name, edit, message):
    path = crafted(random_checkpoint, tmp_path / "crafted.safetensors", edit)
    result = run_cli(["translate", "-m", path, "-o", tmp_path / "out.txt"], input="a b\n")
    assert result.exit_code == 1
    assert result.stderr.count("error:") == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out.txt").exists()


# Configs that read cleanly but do not fit the tokenizer inside the same file: refused when the model loads.
MISMATCHED = [
    ("eos id not the tokenizer's", set_config(eos_id=5), "model.eos_id is 5 but the source tokenizer's eos id is 3"),
    ("pad and bos swapped", set_config(pad_id=2, bos_id=0), "model.pad_id is 2 but the source tokenizer's pad id is 0"),
]


@pytest.mark.parametrize("name, edit, message", MISMATCHED, ids=[case[0] for case in MISMATCHED])
def test_a_config_that_does_not_fit_its_tokenizer_is_refused(tmp_path, random_checkpoint, name, edit, message):
    path = crafted(random_checkpoint, tmp_path / "crafted.safetensors", edit)
    result = run_cli(["translate", "-m", path, "-o", tmp_path / "out.txt"], input="a b\n")
    assert result.exit_code == 1
    assert result.stderr.count("error:") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "out.txt").exists()
