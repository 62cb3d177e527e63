"""Bad input against every subcommand: a matrix of (subcommand x bad input), pipes, Ctrl-C and SIGKILL.

Each case checks what a user in an unattended pipeline relies on: a non-zero exit with exactly one
`error:` line on stderr (or the documented tolerant behaviour, exit 0 with one output line per
input line), never a traceback, and never a partial output file (the `-o` target is absent after
an error and no hidden `.tmp` file is left in its folder). tests/README.md has the table of cases
and how each one behaves. Cases already covered elsewhere (tokenize encode on every bad
checkpoint: test_checkpoint.py; mismatched parallel counts: test_score_*.py, test_train_cli.py,
test_inspect_attention.py; unknown/mis-typed recipe keys: test_train_cli.py; closed stdout and
10,000 lines through tokenize encode: test_tokenize_cli.py; translate | head -1:
test_translate_process.py) are not repeated here.
"""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import REPO_ROOT, rewritten_checkpoint, run_cli, run_tfm_process

# One torch thread: on a shared, busy machine two OpenMP threads make tiny-model steps far slower.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

DECODE_LIMITS = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "5", "--device", "cpu"]
LONG_LINE = "Hund " * 20000  # 100,000 characters, far beyond the tiny model's 128 positions

# name -> file content (None: the file does not exist; "dir": a directory of that name).
TEXT_INPUTS: dict[str, bytes | str | None] = {
    "missing": None,
    "directory": "dir",
    "empty": b"",
    "blank_lines": b"\n  \n\n",
    "invalid_utf8": b"Ein Hund\n\xff\xfe l\xe4uft\n",
    "nul_bytes": b"Ein\x00Hund\nzwei\n",
    "crlf": b"Ein Hund\r\nzwei Katzen\r\n",
    "long_line": LONG_LINE.encode() + b"\n",
}


@dataclass(frozen=True)
class Expect:
    """What a case must do: `error` with this fragment in its one stderr line, or succeed with `lines` output lines.

    `warning` is a fragment of the one warning line a tolerant case prints (with -q), if any.
    """

    error: str | None = None
    lines: int | None = None
    warning: str | None = None


def error(fragment: str) -> Expect:
    """A case that must fail with `fragment` in its error line."""
    return Expect(error=fragment)


def ok(lines: int, warning: str | None = None) -> Expect:
    """A case that must succeed with `lines` output lines (and this warning, if given)."""
    return Expect(lines=lines, warning=warning)


NO_FILE, IS_DIR, BAD_UTF8 = error("no such file"), error("is a directory"), error(":2: invalid UTF-8")

# subcommand -> expected behaviour per TEXT_INPUTS case (the table in tests/README.md).
TEXT_MATRIX: dict[str, dict[str, Expect]] = {
    "tokenize-encode": dict(missing=NO_FILE, directory=IS_DIR, empty=ok(0), blank_lines=ok(3), invalid_utf8=BAD_UTF8,
                            nul_bytes=ok(2), crlf=ok(2), long_line=ok(1)),
    "tokenize-decode": dict(missing=NO_FILE, directory=IS_DIR, empty=ok(0), blank_lines=ok(3), invalid_utf8=BAD_UTF8,
                            nul_bytes=ok(2), crlf=ok(2), long_line=ok(1)),
    "translate": dict(missing=NO_FILE, directory=IS_DIR, empty=ok(0), blank_lines=ok(3),
                      invalid_utf8=ok(2, "1 line(s) had invalid UTF-8 (line 2)"), nul_bytes=ok(2), crlf=ok(2),
                      long_line=ok(1, "source tokens exceed the model's 127; only the first 127 were translated")),
    # The same inputs with each way of taking lines apart: still one output line per input line.
    **{
        f"translate{'-'.join(['', *flags[0].strip('-').split()])}": dict(
            missing=NO_FILE, directory=IS_DIR, empty=ok(0), blank_lines=ok(3),
            invalid_utf8=ok(2, "1 line(s) had invalid UTF-8 (line 2)"), nul_bytes=ok(2), crlf=ok(2),
            long_line=ok(1, "source tokens exceed the model's 127; only the first 127 were translated"),
        )
        for flags in (["--split-sentences"], ["--markup html"], ["--constraints"])
    },
    # The same file as hypotheses and reference (line counts match); output: one line per metric.
    "score-metrics": dict(missing=NO_FILE, directory=IS_DIR, empty=error("no hypotheses to score"),
                          blank_lines=ok(2), invalid_utf8=BAD_UTF8, nul_bytes=ok(2), crlf=ok(2), long_line=ok(2)),
    "score-model": dict(missing=NO_FILE, directory=IS_DIR, empty=ok(0), blank_lines=ok(3), invalid_utf8=BAD_UTF8,
                        nul_bytes=ok(2), crlf=ok(2),
                        long_line=ok(1, "exceed the model's max_positions=128: not scored, its score line is empty")),
    "inspect-attention": dict(missing=NO_FILE, directory=IS_DIR, empty=ok(0), blank_lines=ok(3),
                              invalid_utf8=BAD_UTF8, nul_bytes=ok(2), crlf=ok(2),
                              long_line=error("exceeds the model's max_positions=128")),
}


