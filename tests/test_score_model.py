"""`tfm score -m`: forced-decoding scores equal the model's token log-probs summed directly."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli

# Tiny models: one thread is as fast on an idle machine and far faster on a busy one (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")
from tfm_cli.checkpoints.format import load_model
from tfm_cli.length_penalty import GnmtPenalty
from tfm_cli.special_ids import BOS_ID, EOS_ID


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, synthetic):
    """12 synthetic sentence pairs of varied lengths (plus an empty target and an empty source) as two files."""
    folder = tmp_path_factory.mktemp("score_model")
    src = synthetic["valid.src"].read_text(encoding="utf-8").splitlines()[:12] + ["the dog sees my cat", ""]
    tgt = synthetic["valid.tgt"].read_text(encoding="utf-8").splitlines()[:12] + ["", "la hundo mia kato vidas"]
    (folder / "src.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (folder / "tgt.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return folder / "src.txt", folder / "tgt.txt", src, tgt


def direct_log_probs(loaded, src_text: str, tgt_text: str) -> torch.Tensor:
    """One sentence, no padding: log_softmax(model.forward) at each reference token, EOS last. Returns (T,)."""
    src_ids = loaded.src_tokenizer.encode_ids(src_text) + [EOS_ID]
    tgt_ids = loaded.tgt_tokenizer.encode_ids(tgt_text)
    tgt_in = torch.tensor([[BOS_ID] + tgt_ids])
    tgt_out = torch.tensor(tgt_ids + [EOS_ID])
    with torch.no_grad():
        logits = loaded.model(torch.tensor([src_ids]), tgt_in)[0]  # (T, V)
    return torch.log_softmax(logits, dim=-1)[torch.arange(len(tgt_out)), tgt_out]


def test_scores_equal_directly_summed_token_log_probs(random_checkpoint, pairs):
    src_path, tgt_path, src, tgt = pairs
    # A batch size of 4 mixes lengths and padding; each line must still score as if alone.
    result = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", tgt_path,
                      "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == len(src)
    loaded = load_model(random_checkpoint)
    for record, s, t in zip(records, src, tgt):
        expected = direct_log_probs(loaded, s, t)
        assert record["schema"] == "tfm-score/1"
        # As in translate --json: `tokens` are the target's pieces (EOS not listed), n_scored_tokens counts EOS too.
        assert [loaded.tgt_tokenizer.piece_to_id(piece) for piece in record["tokens"]] == loaded.tgt_tokenizer.encode_ids(t)
        assert record["n_scored_tokens"] == len(record["tokens"]) + 1 == len(expected)
        assert record["raw"] == pytest.approx(expected.sum().item(), rel=1e-5, abs=1e-4)
        # --normalize length is the default: raw / ((5 + n) / 6) ** 0.6, as translate --scores prints.
        n = record["n_scored_tokens"]
        assert record["score"] == pytest.approx(record["raw"] / ((5 + n) / 6) ** 0.6, abs=1e-9)
        torch.testing.assert_close(torch.tensor(record["token_log_probs"]), expected, atol=1e-4, rtol=1e-5)
    assert "nats/token" in result.stderr


@pytest.mark.parametrize("normalize", ["length", "per-token"])
def test_normalizations_follow_the_score_convention(random_checkpoint, pairs, normalize):
    src_path, tgt_path, src, tgt = pairs
    raw_run = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", tgt_path, "--json"])
    run = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", tgt_path,
                   "--normalize", normalize, "--length-penalty", "0.8"])
    assert run.exit_code == 0, run.stderr
    values = [float(line) for line in run.stdout.splitlines()]
    for value, record in zip(values, map(json.loads, raw_run.stdout.splitlines())):
        n = record["n_scored_tokens"]  # EOS included
        # GNMT length penalty ((5 + n) / 6) ** alpha, written out here independently of search.py.
        expected = record["raw"] / ((5 + n) / 6) ** 0.8 if normalize == "length" else record["raw"] / n
        assert value == pytest.approx(expected, abs=2e-6)


def test_forced_decoding_reproduces_greedy_search_scores(random_checkpoint, pairs):
    from tfm_cli.inference.model_scores import score_id_pairs
    from tfm_cli.inference.search import greedy_search

    _, _, src, _ = pairs
    loaded = load_model(random_checkpoint)
    src_ids = [loaded.src_tokenizer.encode_ids(line) for line in src[:6]]
    width = max(len(ids) for ids in src_ids) + 1
    batch = torch.tensor([ids + [EOS_ID] + [0] * (width - len(ids) - 1) for ids in src_ids])
    hypotheses = greedy_search(loaded.model, batch, max_len_a=0.0, max_len_b=8)
    # Greedy's score counts the EOS it ended with, chosen or forced at the length limit, like ours.
    forced = score_id_pairs(loaded.model, [(ids, hyp.tokens) for ids, hyp in zip(src_ids, hypotheses)], GnmtPenalty(0.6))
    for hyp, score in zip(hypotheses, forced):
        assert score.n_tokens == len(hyp.tokens) + 1
        assert score.raw == pytest.approx(hyp.score, abs=1e-4)


def test_forced_decoding_reproduces_beam_search_normalised_scores(random_checkpoint, pairs):
    from tfm_cli.config import DecodeConfig
    from tfm_cli.inference.model_scores import score_id_pairs
    from tfm_cli.inference.search import beam_search

    _, _, src, _ = pairs
    loaded = load_model(random_checkpoint)
    decode = DecodeConfig(beam_size=3, nbest=3, length_penalty=0.6, max_len_a=0.0, max_len_b=6)
    for line in src[:3]:
        ids = loaded.src_tokenizer.encode_ids(line)
        (nbest,) = beam_search(loaded.model, torch.tensor([ids + [EOS_ID]]), decode)
        forced = score_id_pairs(loaded.model, [(ids, hyp.tokens) for hyp in nbest], GnmtPenalty(0.6))
        for hyp, score in zip(nbest, forced):
            assert score.length_normalized == pytest.approx(hyp.normalised_score(GnmtPenalty(0.6)), abs=1e-4)


def test_token_log_probs_are_zero_at_padding(random_checkpoint):
    from tfm_cli.inference.model_scores import token_log_probs

    loaded = load_model(random_checkpoint)
    src = torch.tensor([[10, 11, EOS_ID], [12, EOS_ID, 0]])
    tgt_out = torch.tensor([[20, 21, 22, EOS_ID], [23, EOS_ID, 0, 0]])
    with torch.no_grad():
        log_probs = token_log_probs(loaded.model, src, tgt_out)
    assert log_probs.shape == (2, 4)
    assert torch.all(log_probs[1, 2:] == 0) and torch.all(log_probs[:, :2] < 0)


def test_mismatched_source_and_target_counts(random_checkpoint, pairs, tmp_path):
    src_path, _, src, _ = pairs
    short = tmp_path / "short.txt"
    short.write_text("la hundo\n", encoding="utf-8")
    result = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", short])
    assert result.exit_code == 1
    assert f"{short} has 1" in result.stderr and f"has {len(src)} lines" in result.stderr


def test_target_on_stdin_and_bad_normalize(random_checkpoint, pairs):
    src_path, tgt_path, src, _ = pairs
    result = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", "-"], input=tgt_path.read_bytes())
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == len(src)
    bad = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", tgt_path, "--normalize", "avg"])
    assert bad.exit_code == 1 and "--normalize must be one of" in bad.stderr
    bad = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", tgt_path, "--device", "banana"])
    assert bad.exit_code == 1 and "--device banana: tfm runs on cpu or cuda" in bad.stderr


def test_interactive_target_lines_are_scored_before_the_input_ends(random_checkpoint, pairs):
    import select
    import subprocess
    import sys

    src_path, _, _, tgt = pairs
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "score", "-m", random_checkpoint, "--src", src_path, "--tgt", "-",
         "--threads", "1", "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        process.stdin.write((tgt[0] + "\n").encode())
        process.stdin.flush()
        # The first score must arrive while stdin is still open (a pause ends the window).
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "no score before the end of input"
        first = process.stdout.readline()
        assert float(first) < 0
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    # The source file has more lines than the one target line: a clear error once input ends.
    assert process.returncode == 1 and b"line counts differ" in process.stderr.read()


def test_a_pair_longer_than_the_model_gets_an_empty_line_and_the_others_their_scores(random_checkpoint, pairs, tmp_path):
    src_path, tgt_path, src, tgt = pairs
    loaded = load_model(random_checkpoint)
    # The tiny test model takes max_positions tokens a side; this source has about three times as many.
    long_source = " ".join(["the dog sees my cat"] * loaded.model.config.max_positions)
    src_file, tgt_file = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src_file.write_text("\n".join([src[0], long_source, src[1]]) + "\n", encoding="utf-8")
    tgt_file.write_text("\n".join([tgt[0], tgt[0], tgt[1]]) + "\n", encoding="utf-8")
    plain = run_cli(["score", "-m", random_checkpoint, "--src", src_file, "--tgt", tgt_file, "--normalize", "none"])
    assert plain.exit_code == 0, plain.stderr
    lines = plain.stdout.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    for line, s, t in zip((lines[0], lines[2]), (src[0], src[1]), (tgt[0], tgt[1])):
        assert float(line) == pytest.approx(direct_log_probs(loaded, s, t).sum().item(), rel=1e-5, abs=1e-4)
    assert "line 2:" in plain.stderr and "exceed the model's max_positions" in plain.stderr
    as_json = run_cli(["score", "-m", random_checkpoint, "--src", src_file, "--tgt", tgt_file, "--json"])
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [record["score"] is None for record in records] == [False, True, False]
    assert "max_positions" in records[1]["skipped"] and "skipped" not in records[0]


def test_files_of_unequal_length_write_no_score_at_all(random_checkpoint, pairs, tmp_path):
    src_path, tgt_path, src, _ = pairs
    short = tmp_path / "short.txt"
    short.write_text("la hundo\n", encoding="utf-8")
    output = tmp_path / "scores.txt"
    result = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", short])
    assert result.exit_code == 1 and result.stdout == ""
    result = run_cli(["score", "-m", random_checkpoint, "--src", src_path, "--tgt", short, "-o", output])
    assert result.exit_code == 1 and not output.exists()


def test_a_last_line_without_a_newline_still_pairs_up(random_checkpoint, pairs, tmp_path):
    _, _, src, tgt = pairs
    src_file, tgt_file = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src_file.write_text(f"{src[0]}\n{src[1]}\n", encoding="utf-8")
    tgt_file.write_text(f"{tgt[0]}\n{tgt[1]}", encoding="utf-8")  # no newline after the last line
    result = run_cli(["score", "-m", random_checkpoint, "--src", src_file, "--tgt", tgt_file])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
