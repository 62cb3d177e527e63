"""recipes/multi30k: the data fetcher (local folder, download, offline) and a CI-sized run of run.sh."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

RECIPE_DIR = REPO_ROOT / "recipes" / "multi30k"
FILE_NAMES = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]


def script_env(**variables: str | None) -> dict[str, str]:
    """This environment with the venv's bin first on PATH (run.sh calls `tfm` and `python`), plus `variables`
    (None removes one)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for name, value in variables.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return env


def fetch(**variables: str | None) -> subprocess.CompletedProcess:
    """Run fetch.py with MULTI30K_DIR unset unless given."""
    variables.setdefault("MULTI30K_DIR", None)
    return subprocess.run([sys.executable, RECIPE_DIR / "fetch.py"], env=script_env(**variables),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, multi30k_dir) -> Path:
    """A file:// stand-in for the dataset's repository: the six real files, gzipped."""
    folder = tmp_path_factory.mktemp("mirror")
    for name in FILE_NAMES:
        (folder / f"{name}.gz").write_bytes(gzip.compress((multi30k_dir / name).read_bytes()))
    return folder


def test_downloads_once_into_the_cache_and_prints_the_folder(mirror, multi30k_dir, tmp_path):
    first = fetch(MULTI30K_URL=mirror.as_uri(), TFM_CACHE=str(tmp_path / "cache"))
    assert first.returncode == 0, first.stderr
    folder = Path(first.stdout.strip())
    assert folder == tmp_path / "cache" / "multi30k"
    for name in FILE_NAMES:
        assert (folder / name).read_bytes() == (multi30k_dir / name).read_bytes(), name
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILE_NAMES)  # no temporary files left
    assert first.stderr.count("downloading") == 6
    again = fetch(MULTI30K_URL=mirror.as_uri(), TFM_CACHE=str(tmp_path / "cache"))
    assert again.returncode == 0 and again.stdout == first.stdout and "downloading" not in again.stderr


def test_offline_is_one_clear_line_and_leaves_no_file(tmp_path):
    # Port 9 (discard) on localhost refuses connections: the same failure as no network.
    result = fetch(MULTI30K_URL="http://127.0.0.1:9/raw", TFM_CACHE=str(tmp_path / "cache"))
    assert result.returncode == 1 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot download Multi30k train.de" in errors[0] and "MULTI30K_DIR" in errors[0]
    assert "Traceback" not in result.stderr
    assert list((tmp_path / "cache" / "multi30k").iterdir()) == []


