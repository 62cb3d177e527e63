"""Files and folders in the wrong shape: outputs under a file, a folder where a file goes, damaged run folders.

Each case is one `error:` line naming the path and what is wrong, exit 1, no traceback, and nothing
written (no output, no temp file).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, letter_settings, rewritten_checkpoint, run_cli

TINY = REPO_ROOT / "recipes" / "tiny.toml"


def assert_one_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in errors[0], result.stderr


@pytest.fixture
def a_file(tmp_path) -> Path:
    """A regular file where a folder is expected."""
    path = tmp_path / "notes.txt"
    path.write_text("not a folder\n")
    return path


@pytest.mark.parametrize("command", ["tokenize train", "tokenize encode", "translate", "average", "train"])
def test_an_output_under_a_regular_file_names_that_file(tmp_path, a_file, command, synthetic, small_spm,
                                                        random_checkpoint, letters):
    under = a_file / "out"
    args = {
        "tokenize train": ["tokenize", "train", synthetic["train.src"], "-o", under / "spm", "--vocab-size", "100"],
        "tokenize encode": ["tokenize", "encode", "-m", small_spm, "-o", under],
        "translate": ["translate", "-m", random_checkpoint, "-b", "1", "--max-len-b", "2", "-o", under],
        "average": ["average", random_checkpoint, "-o", under],
        "train": ["train", TINY, "--run", under / "run", *letter_settings(letters, **{"train.max_steps": 1})],
    }[command]
    result = run_cli(args, input="a b\n")
    assert_one_error(result, f"{a_file}: is a file, not a folder")
    assert a_file.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_train_run_that_is_a_file_is_refused(tmp_path, a_file, letters):
    result = run_cli(["train", TINY, "--run", a_file, *letter_settings(letters, **{"train.max_steps": 1})])
    assert_one_error(result, f"{a_file}: is a file, not a folder; --run needs a folder")
    assert a_file.read_text() == "not a folder\n"


def test_average_output_that_is_a_folder_is_refused_before_reading(tmp_path, random_checkpoint):
    folder = tmp_path / "out"
    folder.mkdir()
    result = run_cli(["average", random_checkpoint, "-o", folder])
    assert_one_error(result, f"{folder}: is a directory, expected an output file path")
    assert "read " not in result.stderr  # refused before any input was read
    assert list(folder.iterdir()) == []


def test_average_run_that_is_a_file_says_so(a_file):
    result = run_cli(["average", "--run", a_file, "-o", a_file.parent / "avg.safetensors"])
    assert_one_error(result, f"{a_file}: is a file; --run needs a `tfm train` run folder")


def test_a_folder_given_as_a_tokenizer_model_says_it_is_a_folder(tmp_path):
    result = run_cli(["tokenize", "encode", "-m", tmp_path], input="a b\n")
    assert_one_error(result, f"{tmp_path}: is a directory, expected a file")


# A finished 2-step run, copied and damaged per case, then resumed.
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, letters) -> Path:
    run = tmp_path_factory.mktemp("finished") / "run"
    options = letter_settings(letters, **{"train.max_steps": 2, "train.save_every": 2, "train.valid_every": 2})
    result = run_cli(["train", TINY, "--run", run, "--threads", "1", "-q", *options])
    assert result.exit_code == 0, result.stderr
    return run


def edit_config(change):
    def damage(run: Path) -> None:
        path = run / "config.json"
        path.write_text(change(path.read_text()))
    return damage


def edit_state(tensors=None, metadata=None, truncate: bool = False):
    def damage(run: Path) -> None:
        path = run / "train_state.safetensors"
        if truncate:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            return
        rewritten_checkpoint(path, path, metadata=metadata, tensors=tensors)  # any safetensors file will do
    return damage


def drop_first(prefix: str, suffix: str = ""):
    def change(values: dict[str, torch.Tensor]) -> None:
        name = next(n for n in sorted(values) if n.startswith(prefix) and n.endswith(suffix))
        del values[name]
    return change


def reshape_first_moment(values: dict[str, torch.Tensor]) -> None:
    name = next(n for n in sorted(values) if n.startswith("optimizer.") and n.endswith(".exp_avg"))
    values[name] = values[name].flatten()[:3].clone()


DAMAGE = [
    ("config not JSON", edit_config(lambda text: text[:40]), "config.json: damaged run config (not JSON)"),
    ("config a list", edit_config(lambda text: "[1, 2]"), "config.json: damaged run config (not a JSON object)"),
    ("config recipe.model a list", edit_config(lambda text: json.dumps({"recipe": {"model": [1]}})),
     "recipe.model is not an object"),
    ("state truncated", edit_state(truncate=True), "train_state.safetensors: unreadable training state"),
    ("state lacks a moment", edit_state(tensors=drop_first("optimizer.", ".exp_avg_sq")), "lacks or adds tensor"),
    ("state moment mis-shaped", edit_state(tensors=reshape_first_moment), "has shape (3,)"),
    ("state lacks the RNG", edit_state(tensors=drop_first("rng.cpu")), "no tensor 'rng.cpu'"),
    ("counters not JSON", edit_state(metadata=lambda m: m.update(counters="{step")), "counters metadata is not JSON"),
    ("counters a list", edit_state(metadata=lambda m: m.update(counters="[1]")), "counters is not a JSON object"),
    ("counter negative", edit_state(metadata=lambda m: m.update(counters=json.dumps({"step": -3}))),
     "counter step = -3"),
    ("counter unknown", edit_state(metadata=lambda m: m.update(counters=json.dumps({"steps": 3}))),
     "unknown counter 'steps'"),
    ("scaler not JSON", edit_state(metadata=lambda m: m.update(scaler="{")), "scaler metadata is not JSON"),
]


@pytest.mark.parametrize("name, damage, message", DAMAGE, ids=[case[0] for case in DAMAGE])
def test_resuming_a_damaged_run_names_the_file_and_the_damage(tmp_path, finished_run, letters, name, damage, message):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run)
    before = sorted(p.name for p in run.iterdir())
    options = letter_settings(letters, **{"train.max_steps": 4}) if name.startswith("state") or "counter" in name \
        or "scaler" in name else []
    result = run_cli(["train", *([TINY] if options else []), "--run", run, "--resume", "--threads", "1", *options])
    assert_one_error(result, message)
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written, no temp file


def test_a_metrics_line_that_is_not_an_object_does_not_stop_a_resume(tmp_path, finished_run, letters):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("[1, 2]\n\"text\"\n")
    result = run_cli(["train", TINY, "--run", run, "--resume", "--threads", "1",
                      *letter_settings(letters, **{"train.max_steps": 3})])
    assert result.exit_code == 0, result.stderr
    assert "dropped 2 damaged line(s) of metrics.jsonl" in result.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(record, dict) for record in records)


def test_tokenize_train_prefix_that_is_a_folder_is_refused(tmp_path, synthetic):
    folder = tmp_path / "spmdir"
    folder.mkdir()
    for prefix in (f"{folder}/", str(folder)):
        result = run_cli(["tokenize", "train", synthetic["train.src"], "-o", prefix, "--vocab-size", "100"])
        assert_one_error(result, "is a folder; -o takes a file prefix")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spmdir"] and list(folder.iterdir()) == []


def test_a_metrics_file_with_bytes_that_are_not_utf8_does_not_stop_a_resume(tmp_path, finished_run, letters):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 1, "x": "\xff"}\n')
    result = run_cli(["train", TINY, "--run", run, "--resume", "--threads", "1", "-q",
                      *letter_settings(letters, **{"train.max_steps": 3})])
    assert result.exit_code == 0, result.stderr


def test_a_file_where_the_run_keeps_its_cache_is_named(tmp_path, letters):
    run = tmp_path / "run"
    run.mkdir()
    (run / "cache").write_text("not a folder\n")
    result = run_cli(["train", TINY, "--run", run, *letter_settings(letters, **{"train.max_steps": 1})])
    assert_one_error(result, f"{run / 'cache'}: is a file, not a folder")


def test_a_folder_named_config_json_is_not_taken_for_a_missing_run(tmp_path, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "config.json").unlink()
    (run / "config.json").mkdir()
    result = run_cli(["train", "--run", run, "--resume"])
    assert_one_error(result, f"{run / 'config.json'}: is not a file")


def test_a_recipe_read_from_a_pipe_works(tmp_path, letters):
    import subprocess
    import sys

    options = " ".join(f"'{item}'" for item in letter_settings(letters, **{"train.max_steps": 1}))
    command = (f'"{sys.executable}" -m tfm_cli train <(cat "{TINY}") --run "{tmp_path / "run"}" --threads 1 -q '
               f"{options}")
    process = subprocess.run(["bash", "-c", command], capture_output=True, timeout=300)
    assert process.returncode == 0, process.stderr.decode()
    assert (tmp_path / "run" / "checkpoint_last.safetensors").is_file()


def test_tokenize_train_names_stdin_not_its_temp_copy(tmp_path):
    empty = run_cli(["tokenize", "train", "-", "-o", tmp_path / "spm"], input="")
    assert_one_error(empty, "<stdin>: the file is empty")
    twice = run_cli(["tokenize", "train", "-", "-", "-o", tmp_path / "spm"], input="a b\n")
    assert_one_error(twice, "stdin (-) is given more than once")
    assert list(tmp_path.iterdir()) == []
