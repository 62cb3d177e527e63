"""Before the first update: check the run folder, read and check the text, train or load the
tokenizers, tokenize (cached); rank 0 first, then the other ranks reuse its files."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tfm_cli import distributed
from tfm_cli.config import ModelConfig, Recipe
from tfm_cli.data import (
    ParallelText,
    TokenizedCorpus,
    count_tokens,
    load_or_tokenize,
    read_parallel,
)
from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.textio import make_folder, remove_stale_temp_files
from tfm_cli.tokenizer import SentenceSample, Tokenizer, train_sentencepiece
from tfm_cli.training.events import DataEvent, Event, PhaseEvent
from tfm_cli.training.initialization import InitModel
from tfm_cli.training.run_dir import CACHE_DIR, CACHE_FILES, RUN_FILES, check_run_dir


@dataclass
class PreparedData:
    """Everything the loop needs from the data side, and the model config that fits its tokenizers."""

    model_config: ModelConfig
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    train: TokenizedCorpus
    valid: TokenizedCorpus | None
    valid_references: list[str]


def prepare_tokenizers(
    recipe: Recipe, run_dir: Path, resume: bool, text: ParallelText, on_event: Callable[[Event], None]
) -> tuple[Tokenizer, Tokenizer]:
    """Load the recipe's sentencepiece models, or train them into the run directory (reused on resume)."""
    settings = recipe.tokenizer
    if settings.src_model:
        src = Tokenizer.from_file(Path(settings.src_model))
        tgt = Tokenizer.from_file(Path(settings.tgt_model)) if settings.tgt_model else src
        return src, tgt
    train_settings = settings.train_settings()
    if settings.joint:
        prefixes = {"joint": (run_dir / "spm", [text.src.path, text.tgt.path])}
    else:
        prefixes = {"src": (run_dir / "spm.src", [text.src.path]), "tgt": (run_dir / "spm.tgt", [text.tgt.path])}
    def report_sample(sample: SentenceSample) -> None:
        if sample.used < sample.total:
            on_event(PhaseEvent(f"the tokenizer learns from {sample.used:,} of {sample.total:,} sentences "
                                "(a seeded sample; tokenizer.input_sentence_size = 0 takes all)"))

    loaded = {}
    for side, (prefix, inputs) in prefixes.items():
        model_path = Path(f"{prefix}.model")
        if not (resume and model_path.is_file()):
            on_event(PhaseEvent(f"training a {train_settings.vocab_size}-piece {train_settings.model_type} "
                                f"sentencepiece model ({side}) -> {model_path}"))
            train_sentencepiece(inputs, prefix, train_settings, on_sample=report_sample)
        loaded[side] = Tokenizer.from_file(model_path)
    if settings.joint:
        return loaded["joint"], loaded["joint"]
    return loaded["src"], loaded["tgt"]


def prepare_data(
    recipe: Recipe, run_dir: Path, resume: bool, on_event: Callable[[Event], None], init: InitModel | None = None
) -> PreparedData:
    """Read and check all text first (line counts, UTF-8), then tokenizers, then the tokenized corpora.

    A run started with --init (`init`) takes its tokenizers and model config from that checkpoint.
    """
    data = recipe.data
    on_event(PhaseEvent("reading the parallel text"))
    train_text = read_parallel(data.train_src, data.train_tgt, "training")
    valid_text = read_parallel(data.valid_src, data.valid_tgt, "validation") if data.valid_src else None
    if init is not None:
        src_tokenizer, tgt_tokenizer = init.src_tokenizer, init.tgt_tokenizer
        model_config = init.model_config(recipe.model)
    else:
        src_tokenizer, tgt_tokenizer = prepare_tokenizers(recipe, run_dir, resume, train_text, on_event)
        if recipe.model.share_embeddings and src_tokenizer.model_bytes != tgt_tokenizer.model_bytes:
            raise TfmError(
                "model.share_embeddings needs one joint sentencepiece model for both sides "
                "(tokenizer.joint = true, or no tokenizer.tgt_model)"
            )
        model_config = recipe.model_config(src_tokenizer.vocab_size, tgt_tokenizer.vocab_size)
    corpora = {}
    for name, text in (("train", train_text), ("valid", valid_text)):
        if text is None:
            continue
        on_event(PhaseEvent(f"tokenizing the {name} data"))
        corpus, cached = load_or_tokenize(
            text, src_tokenizer, tgt_tokenizer, data.max_length, run_dir / CACHE_DIR, name, model_config.eos_id
        )
        src_tokens, tgt_tokens = count_tokens(corpus)
        on_event(DataEvent(name, corpus.stats, data.max_length, cached, src_tokens, tgt_tokens))
        corpora[name] = corpus
    if len(corpora["train"]) == 0:
        raise TfmError(f"no training pairs left after filtering {data.train_src} / {data.train_tgt}")
    valid = corpora.get("valid")
    if valid is not None and len(valid) == 0:
        raise TfmError(f"no validation pairs left after filtering {data.valid_src} / {data.valid_tgt}")
    references = [valid_text.tgt.lines[i] for i in valid.line_numbers.tolist()] if valid is not None else []
    return PreparedData(model_config, src_tokenizer, tgt_tokenizer, corpora["train"], valid, references)


def prepare_on_rank0_first(
    recipe: Recipe, run_dir: Path, resume: bool, device: torch.device, world: World, on_event: Callable[[Event], None],
    init: InitModel | None = None,
) -> PreparedData:
    """prepare_run on rank 0, which then tells the other ranks whether it worked; they prepare after it.

    Rank 0 trains the tokenizers and fills the cache; the others then read them. If rank 0 fails, the
    others raise TfmError at once with its message instead of waiting out train.dist_timeout.
    """
    if world.is_main:
        try:
            data = prepare_run(recipe, run_dir, resume, world, on_event, init)
        except BaseException as error:
            message = str(error) if isinstance(error, TfmError) else f"{type(error).__name__}: {error}"
            with contextlib.suppress(Exception):  # rank 0's own error is the one to report
                distributed.broadcast_text(message, world, device)
            raise
        distributed.broadcast_text(None, world, device)
        return data
    failure = distributed.broadcast_text(None, world, device)
    if failure is not None:
        raise TfmError(f"rank 0 failed while preparing the data: {failure}")
    return prepare_run(recipe, run_dir, resume, world, on_event, init)


def prepare_run(
    recipe: Recipe, run_dir: Path, resume: bool, world: World, on_event: Callable[[Event], None],
    init: InitModel | None = None,
) -> PreparedData:
    """Check the run directory, then prepare_data; ranks other than 0 reuse rank 0's tokenizers and cache."""
    check_run_dir(recipe, run_dir, resume)
    if resume and world.is_main:
        # Saves killed mid-write (SIGKILL) leave hidden temp files; the other ranks wait for rank 0.
        stale = remove_stale_temp_files(run_dir, RUN_FILES) + remove_stale_temp_files(run_dir / CACHE_DIR, CACHE_FILES)
        if stale:
            names = ", ".join(path.name for path in stale)
            on_event(PhaseEvent(f"removed {len(stale)} temp file(s) left by an interrupted save: {names}"))
    make_folder(run_dir, "run folder")
    return prepare_data(recipe, run_dir, resume or not world.is_main, on_event, init)
