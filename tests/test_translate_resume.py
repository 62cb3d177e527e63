"""`tfm translate --resume`: a run stopped by a signal and run again writes the very file one run writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_cli, run_tfm_process


def long_input(synthetic: dict[str, Path], path: Path) -> Path:
    """400 synthetic source lines, with a blank line now and then."""
    lines = synthetic["test.src"].read_text(encoding="utf-8").splitlines() * 2
    lines[7::50] = [""] * len(lines[7::50])
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def interrupt(args: list, output: Path, at_least: int) -> None:
    """Run `tfm translate ARGS --resume` and stop it with SIGINT once `at_least` lines are recorded as done;
    checks that no output file appeared and the record is short of the whole."""
    record = output.with_name(output.name + ".partial.json")
    # A shell starts background jobs (nohup ... &, a CI runner's) with SIGINT ignored, and Python then installs
    # no Ctrl-C handler in the child: give it the default a terminal's foreground job has (test_bad_input.py).
    process = subprocess.Popen([sys.executable, "-m", "tfm_cli", "translate", *map(str, args), "--resume"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if json.loads(record.read_text(encoding="utf-8"))["lines"] >= at_least:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    assert process.returncode != 0, "the run ended before it could be interrupted"
    assert not output.exists() and record.exists()
    assert at_least <= json.loads(record.read_text(encoding="utf-8"))["lines"] < 400


def test_a_resumed_run_writes_the_file_one_run_writes(random_checkpoint, synthetic, tmp_path):
    source = long_input(synthetic, tmp_path / "in.txt")
    common = ["-m", random_checkpoint, "-i", source, "--buffer-size", "20", "--threads", "1", "--sample", "--seed", "3",
              "--scores"]  # sampling: each line's draw must not depend on where the run started
    whole = run_tfm_process(["translate", *common, "-o", tmp_path / "whole.txt"])
    assert whole.returncode == 0, whole.stderr.decode()
    output = tmp_path / "resumed.txt"
    interrupt([*common, "-o", output], output, at_least=60)
    # The input's bytes decide, not its time: a copy or a re-mounted folder gives a file a new one.
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    resumed = run_tfm_process(["translate", *common, "-o", output, "--resume"])
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert "--resume: the first" in resumed.stderr.decode()
    assert output.read_bytes() == (tmp_path / "whole.txt").read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt", "resumed.txt", "whole.txt"]


def test_a_half_written_chunk_is_done_again_and_another_job_or_input_is_refused(random_checkpoint, synthetic, tmp_path):
    source = long_input(synthetic, tmp_path / "in.txt")
    options = ["-m", random_checkpoint, "-i", source, "--buffer-size", "20", "--threads", "1"]  # beam search
    whole = run_cli(["translate", *options, "-o", tmp_path / "whole.txt"])
    assert whole.exit_code == 0, whole.stderr
    output = tmp_path / "out.txt"
    common = [*options, "-o", output]
    interrupt(common, output, at_least=40)  # leaves out.txt.partial and its record...
    partial = output.with_name("out.txt.partial")
    partial.write_bytes(partial.read_bytes() + b"a chunk cut off by a crash")  # ...with bytes past the record
    other = run_cli(["translate", *common, "--resume", "--beam", "2"])
    assert other.exit_code == 1 and "was begun by another job (differs in: option beam)" in other.stderr
    assert not output.exists()
    # An edit that keeps the size (and, within a timestamp tick, the time) is another input.
    text = source.read_bytes()
    middle = text.index(b"\n", len(text) // 2) + 1
    source.write_bytes(text[:middle] + (b"X" if text[middle:middle + 1] != b"X" else b"Y") + text[middle + 1:])
    edited = run_cli(["translate", *common, "--resume"])
    assert edited.exit_code == 1 and f"(differs in: file {source.resolve()})" in edited.stderr and not output.exists()
    source.write_bytes(text)
    again = run_cli(["translate", *common, "--resume"])
    assert again.exit_code == 0, again.stderr
    assert output.read_bytes() == (tmp_path / "whole.txt").read_bytes()


def test_resume_needs_files(random_checkpoint, tmp_path):
    result = run_cli(["translate", "-m", random_checkpoint, "--resume"], input="the dog\n")
    assert result.exit_code == 1 and "--resume continues a file from a file" in result.stderr

