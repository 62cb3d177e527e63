"""`torchrun -m tfm_cli train` with 2 CPU processes (gloo): same weights as one process, resume, failing ranks.

Eight torchrun launches in all (each a few seconds of torch imports): a straight 2-process run (and one with a
budgeted learning-rate schedule, and one drawing subword segmentations); a 2-process run whose rank 1 dies (tfm_cli.distributed.FAIL_AT_ENV) after a save, then resumed; a run
whose rank 0 fails while preparing the data; one with fewer batches than ranks; and one whose rank 0
prepares for longer than train.dist_timeout (tfm_cli.distributed.PREPARE_DELAY_ENV).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO_ROOT, run_cli
from tfm_cli.distributed import FAIL_AT_ENV, PREPARE_DELAY_ENV
from tfm_cli.training.run_dir import STATE_FILE

TINY = REPO_ROOT / "recipes" / "tiny.toml"
STEPS = 4


@pytest.fixture(scope="module")
def data(letters) -> dict[str, Path]:
    """The letter-reversal data of conftest.letters (200 training pairs, 20 validation pairs)."""
    return letters


def options(data: dict[str, Path], **train: object) -> list[str]:
    """--set options for the tiny recipe; dropout off, so a 2-process run can equal a 1-process one."""
    values = {
        "data.train_src": data["train_src"], "data.train_tgt": data["train_tgt"],
        "data.valid_src": data["valid_src"], "data.valid_tgt": data["valid_tgt"],
        "tokenizer.src_model": data["spm"], "model.dropout": 0.0, "model.attention_dropout": 0.0,
        "train.max_tokens": 256, "train.warmup_steps": 5, "train.log_every": 1, "train.valid_every": 1000,
        "train.valid_bleu": "false", "train.best_metric": "loss", "train.save_every": 1000,
        "train.max_steps": STEPS, "train.dist_timeout": 30,
        "train.precision": "fp32",  # the comparisons are exact to 1e-5, which holds in float32 only
    }
    values.update({f"train.{key}": value for key, value in train.items()})
    return [item for key, value in values.items() for item in ("--set", f"{key}={value}")]


def torchrun(
    run: Path, settings: list[str], resume: bool = False, env: dict[str, str] | None = None,
    log_dir: Path | None = None, timeout: float = 120,
) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node 2 -m tfm_cli train ...` (--run-dir: see train).

    With log_dir, each rank's stderr also goes to a file there (see rank_stderr). Past `timeout` seconds,
    torchrun gets SIGTERM (which it passes on to the workers, in their own sessions) and TimeoutExpired is raised.
    """
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        *(["--log-dir", str(log_dir), "--tee", "2"] if log_dir else []),
        "-m", "tfm_cli", "train", str(TINY), "--run-dir", str(run), "--threads", "1", *settings,
        *(["--resume"] if resume else []),
    ]
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()  # a plain kill would leave the workers running until train.dist_timeout
        process.communicate(timeout=60)
        raise
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def rank_stderr(log_dir: Path, rank: int) -> str:
    """The stderr of one rank of a torchrun launch with --log-dir (LOG_DIR/RUN_ID/attempt_0/RANK/stderr.log)."""
    (path,) = log_dir.glob(f"*/attempt_0/{rank}/stderr.log")
    return path.read_text()


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint (the embedded tokenizer bytes left out)."""
    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def two_process_run(data, tmp_path_factory) -> Path:
    """A straight 2-process run of STEPS updates, update_freq 1 per rank (2 batches per update in all)."""
    run = tmp_path_factory.mktemp("ddp") / "straight"
    result = torchrun(run, options(data))
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_two_processes_give_the_weights_of_one_process_with_the_same_effective_batch(tmp_path, data, two_process_run):
    single = run_cli(["train", TINY, "--run", tmp_path / "single", "--threads", "1",
                      *options(data, update_freq=2)])
    assert single.exit_code == 0, single.stderr
    expected = weights(tmp_path / "single" / "checkpoint_last.safetensors")
    got = weights(two_process_run / "checkpoint_last.safetensors")
    assert got.keys() == expected.keys()  # saved from the unwrapped model: no DDP `module.` prefix
    assert not any(name.startswith("module.") for name in got)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)
    records = [json.loads(line) for line in (two_process_run / "metrics.jsonl").read_text().splitlines()]
    train_records = [record for record in records if record["kind"] == "train"]
    assert [record["step"] for record in train_records] == list(range(1, STEPS + 1))  # rank 0 alone writes
    assert train_records[-1]["loss"] < train_records[0]["loss"]  # it trained: equal untouched weights prove nothing


def test_a_budgeted_schedule_gives_every_rank_the_learning_rate_of_one_process(tmp_path, data):
    # With the largest seed the config takes: the ranks' own seeds, derived from it, once overflowed torch's 64 bits.
    linear = {"lr_schedule": "linear", "lr": 3e-3, "seed": 2**63 - 1}
    single = run_cli(["train", TINY, "--run", tmp_path / "single", "--threads", "1",
                      *options(data, update_freq=2, **linear)])
    assert single.exit_code == 0, single.stderr
    result = torchrun(tmp_path / "two", options(data, **linear))
    assert result.returncode == 0, result.stderr[-3000:]
    expected = weights(tmp_path / "single" / "checkpoint_last.safetensors")
    got = weights(tmp_path / "two" / "checkpoint_last.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)


def test_two_processes_draw_the_subword_segmentations_of_one_process(tmp_path, data):
    # Every rank draws the epoch's segmentations from (seed, epoch): the batches are one process's.
    sampling = ["--set", "data.subword_nbest=8", "--set", "data.subword_alpha=0.2"]
    single = run_cli(["train", TINY, "--run", tmp_path / "single", "--threads", "1",
                      *options(data, update_freq=2), *sampling])
    assert single.exit_code == 0, single.stderr
    result = torchrun(tmp_path / "two", [*options(data), *sampling])
    assert result.returncode == 0, result.stderr[-3000:]
    expected = weights(tmp_path / "single" / "checkpoint_last.safetensors")
    got = weights(tmp_path / "two" / "checkpoint_last.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)


def test_a_failing_rank_stops_the_run_with_an_error_and_the_run_resumes(tmp_path, data, two_process_run):
    run = tmp_path / "failing"
    failed = torchrun(run, options(data, save_every=2), env={FAIL_AT_ENV: "1:3"})
    assert failed.returncode != 0
    assert "rank 1 fails on purpose before update 3" in failed.stderr
    assert (run / "checkpoint_00000002.safetensors").is_file()
    assert not (run / "checkpoint_00000003.safetensors").exists()

    resumed = torchrun(run, options(data, save_every=2), resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at step 2" in resumed.stderr
    got = weights(run / "checkpoint_last.safetensors")
    expected = weights(two_process_run / "checkpoint_last.safetensors")
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_resume_with_another_number_of_processes_is_refused(data, two_process_run):
    result = run_cli(["train", "--run", two_process_run, "--resume", "--threads", "1",
                      "--set", f"train.max_steps={STEPS + 1}"])
    assert result.exit_code == 1
    assert "trained with 2 process(es) but this resume has 1" in result.stderr


# Both failures below must end the run long before train.dist_timeout: a rank waiting out the timeout is the bug.
FAIL_FAST_S = 120


def assert_every_rank_fails_with_one_error_line(result: subprocess.CompletedProcess, log_dir: Path) -> list[str]:
    """Each rank's `error:` line (exactly one per rank, and no traceback), after checking the run failed."""
    assert result.returncode != 0
    lines = []
    for rank in (0, 1):
        stderr = rank_stderr(log_dir, rank)
        assert "Traceback" not in stderr, stderr
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, stderr
        lines.append(errors[0])
    return lines