def text_command(name: str, path: Path, output: Path, spm: Path, checkpoint: Path) -> list:
    """The argument list running subcommand `name` on input `path`, writing `output` where it has -o."""
    return {
        "tokenize-encode": ["tokenize", "encode", "-m", spm, "-i", path, "-o", output],
        "tokenize-decode": ["tokenize", "decode", "-m", spm, "-i", path, "-o", output],
        "translate": ["translate", "-m", checkpoint, "-i", path, "-o", output, "-q", *DECODE_LIMITS],
        "translate-split-sentences": ["translate", "-m", checkpoint, "-i", path, "-o", output, "-q", *DECODE_LIMITS,
                                      "--split-sentences"],
        "translate-markup-html": ["translate", "-m", checkpoint, "-i", path, "-o", output, "-q", *DECODE_LIMITS,
                                  "--markup", "html"],
        "translate-constraints": ["translate", "-m", checkpoint, "-i", path, "-o", output, "-q", *DECODE_LIMITS,
                                  "--constraints"],
        # TER is left out: sacrebleu's TER takes minutes on the 100k-character line (tests/README.md).
        "score-metrics": ["score", "-r", path, "-i", path, "-o", output, "-q", "--metrics", "bleu,chrf"],
        "score-model": ["score", "-m", checkpoint, "--src", path, "--tgt", path, "-o", output, "-q", "--device", "cpu"],
        "inspect-attention": ["inspect-attention", "-m", checkpoint, "-i", path, "-o", output, "--format", "pharaoh",
                              "-q", "--beam", "1", "--device", "cpu"],
    }[name]


def make_input(folder: Path, content: bytes | str | None) -> Path:
    """Create the case's input in `folder` (or not, for a missing file); returns its path."""
    path = folder / "input.txt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


def assert_error(result, fragment: str, output: Path | None) -> None:
    """Exit 1, exactly one `error:` line holding `fragment`, no traceback, no output file or temp file."""
    assert result.exit_code == 1, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    if output is not None:
        assert not output.exists(), f"{output} was left behind"
        assert not list(output.parent.glob(".*.tmp")), "a temp file was left behind"


def assert_tolerated(result, expect: Expect, output_text: str) -> None:
    """Exit 0, `expect.lines` whole output lines, and exactly the expected warning (or none) on stderr."""
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert output_text.count("\n") == expect.lines and (output_text == "" or output_text.endswith("\n")), output_text
    warnings = result.stderr.strip().splitlines()
    if expect.warning is None:
        assert warnings == [], result.stderr
    else:
        assert len(warnings) == 1 and warnings[0].startswith("warning:") and expect.warning in warnings[0], warnings


