"""Shared fixtures: tiny configs, synthetic data and a sentencepiece model for it, a CLI runner that keeps stderr apart.

Every fixture here except `multi30k_dir` builds its data from the project's own synthetic language
pair (tfm_cli/synthetic.py) or from inline text, in temp folders: the suite needs nothing outside
the repository. Only tests about Multi30k itself ask for `multi30k_dir`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfm_cli.cli import app
from tfm_cli.config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
LETTERS = "abcdefgh"
MULTI30K_DIR = Path(os.environ.get("MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@dataclass
class CliResult:
    """What one CLI invocation produced."""

    exit_code: int
    stdout: str
    stderr: str


def run_cli(args: list[str], input: str | bytes | None = None) -> CliResult:
    """Run `tfm ARGS` in-process (Typer's CliRunner), with stdout and stderr kept separate."""
    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


def run_tfm_process(args: list[str], input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m tfm_cli ARGS` as a real process (for pipes, signals and import checks)."""
    return subprocess.run(
        [sys.executable, "-m", "tfm_cli", *map(str, args)], input=input, capture_output=True, timeout=timeout
    )


def tiny_config(**overrides) -> ModelConfig:
    """A small model config that runs in milliseconds."""
    values = dict(
        src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=64,
        n_enc_layers=2, n_dec_layers=2, dropout=0.0, max_positions=128,
    )
    values.update(overrides)
    return ModelConfig(**values)


MULTI30K_FILES = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]


def running_in_ci() -> bool:
    """True where the environment variable CI is set (CI=true, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The real Multi30k folder ($MULTI30K_DIR, default ../shared/data/multi30k), for tests about Multi30k only.

    Without the data those tests skip, saying where it was looked for; in CI (CI set) they fail instead,
    because CI must have the data.
    """
    missing = [name for name in MULTI30K_FILES if not (MULTI30K_DIR / name).is_file()]
    if missing:
        message = f"Multi30k data not found in {MULTI30K_DIR} (no {missing[0]}); set MULTI30K_DIR"
        if running_in_ci():
            pytest.fail(f"{message} (CI is set: CI must have the data)", pytrace=False)
        pytest.skip(message)
    return MULTI30K_DIR


# The synthetic corpus every data-needing fixture uses: distinct sentences, no sentence in two splits.
SYNTHETIC_SIZES = {"train_size": 2000, "valid_size": 100, "test_size": 200, "seed": 0}
# The quickstart's size. The synthetic lexicon (~230 word forms) supports at most ~230 unigram pieces,
# and at 200 most words are 2-4 pieces: real subword splits for the word-level tests.
SMALL_SPM_PIECES = 200


def write_synthetic_corpus(folder: Path) -> dict[str, Path]:
    """The synthetic corpus (tfm_cli/synthetic.py) in `folder`: {"train.src": Path, ..., "test.align": Path}.

    Source: English-like ("the two big dogs sees my cat"); target: verb-final "Verbish".
    """
    from tfm_cli.synthetic import write_corpus

    return write_corpus(folder, **SYNTHETIC_SIZES)


def train_joint_spm(corpus: dict[str, Path], prefix: Path) -> Path:
    """A SMALL_SPM_PIECES-piece joint unigram model on the corpus's train.src + train.tgt (~0.1 s)."""
    from tfm_cli.tokenizer import TokenizerTrainConfig, train_sentencepiece

    return train_sentencepiece(
        [corpus["train.src"], corpus["train.tgt"]], prefix, TokenizerTrainConfig(vocab_size=SMALL_SPM_PIECES)
    )


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> dict[str, Path]:
    """The synthetic corpus: train (2000) / valid (100) / test (200) .src/.tgt files and test.align."""
    return write_synthetic_corpus(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def small_spm(tmp_path_factory, synthetic) -> Path:
    """A 200-piece joint sentencepiece model (the default unigram) trained on the synthetic train split."""
    return train_joint_spm(synthetic, tmp_path_factory.mktemp("spm") / "joint")


@pytest.fixture(scope="session")
def random_checkpoint(tmp_path_factory, small_spm) -> Path:
    """An untrained tiny model (seeded random weights) with the small_spm tokenizer, as a checkpoint file."""
    from tfm_cli.checkpoint import save_model
    from tfm_cli.model import Transformer
    from tfm_cli.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(small_spm)
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size)).eval()
    path = tmp_path_factory.mktemp("random_checkpoint") / "model.safetensors"
    save_model(path, model, tokenizer, tokenizer)
    return path


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread, then restore the setting.

    On a machine whose cores are busy with other work, 2 intra-op threads made tiny-model steps
    ~70x slower than 1 thread (4.5 s vs 0.065 s per training step, measured at load average 9.5).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def write_pairs(folder: Path, name: str, count: int, seed: int) -> tuple[Path, Path]:
    """`count` pairs of random letter sequences and their reversals, as NAME.src / NAME.tgt."""
    generator = torch.Generator().manual_seed(seed)
    lines = []
    for _ in range(count):
        length = int(torch.randint(3, 8, (1,), generator=generator))
        lines.append(" ".join(LETTERS[int(i)] for i in torch.randint(0, 8, (length,), generator=generator)))
    src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tgt.write_text("".join(" ".join(reversed(line.split())) + "\n" for line in lines), encoding="utf-8")
    return src, tgt


@pytest.fixture(scope="session")
def letters(tmp_path_factory) -> dict[str, Path]:
    """Small letter data (200 train, 20 valid pairs) and a 20-piece sentencepiece model for it."""
    folder = tmp_path_factory.mktemp("letters")
    train_src, train_tgt = write_pairs(folder, "train", 200, seed=1)
    valid_src, valid_tgt = write_pairs(folder, "valid", 20, seed=2)
    from tfm_cli.tokenizer import TokenizerTrainConfig, train_sentencepiece

    spm = train_sentencepiece([train_src, train_tgt], folder / "spm", TokenizerTrainConfig(vocab_size=20))
    return {"train_src": train_src, "train_tgt": train_tgt, "valid_src": valid_src, "valid_tgt": valid_tgt, "spm": spm}


def letter_settings(letters: dict[str, Path], **values: object) -> list[str]:
    """`tfm train --set` options: the letter data and its tokenizer, then `values` ({"train.seed": 2, ...})."""
    settings = {
        "data.train_src": letters["train_src"], "data.train_tgt": letters["train_tgt"],
        "data.valid_src": letters["valid_src"], "data.valid_tgt": letters["valid_tgt"],
        "tokenizer.src_model": letters["spm"], **values,
    }
    return [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]


def rewritten_checkpoint(source: Path, target: Path, metadata=None, tensors=None) -> Path:
    """A copy of checkpoint `source` at `target`, its metadata dict and/or tensor dict edited in place
    by the callbacks `metadata(meta)` and `tensors(weights)`; returns `target`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as f:
        meta = dict(f.metadata())
        weights = {name: f.get_tensor(name) for name in f.keys()}
    if metadata:
        metadata(meta)
    if tensors:
        tensors(weights)
    save_file(weights, str(target), metadata=meta)
    return target
