"""`tfm train` on several weighted corpora and on prepared data: exact resume, a shared cache folder that a
new run starts from without reading the text again, --prepare-only, and what is reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, letter_settings, run_cli
from safetensors.torch import load_file

TINY = REPO_ROOT / "recipes" / "tiny.toml"


@pytest.fixture(scope="module")
def shards(letters, tmp_path_factory) -> dict[str, Path]:
    """The letter training data cut into three corpora (shards) of 120, 50 and 30 pairs."""
    folder = tmp_path_factory.mktemp("shards")
    src = letters["train_src"].read_text().splitlines(keepends=True)
    tgt = letters["train_tgt"].read_text().splitlines(keepends=True)
    files = {}
    for name, (start, end) in {"a": (0, 120), "b": (120, 170), "c": (170, 200)}.items():
        for side, lines in (("src", src), ("tgt", tgt)):
            path = folder / f"{name}.{side}"
            path.write_text("".join(lines[start:end]))
            files[f"{name}_{side}"] = path
    return files


def sharded_settings(letters, shards, **values) -> list[str]:
    """Train on shard a (weight 1), b (weight 2) and c (weight 0.5); tiny model, no dropout."""
    more = (f'[{{src="{shards["b_src"]}", tgt="{shards["b_tgt"]}", weight=2}}, '
            f'{{src="{shards["c_src"]}", tgt="{shards["c_tgt"]}", weight=0.5}}]')
    return [
        *letter_settings(letters, **{"data.train_src": shards["a_src"], "data.train_tgt": shards["a_tgt"],
                                     "model.dropout": 0.0, "train.max_tokens": 200, "train.valid_every": 1000,
                                     "train.log_every": 1, **values}),
        "--set", f"data.more_train={more}",
    ]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


def test_weighted_corpora_train_and_resume_exactly(tmp_path, letters, shards):
    # 200 + 50 (b twice) - 15 (half of c) = 255 pairs an epoch; 2+ epochs so the sampled half of c changes.
    straight = run_cli(["train", TINY, "--run", tmp_path / "straight", "--threads", "1",
                        *sharded_settings(letters, shards, **{"train.max_steps": 16})])
    assert straight.exit_code == 0, straight.stderr
    assert "train data: 200 pairs read, 200 kept" in straight.stderr
    assert "b.src / b.tgt: 50 pairs read, 50 kept" in straight.stderr
    first = run_cli(["train", TINY, "--run", tmp_path / "resumed", "--threads", "1",
                     *sharded_settings(letters, shards, **{"train.max_steps": 9})])
    assert first.exit_code == 0, first.stderr
    resumed = run_cli(["train", "--run", tmp_path / "resumed", "--resume", "--threads", "1", "--set", "train.max_steps=16"])
    assert resumed.exit_code == 0, resumed.stderr
    assert "(prepared before)" in resumed.stderr
    expected = weights(tmp_path / "straight" / "checkpoint_last.safetensors")
    got = weights(tmp_path / "resumed" / "checkpoint_last.safetensors")
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert max(record["epoch"] for record in records if record["kind"] == "train") >= 2


def test_a_new_run_starts_from_a_shared_cache_without_preparing_again(tmp_path, letters):
    cache = tmp_path / "shared-cache"
    # The tokenizer is trained by the run (no tokenizer.src_model), so it is cached too.
    values = {**{f"data.{key}": letters[key] for key in ("train_src", "train_tgt", "valid_src", "valid_tgt")},
              "data.cache_dir": cache, "tokenizer.vocab_size": 20, "train.max_steps": 2}
    settings = [item for key, value in values.items() for item in ("--set", f"{key}={value}")]
    prepared = run_cli(["train", TINY, "--run", tmp_path / "first", "--prepare-only", "--threads", "1", *settings])
    assert prepared.exit_code == 0, prepared.stderr
    assert "training a 20-piece" in prepared.stderr and "prepared the data for" in prepared.stderr
    assert not (tmp_path / "first" / "checkpoint_last.safetensors").exists()
    again = run_cli(["train", TINY, "--run", tmp_path / "second", "--threads", "1", *settings])
    assert again.exit_code == 0, again.stderr
    assert "sentencepiece model (joint) from the cache" in again.stderr and "training a 20-piece" not in again.stderr
    assert again.stderr.count("(prepared before)") == 2  # train and valid
    assert (tmp_path / "second" / "spm.model").read_bytes() == (tmp_path / "first" / "spm.model").read_bytes()


def test_a_changed_training_file_is_reported_and_prepared_again(tmp_path, letters):
    src = tmp_path / "train.src"
    src.write_text(letters["train_src"].read_text())
    settings = letter_settings(letters, **{"train.max_steps": 1, "data.train_src": src})
    assert run_cli(["train", TINY, "--run", tmp_path / "run", "--prepare-only", *settings]).exit_code == 0
    src.write_text(letters["train_src"].read_text().replace("a", "b", 1))
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *settings])
    assert result.exit_code == 0, result.stderr
    assert "train data changed since it was prepared (train.src: modification time, content)" in result.stderr


def test_filters_for_real_data_are_counted_and_reported(tmp_path, letters):
    src_lines = letters["train_src"].read_text().splitlines()
    tgt_lines = letters["train_tgt"].read_text().splitlines()
    tgt_lines[4] = src_lines[4]  # an untranslated copy
    src_lines[6] = "a"
    tgt_lines[6] = " ".join("abcdefghij")  # 1 token against about 10
    (tmp_path / "s").write_bytes(("\n".join(src_lines[:9]) + "\n").encode() + b"\xff\xfe\n"
                                 + ("\n".join(src_lines[10:]) + "\n").encode())
    (tmp_path / "t").write_text("\n".join(tgt_lines) + "\n")
    settings = letter_settings(letters, **{"train.max_steps": 1, "data.train_src": tmp_path / "s",
                                           "data.train_tgt": tmp_path / "t", "data.skip_identical": "true",
                                           "data.max_length_ratio": 3, "data.invalid_utf8": "skip"})
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *settings])
    assert result.exit_code == 0, result.stderr
    # Letter reversal has palindromes: they are identical pairs too (line 10 is the invalid one).
    identical = sum(s == t for i, (s, t) in enumerate(zip(src_lines, tgt_lines)) if i != 9)
    assert identical >= 1
    assert f"train data: 200 pairs read, {200 - identical - 2} kept" in result.stderr
    assert (f"skipped {identical} pair{'s' if identical > 1 else ''} with the same text on both sides "
            f"(data.skip_identical), 1 pair over data.max_length_ratio (3), 1 pair with invalid UTF-8 "
            f"(data.invalid_utf8 = \"skip\"; first at {tmp_path / 's'}:10)") in result.stderr
    strict = run_cli(["train", TINY, "--run", tmp_path / "strict", *settings[:-2], "--set", "data.invalid_utf8=fail"])
    assert strict.exit_code == 1
    assert f"{tmp_path / 's'}:10: invalid UTF-8" in strict.stderr and "Traceback" not in strict.stderr


@pytest.mark.parametrize(("setting", "message"), [
    ("data.more_train=[{src=\"x\"}]", "missing required key data.more_train[0].tgt"),
    ("data.more_train=[{src=\"x\", tgt=\"y\", weight=-1}]", "data.more_train[0].weight must be above 0"),
    ("data.train_weight=0", "data.train_weight must be above 0"),
    ("data.max_length_ratio=0.5", "data.max_length_ratio must be 0 (off) or at least 1"),
    ("data.invalid_utf8=ignore", "data.invalid_utf8 must be one of fail, skip"),
])
def test_bad_corpus_settings_are_one_line(tmp_path, letters, setting, message):
    result = run_cli(["train", TINY, "--run", tmp_path / "run", *letter_settings(letters), "--set", setting])
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_run_whose_config_predates_the_corpus_settings_resumes(tmp_path, letters):
    settings = letter_settings(letters, **{"train.max_steps": 2})
    assert run_cli(["train", TINY, "--run", tmp_path / "run", *settings]).exit_code == 0
    config_path = tmp_path / "run" / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("max_length_ratio", "skip_identical", "invalid_utf8", "train_weight", "more_train", "cache_dir"):
        del config["recipe"]["data"][key]
    config_path.write_text(json.dumps(config))
    resumed = run_cli(["train", "--run", tmp_path / "run", "--resume", "--set", "train.max_steps=3"])
    assert resumed.exit_code == 0, resumed.stderr
    changed = run_cli(["train", "--run", tmp_path / "run", "--resume", "--set", "train.max_steps=4",
                       "--set", "data.skip_identical=true"])
    assert changed.exit_code == 1 and "data.skip_identical is True but the run" in changed.stderr


def test_text_changed_behind_its_fingerprint_stops_training_before_any_validation(tmp_path, letters, monkeypatch):
    from test_corpus_cache import forge_ref_for_current_files

    src = tmp_path / "train.src"
    src.write_text(letters["train_src"].read_text())
    cache = tmp_path / "cache"
    settings = letter_settings(letters, **{"train.max_steps": 3, "train.valid_every": 1, "data.train_src": src,
                                           "data.cache_dir": cache})
    assert run_cli(["train", TINY, "--run", tmp_path / "first", "--prepare-only", *settings]).exit_code == 0
    # The same length and modification time, other letters; then a ref as a file system whose change
    # times cannot be trusted would leave it: the fingerprint now leads to the old tokens.
    stat = src.stat()
    text = src.read_text()
    src.write_text(text.replace("a", "b", 1) if "a" in text else text.replace("b", "a", 1))
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    train_entries = [path for path in cache.iterdir() if path.is_dir() and path.name.startswith("train-")]
    ref = forge_ref_for_current_files(cache, [(src, letters["train_tgt"])], train_entries[0])
    monkeypatch.setattr("tfm_cli.corpus.cache.SYNC_CHECK_BYTES", 0)  # as for a corpus of many gigabytes
    stopped = run_cli(["train", TINY, "--run", tmp_path / "second", *settings])
    assert stopped.exit_code == 1
    assert f"training stopped: {src}: its content changed since its prepared data was made" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    metrics = tmp_path / "second" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    assert [record for record in records if record["kind"] == "valid"] == []
    assert not ref.exists()
    # The next run prepares the changed file anew, and trains and validates on it.
    again = run_cli(["train", TINY, "--run", tmp_path / "third", *settings])
    assert again.exit_code == 0, again.stderr
    assert "train data changed since it was prepared (train.src: content)" in again.stderr


def test_a_sweep_starting_together_on_a_shared_cache_prepares_everything_once(tmp_path, letters):
    import subprocess
    import sys

    values = {**{f"data.{key}": letters[key] for key in ("train_src", "train_tgt", "valid_src", "valid_tgt")},
              "data.cache_dir": tmp_path / "shared", "tokenizer.vocab_size": 20}
    settings = [item for key, value in values.items() for item in ("--set", f"{key}={value}")]
    processes = [
        subprocess.Popen([sys.executable, "-m", "tfm_cli", "train", str(TINY), "--run", str(tmp_path / f"run{i}"),
                          "--prepare-only", "--threads", "1", *map(str, settings)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    stderr = ""
    for process in processes:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        stderr += err
    # Whatever the interleaving: one tokenizer trained, and each of train and valid prepared by one run
    # and taken from the cache by the other.
    assert stderr.count("training a 20-piece") == 1
    assert stderr.count("(prepared before)") == 2
