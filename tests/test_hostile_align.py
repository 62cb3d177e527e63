"""Hostile input for `tfm align` and `tfm train-aligner` (issue 71), tried as a fast_align / eflomal user would.

Every case checks what an unattended pipeline relies on: exit 0 with exactly one output line per
input line (the documented tolerant cases), or exit 1 with exactly one `error:` line on stderr that
says what is wrong, where, and what to do; never a traceback; never a partial output (the `-o` file or
checkpoint is absent after an error and no hidden `.tmp` file is left beside it). The tables below
say what each input does and why. Cases covered elsewhere are not repeated: bad `--align-layer` /
`--align-head` and `--src`/`--tgt`/`-i` combinations (test_align.py), the memory limit and `-o` the
model itself (test_aligner.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_cli, save_random_checkpoint
from test_align import links
from test_aligner import SIZES
from test_bad_input import CHECKPOINT_CASES, assert_error, bad_checkpoint
from test_inspect_attention import unwritable_folder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ONE_THREAD = ["--threads", "1"]  # module-scoped runs start before the one_torch_thread fixture
LONG_SIDE = b"the " * 20000  # 20,000 words: far beyond the tiny model's 127 pieces a side


# ---------------------------------------------------------------- tfm align: one line per input line


@dataclass(frozen=True)
class Row:
    """One input pair and what its output line must be.

    expect: "same" = the links of the clean row (the words are the same); "links" = one link per target
    word, in target order; "empty" / "too long" / "malformed" = an empty line, and that `skipped` in
    --json. `words`: the source words --json must show, where the row is about them. `warns`: the
    warning the row adds ("utf8", "long", "malformed").
    """

    src: bytes
    tgt: bytes | None  # None: `src` is a whole fast_align line (a case only `-i` input can have)
    expect: str
    words: list[str] | None = None
    warns: str | None = None


CLEAN_SRC, CLEAN_TGT = b"the dog sees my cat", b"la hundo mia kato vidas"

# Each pair as --src/--tgt lines and as a fast_align line `SRC ||| TGT`. Words are str.split() tokens, as
# `tfm align --help` says: any Unicode whitespace separates them (U+2028 and U+2029 too, so --json never
# holds a line break); NUL is no whitespace, so `the\0dog` is one word. Invalid UTF-8 is repaired (U+FFFD,
# one warning per file naming its lines), as translate repairs it: an aligner input is a corpus, where one
# bad line should cost that line's links, not the run. A pair with an empty side, or longer than the
# model's positions, gets an empty line, so the output stays line-parallel to the corpus.
PAIRS: dict[str, Row] = {
    "clean": Row(CLEAN_SRC, CLEAN_TGT, "links", words=CLEAN_SRC.decode().split()),
    "crlf": Row(CLEAN_SRC + b"\r", CLEAN_TGT + b"\r", "same"),  # CR before each LF (and mid-line in -i)
    "tabs_and_spaces": Row(b"  the\tdog  sees my\t cat ", b"\tla hundo mia  kato vidas", "same"),
    "u2028_u2029": Row("the\u2028dog sees my cat".encode(), "la hundo\u2029mia kato vidas".encode(), "same",
                       words=CLEAN_SRC.decode().split()),
    "nul_byte": Row(b"the\x00dog sees", b"la hundo", "links", words=["the\x00dog", "sees"]),
    "invalid_utf8": Row(b"the \xff\xfe dog", b"la \xc3 hundo", "links", words=["the", "\ufffd\ufffd", "dog"],
                        warns="utf8"),
    "empty_source": Row(b"", b"la hundo", "empty"),
    "empty_target": Row(b"the dog", b"  \t", "empty"),
    "both_blank": Row(b"", b"", "empty"),
    "long_source_20000_words": Row(LONG_SIDE, b"la hundo", "too long", warns="long"),
    "long_target_20000_words": Row(b"the dog", LONG_SIDE, "too long", warns="long"),
    "after_the_long_lines": Row(CLEAN_SRC, CLEAN_TGT, "same"),  # its own links, not a neighbour's
}
# fast_align lines without exactly one `|||` word: an empty line each and one warning counting them and
# naming the first, so the output stays line-parallel to a corpus with a few broken lines.
FAST_ALIGN_LINES: dict[str, Row] = {
    "blank_line": Row(b"", None, "empty"),
    "only_the_separator": Row(b" ||| ", None, "empty"),
    "no_separator": Row(b"the dog la hundo", None, "malformed", warns="malformed"),
    "two_separators": Row(b"the dog ||| la hundo ||| la kato", None, "malformed", warns="malformed"),
    "glued_separator": Row(b"the dog|||la hundo", None, "malformed", warns="malformed"),
}
ALL_LINES = {**PAIRS, **FAST_ALIGN_LINES}


def fast_align_bytes(rows: dict[str, Row]) -> bytes:
    """The rows as fast_align input, one line each."""
    return b"".join((row.src if row.tgt is None else row.src + b" ||| " + row.tgt) + b"\n" for row in rows.values())


def expected_warnings(rows: dict[str, Row], utf8_files: list[str]) -> list[str]:
    """The fragments of the warning lines a run over `rows` must print (invalid UTF-8 once per file in `utf8_files`)."""
    names = list(rows)
    numbers = {kind: [names.index(name) + 1 for name, row in rows.items() if row.warns == kind]
               for kind in ("utf8", "long", "malformed")}
    warnings = [f"line {n}: " for n in numbers["long"]]
    warnings += [f"{name}: 1 line(s) had invalid UTF-8 (line {numbers['utf8'][0]})" for name in utf8_files]
    if numbers["malformed"]:
        warnings.append(f"{len(numbers['malformed'])} line(s) did not have exactly one ' ||| ' separator "
                        f"(the first: line {numbers['malformed'][0]})")
    return warnings


@dataclass(frozen=True)
class AlignRun:
    """One `tfm align` run over a table: its output lines (by row name), its stderr, and the names its
    invalid UTF-8 warnings must give."""

    lines: dict[str, str]
    stderr: str
    rows: dict[str, Row]
    utf8_files: list[str]


def aligned_run(
    args: list, rows: dict[str, Row], output: Path | None, utf8_files: list[str], input: bytes | None = None
) -> AlignRun:
    """Run `tfm align ARGS -q` (output to `output`, or stdout) and check what holds for every run: exit 0, no
    traceback, exactly one whole line per row (by any line reader: no stray line break), nothing left over."""
    result = run_cli(["align", *args, "-q", *ONE_THREAD], input=input)
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr
    text = output.read_bytes().decode("utf-8") if output is not None else result.stdout
    assert text.endswith("\n") and text.count("\n") == len(rows) == len(text.splitlines()), text[:2000]
    if output is not None:
        assert result.stdout == "" and not list(output.parent.glob(".*.tmp"))
    return AlignRun(dict(zip(rows, text.splitlines())), result.stderr, rows, utf8_files)


@pytest.fixture(scope="module")
def align_runs(tmp_path_factory, random_checkpoint) -> dict[str, AlignRun]:
    """The tables run once each: fast_align lines from `-i FILE -o FILE`, the pairs from `--src/--tgt` files,
    and the fast_align lines through stdin with --json."""
    folder = tmp_path_factory.mktemp("hostile_align")
    joined, src, tgt = folder / "corpus.src-tgt", folder / "corpus.src", folder / "corpus.tgt"
    joined.write_bytes(fast_align_bytes(ALL_LINES))
    src.write_bytes(b"".join(row.src + b"\n" for row in PAIRS.values()))
    tgt.write_bytes(b"".join(row.tgt + b"\n" for row in PAIRS.values()))
    model = ["-m", random_checkpoint]
    return {
        "-i FILE": aligned_run([*model, "-i", joined, "-o", folder / "a.align"], ALL_LINES, folder / "a.align",
                               [str(joined)]),
        "--src/--tgt": aligned_run([*model, "--src", src, "--tgt", tgt, "-o", folder / "b.align"], PAIRS,
                                   folder / "b.align", [str(src), str(tgt)]),
        "stdin --json": aligned_run([*model, "--json"], ALL_LINES, None, ["<stdin>"],
                                    input=fast_align_bytes(ALL_LINES)),
    }


@pytest.mark.parametrize(
    "mode, case", [(mode, case) for mode, rows in (("-i FILE", ALL_LINES), ("--src/--tgt", PAIRS)) for case in rows]
)
def test_align_answers_each_hostile_line_with_its_own_line(align_runs, mode, case):
    run, row = align_runs[mode], ALL_LINES[case]
    line = run.lines[case]
    if row.expect == "same":
        assert line == run.lines["clean"] != ""
    elif row.expect == "links":
        found = links(line)
        src_words = row.src.decode("utf-8", errors="replace").split()
        tgt_words = row.tgt.decode("utf-8", errors="replace").split()
        assert [t for _, t in found] == list(range(len(tgt_words)))  # one link per target word, in order
        assert all(0 <= s < len(src_words) for s, _ in found)
    else:
        assert line == ""


@pytest.mark.parametrize("case", list(ALL_LINES))
def test_align_json_is_one_line_per_input_line_saying_why_a_line_is_empty(align_runs, case):
    run, row = align_runs["stdin --json"], ALL_LINES[case]
    record = json.loads(run.lines[case])  # one line each (aligned_run): U+2028 broke none
    assert record["line"] == list(ALL_LINES).index(case) + 1
    assert record["skipped"] == (row.expect if row.expect in ("empty", "too long", "malformed") else None)
    if row.words is not None:
        assert record["src"] == row.words
    if row.expect in ("same", "links"):
        assert record["alignment"] == align_runs["-i FILE"].lines[case]


@pytest.mark.parametrize("mode", ["-i FILE", "--src/--tgt", "stdin --json"])
def test_align_warns_once_per_kind_naming_the_lines(align_runs, mode):
    run = align_runs[mode]
    expected = expected_warnings(run.rows, run.utf8_files)
    warnings = run.stderr.strip().splitlines()
    assert all(line.startswith("warning:") for line in warnings), run.stderr
    assert len(warnings) == len(expected), run.stderr
    for fragment in expected:  # invalid UTF-8 in --src and --tgt: a warning for each file, its line named
        assert sum(fragment in line for line in warnings) == 1, (fragment, run.stderr)


# ---------------------------------------------------------------- tfm align: refused and tolerated settings and files

# name -> (arguments after `-m MODEL`, each placeholder a path: MODEL = the good checkpoint, SRC / TGT = 3-line
# files, SHORT = a 2-line file, EMPTY = an empty one; the fragment of the error line, its placeholders the
# same paths). `--symmetrize` takes exactly the names atools and eflomal users write; anything else, the
# empty string included (a shell variable left unset), is refused rather than read as the default.
# Line counts of two files are compared before any work; a pipe's at its end (its answers so far are
# printed, and an -o file is removed).
PAIR = ["--src", "SRC", "--tgt", "TGT"]
ALIGN_REFUSED: dict[str, tuple[list[str], str]] = {
    "symmetrize_empty": ([*PAIR, "--reverse-model", "MODEL", "--symmetrize", ""],
                         "--symmetrize must be one of intersection, union, grow-diag-final-and, got ''"),
    "symmetrize_moses_grow_diag_final": ([*PAIR, "--reverse-model", "MODEL", "--symmetrize", "grow-diag-final"],
                                         "got 'grow-diag-final'"),
    "symmetrize_capitalised": ([*PAIR, "--reverse-model", "MODEL", "--symmetrize", "Union"], "got 'Union'"),
    "symmetrize_without_reverse_model": ([*PAIR, "--symmetrize", "union"],
                                         "give the target->source model with --reverse-model"),
    "symmetrize_empty_without_reverse_model": ([*PAIR, "--symmetrize", ""], "--symmetrize combines two directions"),
    "src_longer_than_tgt": (["--src", "SRC", "--tgt", "SHORT"], "line counts differ: SRC has 3 lines but SHORT has 2"),
    "tgt_longer_than_src": (["--src", "SHORT", "--tgt", "TGT"], "line counts differ: SHORT has 2 lines but TGT has 3"),
    "src_empty_tgt_not": (["--src", "EMPTY", "--tgt", "TGT"], "line counts differ: EMPTY has 0 lines but TGT has 3"),
    "piped_src_longer": (["--src", "-", "--tgt", "SHORT"], "line counts differ: SHORT has 2 lines but <stdin> has 3"),
}


def three_pair_files(folder: Path) -> dict[str, str]:
    """SRC and TGT (3 pairs), SHORT (their first 2 target lines), EMPTY (no lines), in `folder`, by name."""
    files = {"SRC": b"the dog\nthe big cat\nmy man\n", "TGT": b"la hundo\nla kato granda\nmia viro\n",
             "SHORT": b"la hundo\nla kato granda\n", "EMPTY": b""}
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return {name: str(folder / name) for name in files}


@pytest.mark.parametrize("case", list(ALIGN_REFUSED))
def test_align_refuses_with_one_line_and_writes_nothing(case, tmp_path, random_checkpoint):
    args, fragment = ALIGN_REFUSED[case]
    names = {**three_pair_files(tmp_path), "MODEL": str(random_checkpoint)}
    output = tmp_path / "out" / "out.align"
    output.parent.mkdir()
    result = run_cli(["align", "-m", random_checkpoint, *(names.get(arg, arg) for arg in args), "-o", output,
                      *ONE_THREAD], input=Path(names["SRC"]).read_bytes())
    for name, path in names.items():
        fragment = fragment.replace(name, path)
    assert_error(result, fragment, output)
    assert result.stdout == ""


@pytest.mark.parametrize("where", ["unwritable folder", "missing folder"])
def test_align_an_output_it_cannot_write_is_one_line(where, tmp_path, random_checkpoint):
    names = three_pair_files(tmp_path)
    if where == "unwritable folder":
        folder = unwritable_folder(tmp_path)  # as root, who may write anywhere: /sys
        output, fragment = folder / "out.align", f"cannot create a file in {folder}"
    else:
        output, fragment = tmp_path / "missing" / "out.align", "output folder does not exist"
    result = run_cli(["align", "-m", random_checkpoint, "--src", names["SRC"], "--tgt", names["TGT"], "-o", output])
    assert_error(result, fragment, output)
    assert result.stdout == ""


def test_align_empty_files_give_an_empty_output(tmp_path, random_checkpoint):
    names = three_pair_files(tmp_path)
    output = tmp_path / "out.align"
    result = run_cli(["align", "-m", random_checkpoint, "--src", names["EMPTY"], "--tgt", names["EMPTY"], "-o", output,
                      "-q"])
    assert result.exit_code == 0 and result.stderr == "" and output.read_bytes() == b""
    piped = run_cli(["align", "-m", random_checkpoint, "-q"], input=b"")  # fast_align lines: none
    assert piped.exit_code == 0 and piped.stdout == "" and piped.stderr == ""


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_align_a_reverse_model_that_is_not_a_checkpoint_is_one_line(case, tmp_path, random_checkpoint):
    reverse = bad_checkpoint(case, tmp_path, random_checkpoint)
    names = three_pair_files(tmp_path)
    output = tmp_path / "out" / "out.align"
    output.parent.mkdir()
    result = run_cli(["align", "-m", random_checkpoint, "--reverse-model", reverse, "--src", names["SRC"],
                      "--tgt", names["TGT"], "-o", output, *ONE_THREAD])
    assert_error(result, CHECKPOINT_CASES[case], output)
    assert not (tmp_path / "unpickled-marker").exists(), "the pickle was unpickled"


def test_align_a_reverse_model_with_another_vocabulary_aligns_the_same_words(tmp_path, random_checkpoint, letters):
    """Tolerated: each model encodes its own side's words with its own tokenizer and links are word indices,
    so the reverse model's vocabulary need not be the forward one's (separately trained directions rarely
    share one). The result is the symmetrization of the two directions run alone."""
    other = save_random_checkpoint(tmp_path / "other.safetensors", letters["spm"], seed=2)
    names = three_pair_files(tmp_path)

    def align(*args: object) -> list[str]:
        result = run_cli(["align", *args, "-q", *ONE_THREAD])
        assert result.exit_code == 0 and result.stderr == "", result.stderr
        return result.stdout.splitlines()

    forward = align("-m", random_checkpoint, "--src", names["SRC"], "--tgt", names["TGT"])
    backward = align("-m", other, "--src", names["TGT"], "--tgt", names["SRC"])
    both = align("-m", random_checkpoint, "--reverse-model", other, "--symmetrize", "union", "--src", names["SRC"],
                 "--tgt", names["TGT"])
    assert len(both) == 3
    assert [set(links(line)) for line in both] == [
        set(links(f)) | {(s, t) for t, s in links(b)} for f, b in zip(forward, backward)
    ]


def test_align_ctrl_c_while_reading_a_pipe_leaves_no_output_file(tmp_path, random_checkpoint):
    """A real process answering a pipe that stays open: SIGINT ends it at once with exit 130 and the one
    line `error: interrupted`, and the -o file it was writing (already holding answers) is removed."""
    folder = tmp_path / "work"
    folder.mkdir()
    output = folder / "out.align"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "align", "-m", str(random_checkpoint), "-o", str(output), "-q", *ONE_THREAD],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # A background job starts with SIGINT ignored; a terminal's foreground job has the default (test_bad_input.py).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        process.stdin.write(fast_align_bytes({"clean": PAIRS["clean"]}) * 20)
        process.stdin.flush()  # and the pipe stays open: the command answers these, then waits for more
        deadline = time.monotonic() + 120
        while not any(path.stat().st_size for path in folder.glob(".out.align.*.tmp")):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "align never wrote its first answers"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130, stderr.decode()
    assert stderr.decode().strip().splitlines() == ["error: interrupted"]
    assert stdout == b"" and list(folder.iterdir()) == []  # neither the output nor its temp file


# ---------------------------------------------------------------- tfm train-aligner

GOOD_FILES = {"train.src": b"the dog\nthe big cat\n", "train.tgt": b"la hundo\nla kato granda\n",
              "train.align": b"0-0 1-1\n0-0 1-2 2-1\n"}
TRAIN_OPTIONS = [*SIZES, "--epochs", "1", *ONE_THREAD]

# name -> (files replaced in GOOD_FILES, the error fragment). A malformed or out-of-range link means a links
# file of other pairs, or not Pharaoh at all: refused, naming the file and line, since training on it
# would teach the wrong words. Files of other lengths, no lines at all, or no link on any line (what a
# failed aligner run leaves) are refused before the model is read; pairs that all turn out unusable (too
# long, or split by the tokenizer into other words than the whitespace ones, so no link can be placed)
# are refused after, instead of writing an aligner trained on nothing. Invalid UTF-8 is refused here (as
# every reader but translate and align refuses it): the links count words of the text as written.
TRAIN_REFUSED: dict[str, tuple[dict[str, bytes], str]] = {
    "link_out_of_range": ({"train.align": b"0-0 1-1\n0-0 1-2 2-3\n"},
                          "train.align:2: link 2-3 is beyond the pair's words (3 source, 3 target, 0-based)"),
    "link_3-": ({"train.align": b"0-0 3-\n0-0\n"}, "train.align:1: not a Pharaoh alignment pair: '3-'"),
    "link_a-b": ({"train.align": b"0-0\na-b\n"}, "train.align:2: not a Pharaoh alignment pair: 'a-b'"),
    "link_1-2-3": ({"train.align": b"0-0\n1-2-3\n"}, "train.align:2: not a Pharaoh alignment pair: '1-2-3'"),
    "link_negative": ({"train.align": b"-1-0\n0-0\n"}, "train.align:1: not a Pharaoh alignment pair: '-1-0'"),
    "links_comma_separated": ({"train.align": b"0-0,1-1\n0-0\n"}, "train.align:1: not a Pharaoh alignment pair"),
    "links_too_few_lines": ({"train.align": b"0-0 1-1\n"},
                            "train.align 1; --src, --tgt and --links must be line-parallel"),
    "links_too_many_lines": ({"train.align": b"0-0\n0-0\n0-0\n"}, "line counts differ"),
    "links_empty_file": ({"train.align": b""}, "line counts differ"),
    "tgt_too_few_lines": ({"train.tgt": b"la hundo\n"}, "line counts differ"),
    "all_files_empty": ({"train.src": b"", "train.tgt": b"", "train.align": b""}, "have no lines"),
    "links_only_blank_lines": ({"train.align": b"\n\n"}, "train.align: none of its 2 lines has a link"),
    "src_invalid_utf8": ({"train.src": b"the dog\nthe \xff cat\n"}, "train.src:2: invalid UTF-8"),
    "every_pair_too_long": ({"train.src": LONG_SIDE + b"\n" + LONG_SIDE + b"\n"}, "no pair to train the aligner on"),
    # U+2581 is sentencepiece's word boundary: `dog▁cat` is one whitespace word but two of the tokenizer's.
    "every_pair_split_into_other_words": ({"train.src": "the dog\u2581cat\nthe big\u2581cat\n".encode(),
                                           "train.align": b"0-0 1-1\n0-0 1-2\n"}, "no pair to train the aligner on"),
}


def train_files(folder: Path, replaced: dict[str, bytes]) -> list[str]:
    """GOOD_FILES with `replaced` written to `folder`: the --src/--tgt/--links options."""
    options = []
    for (name, content), option in zip(GOOD_FILES.items(), ("--src", "--tgt", "--links")):
        (folder / name).write_bytes(replaced.get(name, content))
        options += [option, str(folder / name)]
    return options


@pytest.mark.parametrize("case", list(TRAIN_REFUSED))
def test_train_aligner_refuses_bad_text_and_links_and_writes_nothing(case, tmp_path, random_checkpoint):
    replaced, fragment = TRAIN_REFUSED[case]
    output = tmp_path / "out" / "aligned.safetensors"
    output.parent.mkdir()
    result = run_cli(["train-aligner", "-m", random_checkpoint, *train_files(tmp_path, replaced), "-o", output, "-q",
                      *TRAIN_OPTIONS])
    assert_error(result, fragment, output)
    assert result.stdout == ""


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_train_aligner_refuses_a_model_that_is_not_a_checkpoint(case, tmp_path, random_checkpoint):
    model = bad_checkpoint(case, tmp_path, random_checkpoint)
    output = tmp_path / "out" / "aligned.safetensors"
    output.parent.mkdir()
    result = run_cli(["train-aligner", "-m", model, *train_files(tmp_path, {}), "-o", output, "-q", *TRAIN_OPTIONS])
    assert_error(result, CHECKPOINT_CASES[case], output)
    assert not (tmp_path / "unpickled-marker").exists(), "the pickle was unpickled"


# name -> (options, given after the defaults of these tests; the error fragment). Values torch cannot take, and
# a learning rate whose training diverges, are refused with the option named; before, they were tracebacks or
# (lr) a checkpoint of NaN weights that every other command then refused.
TRAIN_OPTIONS_REFUSED: dict[str, tuple[list[str], str]] = {
    "lr_inf": (["--lr", "inf"], "--lr must be a positive number, got inf"),
    "lr_nan": (["--lr", "nan"], "--lr must be a positive number, got nan"),
    "lr_that_diverges": (["--lr", "1e30", "--epochs", "3"],
                         "the aligner's training diverged (its weights are not finite); lower --lr"),
    "max_memory_inf": (["--max-memory", "inf"], "--max-memory must be positive (GiB), got inf"),
    "seed_beyond_torch": (["--seed", str(10**20)], "--seed must be between 0 and 2**63 - 1"),
    "seed_negative": (["--seed", "-1"], "--seed must be between 0 and 2**63 - 1, got -1"),
    "hidden_huge": (["--hidden", str(10**11)], "--hidden must be at most 65,536, got 100,000,000,000"),
}


@pytest.mark.parametrize("case", list(TRAIN_OPTIONS_REFUSED))
def test_train_aligner_refuses_option_values_it_cannot_train_with(case, tmp_path, random_checkpoint):
    options, fragment = TRAIN_OPTIONS_REFUSED[case]
    output = tmp_path / "out" / "aligned.safetensors"
    output.parent.mkdir()
    result = run_cli(["train-aligner", "-m", random_checkpoint, *train_files(tmp_path, {}), "-o", output, "-q",
                      *TRAIN_OPTIONS, *options])
    assert_error(result, fragment, output)


@pytest.mark.parametrize("where", ["unwritable folder", "missing folder"])
def test_train_aligner_finds_an_output_it_cannot_write_before_any_work(where, tmp_path, random_checkpoint):
    # Without -q: the one stderr line is the error, so the model's states were never computed (that
    # says "N of M pairs to learn from" first), let alone trained on for hours.
    if where == "unwritable folder":
        folder = unwritable_folder(tmp_path)
        output, fragment = folder / "aligned.safetensors", f"cannot create a file in {folder}"
    else:
        output, fragment = tmp_path / "missing" / "aligned.safetensors", "output folder does not exist"
    result = run_cli(["train-aligner", "-m", random_checkpoint, *train_files(tmp_path, {}), "-o", output,
                      *TRAIN_OPTIONS])
    assert_error(result, fragment, output)


def test_train_aligner_tolerates_what_a_corpus_holds_and_says_what_it_left_out(tmp_path, random_checkpoint):
    """CRLF files, a NUL inside a word, a blank pair (its links line blank too), possible links `0?1`, extra
    whitespace, and a 20,000-word pair: trained on the usable pairs, the blank and the over-long one
    counted and left out (as `tfm align` leaves such lines empty). One checkpoint, nothing else left."""
    pairs = [  # (source, target, links)
        (b"the dog", b"la hundo", b"0-0 1-1"),
        (b"the big cat\r", b"la kato granda\r", b"0-0 1-2 2-1\r"),
        (b"the\x00dog sees", b"la hundo vidas", b"0-0 0-1 1-2"),
        (b"", b"", b""),
        (b"my man", b"mia viro", b"0?0 1?1"),
        (b" \tthe  cat ", b"la\t kato", b" 0-0  1-1 "),
        (LONG_SIDE, b"la hundo", b"0-0 19999-1"),
    ]
    replaced = {name: b"".join(pair[k] + b"\n" for pair in pairs) for k, name in enumerate(GOOD_FILES)}
    output = tmp_path / "out" / "aligned.safetensors"
    output.parent.mkdir()
    result = run_cli(["train-aligner", "-m", random_checkpoint, *train_files(tmp_path, replaced), "-o", output,
                      *TRAIN_OPTIONS])
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert "5 of 7 pairs to learn from and 0 held out (1 with an empty side, 1 too long, 0 split into other words" in result.stderr
    from tfm_cli.checkpoints.format import read_checkpoint

    assert read_checkpoint(output).provenance["aligner"]["pairs"] == 5
    assert [path.name for path in output.parent.iterdir()] == [output.name]  # no temp file beside it
