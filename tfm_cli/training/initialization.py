"""`tfm train --init MODEL`: a run that starts from a checkpoint's weights, model config and tokenizers.

Owns the run's recipe when a checkpoint is involved: the recipe's [model] and [tokenizer] keys are
checked against the checkpoint (a contradiction is one error naming the key), and a resumed --init run
reads its model config and tokenizers back from its own checkpoint_last (MODEL is not needed again).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tfm_cli.checkpoints.format import checkpoint_tokenizers, model_with_weights, read_checkpoint
from tfm_cli.config import ModelConfig, ModelShape, TokenizerConfig, check_type, config_from_dict
from tfm_cli.errors import TfmError
from tfm_cli.recipe import Recipe, recipe_from_dict, recipe_values
from tfm_cli.textio.paths import as_regular_file, check_input_file, file_sha256
from tfm_cli.tokenization.tokenizer import Tokenizer
from tfm_cli.training.run_dir import (
    LAST_CHECKPOINT,
    STATE_FILE,
    saved_init,
    saved_recipe,
)
from tfm_cli.tokenization.vocabulary import MappedTokenizer

# Training-time settings that people change when fine-tuning; every other [model] key is the checkpoint's.
OVERRIDABLE_MODEL_KEYS = ("dropout", "attention_dropout", "activation_dropout")
TOKENIZER_FILE_KEYS = ("src_model", "tgt_model")


@dataclass(frozen=True)
class InitRecord:
    """Where an --init run's first weights came from: MODEL's absolute path and the SHA-256 of its bytes."""

    path: str
    sha256: str

    def to_dict(self) -> dict[str, str]:
        """The record as JSON-ready data (config.json's and every checkpoint provenance's `init`)."""
        return {"path": self.path, "sha256": self.sha256}


@dataclass
class InitModel:
    """An --init run's starting point, read from `source` (MODEL, or on resume the run's checkpoint_last)."""

    record: InitRecord
    source: Path
    config: ModelConfig
    src_tokenizer: Tokenizer | MappedTokenizer
    tgt_tokenizer: Tokenizer | MappedTokenizer
    state: dict[str, torch.Tensor]  # the checkpoint model's state_dict (CPU float32)
    decode_defaults: dict[str, Any]  # the checkpoint's own decoding settings (an imported model's), if any

    @property
    def joint(self) -> bool:
        """Whether one tokenizer serves both sides (the checkpoint stores one)."""
        return self.src_tokenizer.model_bytes == self.tgt_tokenizer.model_bytes

    def model_config(self, shape: ModelShape) -> ModelConfig:
        """The checkpoint's config with the dropout rates of `shape` (the recipe's): the run's model config."""
        return dataclasses.replace(self.config, **{key: getattr(shape, key) for key in OVERRIDABLE_MODEL_KEYS})


def read_init_model(path: Path | str, record: InitRecord | None = None) -> InitModel:
    """Read and validate the checkpoint at `path` (as checkpoint.load_model does). Returns the InitModel.

    `record` defaults to `path` itself (absolute) and its SHA-256. Raises TfmError, prefixed `--init:`,
    for a missing or bad file.
    """
    given = Path(path)
    try:
        check_input_file(given, "checkpoint")
        with as_regular_file(given) as regular:
            try:
                checkpoint = read_checkpoint(regular)
                src_tokenizer, tgt_tokenizer = checkpoint_tokenizers(regular, checkpoint)
                state = dict(model_with_weights(checkpoint).state_dict())  # state_dict's tensors are detached
            except TfmError as error:
                raise TfmError(str(error).replace(str(regular), str(given))) from None
            sha256 = file_sha256(regular)
    except TfmError as error:
        raise TfmError(f"--init: {error}") from None
    return InitModel(
        record=record or InitRecord(str(given.absolute()), sha256),
        source=given,
        config=checkpoint.config,
        src_tokenizer=src_tokenizer,
        tgt_tokenizer=tgt_tokenizer,
        state=state,
        decode_defaults=checkpoint.decode_defaults,
    )


def check_model_keys(model: dict[str, Any], init: InitModel) -> None:
    """Raise TfmError for the first [model] key that the recipe sets to a value other than the checkpoint's.

    The dropout rates may differ (they are the run's own); keys ModelConfig does not have are
    reported as unknown, as without --init.
    """
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    hints = typing.get_type_hints(ModelConfig)
    for key, value in model.items():
        if key not in fields:
            config_from_dict(ModelShape, {key: value}, "model")  # raises: unknown key, listing the valid ones
        value = check_type(f"model.{key}", value, hints[key])
        expected = getattr(init.config, key)
        if key not in OVERRIDABLE_MODEL_KEYS and value != expected:
            raise TfmError(
                f"--init: model.{key} is {value!r} in the recipe but {expected!r} in {init.source}; the architecture "
                "comes from the checkpoint (only dropout, attention_dropout and activation_dropout may change)"
            )


