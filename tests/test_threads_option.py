"""--threads, shared by every command that runs the model: refused below 0 and above 1024, restored afterwards."""

from __future__ import annotations

import pytest
import torch

from conftest import REPO_ROOT, run_cli


@pytest.mark.parametrize("command", [
    ["translate", "-m", "MODEL"],
    ["score", "-m", "MODEL", "--src", "SRC", "--tgt", "SRC"],
    ["inspect-attention", "-m", "MODEL", "a b"],
    ["train", "RECIPE", "--run", "RUN"],
])
def test_a_negative_thread_count_is_one_error_naming_the_option(command):
    result = run_cli([*command, "--threads", "-4"], input="a b\n")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: --threads must be between 0 (the default) and 1024, got -4"


def test_an_in_process_command_leaves_the_callers_thread_count_alone(tmp_path, letters):
    from conftest import letter_settings

    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    recipe_options = letter_settings(letters, **{"train.max_steps": 1, "train.valid_bleu": "false", "train.best_metric": "loss"})
    result = run_cli(["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", tmp_path / "run", "--threads", wanted, "-q", *recipe_options])
    assert result.exit_code == 0, result.stderr
    assert torch.get_num_threads() == before