@pytest.mark.parametrize(
    "command, case", [(command, case) for command, cases in TEXT_MATRIX.items() for case in cases]
)
def test_text_input(command, case, tmp_path, small_spm, random_checkpoint):
    path = make_input(tmp_path, TEXT_INPUTS[case])
    output = tmp_path / "out" / "result.txt"
    output.parent.mkdir()
    result = run_cli(text_command(command, path, output, small_spm, random_checkpoint))
    expect = TEXT_MATRIX[command][case]
    if expect.error is not None:
        assert_error(result, expect.error, output)
        return
    assert result.stdout == ""
    text = output.read_text(encoding="utf-8")
    assert_tolerated(result, expect, text)
    assert not list(output.parent.glob(".*.tmp"))
    if command == "translate" and case == "blank_lines":
        assert text == "\n\n\n"  # blank lines give empty output lines
    if case == "crlf":
        assert "\r" not in text


# ---------------------------------------------------------------- tokenize train


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "no such file"),
        ("dir", "is a directory"),
        (b"", "the file is empty"),
        (b"\n  \n\n", "sentencepiece training failed"),
        (b"Ein Hund\n" * 50 + b"Ein \xff\xfe Hund\n", ":51: invalid UTF-8"),
    ],
    ids=["missing", "directory", "empty", "blank_lines", "invalid_utf8"],
)
def test_tokenize_train_refuses(content, fragment, tmp_path):
    path = make_input(tmp_path, content)
    prefix = tmp_path / "out" / "spm"
    result = run_cli(["tokenize", "train", path, "-o", prefix, "--vocab-size", "8", "-q"])
    assert_error(result, fragment, prefix.with_suffix(".model"))
    assert not prefix.with_suffix(".vocab").exists()
    assert not prefix.parent.exists() or list(prefix.parent.iterdir()) == []


# ---------------------------------------------------------------- bad checkpoints


def misshape(weights: dict[str, torch.Tensor]) -> None:
    """Replace one (64, 32) weight with a (3, 3) tensor."""
    weights["decoder_layers.0.ffn.linear1.weight"] = torch.zeros(3, 3)


