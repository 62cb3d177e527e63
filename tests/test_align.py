"""`tfm align`: word alignments of given pairs, line for line, equal to inspect-attention's, batch-invariant."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import run_cli, save_random_checkpoint

# Tiny models: one thread is as fast on an idle machine and far faster on a busy one (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_PAIRS = 12  # synthetic test pairs used: enough for several batches at --batch-size 1


@pytest.fixture(scope="module")
def reverse_checkpoint(tmp_path_factory, small_spm) -> Path:
    """Another untrained tiny model (seed 1) on the joint tokenizer: a target->source model unlike the forward one."""
    return save_random_checkpoint(tmp_path_factory.mktemp("reverse_checkpoint") / "model.safetensors", small_spm, seed=1)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, synthetic) -> dict[str, Path | list[str]]:
    """The first N_PAIRS synthetic test pairs as .src/.tgt files, their reversal, and fast_align lines."""
    folder = tmp_path_factory.mktemp("align_pairs")
    src = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:N_PAIRS]
    tgt = synthetic["test.tgt"].read_text(encoding="utf-8").splitlines()[:N_PAIRS]
    files = {}
    for name, lines in (("src", src), ("tgt", tgt)):
        files[name] = folder / f"pairs.{name}"
        files[name].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return {**files, "src_lines": src, "tgt_lines": tgt, "fast_align": "".join(f"{s} ||| {t}\n" for s, t in zip(src, tgt))}


def align(*args, input=None) -> list[str]:
    result = run_cli(["align", *map(str, args)], input=input)
    assert result.exit_code == 0, result.stderr
    return result.stdout.split("\n")[:-1]


def links(line: str) -> list[tuple[int, int]]:
    return [tuple(map(int, item.split("-"))) for item in line.split()]


def test_per_word_encoding_gives_the_pieces_of_the_whole_line(small_spm, synthetic):
    """sentencepiece splits on whitespace first, so words encoded one by one give the line's own pieces."""
    from tfm_cli.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(small_spm)
    lines = synthetic["test.src"].read_text(encoding="utf-8").splitlines()[:50]
    lines += synthetic["test.tgt"].read_text(encoding="utf-8").splitlines()[:50]
    for line in lines:
        per_word = [piece for word in line.split() for piece in tokenizer.encode_pieces(word)]
        assert per_word == tokenizer.encode_pieces(line), line


def test_word_without_pieces_gets_no_link_and_keeps_the_other_indices():
    from tfm_cli.inference.word_alignment import word_matrix

    pieces = torch.tensor([[0.1, 0.6, 0.2], [0.5, 0.1, 0.3]])  # (T=2 pieces, S=3 pieces), EOS column dropped
    # Source words: 0 = piece 0, 1 = no pieces, 2 = pieces 1-2. Target words: 0 = no pieces, 1 = piece 0, 2 = piece 1.
    matrix, pairs = word_matrix(pieces, [(0, 0), (0, 1), (1, 2)], [(0, 1), (1, 1), (1, 3)])
    assert pairs == [(2, 1), (0, 2)]
    assert matrix.shape == (3, 3)
    assert matrix[0].tolist() == [0.0, 0.0, 0.0] and matrix[:, 1].tolist() == [0.0, 0.0, 0.0]
    assert torch.allclose(matrix[1], torch.tensor([0.1, 0.0, 0.8]) / 0.9)


@pytest.mark.parametrize("options", [[], ["--align-layer", "0", "--align-head", "1"]], ids=["defaults", "layer0-head1"])
def test_alignment_equals_inspect_attention(random_checkpoint, pairs, options):
    """An independent path (one sentence, whole-line encoding, inspection.attention_view) gives the same links."""
    inspect_options = ["--layer", options[1], "--head", options[3]] if options else []
    result = run_cli(["inspect-attention", "-m", random_checkpoint, "-i", pairs["src"], "--target-file", pairs["tgt"],
                      "--words", "--format", "pharaoh", *inspect_options])
    assert result.exit_code == 0, result.stderr
    expected = result.stdout.splitlines()
    assert align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"], *options) == expected


@pytest.mark.parametrize("shift", [False, True])
def test_alignment_equals_translator_align(random_checkpoint, pairs, shift):
    """Translator.align (translate --alignment's batched pass) given the pairs' targets as its outputs links
    the same words, with the shift as the model's stored setting or as the --align-shift flag."""
    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.config import AlignmentConfig, DecodeConfig
    from tfm_cli.inference.translation import (
        BatchingConfig,
        Output,
        TranslatedLine,
        Translator,
    )

    loaded = load_model(random_checkpoint)
    translator = Translator(loaded, DecodeConfig(), BatchingConfig(), AlignmentConfig(shift=shift))
    tok = loaded.src_tokenizer
    sources = {i: tok.encode_ids(line) for i, line in enumerate(pairs["src_lines"])}
    results = []
    for i, (source, target) in enumerate(zip(pairs["src_lines"], pairs["tgt_lines"])):
        ids = tok.encode_ids(target)
        output = Output(target, ids, [tok.id_to_piece(t) for t in ids], 0.0, 0.0, True)
        results.append(TranslatedLine(index=i, source=source, outputs=[output]))
    translator.align(list(sources), sources, results)
    expected = [" ".join(f"{s}-{t}" for s, t in line.outputs[0].alignment) for line in results]
    flag = "--align-shift" if shift else "--no-align-shift"
    assert align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"], flag) == expected


