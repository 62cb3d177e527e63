"""Every command that reads lines from stdin answers a line before it blocks on the next (issue 30, item 13).

Real processes in pipes: a line is written and stdin stays open, so its answer can only come if
the command reads lazily (textio.read_chunks) and flushes; then a second line; then stdin closes.
PYTHONUNBUFFERED is removed from the child's environment: with it stdout is line-buffered, and a
missing flush would go unseen. (`translate` is tested the same way in test_translate_process.py.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import read_line_within

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="selectors on pipes and /dev/stdin need a POSIX system")

# Generous, and never reached when things work: an answer comes at once, or only at end of input.
ANSWER_WITHIN_S = 60
SOURCES = ["the dog sees my cat", "the three happy women carries that blue boat"]


def answers_while_stdin_is_open(args: list, lines: list[str]) -> list[str]:
    """Run `tfm ARGS`, writing `lines` one at a time and reading each one's answer line before the next.

    Fails if an answer does not come while stdin is open, if the command fails, or if more output
    follows once stdin is closed. Returns the answers without their newlines.
    """
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
    )
    try:
        answers = []
        for line in lines:
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
            answer = read_line_within(process, ANSWER_WITHIN_S)
            assert answer.endswith(b"\n"), f"no answer to {line!r} while stdin stays open (got {answer!r})"
            answers.append(answer[:-1].decode())
        process.stdin.close()
        rest, stderr = process.stdout.read(), process.stderr.read()
        assert process.wait(ANSWER_WITHIN_S) == 0, stderr.decode()
        assert rest == b"", rest
    finally:
        process.kill()
        process.wait()
    return answers


@pytest.mark.parametrize("output_format", ["pharaoh", "json"])
def test_inspect_attention(random_checkpoint, output_format):
    args = ["inspect-attention", "-m", random_checkpoint, "--format", output_format, "--words", "--beam", "1",
            "--threads", "1", "-q"]
    answers = answers_while_stdin_is_open(args, SOURCES)
    if output_format == "pharaoh":
        assert all(re.fullmatch(r"(\d+-\d+)( \d+-\d+)*", answer) for answer in answers), answers
    else:
        assert [json.loads(answer)["source"] for answer in answers] == SOURCES


def test_score_with_a_model(random_checkpoint, tmp_path):
    sources = tmp_path / "src.txt"
    sources.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    args = ["score", "-m", random_checkpoint, "--src", sources, "--tgt", "-", "--threads", "1", "-q"]
    answers = answers_while_stdin_is_open(args, ["la hundo mia kato vidas", "la kato"])
    assert all(float(answer) < 0 for answer in answers), answers


@pytest.mark.parametrize("input", ["-", "/dev/stdin"])
def test_tokenize_encode(small_spm, input):
    from tfm_cli.tokenization.tokenizer import Tokenizer

    answers = answers_while_stdin_is_open(["tokenize", "encode", "-m", small_spm, "-i", input], SOURCES)
    tokenizer = Tokenizer.from_file(small_spm)
    assert answers == [" ".join(tokenizer.encode_pieces(line)) for line in SOURCES]


@pytest.mark.parametrize("input", ["-", "/dev/stdin"])
def test_tokenize_decode(small_spm, input):
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(small_spm)
    lines = [" ".join(map(str, tokenizer.encode_ids(line))) for line in SOURCES]
    answers = answers_while_stdin_is_open(["tokenize", "decode", "-m", small_spm, "--ids", "-i", input], lines)
    assert answers == SOURCES


def test_read_chunks_hands_out_the_lines_before_a_bad_one_then_raises():
    from tfm_cli.errors import TfmError
    from tfm_cli.textio.streams import read_chunks

    def lines():
        yield "a"
        yield "b"
        raise TfmError("<stdin>:3: invalid UTF-8")

    chunks = read_chunks(lines(), size=100)
    assert next(chunks) == ["a", "b"]  # answered first: a pipe's good lines are not lost to a later bad one
    with pytest.raises(TfmError, match="invalid UTF-8"):
        next(chunks)


def test_read_chunks_reads_at_most_two_chunks_ahead():
    from tfm_cli.textio.streams import read_chunks

    pulled = []

    def lines():
        for number in range(1000):
            pulled.append(number)
            yield str(number)

    chunks = read_chunks(lines(), size=10)
    assert next(chunks) == [str(number) for number in range(10)]
    time.sleep(0.5)  # time for the reader to run ahead, were it unbounded (a huge file held whole)
    assert len(pulled) <= 3 * 10 + 1, len(pulled)  # the chunk handed out, two more, and the one it waits with
    assert sum(len(chunk) for chunk in chunks) == 990
