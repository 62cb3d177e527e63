"""train.ema_decay: the moving average of the weights, checked against the recurrence computed here in
float64 from the run's own step checkpoints, across a resume."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import REPO_ROOT, letter_settings, run_cli
from tfm_cli.training.moving_average import moving_average_decay

TINY = REPO_ROOT / "recipes" / "tiny.toml"
DECAY = 0.3  # (1 + t) / (10 + t) is 0.25 at update 2 and above 0.3 from update 3: both regimes are used


def weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


def ema_settings(letters, **values) -> list[str]:
    # warmup 1: every update moves the weights by ~lr, so a wrong decay shows far above the tolerance.
    return letter_settings(letters, **{"model.dropout": 0.0, "train.max_tokens": 200, "train.valid_every": 1000,
                                       "train.warmup_steps": 1, "train.save_every": 1, "train.keep_last": 0,
                                       "train.ema_decay": DECAY, **values})


def test_the_decay_is_capped_by_the_step_early_on():
    assert moving_average_decay(0.999, 1) == pytest.approx(2 / 11)
    assert moving_average_decay(0.999, 100) == pytest.approx(101 / 110)
    assert moving_average_decay(0.999, 10**6) == 0.999


def test_checkpoint_ema_follows_every_update_and_resumes_exactly(tmp_path, letters):
    first = run_cli(["train", TINY, "--run", tmp_path / "resumed", "--threads", "1",
                     *ema_settings(letters, **{"train.max_steps": 1})])
    assert first.exit_code == 0, first.stderr
    run = tmp_path / "resumed"
    shutil.copy(run / "checkpoint_ema.safetensors", tmp_path / "ema_1.safetensors")
    resumed = run_cli(["train", "--run", run, "--resume", "--threads", "1", "--set", "train.max_steps=4"])
    assert resumed.exit_code == 0, resumed.stderr

    # The recurrence, in float64, from the average after update 1 and the weights after updates 2-4.
    expected = {name: tensor.double() for name, tensor in weights(tmp_path / "ema_1.safetensors").items()}
    for step in (2, 3, 4):
        current = weights(run / f"checkpoint_{step:08d}.safetensors")
        decay = min(DECAY, (1 + step) / (10 + step))
        expected = {name: decay * value + (1 - decay) * current[name].double() for name, value in expected.items()}
    got = weights(run / "checkpoint_ema.safetensors")
    last = weights(run / "checkpoint_last.safetensors")
    assert set(got) == set(last)
    for name, value in expected.items():
        torch.testing.assert_close(got[name].double(), value, rtol=0, atol=1e-6, msg=name)
    assert max((got[name] - last[name]).abs().max().item() for name in got) > 1e-4  # an average, not the weights

    # Four updates straight give the same average, bit for bit.
    straight = run_cli(["train", TINY, "--run", tmp_path / "straight", "--threads", "1",
                        *ema_settings(letters, **{"train.max_steps": 4})])
    assert straight.exit_code == 0, straight.stderr
    straight_ema = weights(tmp_path / "straight" / "checkpoint_ema.safetensors")
    for name in got:
        assert torch.equal(straight_ema[name], got[name]), name

    with safe_open(str(run / "checkpoint_ema.safetensors"), framework="pt") as f:
        provenance = json.loads(f.metadata()["provenance"])
    assert provenance["weights"] == "exponential moving average" and provenance["step"] == 4
    translated = run_cli(["translate", "-m", run / "checkpoint_ema.safetensors", "--threads", "1"], input="abc\n")
    assert translated.exit_code == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 1


def test_a_run_without_the_average_has_no_checkpoint_ema(tmp_path, letters):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", "--threads", "1",
                      *ema_settings(letters, **{"train.max_steps": 1, "train.ema_decay": 0.0})])
    assert result.exit_code == 0, result.stderr
    assert not (tmp_path / "run" / "checkpoint_ema.safetensors").exists()


def one_line_error(result, message: str) -> None:
    """The command failed with one error line matching `message` (after any progress lines) and no traceback."""
    assert result.exit_code != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), result.stderr


@pytest.mark.parametrize("value", ["1.0", "-0.1"])
def test_a_decay_outside_0_1_is_one_line(tmp_path, letters, value):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *ema_settings(letters), "--set", f"train.ema_decay={value}"])
    one_line_error(result, r"train.ema_decay must be in \[0, 1\)")


def test_turning_the_average_on_when_resuming_is_one_line(tmp_path, letters):
    first = run_cli(["train", TINY, "--run", tmp_path / "run", "--threads", "1",
                     *ema_settings(letters, **{"train.max_steps": 1, "train.ema_decay": 0.0})])
    assert first.exit_code == 0, first.stderr
    resumed = run_cli(["train", "--run", tmp_path / "run", "--resume", "--threads", "1",
                       "--set", "train.max_steps=2", "--set", "train.ema_decay=0.5"])
    one_line_error(resumed, "no moving average of the weights .*start a new --run")
