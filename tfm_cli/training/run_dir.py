"""The run directory of `tfm train`: its file names, checkpoint naming, checks, and metrics.jsonl.

`tfm average --run` finds a run's step checkpoints through `step_checkpoints` too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from tfm_cli.config import DataConfig, ModelShape, config_from_dict, config_to_dict
from tfm_cli.errors import TfmError
from tfm_cli.recipe import Recipe
from tfm_cli.textio.atomic_files import atomic_write_bytes
from tfm_cli.textio.paths import file_in_the_way

STATE_FILE = "train_state.safetensors"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
LAST_CHECKPOINT = "checkpoint_last.safetensors"
BEST_CHECKPOINT = "checkpoint_best.safetensors"
EMA_CHECKPOINT = "checkpoint_ema.safetensors"  # the moving average of the weights (train.ema_decay)
# checkpoint_00001200.safetensors: 8 digits (or more), so lexical order is numeric order.
STEP_CHECKPOINT = re.compile(r"^checkpoint_(\d{8,})\.safetensors$")
# The files a run writes atomically, as regular expressions over their names (on resume, the temp
# files of a killed save are found by these).
RUN_FILES = "|".join([
    r"checkpoint_(?:\d+|last|best|ema)\.safetensors",
    r"spm(?:\.src|\.tgt)?\.(?:model|vocab)",  # the run's tokenizers
    *map(re.escape, (STATE_FILE, CONFIG_FILE, METRICS_FILE)),
])
CACHE_FILES = r"[\w.-]+\.(?:model|vocab)"  # the tokenizers kept in run_dir/cache
CACHE_DIR = "cache"


def step_checkpoint_path(run_dir: Path, step: int) -> Path:
    """run_dir / checkpoint_STEP.safetensors, STEP zero-padded to 8 digits."""
    return run_dir / f"checkpoint_{step:08d}.safetensors"


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The step checkpoints (checkpoint_NNNNNNNN.safetensors) in `run_dir`, oldest step first."""
    found = [path for path in run_dir.iterdir() if STEP_CHECKPOINT.match(path.name)]
    return sorted(found, key=lambda path: int(STEP_CHECKPOINT.match(path.name).group(1)))


def read_run_config(run_dir: Path) -> dict[str, Any] | None:
    """The JSON object in a run directory's config.json, or None if there is none; TfmError if damaged."""
    check_run_folder_shape(run_dir)
    path = run_dir / CONFIG_FILE
    if path.exists() and not path.is_file():
        raise TfmError(f"{path}: is not a file; the run folder is damaged, start a new --run")
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TfmError(f"{path}: damaged run config (not JSON); start a new --run") from None
    if not isinstance(saved, dict):
        raise TfmError(f"{path}: damaged run config (not a JSON object); start a new --run")
    return saved


def saved_recipe(run_dir: Path) -> dict[str, Any] | None:
    """The resolved recipe data stored in a run directory's config.json, or None if there is none."""
    saved = read_run_config(run_dir)
    if saved is None:
        return None
    path = run_dir / CONFIG_FILE
    recipe = saved.get("recipe")
    if not isinstance(recipe, dict):
        raise TfmError(f"{path}: damaged run config (no \"recipe\" object); start a new --run")
    for section, table in recipe.items():
        if not isinstance(table, dict):
            raise TfmError(f"{path}: damaged run config (recipe.{section} is not an object); start a new --run")
    return recipe


def saved_init(run_dir: Path) -> dict[str, str] | None:
    """Where a run started with `--init` took its first weights: config.json's {"path", "sha256"}, or None."""
    saved = read_run_config(run_dir)
    init = saved.get("init") if saved is not None else None
    if init is None:
        return None
    well_formed = isinstance(init, dict) and set(init) == {"path", "sha256"}
    if not (well_formed and all(isinstance(value, str) for value in init.values())):
        raise TfmError(
            f"{run_dir / CONFIG_FILE}: damaged run config (init is not a {{path, sha256}} object); start a new --run"
        )
    return init


# Settings that may differ on resume although outside [train]: how many sentences trained the
# tokenizer does not matter once the run has its tokenizer files, nor where prepared corpora are kept.
RESUME_IGNORES = {("tokenizer", "input_sentence_size"), ("data", "cache_dir")}


def check_resumable(recipe: Recipe, run_dir: Path) -> None:
    """Raise TfmError if the recipe's data, tokenizer or model settings differ from the run's own."""
    saved = saved_recipe(run_dir)
    if saved is None:
        raise TfmError(f"{run_dir}: no {CONFIG_FILE}; this is not a tfm run directory")
    current = recipe.to_dict()
    # A [model] section is compared with its defaults filled in: config.json may list only the keys set.
    saved = {**saved, "model": config_to_dict(config_from_dict(ModelShape, saved.get("model", {}), "model"))}
    # [data] keys newer than the run's config.json are compared as their defaults (what the run used).
    saved["data"] = {**data_defaults(), **saved.get("data", {})}
    for section in ("data", "tokenizer", "model"):
        old, new = saved.get(section, {}), current[section]
        for key in sorted(set(old) | set(new)):
            if (section, key) in RESUME_IGNORES:
                continue
            if old.get(key) != new.get(key):
                raise TfmError(
                    f"--resume: {section}.{key} is {new.get(key)!r} but the run in {run_dir} used {old.get(key)!r}; "
                    "only [train] settings may change on resume"
                )


def data_defaults() -> dict[str, Any]:
    """The [data] settings that have defaults, as Recipe.to_dict writes them."""
    defaults = {f.name: f.default for f in dataclasses.fields(DataConfig) if f.default is not dataclasses.MISSING}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in defaults.items()}


def check_run_folder_shape(run_dir: Path) -> None:
    """Raise TfmError if `run_dir`, or a folder above it, is a file: --run names a folder."""
    blocking = file_in_the_way(run_dir)
    if blocking is not None:
        raise TfmError(f"{blocking}: is a file, not a folder; --run needs a folder (new or a run to resume)")


def check_run_dir(recipe: Recipe, run_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run without --resume, or to resume one that does not exist or differs."""
    check_run_folder_shape(run_dir)
    if resume:
        if not (run_dir / STATE_FILE).is_file():
            raise TfmError(f"{run_dir}: no {STATE_FILE} to resume from; drop --resume to start a new run")
        check_resumable(recipe, run_dir)
    elif (run_dir / STATE_FILE).is_file():
        raise TfmError(f"{run_dir} already holds a training run; add --resume to continue it, or choose another --run")


def write_metrics(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON object as a line to metrics.jsonl; a non-finite number is written as null.

    (NaN and Infinity are not JSON: strict readers, jq among them, reject the whole line.)
    """
    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(finite, sort_keys=True, allow_nan=False) + "\n")


def truncate_metrics(path: Path, step: int) -> int:
    """Drop metrics.jsonl records after `step` (written by a session that died after its last save).

    Lines that are not JSON objects with an integer step (a write cut short by a full disk, say) are
    dropped too; returns how many such damaged lines there were, for the caller to report.
    """
    if not path.is_file():
        return 0
    kept, damaged = [], 0
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not (isinstance(record, dict) and isinstance(record.get("step", 0), int)):
            damaged += 1
        elif record.get("step", 0) <= step:
            kept.append(line + "\n")
    atomic_write_bytes(path, "".join(kept).encode("utf-8"))
    return damaged
