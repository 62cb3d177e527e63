"""A TOML training recipe: the Recipe that holds its five sections (their schemas: config.py), reading the
file with `${VAR}` expansion and relative paths resolved, and `--set` overrides.

Precedence: dataclass defaults < recipe file < command line (--set).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfm_cli.config import (
    RECIPE_DECODE_KEYS,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    ModelShape,
    TokenizerConfig,
    TokenizerTrainConfig,
    TrainConfig,
    check_type,
    config_from_dict,
    config_to_dict,
    train_corpora_from_list,
)
from tfm_cli.errors import TfmError


# Keys of [model] that come from the tokenizer, never from a recipe.
MODEL_KEYS_FROM_TOKENIZER = ("src_vocab_size", "tgt_vocab_size", "pad_id", "unk_id", "bos_id", "eos_id")
TOKENIZER_OWN_KEYS = ("src_model", "tgt_model", "joint")
RECIPE_SECTIONS = ("data", "tokenizer", "model", "train", "decode")
PATH_KEYS = {
    "data": ("train_src", "train_tgt", "valid_src", "valid_tgt", "cache_dir", "train_alignment"),
    "tokenizer": ("src_model", "tgt_model"),
}
VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


@dataclass(frozen=True)
class Recipe:
    """A fully resolved training recipe: every section validated, every path absolute."""

    data: DataConfig
    tokenizer: TokenizerConfig
    model: ModelShape
    train: TrainConfig
    # [decode]: only the keys the recipe sets (RECIPE_DECODE_KEYS), validated by DecodeConfig.
    decode: dict[str, Any] = field(default_factory=dict)

    def model_config(self, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
        """The ModelConfig for tokenizers of these vocabulary sizes (special ids are tfm's fixed ones)."""
        return ModelConfig(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, **config_to_dict(self.model))

    def to_dict(self) -> dict[str, Any]:
        """The recipe as nested plain data (the [tokenizer] section flat, as in the TOML file)."""
        tokenizer = {key: getattr(self.tokenizer, key) for key in TOKENIZER_OWN_KEYS}
        if self.tokenizer.train is not None:
            tokenizer.update(config_to_dict(self.tokenizer.train))
            tokenizer["user_defined_symbols"] = list(tokenizer["user_defined_symbols"])
        data = config_to_dict(self.data)
        data["more_train"] = [dict(corpus) for corpus in data["more_train"]]
        return {
            "data": data,
            "tokenizer": tokenizer,
            "model": config_to_dict(self.model),
            "train": config_to_dict(self.train),
            "decode": dict(self.decode),
        }


def recipe_from_dict(values: dict[str, Any]) -> Recipe:
    """Validate nested recipe data (sections data, tokenizer, model, train) into a Recipe.

    Raises TfmError naming the first unknown section or key, wrong type or missing required key.
    """
    unknown = sorted(set(values) - set(RECIPE_SECTIONS))
    if unknown:
        raise TfmError(f"unknown recipe section [{unknown[0]}]; valid sections: {', '.join(RECIPE_SECTIONS)}")
    for section in RECIPE_SECTIONS:
        if not isinstance(values.get(section, {}), dict):
            raise TfmError(f"[{section}] must be a table of keys, got {values[section]!r}")
    if "data" not in values:
        raise TfmError("the recipe has no [data] section (train_src, train_tgt, valid_src, valid_tgt)")
    data_values = dict(values["data"])
    more_train = train_corpora_from_list(data_values.pop("more_train", []), "data.more_train")
    data = config_from_dict(DataConfig, {**data_values, "more_train": ()}, "data")
    data = dataclasses.replace(data, more_train=more_train)
    tokenizer_values = dict(values.get("tokenizer", {}))
    own = {key: tokenizer_values.pop(key) for key in TOKENIZER_OWN_KEYS if key in tokenizer_values}
    train_fields = {f.name for f in dataclasses.fields(TokenizerTrainConfig)}
    unknown = sorted(set(tokenizer_values) - train_fields)
    if unknown:
        valid = ", ".join(sorted(train_fields | set(TOKENIZER_OWN_KEYS)))
        raise TfmError(f"unknown key tokenizer.{unknown[0]}; valid keys in [tokenizer]: {valid}")
    own = {key: check_type(f"tokenizer.{key}", value, {"joint": bool}.get(key, str)) for key, value in own.items()}
    if own.get("tgt_model") and not own.get("src_model"):
        raise TfmError("tokenizer.tgt_model needs tokenizer.src_model as well")
    # Training settings are checked even when src_model names an existing model (they are then unused).
    train_settings = config_from_dict(TokenizerTrainConfig, tokenizer_values, "tokenizer")
    tokenizer = TokenizerConfig(**own, train=train_settings)
    model = check_model_section(values.get("model", {}))
    if model.share_embeddings and not tokenizer.src_model and not tokenizer.joint:
        raise TfmError("model.share_embeddings = true needs tokenizer.joint = true (one vocabulary for both sides)")
    train = config_from_dict(TrainConfig, values.get("train", {}), "train")
    decode = check_decode_section(values.get("decode", {}))
    recipe = Recipe(data=data, tokenizer=tokenizer, model=model, train=train, decode=decode)
    check_sections_agree(recipe)
    return recipe


def check_decode_section(values: dict[str, Any]) -> dict[str, Any]:
    """The [decode] section's settings (keys of RECIPE_DECODE_KEYS), type- and range-checked as DecodeConfig's.

    Returns only the keys given; raises TfmError naming `decode.KEY` for an unknown key or a bad value.
    """
    unknown = sorted(set(values) - set(RECIPE_DECODE_KEYS))
    if unknown:
        raise TfmError(f"unknown key decode.{unknown[0]}; valid keys in [decode]: {', '.join(RECIPE_DECODE_KEYS)}")
    try:
        decode = config_from_dict(DecodeConfig, values, "decode")
    except TfmError as error:  # a range error names the setting, not the section: say which section
        message = str(error)
        raise TfmError(message if message.startswith("decode.") else f"[decode]: {message}") from None
    return {key: getattr(decode, key) for key in values}


def check_sections_agree(recipe: Recipe) -> None:
    """Raise TfmError for settings of different sections that cannot work together."""
    data, train = recipe.data, recipe.train
    if data.max_length > train.max_tokens:
        raise TfmError(
            f"data.max_length ({data.max_length}) is larger than train.max_tokens ({train.max_tokens}); "
            "a batch must hold at least one sentence"
        )
    if train.best_metric == "bleu" and not train.valid_bleu and data.valid_src:
        raise TfmError("train.best_metric = 'bleu' needs train.valid_bleu = true (or use best_metric = 'loss')")
    if train.patience and not data.valid_src:
        raise TfmError("train.patience needs validation data (data.valid_src and data.valid_tgt)")
    if bool(data.train_alignment) != (train.alignment_weight > 0):
        raise TfmError(
            "guided alignment needs both data.train_alignment (the Pharaoh alignment file) and "
            "train.alignment_weight > 0 (0.1 is a usual weight); "
            + ("train.alignment_weight is 0" if data.train_alignment else "data.train_alignment is not set")
        )
    if recipe.model.max_positions < data.max_length:
        raise TfmError(
            f"model.max_positions ({recipe.model.max_positions}) must be at least data.max_length ({data.max_length})"
        )


def check_model_section(values: dict[str, Any]) -> ModelShape:
    """The recipe's [model] section as a validated ModelShape (the tokenizer's keys are refused)."""
    for key in values:
        if key in MODEL_KEYS_FROM_TOKENIZER:
            raise TfmError(f"model.{key} comes from the tokenizer; remove it from the recipe")
    return config_from_dict(ModelShape, values, "model")


def expand_path(key: str, value: Any, base: Path) -> Any:
    """Expand ${VAR}, ${VAR:-default}, $VAR and ~ in a path setting; make it absolute against `base`.

    A relative folder in an environment variable that starts the path (`MULTI30K_DIR=../data` with
    "${MULTI30K_DIR}/train.de") is relative to the working directory, where the user typed it, not
    to `base`. Returns the absolute path as a string ('' stays ''); non-strings are returned for
    check_type to refuse.
    """
    if not isinstance(value, str) or value == "":
        return value

    def substitute(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        if name in os.environ:
            if match.start() == 0 and os.environ[name]:
                return os.path.abspath(os.path.expanduser(os.environ[name]))
            return os.environ[name]
        if default is not None:
            return default
        raise TfmError(f"{key} = {value!r}: environment variable {name} is not set; set it or give a default")

    expanded = os.path.expanduser(VARIABLE.sub(substitute, value))
    if not expanded:
        return ""  # an empty path stays empty (the section's own check names it), not the recipe's folder
    return str((base / expanded).resolve())


def resolve_paths(values: dict[str, Any], base: Path) -> None:
    """Make every path setting in nested recipe data absolute against `base` (in place)."""
    for section, keys in PATH_KEYS.items():
        table = values.get(section)
        if isinstance(table, dict):
            for key in keys:
                if key in table:
                    table[key] = expand_path(f"{section}.{key}", table[key], base)
    data = values.get("data")
    if isinstance(data, dict) and "more_train" in data:
        resolve_more_train(data, base)


def resolve_more_train(data: dict[str, Any], base: Path) -> None:
    """Make the src and tgt paths of data.more_train's tables absolute against `base` (in place)."""
    corpora = data["more_train"]
    if not isinstance(corpora, list):
        return  # train_corpora_from_list names the mistake
    for index, table in enumerate(corpora):
        if isinstance(table, dict):
            for key in ("src", "tgt"):
                if key in table:
                    table[key] = expand_path(f"data.more_train[{index}].{key}", table[key], base)


def read_recipe_file(path: Path) -> dict[str, Any]:
    """Parse a TOML recipe into nested data with its paths resolved against the recipe's folder."""
    if path.is_dir():
        raise TfmError(f"{path}: is a directory, expected a recipe file (.toml)")
    if not path.exists():
        raise TfmError(f"{path}: no such recipe file")
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise TfmError(f"{path}: not valid TOML ({error})") from None
    except UnicodeDecodeError:
        raise TfmError(f"{path}: the recipe is not UTF-8 text") from None
    # Relative paths in a recipe are relative to its folder; a recipe read from a pipe
    # (`tfm train <(...)`) has none, so they are relative to the working directory.
    resolve_paths(values, path.resolve().parent if path.is_file() else Path.cwd())
    return values


def apply_overrides(values: dict[str, Any], overrides: list[str], cwd: Path) -> None:
    """Apply `section.key=value` settings (in place). Values are TOML literals, or plain strings.

    Path settings given this way are resolved against `cwd`, where the user typed them.
    """
    for override in overrides:
        name, sep, text = override.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise TfmError(f"--set {override!r}: expected section.key=value, e.g. train.max_tokens=4096")
        if section not in RECIPE_SECTIONS:
            raise TfmError(f"--set {override!r}: unknown section [{section}]; valid: {', '.join(RECIPE_SECTIONS)}")
        try:
            value = tomllib.loads(f"value = {text.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare word such as a path or `bleu`
        if key in PATH_KEYS.get(section, ()):
            value = expand_path(f"{section}.{key}", value, cwd)
        values.setdefault(section, {})[key] = value
        if (section, key) == ("data", "more_train"):
            resolve_more_train(values["data"], cwd)


def load_recipe(
    path: Path | None, overrides: list[str], saved: dict[str, Any] | None = None, cwd: Path | None = None
) -> Recipe:
    """The recipe from a TOML file (or `saved` resolved data, when resuming without one), plus overrides.

    Returns the validated Recipe; raises TfmError naming the file or key at fault.
    """
    return recipe_from_dict(recipe_values(path, overrides, saved, cwd))


def recipe_values(
    path: Path | None, overrides: list[str], saved: dict[str, Any] | None = None, cwd: Path | None = None
) -> dict[str, Any]:
    """load_recipe's nested data before validation: only the keys the file (or `saved`) and overrides set.

    `tfm train --init` checks these against the checkpoint before any default is filled in.
    """
    if path is not None:
        values = read_recipe_file(path)
    elif saved is not None:
        values = {section: dict(table) for section, table in saved.items()}
    else:
        raise TfmError("no recipe: give a recipe file (or --resume a run that has one)")
    apply_overrides(values, overrides, cwd or Path.cwd())
    return values