def test_src_tgt_files_and_fast_align_stdin_give_identical_output(random_checkpoint, pairs, tmp_path):
    from_files = align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"])
    assert len(from_files) == N_PAIRS and all(from_files)
    assert align("-m", random_checkpoint, input=pairs["fast_align"]) == from_files
    joined = tmp_path / "pairs.txt"
    joined.write_text(pairs["fast_align"], encoding="utf-8")
    out = tmp_path / "out.align"
    align("-m", random_checkpoint, "-i", joined, "-o", out)
    assert out.read_text(encoding="utf-8").splitlines() == from_files
    # --src from stdin, --tgt a file: the same again
    assert align("-m", random_checkpoint, "--src", "-", "--tgt", pairs["tgt"], input=pairs["src"].read_text()) == from_files
    for line, src, tgt in zip(from_files, pairs["src_lines"], pairs["tgt_lines"]):
        found = links(line)
        assert [t for _, t in found] == list(range(len(tgt.split())))  # one link per target word, in target order
        assert all(0 <= s < len(src.split()) for s, _ in found)


def test_batch_size_does_not_change_results(random_checkpoint, pairs):
    one = align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"], "--json", "--batch-size", "1")
    many = align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"], "--json", "--batch-size", "64",
                 "--buffer-size", "5")
    for a, b in zip(one, many, strict=True):
        a, b = json.loads(a), json.loads(b)
        assert a["alignment"] == b["alignment"]
        assert torch.allclose(torch.tensor(a["probabilities"]), torch.tensor(b["probabilities"]), atol=2e-4)


