"""The JSON metadata of a checkpoint's safetensors header, read and validated before any tensor is.

A checkpoint's metadata (see tfm_cli/checkpoints/format.py for the whole layout) holds the format name and
version, the model config, free-form provenance, and optionally the model's decoding defaults and
alignment settings. Each reader here raises TfmError naming the file for anything damaged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfm_cli.config import CHECKPOINT_DECODE_KEYS, AlignmentConfig, DecodeConfig, ModelConfig, config_from_dict
from tfm_cli.errors import TfmError

FORMAT_NAME = "tfm-checkpoint"
FORMAT_VERSION = 1


def read_metadata(path: Path, header: dict[str, Any]) -> tuple[ModelConfig, dict[str, Any]]:
    """The model config and provenance of a checkpoint's safetensors header, validated before any tensor is read.

    Every size the config names is bounded by what the file holds: its layer counts must match the
    layers whose tensors the header lists (so a crafted config cannot make tfm build 20,000 layers),
    and config validation bounds the rest (model.max_positions). Raises TfmError naming the file.
    """
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict):
        raise TfmError(f"{path}: damaged checkpoint metadata (not a JSON object)")
    if metadata.get("format") != FORMAT_NAME:
        raise TfmError(f"{path}: a safetensors file, but not a tfm checkpoint (no format={FORMAT_NAME!r} metadata)")
    version = metadata.get("format_version")
    if version != str(FORMAT_VERSION):
        if not isinstance(version, str):
            raise TfmError(f"{path}: damaged checkpoint metadata (format_version is {version!r}, not a string)")
        raise TfmError(
            f"{path}: checkpoint format version {version!r} is not supported (this tfm reads version "
            f"{FORMAT_VERSION}); convert it or use a matching tfm release"
        )
    parsed = {}
    for key, default in (("model_config", None), ("provenance", "{}")):
        text = metadata.get(key, default)
        try:
            parsed[key] = json.loads(text) if isinstance(text, str) else None
        except json.JSONDecodeError:
            parsed[key] = None
        if not isinstance(parsed[key], dict):
            raise TfmError(f"{path}: damaged checkpoint metadata ({key} is not a JSON object)")
    try:
        config = config_from_dict(ModelConfig, parsed["model_config"], "model")
    except TfmError as error:
        raise TfmError(f"{path}: bad model config in checkpoint: {error}") from None
    for stack, count in (("encoder_layers", config.n_enc_layers), ("decoder_layers", config.n_dec_layers)):
        present = {name.split(".")[1] for name in header if name.startswith(f"{stack}.") and name.count(".") > 1}
        if len(present) != count:
            raise TfmError(
                f"{path}: bad model config in checkpoint: it names {count} {stack.replace('_', ' ')}, "
                f"the file holds tensors for {len(present)}"
            )
    return config, parsed["provenance"]


def optional_json_object(path: Path, header: dict[str, Any], key: str) -> dict[str, Any]:
    """The JSON object stored under metadata `key`, or {} when the checkpoint has none.

    Raises TfmError naming the file when the value is not a JSON object.
    """
    text = header.get("__metadata__", {}).get(key)
    if text is None:
        return {}
    try:
        values = json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError:
        values = None
    if not isinstance(values, dict):
        raise TfmError(f"{path}: damaged checkpoint metadata ({key} is not a JSON object)")
    return values


def read_decode_defaults(path: Path, header: dict[str, Any], config: ModelConfig) -> dict[str, Any]:
    """The checkpoint's decoding defaults (metadata decode_defaults), validated; {} when it has none.

    Raises TfmError naming the file for damaged JSON, a key outside config.CHECKPOINT_DECODE_KEYS, a value
    DecodeConfig refuses, or a banned id outside the target vocabulary.
    """
    values = optional_json_object(path, header, "decode_defaults")
    unknown = sorted(set(values) - set(CHECKPOINT_DECODE_KEYS))
    if unknown:
        raise TfmError(f"{path}: bad decode_defaults in checkpoint: unknown key {unknown[0]!r}")
    try:
        decode = config_from_dict(DecodeConfig, values, "decode_defaults")
    except TfmError as error:
        raise TfmError(f"{path}: bad decode_defaults in checkpoint: {error}") from None
    outside = [token for token in decode.banned_ids if token >= config.tgt_vocab_size]
    if outside:
        raise TfmError(f"{path}: bad decode_defaults in checkpoint: banned id {outside[0]} is outside the target vocabulary")
    return {key: getattr(decode, key) for key in values}


def read_alignment(path: Path, header: dict[str, Any], config: ModelConfig) -> dict[str, Any]:
    """The checkpoint's alignment settings (metadata alignment, AlignmentConfig fields), validated; {} if none.

    Raises TfmError naming the file for damaged JSON, an unknown key or a layer/head the model lacks.
    """
    values = optional_json_object(path, header, "alignment")
    try:
        config_from_dict(AlignmentConfig, values, "alignment").check(config.n_dec_layers, config.n_heads)
    except TfmError as error:
        raise TfmError(f"{path}: bad alignment settings in checkpoint: {error}") from None
    return values