class Unpickled:
    """A pickle payload whose unpickling creates the marker file it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def bad_checkpoint(case: str, folder: Path, good: Path) -> Path:
    """Make checkpoint case `case` in `folder` from the good checkpoint `good`; returns its path."""
    path = folder / "model.safetensors"
    if case == "directory":
        path.mkdir()
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
    elif case == "misshaped_tensor":
        rewritten_checkpoint(good, path, tensors=misshape)
    elif case == "format_version_2":
        rewritten_checkpoint(good, path, metadata=lambda meta: meta.update(format_version="2"))
    elif case == "plain_safetensors":
        save_file({"weight": torch.zeros(2, 2)}, str(path))
    elif case == "pickle":
        path.write_bytes(pickle.dumps({"model": Unpickled(folder / "unpickled-marker")}))
    elif case == "sentencepiece_model":
        path.write_bytes(sentencepiece_bytes(good))
    return path


def sentencepiece_bytes(checkpoint: Path) -> bytes:
    """The sentencepiece model embedded in `checkpoint` (what `tfm tokenize train` wrote as a .model file)."""
    with safe_open(str(checkpoint), framework="pt") as f:
        return f.get_tensor("tokenizer.src").numpy().tobytes()


CHECKPOINT_CASES = {
    "missing": "no such file",
    "directory": "is a directory",
    "empty": "not a safetensors file",
    "truncated": "truncated",
    "misshaped_tensor": "has shape (3, 3)",
    "format_version_2": "format version '2' is not supported",
    "plain_safetensors": "not a tfm checkpoint",
    "pickle": "not a safetensors file",
    "sentencepiece_model": "a sentencepiece model, not a tfm checkpoint",
}


def checkpoint_command(name: str, model: Path, source: Path, output: Path, good: Path) -> list:
    """The argument list running subcommand `name` with checkpoint `model`."""
    return {
        "translate": ["translate", "-m", model, "-i", source, "-o", output, *DECODE_LIMITS],
        "score-model": ["score", "-m", model, "--src", source, "--tgt", source, "-o", output, "--device", "cpu"],
        "inspect-attention": ["inspect-attention", "-m", model, "-i", source, "--format", "pharaoh", "--device", "cpu"],
        "inspect-attention-reverse": ["inspect-attention", "-m", good, "--reverse-model", model, "-i", source,
                                      "--format", "pharaoh", "--words", "--device", "cpu"],
        "average": ["average", good, model, "-o", output, "-q"],
        "tokenize-decode": ["tokenize", "decode", "-m", model, "-i", source, "-o", output],
    }[name]


CHECKPOINT_COMMANDS = ["translate", "score-model", "inspect-attention", "inspect-attention-reverse", "average",
                       "tokenize-decode"]


@pytest.mark.parametrize("command", CHECKPOINT_COMMANDS)
@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_bad_checkpoint(command, case, tmp_path, random_checkpoint):
    model = bad_checkpoint(case, tmp_path, random_checkpoint)
    source = tmp_path / "source.txt"
    source.write_text("Ein Hund\n", encoding="utf-8")
    output = tmp_path / "out" / "result.txt"
    output.parent.mkdir()
    result = run_cli(checkpoint_command(command, model, source, output, random_checkpoint))
    assert_error(result, CHECKPOINT_CASES[case], output)
    assert result.stdout == ""
    assert not (tmp_path / "unpickled-marker").exists(), "the pickle was unpickled"


@pytest.mark.parametrize("command", ["translate", "score-model", "inspect-attention"])
def test_a_sentencepiece_model_given_as_the_checkpoint_says_what_to_pass(command, tmp_path, small_spm, random_checkpoint):
    source = tmp_path / "source.txt"
    source.write_text("Ein Hund\n", encoding="utf-8")
    output = tmp_path / "result.txt"
    result = run_cli(checkpoint_command(command, small_spm, source, output, random_checkpoint))
    assert_error(result, f"{small_spm}: a sentencepiece model, not a tfm checkpoint", output)
    assert "checkpoint_best.safetensors" in result.stderr and "tokenizer inside" in result.stderr
    assert result.stdout == ""


# ---------------------------------------------------------------- train: recipes and data


def small_parallel(folder: Path) -> tuple[Path, Path]:
    """Five short synthetic pairs (small_spm's languages) as validation data (so a failing start fails fast)."""
    src, tgt = folder / "valid.src", folder / "valid.tgt"
    src.write_text("the dog sees my cat\nthe two cats\nmy man\nthe woman\nthe children\n", encoding="utf-8")
    tgt.write_text("la hundo mia kato vidas\nla katoj du\nmia viro\nla virino\nla infanoj\n", encoding="utf-8")
    return src, tgt


RECIPE_CASES = {
    # name: (recipe: None = no file, "dir" = a directory, bytes, "tiny" = recipes/tiny.toml, "tiny+" = it plus an
    # unknown section, "tiny-type" = it with d_model = "big"; the error fragment). Data cases point data.train_* at the bad file with --set.
    "missing_recipe": (None, "no such recipe file"),
    "recipe_directory": ("dir", "is a directory, expected a recipe file"),
    "recipe_not_toml": (b"this is [not toml\n", "not valid TOML"),
    "recipe_not_utf8": (b"[model]\nname = \"\xff\"\n", "not UTF-8"),
    "recipe_wrong_type": ("tiny-type", "model.d_model must be"),
    "recipe_unknown_section": ("tiny+", "unknown recipe section [optimizer]"),
    "train_data_missing": ("tiny", "no such file (training source)"),
    "train_data_directory": ("tiny", "is a directory"),
    "train_data_empty": ("tiny", "no training pairs left"),
    "train_data_blank_lines": ("tiny", "no training pairs left"),
}


@pytest.mark.parametrize("case", list(RECIPE_CASES))
def test_train_refuses(case, tmp_path, small_spm):
    content, fragment = RECIPE_CASES[case]
    recipe = tmp_path / "recipe.toml"
    tiny = (REPO_ROOT / "recipes" / "tiny.toml").read_text(encoding="utf-8")
    if content == "tiny":
        recipe.write_text(tiny, encoding="utf-8")
    elif content == "tiny+":
        recipe.write_text(tiny + "\n[optimizer]\nlr = 1\n", encoding="utf-8")
    elif content == "tiny-type":
        recipe.write_text(tiny.replace("d_model = 32", 'd_model = "big"'), encoding="utf-8")
    elif content == "dir":
        recipe.mkdir()
    elif content is not None:
        recipe.write_bytes(content)
    valid_src, valid_tgt = small_parallel(tmp_path)
    data = {"missing": tmp_path / "nope.txt", "directory": tmp_path, "empty": tmp_path / "empty.txt",
            "blank_lines": tmp_path / "blank.txt"}
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_bytes(b"\n \n\n")
    train_file = data.get(case.removeprefix("train_data_"), valid_src)
    settings = {
        "data.train_src": train_file, "data.train_tgt": valid_tgt if case == "train_data_missing" else train_file,
        "data.valid_src": valid_src, "data.valid_tgt": valid_tgt, "tokenizer.src_model": small_spm,
        "train.max_steps": 1,
    }
    options = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    run = tmp_path / "run"
    result = run_cli(["train", recipe, "--run", run, "--threads", "1", "-q", *options])
    assert_error(result, fragment, None)
    # A failed start may leave only its data cache; no checkpoint, so a retry needs no --resume.
    assert not run.exists() or not list(run.glob("*.safetensors"))


# ---------------------------------------------------------------- pipes and Ctrl-C (real processes)


def test_translate_ten_thousand_lines_through_a_pipe(random_checkpoint):
    lines = ["Ein Hund.", "", "Zwei Katzen spielen.", "Ein Mann"] * 2500
    result = run_tfm_process(
        ["translate", "-m", random_checkpoint, "--threads", "1", "-q", "--beam", "1", "--max-len-a", "0",
         "--max-len-b", "1", "--device", "cpu", "--batch-size", "500"],
        input=("\n".join(lines) + "\n").encode(),
    )
    assert result.returncode == 0, result.stderr.decode()
    outputs = result.stdout.decode().split("\n")
    assert len(outputs) == 10001 and outputs[-1] == ""
    assert all(outputs[i] == "" for i in range(1, 10000, 4))  # empty lines stay empty, in place


def test_ctrl_c_during_translate_leaves_a_complete_prefix(random_checkpoint, tmp_path):
    sources = [f"Satz Nummer {i} mit einem Hund." for i in range(5000)]
    source = tmp_path / "source.de"
    source.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", str(random_checkpoint), "-i", str(source), "--json",
         "--buffer-size", "16", "--batch-size", "16", "--threads", "1", "-q", *DECODE_LIMITS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # A shell starts background jobs with SIGINT ignored, and Python then installs no Ctrl-C
        # handler: give the child the default disposition, as a terminal's foreground job has.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        first = process.stdout.readline()  # translation is under way
        assert first, process.stderr.read().decode()
        process.send_signal(signal.SIGINT)
        # Read through the same buffered reader: communicate() would skip what readline buffered.
        rest, stderr = process.stdout.read(), process.stderr.read()
        process.wait(60)
    finally:
        process.kill()
        process.wait()
    output = (first + rest).decode()
    assert process.returncode == 130, stderr.decode()
    assert stderr.decode().strip().splitlines() == ["error: interrupted"]
    assert output.endswith("\n")
    records = [json.loads(line) for line in output.splitlines()]  # every printed line is whole
    assert 0 < len(records) < len(sources)
    assert [record["source"] for record in records] == sources[: len(records)]



# A process supervisor stops a command with SIGTERM and expects exit 143 (128 + 15), Ctrl-C gives
# 130; either way the -o file being written is removed. Each command here writes -o FILE while it
# waits for more of stdin (held open, empty), so the signal lands while the output is open.
COMMANDS_WRITING_WHILE_READING = {
    "translate": "translate -m {model} -b 1 -o {output}",
    "tokenize encode": "tokenize encode -m {spm} -o {output}",
    "tokenize decode": "tokenize decode -m {spm} -o {output}",
    "score -m": "score -m {model} --src - --tgt {folder}/target.txt -o {output}",
    "inspect-attention": "inspect-attention -m {model} --beam 1 -o {output}",
}
STOPPED_BY = {
    "SIGTERM": (signal.SIGTERM, 143, "error: terminated (SIGTERM)"),
    "SIGINT": (signal.SIGINT, 130, "error: interrupted"),
}


@pytest.mark.parametrize("command, stopped_by", [
    *((command, "SIGTERM") for command in COMMANDS_WRITING_WHILE_READING),
    ("translate", "SIGINT"), ("tokenize encode", "SIGINT"),
])
def test_a_signal_while_writing_an_output_file_exits_128_plus_its_number_and_leaves_nothing(
    tmp_path, small_spm, random_checkpoint, command, stopped_by
):
    signum, exit_code, message = STOPPED_BY[stopped_by]
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "target.txt").write_text("a b\n")
    output = folder / "out.txt"
    args = COMMANDS_WRITING_WHILE_READING[command].format(
        model=random_checkpoint, spm=small_spm, folder=folder, output=output
    ).split()
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not list(folder.glob(".out.txt.*.tmp")) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the output file is open (stdin stays open: the command waits for it)
        assert list(folder.glob(".out.txt.*.tmp")), f"{command} never opened its output"
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == exit_code, stderr.decode()
    assert stderr.decode().strip().splitlines() == [message]
    assert [p.name for p in folder.iterdir()] == ["target.txt"]  # no output, no temp file


