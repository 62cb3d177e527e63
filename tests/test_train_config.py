"""Recipes: every shipped recipe loads; paths, ${VAR:-default}, --set overrides; errors name the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from tfm_cli.config import CHECKPOINT_DECODE_KEYS, RECIPE_DECODE_KEYS, DecodeConfig, ModelShape
from tfm_cli.errors import TfmError
from tfm_cli.recipe import load_recipe

# Self-contained recipes (the quickstart's [data] is filled in by its own script).
RECIPES = [REPO_ROOT / "recipes" / "tiny.toml", *sorted((REPO_ROOT / "recipes" / "multi30k").glob("*.toml"))]


@pytest.mark.parametrize("path", RECIPES, ids=[str(p.relative_to(REPO_ROOT)) for p in RECIPES])
def test_every_shipped_recipe_loads_and_points_at_existing_data(path, multi30k_dir, monkeypatch):
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    recipe = load_recipe(path, [])
    for name in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        assert Path(getattr(recipe.data, name)).is_file(), name
    assert recipe.model_config(8000, 8000).d_model == recipe.model.d_model


def test_multi30k_recipe_without_its_data_folder_names_the_variable(monkeypatch):
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    with pytest.raises(TfmError, match="environment variable MULTI30K_DIR is not set"):
        load_recipe(REPO_ROOT / "recipes" / "multi30k" / "de-en.toml", [])


def write_recipe(folder: Path, text: str) -> Path:
    path = folder / "recipe.toml"
    path.write_text(text, encoding="utf-8")
    return path


MINIMAL = '[data]\ntrain_src = "data/a.de"\ntrain_tgt = "${CORPUS:-data}/a.en"\n[train]\nmax_steps = 10\n'


def test_paths_resolve_against_the_recipe_folder_and_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("CORPUS", raising=False)
    recipe = load_recipe(write_recipe(tmp_path, MINIMAL), [])
    assert recipe.data.train_src == str(tmp_path / "data" / "a.de")
    assert recipe.data.train_tgt == str(tmp_path / "data" / "a.en")
    monkeypatch.setenv("CORPUS", "/corpora/x")
    assert load_recipe(write_recipe(tmp_path, MINIMAL), []).data.train_tgt == "/corpora/x/a.en"


def test_a_relative_folder_in_the_environment_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    # `MULTI30K_DIR=../shared/data/multi30k bash recipes/multi30k/run.sh` names a folder from where the user is.
    recipe_folder = tmp_path / "recipes"
    recipe_folder.mkdir()
    working = tmp_path / "work" / "project"
    working.mkdir(parents=True)
    monkeypatch.chdir(working)
    monkeypatch.setenv("CORPUS", "../corpora")
    recipe = load_recipe(write_recipe(recipe_folder, MINIMAL), [])
    assert recipe.data.train_tgt == str(tmp_path / "work" / "corpora" / "a.en")
    assert recipe.data.train_src == str(recipe_folder / "data" / "a.de")  # a literal path stays the recipe's


def test_overrides_parse_toml_values_and_resolve_paths_against_cwd(tmp_path):
    overrides = ["train.max_tokens=2048", "train.lr=1e-3", "model.share_embeddings=true",
                 "train.best_metric=loss", "data.valid_src=v.de", "data.valid_tgt=v.en",
                 "tokenizer.user_defined_symbols=['<sep>']"]
    recipe = load_recipe(write_recipe(tmp_path, MINIMAL), overrides, cwd=Path("/work/elsewhere"))
    assert recipe.train.max_tokens == 2048 and recipe.train.lr == 1e-3 and recipe.train.best_metric == "loss"
    assert recipe.model == ModelShape(share_embeddings=True)
    assert recipe.data.valid_src == "/work/elsewhere/v.de"
    assert recipe.tokenizer.train_settings().user_defined_symbols == ("<sep>",)


@pytest.mark.parametrize(
    "extra, overrides, message",
    [
        ("[model]\nd_modle = 64\n", [], "unknown key model.d_modle"),
        ("[model]\nsrc_vocab_size = 64\n", [], "model.src_vocab_size comes from the tokenizer"),
        ("", ["train.max_steps=ten"], "train.max_steps must be of type int"),
        ("", ["train.warmup=10"], "unknown key train.warmup"),
        ("", ["tokenizer.vocab=10"], "unknown key tokenizer.vocab"),
        ("", ["optim.lr=1"], "unknown section"),
        ("", ["train.lr"], "expected section.key=value"),
        ("[model]\nd_model = 60\nn_heads = 8\n", [], "divisible"),
        ("[extra]\nx = 1\n", [], r"unknown recipe section \[extra\]"),
        ("", ["train.max_steps=0"], "nothing stops training"),
        ("", ["model.share_embeddings=true", "tokenizer.joint=false"], "needs tokenizer.joint = true"),
        ("", ["data.train_src=${NO_SUCH_VARIABLE_TFM}/a"], "NO_SUCH_VARIABLE_TFM is not set"),
    ],
)
def test_bad_recipes_name_the_key(tmp_path, extra, overrides, message):
    with pytest.raises(TfmError, match=message):
        load_recipe(write_recipe(tmp_path, MINIMAL + extra), overrides)


def test_a_recipe_that_is_not_toml_names_the_file(tmp_path):
    with pytest.raises(TfmError, match="recipe.toml: not valid TOML"):
        load_recipe(write_recipe(tmp_path, "[data\n"), [])


def test_the_decode_keys_a_recipe_sets_are_ones_a_checkpoint_may_carry():
    fields = {field.name for field in dataclasses.fields(DecodeConfig)}
    assert set(RECIPE_DECODE_KEYS) <= set(CHECKPOINT_DECODE_KEYS) <= fields
