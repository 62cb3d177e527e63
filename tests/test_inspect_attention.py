"""`tfm inspect-attention`: attention invariants, word merge and Pharaoh through the CLI, the seed example."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_cli

# Tiny models: one thread is as fast on an idle machine and far faster on a busy one (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tfm_cli.checkpoints.format import load_model

# A synthetic pair (tfm_cli/synthetic.py) in the small_spm tokenizer's languages. Most of its words are
# several pieces ("▁s i x", "▁rivero j") and "old" is a bare "▁" plus "old": real word merging.
SOURCE = "this three old birds opens your six rivers"
TARGET = "ĉi birdoj maljunaj tri via riveroj ses malfermas"

# The seed document's figures (shared/seed/README.md), copied from the document, not from a tfm run.
DOC_Q = [["0.520", "0.225", "0.125"], ["0.550", "0.780", "1.550"], ["0.275", "1.125", "0.450"], ["1.550", "0.050", "2.450"]]
DOC_K = [["0.422", "0.227", "0.100"], ["0.410", "0.524", "1.546"], ["0.250", "1.115", "0.465"], ["0.860", "0.135", "2.020"]]
DOC_V = [["0.353", "-0.310", "1.047", "-0.095", "0.729", "-0.140"], ["-0.010", "1.004", "0.000", "1.306", "-0.120", "1.018"],
         ["0.120", "0.155", "1.165", "0.050", "1.225", "-0.030"], ["0.075", "0.230", "0.095", "1.250", "0.360", "1.660"]]
DOC_SCORE_LOVE_I = "0.564"
DOC_SOFTMAX_LOVE = ["0.0754", "0.3133", "0.1477", "0.4636"]


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the table printed under `heading`: token label -> cell strings."""
    block = text.split(heading + "\n", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in block.splitlines()[3:]:
        if not line.strip():
            break
        label, *cells = line.split()
        rows[label] = cells
    return rows


def inspect_json(checkpoint, *args) -> dict:
    result = run_cli(["inspect-attention", "-m", checkpoint, SOURCE, "--target", TARGET, "--json", *args])
    assert result.exit_code == 0, result.stderr
    (line,) = result.stdout.splitlines()
    return json.loads(line)


def test_seed_example_walkthrough_reproduces_the_documents_figures():
    result = run_cli(["inspect-attention", "--walkthrough", "--seed-example"])
    assert result.exit_code == 0, result.stderr
    tokens = ["I", "love", "your", "dog"]
    q, k = table_rows(result.stdout, "Q = X W^Q"), table_rows(result.stdout, "K = X W^K")
    v = table_rows(result.stdout, "V = X W^V")
    assert [q[t] for t in tokens] == DOC_Q
    assert [k[t] for t in tokens] == DOC_K
    assert [v[t] for t in tokens] == DOC_V
    scores = table_rows(result.stdout, "Q K^T (row: query token, column: key token)")
    assert scores["love"][0] == DOC_SCORE_LOVE_I
    softmax = table_rows(result.stdout, "softmax rows: the attention weights (each row sums to 1)")
    assert softmax["love"] == DOC_SOFTMAX_LOVE
    # Scaled scores are the raw scores over sqrt(d_k) = sqrt(3); output rows are softmax rows @ V.
    scaled = table_rows(result.stdout, "Q K^T / sqrt(d_k), d_k = 3")
    assert float(scaled["love"][0]) == pytest.approx(0.564 / 3**0.5, abs=1e-3)
    weights = torch.tensor([[float(c) for c in softmax[t]] for t in tokens])
    values = torch.tensor([[float(c) for c in row] for row in DOC_V])
    output = table_rows(result.stdout, "output rows = softmax rows @ V")
    torch.testing.assert_close(torch.tensor([[float(c) for c in output[t]] for t in tokens]), weights @ values,
                               atol=2e-3, rtol=0)


def test_seed_example_as_json():
    result = run_cli(["inspect-attention", "--walkthrough", "--seed-example", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["d_k"] == 3 and record["query_tokens"] == ["I", "love", "your", "dog"]
    torch.testing.assert_close(torch.tensor(record["q"]), torch.tensor([[float(c) for c in r] for r in DOC_Q]),
                               atol=5e-4, rtol=0)
    assert record["scores"][1][0] == pytest.approx(0.564, abs=5e-4)
    assert record["weights"][1] == pytest.approx([float(c) for c in DOC_SOFTMAX_LOVE], abs=5e-5)


def test_every_attention_row_sums_to_one_and_masked_positions_are_zero(random_checkpoint):
    from tfm_cli.inference.inspection import attention_maps

    loaded = load_model(random_checkpoint)
    src_ids, tgt_ids = loaded.src_tokenizer.encode_ids(SOURCE), loaded.tgt_tokenizer.encode_ids(TARGET)
    maps = attention_maps(loaded.model, src_ids, tgt_ids)
    S, T = len(src_ids) + 1, len(tgt_ids) + 1
    assert [w.shape for w in maps.encoder] == [(4, S, S)] * 2
    assert [w.shape for w in maps.cross] == [(4, T, S)] * 2
    for weights in maps.encoder + maps.decoder + maps.cross:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for weights in maps.decoder:
        assert torch.all(weights[:, future] == 0) and torch.all(weights[:, ~future] > 0)
    for kind in ("cross", "encoder", "decoder"):
        record = inspect_json(random_checkpoint, "--kind", kind, "--head", "2", "--layer", "0")
        matrix = torch.tensor(record["matrix"])
        torch.testing.assert_close(matrix.sum(1), torch.ones(matrix.size(0)), atol=1e-5, rtol=0)
        assert matrix.shape == (len(record["rows"]), len(record["columns"]))
        torch.testing.assert_close(matrix, getattr(maps, kind)[0][2], atol=1e-6, rtol=0)


def test_word_level_matrix_sums_source_pieces_and_averages_target_pieces(random_checkpoint):
    pieces = inspect_json(random_checkpoint)
    words = inspect_json(random_checkpoint, "--words")
    assert words["columns"] == SOURCE.split() + ["</s>"] and words["rows"] == TARGET.split() + ["</s>"]
    # Both sides have words of several pieces, so the merge really sums and averages something.
    assert len(pieces["columns"]) > len(words["columns"]) and len(pieces["rows"]) > len(words["rows"])

    def groups(labels: list[str]) -> list[list[int]]:
        # Recomputed here from the piece labels: a '▁' starts a word, a bare '▁' joins the next piece.
        spans: list[list[int]] = []
        open_space = False
        for i, label in enumerate(labels):
            if label == "</s>":
                spans.append([i])
            elif label == "▁":
                spans.append([i])
                open_space = True
            elif label.startswith("▁") or not spans:
                spans.append([i]) if not open_space else spans[-1].append(i)
                open_space = False
            else:
                spans[-1].append(i)
                open_space = False
        return spans

    matrix = pieces["matrix"]
    expected = [
        [sum(sum(matrix[r][c] for c in cols) for r in rows) / len(rows) for cols in groups(pieces["columns"])]
        for rows in groups(pieces["rows"])
    ]
    torch.testing.assert_close(torch.tensor(words["matrix"]), torch.tensor(expected), atol=1e-6, rtol=0)


def test_pharaoh_is_the_argmax_of_the_word_matrix_without_eos(random_checkpoint):
    words = inspect_json(random_checkpoint, "--words")
    result = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--words",
                      "--format", "pharaoh"])
    assert result.exit_code == 0, result.stderr
    expected = []
    for t, row in enumerate(words["matrix"][:-1]):
        real = row[:-1]
        expected.append(f"{real.index(max(real))}-{t}")
    assert result.stdout == " ".join(expected) + "\n"
    assert words["alignment"] == " ".join(expected)
    # Without --words the pairs index pieces, from the piece matrix the same way.
    pieces = inspect_json(random_checkpoint)
    by_piece = [f"{row[:-1].index(max(row[:-1]))}-{t}" for t, row in enumerate(pieces["matrix"][:-1])]
    result = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--format", "pharaoh"])
    assert result.stdout == " ".join(by_piece) + "\n" and pieces["alignment"] == " ".join(by_piece)


def test_many_lines_with_target_file_give_one_alignment_line_each(random_checkpoint, tmp_path):
    sources, targets = tmp_path / "src", tmp_path / "tgt"
    sources.write_text(f"{SOURCE}\nthe dog sees my cat\n\n", encoding="utf-8")
    targets.write_text(f"{TARGET}\nla hundo mia kato vidas\nla kato\n", encoding="utf-8")
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", sources, "--target-file", targets,
                      "--words", "--format", "pharaoh"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 4 and lines[3] == ""
    assert len(lines[1].split()) == 5 and lines[2] == ""  # an empty source has no word to align to
    assert all(re.fullmatch(r"(\d+-\d+ ?)*", line) for line in lines)
    for lines_in_target in (4, 2):
        wrong = tmp_path / "wrong"
        wrong.write_text("la hundo\n" * lines_in_target, encoding="utf-8")
        result = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", sources, "--target-file", wrong,
                          "--words", "--format", "pharaoh"])
        message = f"--target-file has {lines_in_target} lines but the input has 3"
        assert result.exit_code == 1 and message in result.stderr, result.stderr
        assert result.stdout == ""  # found before the first result is printed