def test_truncated_download_is_refused(mirror, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in FILE_NAMES:
        (broken / f"{name}.gz").write_bytes((mirror / f"{name}.gz").read_bytes())
    text = gzip.decompress((broken / "val.de.gz").read_bytes()).decode("utf-8")
    (broken / "val.de.gz").write_bytes(gzip.compress("\n".join(text.splitlines()[:500]).encode() + b"\n"))
    result = fetch(MULTI30K_URL=broken.as_uri(), TFM_CACHE=str(tmp_path / "cache"))
    assert result.returncode == 1 and "has 500 lines, expected 1014" in result.stderr
    assert not (tmp_path / "cache" / "multi30k" / "val.de").exists()


def test_a_given_folder_is_used_as_is_and_checked(multi30k_dir, tmp_path):
    given = fetch(MULTI30K_DIR=str(multi30k_dir), MULTI30K_URL="http://127.0.0.1:9/raw")
    assert given.returncode == 0 and Path(given.stdout.strip()) == multi30k_dir
    (tmp_path / "train.de").write_text("x\n")
    partial = fetch(MULTI30K_DIR=str(tmp_path))
    assert partial.returncode == 1 and "has no train.en" in partial.stderr


@pytest.fixture()
def small_multi30k(tmp_path, multi30k_dir) -> Path:
    """A few hundred lines of each real file (the smoke test's corpus)."""
    folder = tmp_path / "data"
    folder.mkdir()
    sizes = {"train": 300, "val": 40, "test_2016_flickr": 25}
    for name in FILE_NAMES:
        lines = (multi30k_dir / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / name).write_text("".join(lines[: sizes[name.rsplit(".", 1)[0]]]), encoding="utf-8")
    return folder


def test_run_sh_goes_end_to_end_on_a_small_corpus(small_multi30k, tmp_path):
    run = tmp_path / "run"
    shrink = ["tokenizer.vocab_size=400", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
              "model.n_enc_layers=1", "model.n_dec_layers=1", "train.max_tokens=600", "train.max_steps=10",
              "train.save_every=2", "train.valid_every=5", "train.warmup_steps=4"]
    args = [arg for setting in shrink for arg in ("--set", setting)]
    result = subprocess.run(["bash", RECIPE_DIR / "run.sh", "de-en", run, *args],
                            env=script_env(MULTI30K_DIR=str(small_multi30k), TFM_THREADS="1"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    hypotheses = (run / "test_2016_flickr.en.hyp").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 25
    assert result.stdout.startswith("BLEU") and "chrF" in result.stdout
    assert (run / "test_2016_flickr.score").read_text() == result.stdout
    assert "| update | epoch |" in result.stderr and "| 10 |" in result.stderr  # the validation curve
    assert (run / "average.safetensors").is_file()
    assert len(list((run / "train").glob("checkpoint_0*.safetensors"))) == 5
    if shutil.which("eflomal-align", path=script_env()["PATH"]):  # the aligners extra: the aligner is on
        assert (run / "aligned.safetensors").is_file()
    else:
        assert "no aligner: eflomal-align is not installed" in result.stderr


def test_run_sh_wants_a_direction():
    result = subprocess.run(["bash", RECIPE_DIR / "run.sh", "fr-en"], env=script_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "de-en|en-de" in result.stderr


def test_distill_sh_trains_a_student_on_the_teachers_translations(small_multi30k, tmp_path):
    from conftest import run_cli, save_random_checkpoint

    teacher = tmp_path / "teacher"  # what run.sh leaves: average.safetensors and train/spm.model
    (teacher / "train").mkdir(parents=True)
    spm = run_cli(["tokenize", "train", small_multi30k / "train.de", small_multi30k / "train.en", "-o",
                   teacher / "train" / "spm", "--vocab-size", "400"])
    assert spm.exit_code == 0, spm.stderr
    save_random_checkpoint(teacher / "average.safetensors", teacher / "train" / "spm.model", seed=0)
    shrink = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "train.max_tokens=600", "train.max_steps=6",
              "train.save_every=2", "train.valid_every=3", "train.warmup_steps=2"]
    args = [arg for setting in shrink for arg in ("--set", setting)]
    env = script_env(MULTI30K_DIR=str(small_multi30k), TFM_THREADS="1", STUDENT_ENCODER_LAYERS="2", STUDENT_DECODER_LAYERS="1")
    student = tmp_path / "student"
    result = subprocess.run(["bash", RECIPE_DIR / "distill.sh", "de-en", teacher, student, *args],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # The distilled targets are the teacher's own translations of the training sources, line for line.
    teacher_says = subprocess.run([sys.executable, "-m", "tfm_cli", "translate", "-m", teacher / "average.safetensors",
                                   "--threads", "1", "-q"], input=(small_multi30k / "train.de").read_text(encoding="utf-8"),
                                  capture_output=True, text=True, env=env)
    assert (student / "distilled.en").read_text(encoding="utf-8") == teacher_says.stdout
    config = json.loads((student / "train" / "config.json").read_text(encoding="utf-8"))
    assert (config["model_config"]["n_enc_layers"], config["model_config"]["n_dec_layers"]) == (2, 1)
    assert config["recipe"]["tokenizer"]["src_model"] == str(teacher / "train" / "spm.model")
    scores = (student / "test_2016_flickr.score").read_text(encoding="utf-8").splitlines()
    assert [line.split(":")[0] for line in scores] == ["greedy", "beam"] and all("BLEU" in line for line in scores)
    assert len((student / "test_2016_flickr.en.greedy.hyp").read_text(encoding="utf-8").splitlines()) == 25
