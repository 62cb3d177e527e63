"""`tfm translate --workers N`: batches searched in forked one-thread processes give the translations one
process gives, in order; a failing or dying worker is one error line; no worker outlives its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_cli, run_tfm_process
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.search_workers import SearchJob, SearchWorkers
from tfm_cli.inference.text_preparation import TextOptions
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)

# Small batches, so that a chunk has many and the workers answer them out of order.
SMALL_BATCHES = BatchingConfig(buffer_size=40, batch_size=5)


def translations(translator: Translator, lines: list[str]) -> list[list[tuple]]:
    """Per line, each output's (text, raw score, finished, constraints met), chunk by chunk as translate reads them."""
    stats, answers = TranslationStats(), []
    size = translator.batching.buffer_size
    for start in range(0, len(lines), size):
        for line in translator.translate_chunk(lines[start : start + size], start, stats):
            answers.append([(o.text, o.raw_score, o.finished, o.constraints_met) for o in line.outputs])
    return answers


@pytest.mark.parametrize("decode", [
    DecodeConfig(beam_size=5, nbest=2),
    DecodeConfig(beam_size=1),
    DecodeConfig(sample=True, nbest=2, sample_top_k=10, seed=3),
], ids=["beam 5, 2-best", "greedy", "sampling"])
def test_workers_give_the_translations_of_one_process(decode):
    loaded = load_model(trained_checkpoint())
    lines = held_out_sources()[:60] + ["", "   "]
    alone = translations(Translator(loaded, decode, SMALL_BATCHES), lines)
    with SearchWorkers(loaded.model, decode, 2) as workers:
        shared = translations(Translator(loaded, decode, SMALL_BATCHES, workers=workers), lines)
    assert shared == alone
    assert sum(1 for outputs in alone if outputs) == 60


def test_workers_meet_constraints_as_one_process():
    loaded = load_model(trained_checkpoint())
    sources = held_out_sources()[:40]
    words = [source.split()[-1] for source in sources]
    lines = [f"{source}\t{word}" for source, word in zip(sources, words)]  # each line's own last word as a phrase
    decode, text = DecodeConfig(beam_size=4), TextOptions(constraint_fields=True)
    alone = translations(Translator(loaded, decode, SMALL_BATCHES, text=text), lines)
    with SearchWorkers(loaded.model, decode, 3) as workers:
        shared = translations(Translator(loaded, decode, SMALL_BATCHES, text=text, workers=workers), lines)
    assert shared == alone
    assert any(outputs[0][3] == [True] for outputs in alone)


def test_the_cli_writes_the_same_bytes_with_workers(tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("".join(line + "\n" for line in held_out_sources()[:60] + [""] * 3), encoding="utf-8")
    outputs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}.txt"
        result = run_tfm_process(["translate", "-m", trained_checkpoint(), "-i", source, "-o", out, "--scores",
                                  "--batch-size", "6", "--threads", "2", "--workers", workers])
        assert result.returncode == 0, result.stderr.decode()
        assert b"Traceback" not in result.stderr
        outputs[workers] = out.read_bytes()
    assert outputs["2"] == outputs["1"] and outputs["1"].count(b"\n") == 63


def test_a_worker_that_fails_is_one_error():
    loaded = load_model(trained_checkpoint())
    sampling = DecodeConfig(sample=True)
    with SearchWorkers(loaded.model, sampling, 2) as workers:
        job = SearchJob(sources=[[5, 6, 7]], seeds=None)  # sampling without seeds fails inside the worker
        with pytest.raises(TfmError, match="a decoding worker failed: TypeError"):
            list(workers.search([job]))


def test_workers_that_die_are_one_error():
    loaded = load_model(trained_checkpoint())
    with SearchWorkers(loaded.model, DecodeConfig(beam_size=1), 2) as workers:
        for process in workers.processes:
            os.kill(process.pid, signal.SIGKILL)
            process.join()
        with pytest.raises(TfmError, match=r"a decoding worker ended \(exit code -9\) before answering"):
            list(workers.search([SearchJob(sources=[[5, 6, 7]])]))


def test_too_few_workers_is_one_error_line():
    result = run_cli(["translate", "-m", trained_checkpoint(), "--workers", "0"], input="a b\n")
    assert_one_line_error(result, r"--workers must be at least 1, got 0")


def children_of(pid: int) -> list[int]:
    """The process ids whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """True when process `pid` no longer runs (ended, or a zombie waiting to be reaped)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process parents from /proc (Linux)")
@pytest.mark.parametrize("stop", ["SIGINT", "SIGKILL"])
def test_no_worker_outlives_its_translate_process(stop):
    # The translate process waits for more of stdin (held open) with its workers started; then it is
    # interrupted (it stops them itself) or killed (they notice their parent is gone).
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", str(trained_checkpoint()), "--workers", "2", "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while len(children_of(process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = children_of(process.pid)
        assert len(workers) == 2, process.stderr.read().decode() if process.poll() is not None else "no workers"
        process.stdin.write("a b c\n".encode())
        process.stdin.flush()
        assert process.stdout.readline()  # the workers answered one line
        process.send_signal(getattr(signal, stop))
        _, stderr = process.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while not all(gone(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(gone(pid) for pid in workers)
    finally:
        process.kill()
        process.wait()
    if stop == "SIGINT":
        assert process.returncode == 130 and stderr.decode().strip().splitlines() == ["error: interrupted"]