def check_tokenizer_keys(tokenizer: dict[str, Any], init: InitModel) -> None:
    """Raise TfmError if the recipe names tokenizer files, or a `joint` setting, other than the checkpoint's.

    A model file that holds the checkpoint's own tokenizer is no contradiction. The sentencepiece
    training settings (vocab_size, model_type, ...) train nothing here and are not compared, as
    with tokenizer.src_model.
    """
    own = {"src_model": init.src_tokenizer.model_bytes, "tgt_model": init.tgt_tokenizer.model_bytes}
    for key in TOKENIZER_FILE_KEYS:
        value = tokenizer.get(key, "")
        if not isinstance(value, str):
            check_type(f"tokenizer.{key}", value, str)  # raises: wrong type
        if value and check_input_file(value, f"tokenizer.{key}").read_bytes() != own[key]:
            raise TfmError(
                f"--init: tokenizer.{key} is {value} in the recipe, but {init.source} has its own, different "
                "tokenizers; leave it out (the run uses the checkpoint's)"
            )
    if tokenizer.get("src_model") and not tokenizer.get("tgt_model") and not init.joint:
        raise TfmError(
            f"--init: tokenizer.src_model serves both sides in the recipe, but {init.source} has a separate "
            "target tokenizer; leave the tokenizer files out (the run uses the checkpoint's)"
        )
    if "joint" in tokenizer:
        joint = check_type("tokenizer.joint", tokenizer["joint"], bool)
        if joint != init.joint:
            raise TfmError(
                f"--init: tokenizer.joint is {joint} in the recipe but {init.joint} in {init.source} "
                f"({'one tokenizer' if init.joint else 'a tokenizer per side'}); leave it out"
            )


def init_recipe(values: dict[str, Any], init: InitModel) -> Recipe:
    """The validated Recipe of a run started from `init`, from nested recipe data (recipe_values).

    [model] becomes the checkpoint's shape with the recipe's dropout rates; [tokenizer] records no
    files and no training settings (the tokenizers are the checkpoint's). Raises TfmError naming
    the first recipe key that contradicts the checkpoint.
    """
    for section in ("model", "tokenizer"):
        if not isinstance(values.get(section, {}), dict):
            raise TfmError(f"[{section}] must be a table of keys, got {values[section]!r}")
    model, tokenizer = values.get("model", {}), values.get("tokenizer", {})
    check_model_keys(model, init)
    check_tokenizer_keys(tokenizer, init)
    shape = {f.name: getattr(init.config, f.name) for f in dataclasses.fields(ModelShape)}
    shape.update({key: model[key] for key in OVERRIDABLE_MODEL_KEYS if key in model})
    # The training settings are still type-checked (then dropped); the files and `joint` were checked above.
    settings = {key: value for key, value in tokenizer.items() if key not in (*TOKENIZER_FILE_KEYS, "joint")}
    recipe = recipe_from_dict({**values, "model": shape, "tokenizer": settings})
    return dataclasses.replace(recipe, tokenizer=TokenizerConfig(joint=init.joint, train=None))


def resumed_init_model(run_dir: Path, record: InitRecord) -> InitModel:
    """The model config, tokenizers and weights of an --init run being resumed: its own checkpoint_last's.

    (The weights are then replaced by the training state's.) Raises TfmError if the file is missing.
    """
    path = run_dir / LAST_CHECKPOINT
    if not path.is_file():
        raise TfmError(
            f"{run_dir}: this run was started with --init {record.path}; resuming it reads the model config and "
            f"tokenizers from its {LAST_CHECKPOINT}, which is missing"
        )
    return read_init_model(path, record)


def load_run_recipe(
    recipe_path: Path | None, overrides: list[str], run_dir: Path, resume: bool, init_path: Path | None
) -> tuple[Recipe, InitModel | None]:
    """The Recipe of a new or resumed `tfm train` run and, for a run started with --init, its InitModel.

    Without a recipe file, a resumed run's own config.json is the recipe. --init with --resume is an
    error: a resumed run continues from its saved state (an --init run remembers where it started).
    """
    if init_path is not None and resume:
        raise TfmError(
            "--init and --resume cannot be combined: a resumed run continues from its own saved weights "
            "(a run started with --init remembers it); drop --init"
        )
    saved = saved_recipe(run_dir) if resume and recipe_path is None else None
    if resume and recipe_path is None and saved is None:
        raise TfmError(f"{run_dir}: no run to resume here (no config.json); give a recipe to start one")
    values = recipe_values(recipe_path, overrides, saved=saved)
    if init_path is not None:
        init = read_init_model(init_path)
    elif resume and (run_dir / STATE_FILE).is_file() and (record := saved_init(run_dir)) is not None:
        # (Without a training state, check_run_dir refuses the resume with its own message.)
        init = resumed_init_model(run_dir, InitRecord(**record))
    else:
        return recipe_from_dict(values), None
    return init_recipe(values, init), init
