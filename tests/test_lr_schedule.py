"""Budget-aware learning-rate schedules: values by hand, the budget's fraction from steps, epochs or time,
what a run logs, and exact resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO_ROOT, letter_settings, run_cli
from tfm_cli.config import LR_SCHEDULES, TrainConfig
from tfm_cli.distributed import FAIL_AT_ENV
from tfm_cli.errors import TfmError
from tfm_cli.training.lr_schedules import SCHEDULES, OneCycle, ScheduleSettings, make_schedule, train_schedule

TINY = REPO_ROOT / "recipes" / "tiny.toml"


def scheduled(step, warmup_steps, peak_lr, kind, budget_used, d_model=512):
    return make_schedule(kind, ScheduleSettings(peak_lr, warmup_steps, d_model)).rate(step, budget_used)


def test_linear_and_cosine_warm_up_then_reach_zero_at_the_end_of_the_budget():
    # Warmup: 100 steps to the peak 1e-3, times the decay of the budget used so far.
    assert scheduled(50, 100, 1e-3, "linear", 0.05) == pytest.approx(0.5e-3 * 0.95)
    assert scheduled(400, 100, 1e-3, "linear", 0.4) == pytest.approx(0.6e-3)
    assert scheduled(1000, 100, 1e-3, "linear", 1.0) == 0.0
    assert scheduled(500, 100, 1e-3, "cosine", 0.5) == pytest.approx(0.5e-3)
    assert scheduled(250, 100, 1e-3, "cosine", 0.25) == pytest.approx(1e-3 * (1 + math.sqrt(0.5)) / 2)
    assert scheduled(1000, 100, 1e-3, "cosine", 1.0) == pytest.approx(0.0, abs=1e-18)
    # Past the budget (a resume with a shorter limit) the rate stays at zero, never negative.
    assert scheduled(2000, 100, 1e-3, "linear", 1.7) == 0.0
    # The paper's schedule does not use the budget.
    assert scheduled(300, 100, 1e-3, "inverse_sqrt", 0.9) == scheduled(300, 100, 1e-3, "inverse_sqrt", 0.0)
    assert scheduled(400, 100, 1e-3, "inverse_sqrt", 0.9) == pytest.approx(0.5e-3)


def test_one_cycle_warms_up_over_its_steps_then_falls_to_zero_at_the_last_update():
    # train-aligner's schedule over 40 updates, 4 of warm-up: (k / 4) then a cosine over updates 5..40.
    schedule = OneCycle(ScheduleSettings(2e-3, warmup_steps=4, total_steps=40))
    assert [schedule.rate(k) for k in (1, 2, 4)] == pytest.approx([0.5e-3, 1e-3, 2e-3])
    assert schedule.rate(5) == pytest.approx(2e-3)  # the cosine starts at its top
    assert schedule.rate(23) == pytest.approx(1e-3)  # half way through the 36 updates after warm-up
    assert schedule.rate(41) == pytest.approx(0.0, abs=1e-18)
    assert schedule.rate(10, budget_used=0.9) == schedule.rate(10)


def test_every_schedule_a_recipe_may_name_has_its_class():
    assert set(LR_SCHEDULES) <= set(SCHEDULES)
    for name in LR_SCHEDULES:
        config = TrainConfig(lr_schedule=name, lr=1e-3, max_steps=10)
        assert train_schedule(config, 512).name == name


@pytest.mark.parametrize(("values", "message"), [
    ({"lr_schedule": "step", "max_steps": 10}, "train.lr_schedule must be one of inverse_sqrt, linear, cosine"),
    ({"lr_schedule": "linear", "max_steps": 10}, "needs the peak learning rate train.lr > 0"),
    ({"lr_schedule": "cosine", "lr": 1e-3, "patience": 3}, "decays to zero at the end of the budget"),
])
def test_schedule_settings_that_cannot_work_are_refused(values, message):
    with pytest.raises(TfmError, match=message):
        TrainConfig(**values)


def run(tmp_path, name, letters, *extra):
    settings = letter_settings(letters, **{"model.dropout": 0.0, "train.lr": 3e-3, "train.warmup_steps": 3,
                                           "train.lr_schedule": "linear", "train.log_every": 1,
                                           "train.valid_every": 1000, "train.max_tokens": 256})
    result = run_cli(["train", TINY, "--run", tmp_path / name, "--threads", "1", *settings, *extra])
    assert result.exit_code == 0, result.stderr
    return tmp_path / name


def test_a_step_budget_decays_to_zero_and_resumes_exactly(tmp_path, letters, monkeypatch):
    straight = run(tmp_path, "straight", letters, "--set", "train.max_steps=12", "--set", "train.save_every=5")
    lrs = [r["lr"] for r in map(json.loads, (straight / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    # Update k (1-based) runs at 3e-3 * min(k / 3, 1) * (1 - (k - 1) / 12).
    assert lrs == pytest.approx([3e-3 * min(k / 3, 1) * (1 - (k - 1) / 12) for k in range(1, 13)])
    # The same run dies before update 7 (after its save at step 5) and is resumed: the schedule goes on
    # from step 5 of the same 12-step budget, to the same weights.
    monkeypatch.setenv(FAIL_AT_ENV, "0:7")
    with pytest.raises(RuntimeError, match="fails on purpose before update 7"):
        run(tmp_path, "resumed", letters, "--set", "train.max_steps=12", "--set", "train.save_every=5")
    monkeypatch.delenv(FAIL_AT_ENV)
    resumed = run_cli(["train", "--run", tmp_path / "resumed", "--resume", "--threads", "1"])
    assert resumed.exit_code == 0 and "resumed at step 5" in resumed.stderr, resumed.stderr
    expected = load_file(str(straight / "checkpoint_last.safetensors"))
    got = load_file(str(tmp_path / "resumed" / "checkpoint_last.safetensors"))
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_a_time_budget_anneals_by_the_training_time_used(tmp_path, letters):
    folder = run(tmp_path, "timed", letters, "--set", "train.max_minutes=0.05", "--set", "train.max_steps=100000")
    records = [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    lrs = [r["lr"] for r in records]
    assert len(lrs) > 5, "the 3-second budget should hold a few updates"
    after_warmup = lrs[3:]
    assert all(later < earlier for earlier, later in zip(after_warmup, after_warmup[1:]))
    # The run stops once the budget is spent, so its last updates run near zero.
    assert after_warmup[-1] < 0.2 * 3e-3