def test_input_problems_are_found_before_any_output(random_checkpoint, tmp_path):
    sources = tmp_path / "src"
    sources.write_bytes(f"{SOURCE}\nthe dog\n".encode() + b"\xff bad\n")
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", sources, "--beam", "1"])
    assert result.exit_code == 1 and f"{sources}:3: invalid UTF-8" in result.stderr, result.stderr
    assert result.stdout == ""
    both = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "-i", sources])
    assert both.exit_code == 1 and "give a SENTENCE or --input FILE, not both" in both.stderr


def test_png_with_several_sentences_is_refused_before_any_output(random_checkpoint, tmp_path):
    sources = tmp_path / "src"
    sources.write_text(f"{SOURCE}\nthe dog sees my cat\n", encoding="utf-8")
    image = tmp_path / "attention.png"
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", sources, "--png", image])
    assert result.exit_code == 1
    assert "--png saves one image" in result.stderr and "not 2" in result.stderr, result.stderr
    assert result.stdout == "" and not image.exists()
    assert list(tmp_path.iterdir()) == [sources]  # no image, no temp file


def test_intersection_with_a_reverse_model(random_checkpoint):
    def align(source, target, *extra):
        result = run_cli(["inspect-attention", "-m", random_checkpoint, source, "--target", target, "--words",
                          "--format", "pharaoh", *extra])
        assert result.exit_code == 0, result.stderr
        return {tuple(map(int, pair.split("-"))) for pair in result.stdout.split()}

    forward = align(SOURCE, TARGET)
    backward = {(s, t) for t, s in align(TARGET, SOURCE)}
    both = align(SOURCE, TARGET, "--reverse-model", random_checkpoint)
    assert both == forward & backward
    pieces = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--format", "pharaoh",
                      "--reverse-model", random_checkpoint])
    assert pieces.exit_code == 1 and "use it with --format pharaoh --words" in pieces.stderr


