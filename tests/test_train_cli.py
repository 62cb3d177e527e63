"""`tfm train` through the CLI: exact resume, Ctrl-C/SIGTERM/SIGKILL, atomic checkpoints, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO_ROOT, letter_settings, run_cli
from tfm_cli.checkpoints.format import read_checkpoint
from tfm_cli.training.lr_schedules import InverseSqrt, ScheduleSettings
from tfm_cli.textio.atomic_files import temp_file_beside

TINY = REPO_ROOT / "recipes" / "tiny.toml"


def settings(letters: dict[str, Path], **train: object) -> list[str]:
    """--set options: the tiny recipe on the letter data, with dropout on (so RNG state matters) and `train` keys."""
    values = {
        "model.dropout": 0.1, "model.attention_dropout": 0.1,
        "train.max_tokens": 256, "train.update_freq": 2, "train.warmup_steps": 5, "train.log_every": 1,
        "train.valid_every": 5, "train.save_every": 1000, "train.valid_max_len_a": 1.0, "train.valid_max_len_b": 2,
    }
    values.update({f"train.{key}": value for key, value in train.items()})
    return letter_settings(letters, **values)


def train(run: Path, options: list[str], resume: bool = False, recipe: Path | None = TINY):
    args = ["train", *([recipe] if recipe else []), "--run", run, "--threads", "1", *options]
    return run_cli(args + (["--resume"] if resume else []))


def error_lines(stderr: str) -> int:
    """How many `error:` lines stderr holds."""
    return sum(line.startswith("error:") for line in stderr.splitlines())


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint (the embedded tokenizer bytes left out)."""
    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


def test_n_steps_then_resume_n_steps_is_bit_identical_to_2n_steps(tmp_path, letters):
    straight = train(tmp_path / "straight", settings(letters, max_steps=14))
    assert straight.exit_code == 0, straight.stderr
    first = train(tmp_path / "resumed", settings(letters, max_steps=7))
    assert first.exit_code == 0, first.stderr
    second = train(tmp_path / "resumed", settings(letters, max_steps=14), resume=True)
    assert second.exit_code == 0, second.stderr
    assert "resumed at step 7" in second.stderr
    a = weights(tmp_path / "straight" / "checkpoint_last.safetensors")
    b = weights(tmp_path / "resumed" / "checkpoint_last.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), [n for n in a if not torch.equal(a[n], b[n])]
    # The run's data order crossed epoch boundaries and the resume point fell mid-epoch.
    updates_per_epoch = int(second.stderr.split(" updates per epoch")[0].rsplit(" ", 1)[-1])
    assert 7 % updates_per_epoch != 0 and 14 > updates_per_epoch
    # Every checkpoint carries the resolved recipe; the run directory has it as config.json.
    provenance = read_checkpoint(tmp_path / "resumed" / "checkpoint_last.safetensors").provenance
    assert provenance["step"] == 14 and provenance["recipe"]["train"]["max_steps"] == 14
    config = json.loads((tmp_path / "resumed" / "config.json").read_text())
    assert config["recipe"]["data"]["train_src"] == str(letters["train_src"])
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s <= 14] == steps and 14 in steps


def test_keep_last_and_checkpoint_names(tmp_path, letters):
    result = train(tmp_path / "run", settings(letters, max_steps=8, save_every=2, keep_last=2, valid_beam_size=2))
    assert result.exit_code == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "run").glob("checkpoint_*.safetensors"))
    assert names == ["checkpoint_00000006.safetensors", "checkpoint_00000008.safetensors",
                     "checkpoint_best.safetensors", "checkpoint_last.safetensors"]
    assert read_checkpoint(tmp_path / "run" / "checkpoint_best.safetensors").provenance["valid"]["bleu"] is not None


