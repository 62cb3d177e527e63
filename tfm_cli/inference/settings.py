"""Decoding settings resolved once: a flag the user gave > the checkpoint's decode_defaults > DecodeConfig's default.

translate, score -m and inspect-attention all ask `resolve_decode`; nothing else writes the rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfm_cli.config import AlignmentConfig, DecodeConfig


def decode_default(name: str) -> Any:
    """The built-in default of DecodeConfig field `name` (the value used when neither flag nor model sets it)."""
    for item in dataclasses.fields(DecodeConfig):
        if item.name == name:
            return item.default
    raise KeyError(f"DecodeConfig has no field {name!r}")


def model_default_note(name: str) -> str:
    """How --help states the default of a flag a checkpoint may set: "default: the model's, else X"."""
    return f"default: the model's own, else {decode_default(name)}"


def resolve_decode(given: dict[str, Any], model_defaults: dict[str, Any]) -> DecodeConfig:
    """The DecodeConfig to decode with: each field from `given`, else `model_defaults`, else its default.

    given: DecodeConfig field -> the value of a flag, None = the user did not give it. A flag for a
    field a checkpoint may carry (config.CHECKPOINT_DECODE_KEYS) must therefore default to None.
    model_defaults: the checkpoint's decode_defaults (validated on load). Raises TfmError (from
    DecodeConfig) for settings that do not fit together, e.g. --nbest above the model's beam size.
    """
    names = {item.name for item in dataclasses.fields(DecodeConfig)}
    unknown = sorted((set(given) | set(model_defaults)) - names)
    if unknown:
        raise KeyError(f"DecodeConfig has no field {unknown[0]!r}")
    return DecodeConfig(**{**model_defaults, **{name: value for name, value in given.items() if value is not None}})


def resolve_alignment(
    model_alignment: AlignmentConfig, layer: int | None, head_given: bool, head: int | None, shift: bool | None,
    null: bool | None = None,
) -> AlignmentConfig:
    """The alignment settings to use: each option the user gave over the model's (AlignmentConfig).

    `layer`, `shift` and `null` are None when not given; `head` counts only when `head_given` (None is then
    a request for the mean over heads). A layer or head asks for a cross-attention, so it also sets a
    checkpoint's trained aligner aside.
    """
    resolved = model_alignment
    if layer is not None:
        resolved = dataclasses.replace(resolved, layer=layer, aligner=False)
    if head_given:
        resolved = dataclasses.replace(resolved, head=head, aligner=False)
    if shift is not None:
        resolved = dataclasses.replace(resolved, shift=shift)
    if null is not None:
        resolved = dataclasses.replace(resolved, null=null)
    return resolved