def test_a_rank_0_failure_while_preparing_the_data_stops_every_rank_at_once(tmp_path, data):
    short = tmp_path / "valid_short.tgt"  # one line fewer than valid_src: rank 0's data check fails
    short.write_text("".join(data["valid_tgt"].read_text().splitlines(keepends=True)[:-1]))
    settings = options({**data, "valid_tgt": short}, dist_timeout=600)
    result = torchrun(tmp_path / "run", settings, log_dir=tmp_path / "logs", timeout=FAIL_FAST_S)
    rank0, rank1 = assert_every_rank_fails_with_one_error_line(result, tmp_path / "logs")
    assert "has 20 lines but" in rank0 and "has 19" in rank0
    assert rank1 == f"error: rank 0 failed while preparing the data: {rank0.removeprefix('error: ')}"


def test_fewer_batches_than_ranks_is_refused_on_every_rank(tmp_path, data):
    # 200 short pairs fit in one batch of 100,000 tokens: rank 1 would get no batch at all.
    settings = options(data, max_tokens=100_000, dist_timeout=600)
    result = torchrun(tmp_path / "run", settings, log_dir=tmp_path / "logs", timeout=FAIL_FAST_S)
    for line in assert_every_rank_fails_with_one_error_line(result, tmp_path / "logs"):
        assert "makes 1 batch(es) (train.max_tokens=100000) but there are 2 processes" in line
        assert "lower train.max_tokens or use fewer processes" in line
    assert not (tmp_path / "run" / STATE_FILE).exists()


def test_the_wait_for_rank_0_to_prepare_is_not_bounded_by_the_training_timeout(tmp_path, data):
    """Rank 0 prepares for 8 s while train.dist_timeout is 3 s: rank 1 waits in a group of its own."""
    run = tmp_path / "slow"
    result = torchrun(run, options(data, dist_timeout=3, max_steps=2), env={PREPARE_DELAY_ENV: "8"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 prepares the data; 1 other rank(s) wait for it" in result.stderr
    assert (run / "checkpoint_00000002.safetensors").is_file()