def test_json_rows_are_distributions_over_the_source_words(random_checkpoint, pairs):
    records = [json.loads(line) for line in align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"], "--json")]
    for record, src, tgt in zip(records, pairs["src_lines"], pairs["tgt_lines"], strict=True):
        assert record["src"] == src.split() and record["tgt"] == tgt.split() and record["skipped"] is None
        matrix = torch.tensor(record["probabilities"])  # (target words, source words)
        assert matrix.shape == (len(tgt.split()), len(src.split()))
        assert torch.allclose(matrix.sum(dim=1), torch.ones(len(matrix)), atol=1e-3)
        # the links are each row's argmax
        assert links(record["alignment"]) == [(int(row.argmax()), t) for t, row in enumerate(matrix)]


@pytest.mark.parametrize("method", ["intersection", "union", "grow-diag-final-and"])
def test_reverse_model_symmetrizes_the_two_single_directions(random_checkpoint, reverse_checkpoint, pairs, method):
    from tfm_cli.inference.symmetrization import SYMMETRIZATIONS

    forward = align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"])
    backward = align("-m", reverse_checkpoint, "--src", pairs["tgt"], "--tgt", pairs["src"])
    extra = [] if method == "grow-diag-final-and" else ["--symmetrize", method]  # the default
    both = align("-m", random_checkpoint, "--reverse-model", reverse_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"], *extra)
    expected = [SYMMETRIZATIONS[method](links(f), [(s, t) for t, s in links(b)]) for f, b in zip(forward, backward)]
    assert [links(line) for line in both] == expected
    assert any(e != links(f) for e, f in zip(expected, forward))  # the reverse model did change something


def test_reverse_model_json_holds_both_directions(random_checkpoint, reverse_checkpoint, pairs):
    lines = align("-m", random_checkpoint, "--reverse-model", reverse_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"],
                  "--json", "--symmetrize", "union")
    forward = align("-m", random_checkpoint, "--src", pairs["src"], "--tgt", pairs["tgt"])
    for line, plain, src, tgt in zip(lines, forward, pairs["src_lines"], pairs["tgt_lines"], strict=True):
        record = json.loads(line)
        assert record["symmetrization"] == "union" and record["forward"]["alignment"] == plain
        assert set(links(record["alignment"])) == set(links(plain)) | set(links(record["reverse"]["alignment"]))
        assert torch.tensor(record["forward"]["probabilities"]).shape == (len(tgt.split()), len(src.split()))
        assert torch.tensor(record["reverse"]["probabilities"]).shape == (len(src.split()), len(tgt.split()))


def test_hostile_input_gives_one_line_per_line(random_checkpoint, pairs):
    src, tgt = pairs["src_lines"], pairs["tgt_lines"]
    clean = align("-m", random_checkpoint, input=pairs["fast_align"])
    too_long = " ".join(["the"] * 200)  # 200+ pieces: more than the tiny model's 128 positions
    rows = [
        (f"{src[0]} ||| {tgt[0]}".encode(), clean[0]),
        (b"", ""),  # an empty line
        (f"{src[1]} |||".encode(), ""),  # an empty target side
        (f"||| {tgt[1]}".encode(), ""),  # an empty source side
        (f"{too_long} ||| {tgt[2]}".encode(), ""),  # over-long: an empty line and one warning
        (f"{src[3]} ||| {tgt[3]}".encode(), clean[3]),  # after it: still this pair's own links
        (f"{src[4]} {tgt[4]}".encode(), ""),  # no separator
        (f"{src[5]} ||| {tgt[5]} ||| x".encode(), ""),  # two separators
        (b"the \xff\xfe dog ||| la \xc3 hundo", None),  # invalid UTF-8: bad bytes are U+FFFD words
        (f"{src[6]} ||| {tgt[6]}\r".encode(), clean[6]),  # CRLF
        (f"{src[7]}  \t ||| \t {tgt[7]}".encode(), clean[7]),  # more whitespace
    ]
    result = run_cli(["align", "-m", random_checkpoint], input=b"".join(line + b"\n" for line, _ in rows))
    assert result.exit_code == 0, result.stderr
    out = result.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(rows)
    for (_, expected), line in zip(rows, out):
        if expected is not None:
            assert line == expected
    assert links(out[8]) and [t for _, t in links(out[8])] == [0, 1, 2]  # three target words, one a U+FFFD
    assert len(re.findall(r"line 5: \d+ source and \d+ target pieces, the model takes at most 127", result.stderr)) == 1
    assert "1 line(s) had invalid UTF-8" in result.stderr
    assert "2 line(s) did not have exactly one ' ||| ' separator (the first: line 7)" in result.stderr
    # JSON says why a line has no links
    records = [json.loads(line) for line in align("-m", random_checkpoint, "--json", input=b"".join(line + b"\n" for line, _ in rows))]
    assert [r["skipped"] for r in records[:8]] == [None, "empty", "empty", "empty", "too long", None, "malformed", "malformed"]
    assert records[8]["src"] == ["the", "\ufffd\ufffd", "dog"]


def test_too_long_for_the_reverse_model_only_is_skipped_too(random_checkpoint, pairs):
    too_long = " ".join(["la"] * 200)
    result = run_cli(["align", "-m", random_checkpoint, "--reverse-model", random_checkpoint],
                     input=f"{pairs['src_lines'][0]} ||| {too_long}\n")
    assert result.exit_code == 0 and result.stdout == "\n"
    assert "line 1:" in result.stderr and "200 target pieces" in result.stderr


def test_mismatched_line_counts_is_one_clear_error(random_checkpoint, pairs, tmp_path):
    short = tmp_path / "short.tgt"
    short.write_text("".join(line + "\n" for line in pairs["tgt_lines"][:5]), encoding="utf-8")
    up_front = run_cli(["align", "-m", random_checkpoint, "--src", pairs["src"], "--tgt", short])
    assert up_front.exit_code == 1 and up_front.stdout == ""
    assert up_front.stderr.count("\n") == 1
    assert f"{pairs['src']} has {N_PAIRS} lines but {short} has 5" in up_front.stderr
    # From a pipe the difference shows at the end: the pairs before it are answered first.
    piped = run_cli(["align", "-m", random_checkpoint, "--src", "-", "--tgt", short], input=pairs["src"].read_text())
    assert piped.exit_code == 1 and len(piped.stdout.splitlines()) == 5
    assert f"{short} has 5 lines but <stdin> has {N_PAIRS}" in piped.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--symmetrize", "union"], "--symmetrize combines two directions"),
        (["--reverse-model", "MODEL", "--symmetrize", "grow-diag"], "--symmetrize must be one of"),
        (["--src", "SRC"], "--src and --tgt go together"),
        (["--src", "SRC", "--tgt", "SRC", "-i", "SRC"], "not both"),
        (["--src", "-", "--tgt", "-"], "cannot both be stdin"),
        (["--align-head", "first"], "--align-head must be a head number or 'mean'"),
        (["--align-layer", "5"], "--align-layer 5 does not exist"),
    ],
)
def test_usage_problems_are_one_clear_line(random_checkpoint, pairs, args, message):
    args = [str(random_checkpoint) if a == "MODEL" else str(pairs["src"]) if a == "SRC" else a for a in args]
    result = run_cli(["align", "-m", random_checkpoint, *args], input="a ||| b\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1
