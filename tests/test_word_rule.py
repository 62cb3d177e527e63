"""One definition of a word in every command that splits text into words (tokenization/words.py): a tab,
a no-break space or another Unicode space separates words in translate, align, train-aligner, markup
placement and sentence splitting exactly as an ASCII space does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import run_cli
from tfm_cli.inference.alignment import parse_pharaoh
from tfm_cli.model.aligner import ALIGNER_PREFIX

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPACES = ["\t", "\u00a0", "\u2009", "\u202f", "\u3000"]  # tab, no-break, thin, narrow no-break, ideographic


def respaced(line: str, offset: int = 0) -> str:
    """`line` with its ASCII spaces replaced by the SPACES in turn (starting at `offset`)."""
    words = line.split(" ")
    out = words[0]
    for index, word in enumerate(words[1:]):
        out += SPACES[(index + offset) % len(SPACES)] + word
    return out


def first_lines(path: Path, count: int) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[:count]


def test_translate_counts_source_and_target_words_by_the_rule(random_checkpoint):
    line = respaced("the two big dogs sees my cat .")
    result = run_cli(["translate", "-m", random_checkpoint, "--json", "--alignment", "--threads", "1"], input=line + "\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert [line[a:b] for a, b in record["source_words"]] == line.split()
    assert all(src < len(line.split()) for src, _ in parse_pharaoh(record["alignment"]))
    assert [record["translation"][a:b] for a, b in record["target_words"]] == record["translation"].split()


def test_align_gives_the_same_links_whatever_spaces_separate_the_words(random_checkpoint, synthetic):
    src, tgt = first_lines(synthetic["test.src"], 20), first_lines(synthetic["test.tgt"], 20)
    plain = run_cli(["align", "-m", random_checkpoint, "--threads", "1"],
                    input="".join(f"{s} ||| {t}\n" for s, t in zip(src, tgt)))
    spaced = run_cli(["align", "-m", random_checkpoint, "--threads", "1"],
                     input="".join(f"{respaced(s)}\u00a0|||\t{respaced(t, 2)}\n" for s, t in zip(src, tgt)))
    assert plain.exit_code == 0 and spaced.exit_code == 0, plain.stderr + spaced.stderr
    assert spaced.stdout == plain.stdout
    assert any(pair[0] >= 5 for line in plain.stdout.splitlines() for pair in parse_pharaoh(line))


def test_train_aligner_reads_the_links_of_the_same_words_whatever_spaces_separate_them(random_checkpoint, synthetic, tmp_path):
    def train(name: str, offset: int | None) -> dict:
        for side in ("src", "tgt"):
            lines = first_lines(synthetic[f"train.{side}"], 200)
            text = "".join((line if offset is None else respaced(line, offset)) + "\n" for line in lines)
            (tmp_path / f"{name}.{side}").write_text(text, encoding="utf-8")
        (tmp_path / f"{name}.align").write_text("".join(line + "\n" for line in first_lines(synthetic["train.align"], 200)))
        output = tmp_path / f"{name}.safetensors"
        result = run_cli(["train-aligner", "-m", random_checkpoint, "--src", tmp_path / f"{name}.src", "--tgt",
                          tmp_path / f"{name}.tgt", "--links", tmp_path / f"{name}.align", "-o", output,
                          "--epochs", "2", "--hidden", "32", "--dim", "16", "--threads", "1", "--held-out", "0"])
        assert result.exit_code == 0, result.stderr
        assert "0 split into other words" in result.stderr
        return {key: value for key, value in load_file(output).items() if key.startswith(ALIGNER_PREFIX)}

    plain, spaced = train("plain", None), train("spaced", 1)
    assert plain.keys() == spaced.keys() and plain
    assert all(plain[key].equal(spaced[key]) for key in plain)


def test_a_link_to_a_word_only_a_unicode_space_separates_is_accepted_and_one_beyond_is_refused(random_checkpoint, tmp_path):
    (tmp_path / "a.src").write_text("the\u00a0dog\u3000sees\n", encoding="utf-8")  # three words
    (tmp_path / "a.tgt").write_text("dog\tthe\n", encoding="utf-8")  # two words
    args = ["train-aligner", "-m", random_checkpoint, "--src", tmp_path / "a.src", "--tgt", tmp_path / "a.tgt",
            "--links", tmp_path / "a.align", "-o", tmp_path / "out.safetensors", "--epochs", "1", "--hidden", "32",
            "--dim", "16", "--threads", "1", "--held-out", "0"]
    (tmp_path / "a.align").write_text("2-1 1-0\n")
    assert run_cli(args).exit_code == 0
    (tmp_path / "a.align").write_text("3-1\n")
    refused = run_cli(args)
    assert refused.exit_code == 1 and "a.align:1: link 3-1 is beyond the pair's words (3 source, 2 target" in refused.stderr


def test_markup_places_tags_on_words_a_unicode_space_separates(random_checkpoint):
    line = "the\u00a0<b>dog</b>\u3000sees my cat ."
    result = run_cli(["translate", "-m", random_checkpoint, "--markup", "html", "--json", "--threads", "1"], input=line + "\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    source_text = line.replace("<b>", "").replace("</b>", "")
    assert [source_text[a:b] for a, b in record["source_words"]] == ["the", "dog", "sees", "my", "cat", "."]
    assert record["translation"].count("<b>") == 1 and record["translation"].count("</b>") == 1


def test_inspect_attention_gives_a_link_per_target_word_of_the_rule(random_checkpoint):
    source, target = "the\u00a0dog\tsees my\u3000cat", "la\u2009hundo vidas\tmian kato"
    result = run_cli(["inspect-attention", "-m", random_checkpoint, source, "--target", target, "--words",
                      "--format", "pharaoh", "--threads", "1"])
    assert result.exit_code == 0, result.stderr
    pairs = parse_pharaoh(result.stdout)
    assert [tgt for _, tgt in pairs] == list(range(len(target.split())))
    assert all(src < len(source.split()) for src, _ in pairs)


def test_guided_training_counts_the_words_of_each_line_by_the_rule(tmp_path, small_spm):
    from conftest import REPO_ROOT

    (tmp_path / "train.src").write_text("the\u00a0dog\u3000sees\nmy\tcat\n" * 20, encoding="utf-8")
    (tmp_path / "train.tgt").write_text("la hundo\u2009vidas\nmia kato\n" * 20, encoding="utf-8")
    links = tmp_path / "train.align"
    settings = {
        "data.train_src": tmp_path / "train.src", "data.train_tgt": tmp_path / "train.tgt", "data.valid_src": "",
        "data.valid_tgt": "", "tokenizer.src_model": small_spm, "train.max_steps": 2, "train.save_every": 1000,
        "data.train_alignment": links, "train.alignment_weight": 0.1,
    }
    args = ["train", REPO_ROOT / "recipes" / "tiny.toml", "--threads", "1",
            *[item for key, value in settings.items() for item in ("--set", f"{key}={value}")]]
    links.write_text("0-0 1-1 2-2\n0-0 1-1\n" * 20)  # word 2 exists only by the ideographic space
    assert run_cli([*args, "--run", tmp_path / "ok"]).exit_code == 0
    links.write_text("0-0 1-1 3-2\n0-0 1-1\n" * 20)
    refused = run_cli([*args, "--run", tmp_path / "refused"])
    assert refused.exit_code == 1 and "train.align:1: link 3-2 is beyond the pair's words" in refused.stderr
    assert "has 3 words" in refused.stderr
