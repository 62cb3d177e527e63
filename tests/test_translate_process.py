"""`tfm translate` as a real process in pipes: answers before stdin closes, quiet under `| head -1`."""

from __future__ import annotations

import subprocess
import sys

from conftest import read_line_within
from translate_support import trained_checkpoint


def test_each_line_is_answered_while_stdin_stays_open():
    model = trained_checkpoint()
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", str(model), "--beam", "2", "--threads", "1", "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        answers = []
        for sentence in ["the dog sees my cat", "the three happy women carries that blue boat"]:
            process.stdin.write(sentence.encode() + b"\n")
            process.stdin.flush()
            # The default chunk is 2000 lines: only the input pause can make this answer come.
            answers.append(read_line_within(process, 60))
            assert answers[-1].endswith(b"\n"), f"no answer to {sentence!r} while stdin is open"
        process.stdin.close()
        assert process.wait(60) == 0
        assert process.stdout.read() == b""
    finally:
        process.kill()
        process.wait()
    assert all(answer.strip() for answer in answers)


def test_head_1_ends_the_pipeline_quietly(tmp_path):
    model = trained_checkpoint()
    source = tmp_path / "src.txt"
    source.write_text("the dog sees my cat\n" * 300, encoding="utf-8")
    command = (
        f"{sys.executable} -m tfm_cli translate -m {model} -i {source} --beam 1 --buffer-size 50 --threads 1 "
        "| head -1"
    )
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], capture_output=True, timeout=120)
    assert result.stdout.count(b"\n") == 1
    assert b"Traceback" not in result.stderr and b"Error" not in result.stderr, result.stderr.decode()
    assert result.returncode in (0, 141)
