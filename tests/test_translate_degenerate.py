"""`tfm translate` at the edges: lines the tokenizer drops entirely, and a model with non-finite outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import rewritten_checkpoint, run_cli, tiny_config


def letter_checkpoint(folder: Path, letters: dict[str, Path], normalization: str) -> Path:
    """A random tiny model with a 20-piece tokenizer (trained on the letter data) saved as a checkpoint."""
    from tfm_cli.checkpoints.format import save_model
    from tfm_cli.model import Transformer
    from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece

    settings = TokenizerTrainConfig(vocab_size=20, normalization=normalization)
    spm = train_sentencepiece([letters["train_src"], letters["train_tgt"]], folder / "spm", settings)
    tokenizer = Tokenizer.from_file(spm)
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size))
    path = folder / "model.safetensors"
    save_model(path, model.eval(), tokenizer, tokenizer)
    return path


def translate(model: Path, text: str, *options: str):
    return run_cli(["translate", "-m", model, "-b", "2", "--max-len-a", "0", "--max-len-b", "4", *options], input=text)


def test_a_line_the_tokenizer_drops_is_an_empty_line_and_is_counted(tmp_path, letters):
    # nmt_nfkc removes control characters, so "\x01" encodes to no tokens at all.
    model = letter_checkpoint(tmp_path, letters, "nmt_nfkc")
    result = translate(model, "a b c\n\x01\x02\nc d\n")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # three answers, the second empty
    assert "1 non-blank line(s) had no characters the model's tokenizer keeps" in result.stderr


@pytest.mark.parametrize("value", [3e38, -3e38])
def test_a_model_with_non_finite_outputs_is_one_error(tmp_path, letters, value):
    path = letter_checkpoint(tmp_path, letters, "identity")

    def poison(weights: dict[str, torch.Tensor]) -> None:
        # Finite weights (the file loads), but their products overflow: every activation after them is inf or NaN.
        name = "encoder_layers.0.ffn.linear1.weight"
        weights[name] = torch.full_like(weights[name], value)

    path = rewritten_checkpoint(path, tmp_path / "poisoned.safetensors", tensors=poison)
    result = translate(path, "a b c\nc d\n", "-o", str(tmp_path / "out.txt"))
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no translation with a finite score" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.txt").exists()


def test_a_model_that_emits_newlines_still_answers_one_line_per_line(tmp_path, letters):
    # A byte-fallback tokenizer has a piece for the newline byte, <0x0A>. This model emits only that
    # piece: its last decoder LayerNorm outputs a constant (weight 0, bias e_0) and only the
    # <0x0A> row of the output projection reads it. Decoded, that is a string of newlines.
    from tfm_cli.checkpoints.format import save_model
    from tfm_cli.model import Transformer
    from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece

    settings = TokenizerTrainConfig(vocab_size=270, byte_fallback=True)
    tokenizer = Tokenizer.from_file(train_sentencepiece([letters["train_src"]], tmp_path / "spm", settings))
    newline = tokenizer.piece_to_id("<0x0A>")
    torch.manual_seed(0)
    config = tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, tie_output=False)
    model = Transformer(config)
    with torch.no_grad():
        last_norm = model.decoder_layers[-1].ffn_sublayer.norm
        last_norm.weight.zero_()
        last_norm.bias.zero_()
        last_norm.bias[0] = 1.0
        model.output_proj.weight.zero_()
        model.output_proj.weight[newline, 0] = 10.0
    path = tmp_path / "model.safetensors"
    save_model(path, model.eval(), tokenizer, tokenizer)
    source = "a b c\nd e\n\nf\n"
    for options in ([], ["--nbest", "2", "--scores", "--alignment"]):
        result = translate(path, source, *options)
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.split("\n")
        assert len(lines) == 5 and lines[-1] == "", lines  # four answers, each one line
        assert lines[2] == ("" if not options else "\t" * 5)  # the blank input line: empty columns
        first = lines[0].split("\t")
        assert first[0].strip() == "" and len(first[0]) > 0  # the newlines became spaces
        assert len(first) == (1 if not options else 6)
    decoded = run_cli(["tokenize", "decode", "-m", path, "--ids"], input=f"{newline} {newline}\n5\n")
    assert decoded.exit_code == 0 and decoded.stdout.count("\n") == 2, decoded.stdout


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_refused_at_load(tmp_path, letters, value):
    path = letter_checkpoint(tmp_path, letters, "identity")

    def poison(weights: dict[str, torch.Tensor]) -> None:
        weights["decoder_layers.0.ffn.linear2.bias"][3] = value

    path = rewritten_checkpoint(path, tmp_path / "poisoned.safetensors", tensors=poison)
    text = tmp_path / "text"
    text.write_text("a b c\n", encoding="utf-8")
    scoring = ["score", "-m", path, "--src", text, "--tgt", text]
    for command in (["translate", "-m", path, "-i", text], scoring, ["average", path, "-o", tmp_path / "a"]):
        result = run_cli(command)
        assert result.exit_code == 1, (command, result.stderr)
        assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
        assert "'decoder_layers.0.ffn.linear2.bias' holds NaN or infinite values" in result.stderr, result.stderr


def favour_eos(weights: dict[str, torch.Tensor]) -> None:
    """Make EOS the most likely token at every step: the last decoder layer's output norm (post-norm,
    so the decoder's output) shrinks to a constant vector along EOS's output row."""
    last = max(int(name.split(".")[1]) for name in weights if name.startswith("decoder_layers."))
    norm = f"decoder_layers.{last}.ffn_sublayer.norm"
    eos_row = weights["tgt_embed.weight"][3]  # tiny_config's eos_id; the output projection is tied
    weights[f"{norm}.weight"].fill_(0.01)
    weights[f"{norm}.bias"].copy_(4.0 * eos_row / eos_row.norm())


def test_no_empty_translation_of_a_non_empty_line_unless_min_len_0(tmp_path, random_checkpoint):
    import json

    model = rewritten_checkpoint(random_checkpoint, tmp_path / "eos.safetensors", tensors=favour_eos)
    text = "a dog\nthe cat sat\n\nred\n"
    free = translate(model, text, "--min-len", "0")
    assert free.exit_code == 0, free.stderr
    assert free.stdout == "\n\n\n\n"  # the model's best output for every line is the empty one
    default = translate(model, text)
    assert default.exit_code == 0, default.stderr
    assert [bool(line) for line in default.stdout.split("\n")] == [True, True, False, True, False]
    longer = translate(model, text, "--min-len", "3", "--max-len-b", "6", "--json")
    lengths = [len(json.loads(line)["tokens"]) for line in longer.stdout.splitlines()]
    assert lengths == [3, 3, 0, 3]  # EOS as soon as it may come; the blank line is not translated
    # The length limit wins over the minimum: one token with a limit of 1.
    capped = translate(model, text, "--min-len", "3", "--max-len-b", "1", "--json")
    assert capped.exit_code == 0, capped.stderr
    assert [len(json.loads(line)["tokens"]) for line in capped.stdout.splitlines()] == [1, 1, 0, 1]


def test_json_lines_stay_one_line_for_any_line_reader_when_the_source_holds_line_separators(random_checkpoint):
    # U+2028, U+2029 and U+0085 inside a line are text to tfm but line breaks to str.splitlines();
    # json.dumps(ensure_ascii=False) would copy them into the `source` field as they are.
    sources = ["the dog\u2028sees my cat", "my cat\x85", "\u2029two old birds"]
    result = translate(random_checkpoint, "".join(line + "\n" for line in sources), "--json")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(sources)
    assert [json.loads(line)["source"] for line in lines] == sources


def test_finite_weights_whose_sum_overflows_still_load(tmp_path, letters):
    """The load's finiteness check sums each tensor first; a sum that overflows from finite values must
    fall back to checking every value, not refuse the checkpoint."""
    path = letter_checkpoint(tmp_path, letters, "identity")

    def huge(weights: dict[str, torch.Tensor]) -> None:
        weights["decoder_layers.0.ffn.linear2.bias"][:2] = 3e38  # finite; their float32 sum is inf

    path = rewritten_checkpoint(path, tmp_path / "huge.safetensors", tensors=huge)
    assert not torch.isfinite(torch.full((2,), 3e38).sum())
    text = tmp_path / "text"
    text.write_text("a b c\n", encoding="utf-8")
    result = run_cli(["score", "-m", path, "--src", text, "--tgt", text])
    assert "holds NaN or infinite values" not in result.stderr, result.stderr