def test_patience_stops_after_validations_without_improvement(tmp_path, letters):
    # A peak learning rate of 1e-12 moves the weights by about 1e-12, which rounds away in every
    # float32 logit here, so the validation loss never improves after the first validation:
    # patience 2 must stop the run at the third.
    options = settings(letters, max_steps=50, valid_every=1, patience=2, best_metric="loss", valid_bleu="false")
    options += ["--set", "train.lr=1e-12", "--set", "model.dropout=0.0", "--set", "model.attention_dropout=0.0"]
    result = train(tmp_path / "run", options)
    assert result.exit_code == 0, result.stderr
    assert "done (patience) at step 3" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["kind"] == "valid"]
    assert [(r["step"], r["best"], r["bad_validations"]) for r in valid] == [(1, True, 0), (2, False, 1), (3, False, 2)]
    assert read_checkpoint(tmp_path / "run" / "checkpoint_best.safetensors").provenance["step"] == 1


def test_a_failed_checkpoint_write_leaves_the_previous_one_intact(tmp_path, letters, monkeypatch):
    run = tmp_path / "run"
    assert train(run, settings(letters, max_steps=4, save_every=2)).exit_code == 0
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("checkpoint_last.safetensors"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    failed = train(run, settings(letters, max_steps=6, save_every=2), resume=True)
    monkeypatch.setattr(os, "replace", real_replace)
    # A full disk is the machine's state, not a bug: one error line, exit 1, no traceback.
    assert failed.exit_code == 1 and error_lines(failed.stderr) == 1
    assert "No space left on device" in failed.stderr and "Traceback" not in failed.stderr
    assert read_checkpoint(run / "checkpoint_last.safetensors").provenance["step"] == 4
    assert not list(run.glob(".*.tmp")), "a temp file was left behind"
    # The training state was not advanced either, so the run resumes from step 4.
    again = train(run, settings(letters, max_steps=6, save_every=2), resume=True)
    assert again.exit_code == 0 and "resumed at step 4" in again.stderr


def start_process(run: Path, options: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "tfm_cli", "train", str(TINY), "--run", str(run), "--threads", "1", *options]
    # A shell starts background jobs with SIGINT ignored, and Python then installs no Ctrl-C handler:
    # give the child the default disposition, as a terminal's foreground job has.
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_steps(run: Path, count: int, process: subprocess.Popen, timeout: float = 90) -> None:
    """Wait until metrics.jsonl holds `count` training records (log_every = 1)."""
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        if metrics.is_file() and sum('"kind": "train"' in line for line in metrics.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"training did not reach {count} steps in {timeout} s")


def saved_step(run: Path) -> int:
    with open(run / "train_state.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return json.loads(header["__metadata__"]["counters"])["step"]


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_then_exits_128_plus_its_number(tmp_path, letters, signum, exit_code):
    # 143 after SIGTERM is what a process supervisor (systemd, Kubernetes, Slurm) expects back; a
    # script's `tfm train ... && tfm average ...` stops there, as after any interrupted command.
    run = tmp_path / "run"
    process = start_process(run, settings(letters, max_steps=100000, valid_every=100000))
    wait_for_steps(run, 3, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == exit_code, stderr.decode()
    assert "interrupted: saved step" in stderr.decode() and "error" not in stderr.decode()
    step = saved_step(run)
    assert step >= 3
    assert read_checkpoint(run / "checkpoint_last.safetensors").provenance["step"] == step
    resumed = train(run, settings(letters, max_steps=step + 2), resume=True, recipe=None)
    assert resumed.exit_code == 0, resumed.stderr
    assert f"resumed at step {step}" in resumed.stderr


def test_a_second_sigterm_aborts_at_once_and_still_exits_143(tmp_path, letters):
    run = tmp_path / "run"
    process = start_process(run, settings(letters, max_steps=100000, valid_every=100000))
    wait_for_steps(run, 3, process)
    process.send_signal(signal.SIGTERM)
    # The first asks for a save after the update; the second aborts (or comes after the save and exit).
    for line in iter(process.stderr.readline, b""):  # until the warning says the first was handled
        if b"saving a checkpoint after this update" in line:
            break
    else:
        pytest.fail("no warning after the first SIGTERM")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr.decode()
    assert "Traceback" not in stderr.decode()


def test_a_sigterm_while_the_data_is_prepared_exits_143(tmp_path, letters, monkeypatch):
    # The corpus cache answers a stop asked for between chunks by raising KeyboardInterrupt (nothing
    # to save yet); the run must still exit as SIGTERM asks, not as Ctrl-C.
    from tfm_cli import cli
    from tfm_cli.training import trainer

    def preparing(*args, should_stop, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled by `tfm train` (the main thread runs the CLI)
        assert should_stop()
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "run_training", preparing)
    previous = signal.signal(signal.SIGTERM, cli.interrupt_on_sigterm)  # as `tfm` (cli.main) installs it
    try:
        result = train(tmp_path / "run", settings(letters, max_steps=5))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: terminated (SIGTERM)"


def test_sigkill_loses_only_the_steps_since_the_last_save(tmp_path, letters):
    run = tmp_path / "run"
    process = start_process(run, settings(letters, max_steps=100000, valid_every=100000, save_every=2))
    wait_for_steps(run, 5, process)
    process.kill()
    process.communicate(timeout=60)
    step = saved_step(run)
    assert step >= 4
    # A kill in the middle of a save leaves its temp file (made here as the save makes it); resume
    # removes it, and not the temp file of another tool writing into the folder (tfm average here).
    fd, half_written = temp_file_beside(run / "checkpoint_last.safetensors")
    os.write(fd, b"half a checkpoint")
    os.close(fd)
    fd, other_tool = temp_file_beside(run / "average.safetensors")
    os.close(fd)
    resumed = train(run, settings(letters, max_steps=step + 1), resume=True)
    assert resumed.exit_code == 0, resumed.stderr
    assert f"resumed at step {step}" in resumed.stderr
    # (The kill may also have interrupted a real save, whose temp file goes too.)
    assert "temp file(s) left by an interrupted save" in resumed.stderr and Path(half_written).name in resumed.stderr
    assert [path.name for path in run.glob(".*.tmp")] == [Path(other_tool).name]


def test_different_line_counts_fail_before_training(tmp_path, letters):
    short = tmp_path / "short.tgt"
    short.write_text("".join(letters["train_tgt"].read_text().splitlines(keepends=True)[:150]))
    options = settings(letters, max_steps=2) + ["--set", f"data.train_tgt={short}", "--set", "tokenizer.src_model="]
    result = train(tmp_path / "run", options)
    assert result.exit_code == 1
    assert f"{letters['train_src']} has 200 lines but {short} has 150" in result.stderr
    assert error_lines(result.stderr) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "spm.model").exists()  # no tokenizer was trained, nothing else ran


def test_invalid_utf8_is_reported_with_file_and_line(tmp_path, letters):
    bad = tmp_path / "bad.src"
    lines = letters["train_src"].read_bytes().splitlines(keepends=True)
    lines[41] = b"a \xc3\x28 b\n"
    bad.write_bytes(b"".join(lines))
    result = train(tmp_path / "run", settings(letters, max_steps=2) + ["--set", f"data.train_src={bad}"])
    assert result.exit_code == 1
    assert f"{bad}:42: invalid UTF-8" in result.stderr


def test_empty_and_overlong_pairs_are_skipped_and_counted(tmp_path, letters):
    src = tmp_path / "train.src"
    tgt = tmp_path / "train.tgt"
    src_lines = letters["train_src"].read_text().splitlines()
    tgt_lines = letters["train_tgt"].read_text().splitlines()
    src_lines[3] = ""
    tgt_lines[5] = "  "
    src_lines[7] = " ".join("a" * 70)
    src.write_text("\n".join(src_lines) + "\n")
    tgt.write_text("\n".join(tgt_lines) + "\n")
    options = settings(letters, max_steps=1) + ["--set", f"data.train_src={src}", "--set", f"data.train_tgt={tgt}"]
    result = train(tmp_path / "run", options)
    assert result.exit_code == 0, result.stderr
    assert "train data: 200 pairs read, 197 kept" in result.stderr
    assert "skipped 2 pairs with an empty side, 1 pair over data.max_length (64) tokens" in result.stderr


@pytest.mark.parametrize(
    "options, message",
    [
        (["--set", "train.max_stepz=3"], "unknown key train.max_stepz"),
        (["--set", "model.n_heads=true"], "model.n_heads must be an integer"),
        (["--set", "train.precision=fp16", "--device", "cpu"], "needs a CUDA device"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, letters, options, message):
    result = train(tmp_path / "run", settings(letters, max_steps=1) + options)
    assert result.exit_code == 1
    assert message in result.stderr and error_lines(result.stderr) == 1


def test_a_recipe_with_an_unknown_key_names_it(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(TINY.read_text().replace("[model]\n", "[model]\nlayers = 3\n"))
    result = run_cli(["train", recipe, "--run", tmp_path / "run"])
    assert result.exit_code == 1 and "unknown key model.layers" in result.stderr


def test_an_existing_run_needs_resume_and_resume_needs_a_run(tmp_path, letters):
    run = tmp_path / "run"
    missing = train(run, settings(letters, max_steps=1), resume=True)
    assert missing.exit_code == 1 and "no run to resume" not in missing.stderr and "--resume" in missing.stderr
    assert train(run, settings(letters, max_steps=1)).exit_code == 0
    again = train(run, settings(letters, max_steps=2))
    assert again.exit_code == 1 and "already holds a training run" in again.stderr
    changed = train(run, settings(letters, max_steps=2) + ["--set", "model.d_model=64"], resume=True)
    assert changed.exit_code == 1 and "model.d_model" in changed.stderr


def test_max_epochs_stops_at_the_end_of_an_epoch(tmp_path, letters):
    result = train(tmp_path / "run", settings(letters, max_epochs=2, valid_every=1000))
    assert result.exit_code == 0, result.stderr
    updates_per_epoch = int(result.stderr.split(" updates per epoch")[0].rsplit(" ", 1)[-1])
    assert f"done (max_epochs) at step {2 * updates_per_epoch} after 2 full epochs" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records].count("valid") == 1  # validation at the end
    assert all(0.0 <= r["padding"] < 1.0 and r["tgt_tokens_per_s"] > 0 for r in records if r["kind"] == "train")


def strict_json(line: str) -> dict:
    """json.loads that refuses NaN and Infinity, as strict JSON readers (jq, JavaScript) do."""
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def test_inf_nan_updates_are_skipped_counted_and_stop_the_run(tmp_path, letters):
    """lr = 1e30 blows the weights up after the first update; every later loss is inf/nan."""
    run = tmp_path / "run"
    options = settings(letters, max_steps=40, lr=1e30, warmup_steps=1, max_bad_steps=3, valid_every=1000, log_every=1)
    result = train(run, options)
    assert result.exit_code == 1
    assert error_lines(result.stderr) == 1 and "Traceback" not in result.stderr
    assert "3 updates in a row had an inf/nan loss or gradient" in result.stderr
    records = [strict_json(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert train_records[-1]["nonfinite_steps"] == 3
    # Skipped updates move neither the step counter nor the learning-rate schedule (fairseq's rule):
    # one update was applied, and the three skipped ones all ran at step 2's learning rate.
    assert train_records[-1]["step"] == 1
    assert train_records[-1]["lr"] == InverseSqrt(ScheduleSettings(1e30, warmup_steps=1, d_model=32)).rate(2)
    assert train_records[-1]["loss"] is None and train_records[-1]["ppl"] is None
    assert train_records[0]["loss"] is not None
    # The last weights (those of the last good update) were saved before stopping, at the stop's step.
    assert read_checkpoint(run / "checkpoint_last.safetensors").provenance["step"] == 1