@pytest.mark.parametrize("stopped_by", STOPPED_BY)
def test_a_signal_before_the_command_runs_exits_128_plus_its_number(monkeypatch, stopped_by):
    # While the command line is parsed (before any command's own code runs).
    from tfm_cli import cli

    _, exit_code, message = STOPPED_BY[stopped_by]

    def interrupted(*args, **kwargs):
        raise cli.Terminated if stopped_by == "SIGTERM" else KeyboardInterrupt  # what each signal raises

    monkeypatch.setattr(cli.TfmGroup, "parse_args", interrupted)
    result = run_cli(["translate", "--help"])
    assert result.exit_code == exit_code
    assert result.stderr.strip().splitlines() == [message]


# A `tfm train` process whose second write of checkpoint_last stalls inside the write (before its
# fsync and rename), announcing that by creating the marker file given as the first argument.
SLOW_CHECKPOINT_WRITE = """
import os, sys, time
from pathlib import Path
real_fsync, writes = os.fsync, []
def fsync(fd):
    name = os.readlink(f"/proc/self/fd/{fd}")
    if ".checkpoint_last.safetensors." in name:
        writes.append(name)
        if len(writes) == 2:
            Path(sys.argv[1]).touch()
            time.sleep(120)
    return real_fsync(fd)
os.fsync = fsync
from tfm_cli.cli import app
app(sys.argv[2:], prog_name="tfm")
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the file being written")
def test_sigkill_inside_a_checkpoint_write_keeps_the_previous_one(tmp_path, small_spm):
    from tfm_cli.checkpoints.format import read_checkpoint

    valid_src, valid_tgt = small_parallel(tmp_path)
    settings = {
        "data.train_src": valid_src, "data.train_tgt": valid_tgt, "data.valid_src": valid_src,
        "data.valid_tgt": valid_tgt, "tokenizer.src_model": small_spm, "train.max_tokens": 64,
        "train.save_every": 2, "train.valid_every": 1000, "train.max_steps": 4,
    }
    options = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    run, marker = tmp_path / "run", tmp_path / "inside-the-write"
    args = ["train", str(REPO_ROOT / "recipes" / "tiny.toml"), "--run", str(run), "--threads", "1", "-q",
            "--device", "cpu", *map(str, options)]
    process = subprocess.Popen([sys.executable, "-c", SLOW_CHECKPOINT_WRITE, str(marker), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "training never reached its second checkpoint write"
            time.sleep(0.05)
        process.kill()
        process.wait(30)
    finally:
        process.kill()
        process.wait()
    assert read_checkpoint(run / "checkpoint_last.safetensors").provenance["step"] == 2
    leftovers = [path.name for path in run.glob(".*.tmp")]
    assert leftovers, "the killed write left no temp file"
    resumed = run_cli(["train", "--run", run, "--resume", "--threads", "1", "--device", "cpu"])
    assert resumed.exit_code == 0, resumed.stderr
    assert "resumed at step 2" in resumed.stderr
    assert all(name in resumed.stderr for name in leftovers)  # named in the "removed ..." line
    assert not list(run.glob(".*.tmp"))
    assert read_checkpoint(run / "checkpoint_last.safetensors").provenance["step"] == 4
