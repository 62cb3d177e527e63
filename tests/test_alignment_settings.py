"""The alignment settings a checkpoint stores (AlignmentConfig) and the shifted attention row.

Checked through the CLI: translate --alignment and inspect-attention --format pharaoh both default
to the checkpoint's layer/head/shift, and the flags override it; a damaged setting is one clear line.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import rewritten_checkpoint, run_cli
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import AlignmentConfig
from tfm_cli.inference.alignment import chosen_attention, piece_rows

SENTENCES = ["the big dog sees a small cat", "two cats see the dog"]


def with_alignment(random_checkpoint, tmp_path, settings) -> str:
    """A copy of the random checkpoint whose metadata says `settings` (a dict) aligns best."""
    def edit(meta):
        meta["alignment"] = json.dumps(settings)

    return str(rewritten_checkpoint(random_checkpoint, tmp_path / "aligned.safetensors", metadata=edit))


def test_piece_rows_reads_the_predicting_row_or_with_shift_the_next_one():
    attention = torch.arange(12.0).reshape(4, 3)  # rows: <s>->p0, p0->p1, p1->p2, p2->EOS
    assert piece_rows(attention, 3, shift=False).tolist() == attention[:3].tolist()
    assert piece_rows(attention, 3, shift=True).tolist() == attention[1:4].tolist()


def test_chosen_attention_takes_one_layer_and_one_head_or_the_mean():
    layers = [torch.rand(2, 4, 5, 6) for _ in range(3)]  # (R, H, T, S) per layer
    assert torch.equal(chosen_attention(layers, AlignmentConfig(layer=1, head=2)), layers[1][:, 2])
    assert torch.allclose(chosen_attention(layers, AlignmentConfig(layer=-1, head=None)), layers[2].mean(1))


def test_a_checkpoint_without_settings_aligns_with_the_defaults(random_checkpoint):
    assert load_model(random_checkpoint).alignment == AlignmentConfig()


def test_translate_and_inspect_use_the_stored_settings_and_flags_override_them(random_checkpoint, tmp_path):
    stored = with_alignment(random_checkpoint, tmp_path, {"layer": 0, "head": 1, "shift": True})
    assert load_model(stored).alignment == AlignmentConfig(layer=0, head=1, shift=True)
    text = "\n".join(SENTENCES) + "\n"
    by_default = run_cli(["translate", "-m", stored, "--alignment", "--beam", "1"], input=text)
    explicit = run_cli(
        ["translate", "-m", str(random_checkpoint), "--alignment", "--beam", "1",
         "--align-layer", "0", "--align-head", "1", "--align-shift"], input=text,
    )
    assert by_default.exit_code == 0 and explicit.exit_code == 0, by_default.stderr + explicit.stderr
    assert by_default.stdout == explicit.stdout
    unshifted = run_cli(["translate", "-m", stored, "--alignment", "--beam", "1", "--no-align-shift"], input=text)
    plain = run_cli(
        ["translate", "-m", str(random_checkpoint), "--alignment", "--beam", "1", "--align-layer", "0", "--align-head", "1"],
        input=text,
    )
    assert unshifted.stdout == plain.stdout
    # inspect-attention on the translations translate printed: the same links (an independent path:
    # one sentence at a time, the piece matrix shifted before the word merge).
    for line in by_default.stdout.splitlines():
        translation, links = line.split("\t")
        source = SENTENCES[by_default.stdout.splitlines().index(line)]
        inspected = run_cli(
            ["inspect-attention", "-m", stored, source, "--target", translation, "--words", "--format", "pharaoh"]
        )
        assert inspected.exit_code == 0, inspected.stderr
        assert inspected.stdout.strip() == links


def test_shifted_links_differ_from_unshifted_ones_on_a_random_model(random_checkpoint):
    # Guards against a shift flag that is silently ignored: on random weights the rows differ.
    pairs = [("the big dog sees a small cat", "two cats see the dog"), ("a cat", "the big small dog sees")]
    answers = {}
    for flag in ("--shift", "--no-shift"):
        answers[flag] = [
            run_cli(["inspect-attention", "-m", str(random_checkpoint), source, "--target", target, "--words",
                     "--format", "pharaoh", "--head", "0", flag]).stdout
            for source, target in pairs
        ]
    assert all(answers["--shift"]) and answers["--shift"] != answers["--no-shift"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"layer": 99}, "alignment layer 99 does not exist"),
        ({"head": 7}, "alignment head 7 does not exist"),
        ({"rows": 1}, "unknown key alignment.rows"),
    ],
)
def test_bad_stored_settings_are_one_clear_error(random_checkpoint, tmp_path, settings, message):
    stored = with_alignment(random_checkpoint, tmp_path, settings)
    result = run_cli(["translate", "-m", stored, "--alignment"], input="the dog\n")
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_stored_null_and_full_context_settings_give_the_same_links_in_translate_inspect_and_align(random_checkpoint, tmp_path):
    settings = {"layer": 0, "head": 1, "shift": True, "null": True, "full_context": True}
    stored = with_alignment(random_checkpoint, tmp_path, settings)
    assert load_model(stored).alignment == AlignmentConfig(**settings)
    translated = run_cli(["translate", "-m", stored, "--alignment", "--beam", "1"], input="\n".join(SENTENCES) + "\n")
    assert translated.exit_code == 0, translated.stderr
    outputs = [line.split("\t") for line in translated.stdout.splitlines()]
    pairs = "".join(f"{source} ||| {translation}\n" for source, (translation, _) in zip(SENTENCES, outputs))
    aligned = run_cli(["align", "-m", stored], input=pairs)
    assert aligned.exit_code == 0, aligned.stderr
    assert aligned.stdout.splitlines() == [links for _, links in outputs]
    # The full-context pass is really taken: its link probabilities differ from the causal pass's.
    (tmp_path / "causal").mkdir()
    causal_model = with_alignment(random_checkpoint, tmp_path / "causal", {**settings, "full_context": False})
    longer = "the big dog sees a small cat ||| two cats see the dog\na cat ||| the big small dog sees\n"
    answers = {}
    for model in (stored, causal_model):
        lines = run_cli(["align", "-m", model, "--json"], input=longer).stdout.splitlines()
        answers[model] = [json.loads(line)["probabilities"] for line in lines]
    assert len(answers[stored]) == 2 and answers[stored] != answers[causal_model]
    for source, (translation, links) in zip(SENTENCES, outputs):
        inspected = run_cli(
            ["inspect-attention", "-m", stored, source, "--target", translation, "--words", "--format", "pharaoh"]
        )
        assert inspected.exit_code == 0, inspected.stderr
        assert inspected.stdout.strip() == links