def test_heatmap_on_stdout_and_translation_on_stderr(random_checkpoint):
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "--words", "--beam", "2"], input="the dog sees my cat\n")
    assert result.exit_code == 0, result.stderr
    assert "translation:" in result.stderr and "translation" not in result.stdout
    assert "cross-attention, layer -1, head mean, words" in result.stdout
    header = result.stdout.splitlines()[2].split()
    assert header == ["the", "dog", "sees", "my", "cat", "</s>"]
    assert "\x1b[" not in result.stdout  # piped: no colour codes


def test_csv_long_format(random_checkpoint):
    result = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--format", "csv",
                      "--words", "--kind", "encoder"])
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    n = len(SOURCE.split()) + 1
    assert len(rows) == n * n
    for i in range(n):
        assert sum(float(r["weight"]) for r in rows if r["row"] == str(i)) == pytest.approx(1.0, abs=1e-4)


def test_model_walkthrough_matches_the_models_own_attention(random_checkpoint):
    for kind in ("cross", "decoder", "encoder"):
        result = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--walkthrough",
                          "--kind", kind, "--layer", "1", "--head", "3", "--json"])
        assert result.exit_code == 0, result.stderr
        steps = json.loads(result.stdout)
        maps = inspect_json(random_checkpoint, "--kind", kind, "--layer", "1", "--head", "3")
        torch.testing.assert_close(torch.tensor(steps["weights"]), torch.tensor(maps["matrix"]), atol=1e-5, rtol=0)
        assert steps["query_tokens"] == maps["rows"] and steps["key_tokens"] == maps["columns"]
        assert steps["d_k"] == 8
        if kind == "decoder":
            assert steps["scaled"][0][1] is None  # -inf above the diagonal: the causal mask


