"""Lexical shortlists (`tfm shortlist`, `translate --shortlist`): the Dice table worked by hand; a shortlist of
every target id translates byte for byte as the full output layer; a real one keeps each output inside its
sentence's list and constraints, is batch-invariant and the same with --workers; a column's product does not
depend on the other columns computed with it; mismatched or broken files are one error line."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import assert_one_line_error, run_cli, save_random_checkpoint
from tfm_cli.checkpoints.format import load_model
from tfm_cli.inference.shortlist import (
    CooccurrenceCounts,
    Shortlist,
    batch_shortlist,
    load_shortlist,
    save_shortlist,
    tokenizer_fingerprint,
)
from tfm_cli.model.kernels import Linear
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)

PAIRS = [([5, 6], [10, 11]), ([5, 7], [10, 12]), ([6], [11])]


def test_dice_candidates_and_frequent_tokens_by_hand():
    # Sentence counts: c(5)=2 c(6)=2 c(7)=1, c(10)=2 c(11)=2 c(12)=1. Dice 2c(s,t)/(c(s)+c(t)):
    # 5: 10 -> 1.0, 12 -> 0.667, 11 -> 0.5;  6: 11 -> 1.0, 10 -> 0.5;  7: 12 -> 1.0, 10 -> 0.667.
    counts = CooccurrenceCounts(src_vocab_size=8, tgt_vocab_size=13)
    counts.add(PAIRS[:2])  # in two chunks: the counts merge
    counts.add(PAIRS[2:])
    shortlist = counts.shortlist(frequent=2, per_source=2, src_sha256="s", tgt_sha256="t")
    assert shortlist.candidates[5].tolist() == [10, 12]
    assert shortlist.candidates[6].tolist() == [11, 10]
    assert shortlist.candidates[7].tolist() == [12, 10]
    assert shortlist.candidates[0].tolist() == [-1, -1]
    assert shortlist.frequent.tolist() == [10, 11]  # 2 tokens each, the lower id first
    assert shortlist.sentence_ids([7], extra=[2]).tolist() == [2, 10, 11, 12]
    batch = batch_shortlist(shortlist, [[7], [6]], [[2], [2]])
    assert batch.target_ids.tolist() == [2, 10, 11, 12]
    assert batch.allowed.tolist() == [[True, True, True, True], [True, True, True, False]]


def test_a_column_does_not_depend_on_the_columns_beside_it():
    torch.manual_seed(0)
    weight, rows = torch.randn(3000, 64), torch.randn(16, 64)
    core = torch.arange(0, 3000, 97)
    values = []
    for extra in (0, 50, 700, 2000):
        ids = torch.unique(torch.cat([core, torch.randperm(3000)[:extra]]))
        layer = Linear(64, ids.numel(), bias=False)
        with torch.no_grad():
            layer.weight.copy_(weight[ids])
        layer.pack()
        with torch.inference_mode():
            values.append(layer(rows)[:, torch.searchsorted(ids, core)])
    assert all(torch.equal(values[0], other) for other in values[1:])


def write_shortlist(path, checkpoint, frequent: torch.Tensor, candidates: torch.Tensor):
    loaded = load_model(checkpoint)
    shortlist = Shortlist(frequent, candidates, loaded.config.tgt_vocab_size, tokenizer_fingerprint(loaded.src_tokenizer),
                          tokenizer_fingerprint(loaded.tgt_tokenizer))
    save_shortlist(path, shortlist, {"made": "by hand"})
    return path


def translate(args: list, lines: list[str]) -> str:
    result = run_cli(["translate", "-q", *args], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(lines)
    return result.stdout


def test_a_shortlist_of_every_target_id_translates_as_the_full_output_layer(tmp_path):
    checkpoint = trained_checkpoint()
    vocab = load_model(checkpoint).config.tgt_vocab_size
    full = write_shortlist(tmp_path / "full.safetensors", checkpoint, torch.arange(vocab), torch.full((vocab, 1), -1))
    lines = held_out_sources()[:40]
    for options in (["-b", "4", "--nbest", "2", "--scores"], ["-b", "1", "--scores"]):
        assert translate(["-m", checkpoint, "--shortlist", full, *options], lines) == translate(["-m", checkpoint, *options], lines)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    """A small shortlist built by the CLI from the trained model's own training corpus."""
    checkpoint = trained_checkpoint()
    path = tmp_path_factory.mktemp("shortlist") / "built.safetensors"
    folder = checkpoint.parent
    result = run_cli(["shortlist", "-m", checkpoint, "--src", folder / "train.src", "--tgt", folder / "train.tgt",
                      "-o", path, "--frequent", "4", "--per-source", "3"])
    assert result.exit_code == 0, result.stderr
    assert "from 2,000 sentence pairs" in result.stderr
    return str(path)


def test_outputs_stay_in_their_sentences_lists_and_batches_do_not_matter(built):
    checkpoint = trained_checkpoint()
    loaded, shortlist = load_model(checkpoint), load_shortlist(built)
    lines = held_out_sources()[:60]
    options = ["-m", checkpoint, "--shortlist", built, "-b", "3"]
    together = translate(options, lines)
    assert translate([*options, "--batch-size", "1"], lines) == together
    assert translate([*options, "--workers", "2"], lines) == together
    assert together != translate(["-m", checkpoint, "-b", "3"], lines)  # 4 frequent + 3 per token: a real restriction
    for line, output in zip(lines, together.splitlines()):
        allowed = set(shortlist.sentence_ids(loaded.src_tokenizer.encode_ids(line)).tolist())
        assert set(loaded.tgt_tokenizer.encode_ids(output)) <= allowed


def test_constraint_tokens_join_the_list(built):
    checkpoint = trained_checkpoint()
    loaded, shortlist = load_model(checkpoint), load_shortlist(built)
    line = held_out_sources()[0]
    allowed = set(shortlist.sentence_ids(loaded.src_tokenizer.encode_ids(line)).tolist())
    vocab = loaded.tgt_tokenizer
    outside = next(vocab.id_to_piece(i) for i in range(vocab.vocab_size)
                   if i not in allowed and vocab.id_to_piece(i).startswith("\u2581") and len(vocab.id_to_piece(i)) > 3)
    phrase = outside.lstrip("\u2581")
    result = run_cli(["translate", "-q", "-m", checkpoint, "--shortlist", built, "--constraints", "--json"],
                     input=f"{line}\t{phrase}\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert phrase in record["translation"]


def test_a_shortlist_for_other_tokenizers_or_no_shortlist_is_one_error_line(tmp_path, small_spm):
    other_model = save_random_checkpoint(tmp_path / "other.safetensors", small_spm, seed=1)
    other = write_shortlist(tmp_path / "other.shortlist", other_model, torch.arange(3), torch.full((200, 1), -1))
    checkpoint = trained_checkpoint()
    result = run_cli(["translate", "-m", checkpoint, "--shortlist", other], input="a b\n")
    assert_one_line_error(result, "was built for other tokenizers")
    result = run_cli(["translate", "-m", checkpoint, "--shortlist", checkpoint], input="a b\n")
    assert_one_line_error(result, "is not a tfm shortlist")
    result = run_cli(["translate", "-m", checkpoint, "--shortlist", tmp_path / "missing"], input="a b\n")
    assert result.exit_code != 0 and "missing" in result.stderr and "Traceback" not in result.stderr
    result = run_cli(["shortlist", "-m", checkpoint, "--src", tmp_path / "missing", "--tgt", tmp_path / "missing",
                      "-o", tmp_path / "out"])
    assert result.exit_code != 0 and "missing" in result.stderr and not (tmp_path / "out").exists()