def test_png_written_or_clear_message(random_checkpoint, tmp_path, monkeypatch):
    image = tmp_path / "attention.png"
    args = ["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--png", image, "-q"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        matplotlib = None
    if matplotlib is not None:
        result = run_cli(args)
        assert result.exit_code == 0, result.stderr
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the `plot` extra were not installed
    result = run_cli(args)
    assert result.exit_code == 1 and "pip install 'tfm-cli[plot]'" in result.stderr


def unwritable_folder(tmp_path) -> Path:
    """A folder no file can be created in: a read-only one, or (as root, who ignores permissions) /sys."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / "probe.png").touch()
        except OSError:
            return candidate
        (candidate / "probe.png").unlink()
    pytest.skip("no unwritable folder on this machine")


def png_case(case: str, tmp_path) -> tuple[Path, str]:
    """The --png path of a case and the fragment of its error line."""
    if case == "no matplotlib":
        return tmp_path / "attention.png", "--png needs matplotlib, which is not installed: pip install 'tfm-cli[plot]'"
    if case == "suffix":
        return tmp_path / "attention.jpg", "give a file name ending in .png"
    if case == "missing folder":
        return tmp_path / "no-such-folder" / "attention.png", "folder " + str(tmp_path / "no-such-folder") + " does not exist"
    if case == "unwritable folder":
        return unwritable_folder(tmp_path) / "attention.png", "cannot write in folder"
    (tmp_path / "attention.png").mkdir()
    return tmp_path / "attention.png", "is a directory"


@pytest.mark.parametrize("case", ["no matplotlib", "suffix", "missing folder", "unwritable folder", "directory"])
def test_png_problems_stop_before_any_work(random_checkpoint, tmp_path, monkeypatch, case):
    image, message = png_case(case, tmp_path)
    if case == "no matplotlib":
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the `plot` extra were not installed
    # No --target: the model would translate SENTENCE first (and say so on stderr) if the check came late.
    result = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--png", image])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error:") and message in result.stderr, result.stderr
    assert result.stdout == ""
    # The check comes before the model is even read: a missing checkpoint is not what it reports.
    missing = run_cli(["inspect-attention", "-m", tmp_path / "missing.safetensors", SOURCE, "--png", image])
    assert missing.exit_code == 1 and message in missing.stderr, missing.stderr


@pytest.mark.parametrize("output_format", ["heatmap", "pharaoh", "json", "csv"])
def test_output_file_holds_what_stdout_would(random_checkpoint, tmp_path, output_format):
    args = ["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, "--words", "--format", output_format]
    to_stdout = run_cli(args)
    assert to_stdout.exit_code == 0, to_stdout.stderr
    output = tmp_path / f"attention.{output_format}"
    to_file = run_cli([*args, "-o", output])
    assert to_file.exit_code == 0, to_file.stderr
    assert to_file.stdout == ""
    assert output.read_text(encoding="utf-8") == to_stdout.stdout
    walkthrough = run_cli(["inspect-attention", "--walkthrough", "--seed-example", "-o", output])
    assert walkthrough.exit_code == 0 and walkthrough.stdout == ""
    assert "softmax rows" in output.read_text(encoding="utf-8")


def test_output_file_is_not_left_half_written(random_checkpoint, tmp_path):
    sources, targets = tmp_path / "src", tmp_path / "tgt"
    sources.write_text(f"{SOURCE}\nthe dog sees my cat\n", encoding="utf-8")
    targets.write_text(f"{TARGET}\n", encoding="utf-8")  # one line short: an error after the first sentence
    output = tmp_path / "out" / "test.align"
    output.parent.mkdir()
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", sources, "--target-file", targets,
                      "--format", "pharaoh", "-o", output])
    assert result.exit_code == 1 and "--target-file has 1 lines" in result.stderr
    assert list(output.parent.iterdir()) == []
    missing = run_cli(["inspect-attention", "--walkthrough", "--seed-example", "-o", tmp_path / "nope" / "x.txt"])
    assert missing.exit_code == 1 and "output folder does not exist" in missing.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--layer", "2"], "--layer 2 does not exist: the model has 2 decoder layers"),
        (["--kind", "encoder", "--layer", "-3"], "--layer -3 does not exist: the model has 2 encoder layers"),
        (["--head", "4"], "--head 4 does not exist: the model has 4 heads"),
        (["--walkthrough", "--head", "-5"], "--head -5 does not exist"),
        (["--head", "all"], "--head must be a head number or 'mean'"),
        (["--kind", "self"], "--kind must be one of"),
        (["--format", "pharaoh", "--kind", "encoder"], "--format pharaoh needs --kind cross"),
        (["--format", "svg"], "--format must be one of"),
        (["--format", "pharaoh", "--reverse-model", "x"], "x: no such file"),
    ],
)
def test_bad_options_are_one_line_errors(random_checkpoint, args, message):
    result = run_cli(["inspect-attention", "-m", random_checkpoint, SOURCE, "--target", TARGET, *args])
    assert result.exit_code == 1 and message in result.stderr, result.stderr
    assert result.stdout == ""


def test_model_is_required_without_the_seed_example():
    result = run_cli(["inspect-attention", SOURCE])
    assert result.exit_code == 1 and "-m/--model is required" in result.stderr


def test_pharaoh_equals_translate_alignment_for_the_same_output(random_checkpoint, tmp_path):
    sources = tmp_path / "src"
    sources.write_text(f"{SOURCE}\nthe dog follows the two cats\n", encoding="utf-8")
    translated = run_cli(["translate", "-m", random_checkpoint, "-i", sources, "--beam", "1", "--alignment"])
    assert translated.exit_code == 0, translated.stderr
    inspected = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", sources, "--beam", "1", "--words",
                         "--format", "pharaoh", "-q"])
    assert inspected.exit_code == 0, inspected.stderr
    assert [line.split("\t")[1] for line in translated.stdout.splitlines()] == inspected.stdout.splitlines()


def test_a_sentence_longer_than_the_model_is_named_by_its_line(random_checkpoint):
    too_long = " ".join([SOURCE] * load_model(random_checkpoint).model.config.max_positions)
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "--format", "pharaoh"],
                     input=f"{SOURCE}\n{too_long}\n")
    assert result.exit_code == 1
    assert "error: line 2: " in result.stderr and "max_positions" in result.stderr
    assert len(result.stdout.splitlines()) == 1  # the line before it was answered
