"""Before the first update: check the run folder, train or load the tokenizers, prepare the corpora
(corpus/cache.py: tokenized once, memory-mapped after); rank 0 first, then the other ranks map its files."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tfm_cli import distributed
from tfm_cli.config import DataConfig, ModelConfig, TrainCorpus
from tfm_cli.corpus.batching import SpecialIds
from tfm_cli.corpus.cache import ContentCheck, prepare_corpus
from tfm_cli.corpus.cache_folder import digest_of, remove_dead_temp_folders
from tfm_cli.corpus.file_locks import exclusive_lock
from tfm_cli.corpus.filters import FilterSettings
from tfm_cli.corpus.parallel_text import fingerprint
from tfm_cli.corpus.tokenized import TokenizedCorpus, count_tokens
from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.recipe import Recipe
from tfm_cli.textio.atomic_files import atomic_write_pair, remove_stale_temp_files
from tfm_cli.textio.paths import make_folder
from tfm_cli.textio.streams import read_lines
from tfm_cli.tokenization.tokenizer import SentenceSample, Tokenizer, train_sentencepiece
from tfm_cli.training.events import DataEvent, Event, PhaseEvent, PrepareEvent
from tfm_cli.training.guided_alignment import PieceTable, WordLinks, corpus_word_links
from tfm_cli.training.initialization import InitModel
from tfm_cli.training.run_dir import CACHE_DIR, CACHE_FILES, RUN_FILES, check_run_dir

TOKENIZER_CACHE_VERSION = 1


@dataclass
class PreparedData:
    """Everything the loop needs from the data side, and the model config that fits its tokenizers."""

    model_config: ModelConfig
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    train: TokenizedCorpus
    valid: TokenizedCorpus | None
    valid_references: list[str]
    train_weights: tuple[float, ...]  # one per training corpus (data.train_corpora)
    content_checks: tuple[ContentCheck, ...] = ()  # full SHA-256 checks of large cached corpora, still running
    train_links: WordLinks | None = None  # guided alignment: the reference word links of every training row

    def check_unchanged(self, wait: bool) -> None:
        """Raise TfmError if a content check found that a cached corpus's text files changed; with `wait`,
        first wait for the checks still running (before anything is validated on that data)."""
        for check in self.content_checks:
            failure = check.result(wait)
            if failure is not None:
                raise TfmError(f"training stopped: {failure}")


def cache_folder(data: DataConfig, run_dir: Path) -> Path:
    """Where prepared corpora and trained tokenizers are kept: data.cache_dir, or RUN/cache."""
    return Path(data.cache_dir) if data.cache_dir else run_dir / CACHE_DIR


def tokenizer_cache_path(inputs: list[Path], recipe: Recipe, side: str, cache_dir: Path) -> Path:
    """CACHE/spm-SIDE-KEY.model: KEY covers the training text files (by fingerprint) and the settings."""
    parts = {
        "version": TOKENIZER_CACHE_VERSION,
        "side": side,
        # Not the change time and inode: a copied or re-permissioned file need not retrain its tokenizer.
        "inputs": [{key: value for key, value in fingerprint(path, "tokenizer training text").to_dict().items()
                    if key not in ("ctime_ns", "inode")} for path in inputs],
        "settings": asdict(recipe.tokenizer.train_settings()),
        "skip_invalid_utf8": recipe.data.invalid_utf8 == "skip",
    }
    return cache_dir / f"spm-{side}-{digest_of(parts)[:20]}.model"


def check_line_counts(corpora: tuple[TrainCorpus, ...], line_counts: dict[Path, int]) -> None:
    """Raise TfmError for a training corpus whose two files (both counted in `line_counts`) differ in lines."""
    for corpus in corpora:
        src, tgt = Path(corpus.src), Path(corpus.tgt)
        if src in line_counts and tgt in line_counts and line_counts[src] != line_counts[tgt]:
            raise TfmError(
                f"training data: {src} has {line_counts[src]} lines but {tgt} has {line_counts[tgt]}; "
                "parallel files need one sentence per line on both sides"
            )


def prepare_tokenizers(
    recipe: Recipe, run_dir: Path, resume: bool, on_event: Callable[[Event], None],
    should_stop: Callable[[], bool] | None = None,
) -> tuple[Tokenizer, Tokenizer]:
    """Load the recipe's sentencepiece models, or train them into the run directory (reused on resume).

    A model trained on the same files (by fingerprint) with the same settings is taken from the cache
    folder instead of trained again, so a new run on a prepared corpus starts in seconds. Runs that
    start together on a shared cache folder train it once: one holds the model's lock, the others wait
    for it (`should_stop` is asked while they wait).
    """
    settings = recipe.tokenizer
    if settings.src_model:
        src = Tokenizer.from_file(Path(settings.src_model))
        tgt = Tokenizer.from_file(Path(settings.tgt_model)) if settings.tgt_model else src
        return src, tgt
    train_settings = settings.train_settings()
    corpora = recipe.data.train_corpora
    src_files, tgt_files = [Path(c.src) for c in corpora], [Path(c.tgt) for c in corpora]
    if settings.joint:
        prefixes = {"joint": (run_dir / "spm", src_files + tgt_files)}
    else:
        prefixes = {"src": (run_dir / "spm.src", src_files), "tgt": (run_dir / "spm.tgt", tgt_files)}

    line_counts: dict[Path, int] = {}

    def report_sample(sample: SentenceSample) -> None:
        # Sampling read every line: a parallel corpus with uneven files stops before minutes of training.
        check_line_counts(corpora, line_counts)
        if sample.used < sample.total:
            on_event(PhaseEvent(f"the tokenizer learns from {sample.used:,} of {sample.total:,} sentences "
                                "(a seeded sample; tokenizer.input_sentence_size = 0 takes all)"))

    cache_dir = cache_folder(recipe.data, run_dir)
    loaded = {}
    for side, (prefix, inputs) in prefixes.items():
        model_path = Path(f"{prefix}.model")
        if not (resume and model_path.is_file()):
            cached = tokenizer_cache_path(inputs, recipe, side, cache_dir)
            make_folder(cache_dir, "cache folder")
            waiting = (lambda holder, side=side: on_event(PhaseEvent(
                f"waiting for another process that is training the same sentencepiece model ({side}) in {cache_dir} "
                f"({holder})")))
            with exclusive_lock(cached.with_suffix(".lock"), waiting, should_stop):
                if cached.is_file():
                    on_event(PhaseEvent(f"sentencepiece model ({side}) from the cache: {cached}"))
                    model_bytes = cached.read_bytes()
                    Tokenizer(model_bytes, str(cached))  # refuses a damaged file before it is copied
                    vocab = cached.with_suffix(".vocab").read_bytes()
                    atomic_write_pair((model_path, model_bytes), (Path(f"{prefix}.vocab"), vocab))
                else:
                    on_event(PhaseEvent(f"training a {train_settings.vocab_size}-piece {train_settings.model_type} "
                                        f"sentencepiece model ({side}) -> {model_path}"))
                    train_sentencepiece(inputs, prefix, train_settings, on_sample=report_sample,
                                        skip_invalid_utf8=recipe.data.invalid_utf8 == "skip", line_counts=line_counts)
                    vocab = Path(f"{prefix}.vocab").read_bytes()
                    atomic_write_pair((cached, model_path.read_bytes()), (cached.with_suffix(".vocab"), vocab))
        loaded[side] = Tokenizer.from_file(model_path)
    if settings.joint:
        return loaded["joint"], loaded["joint"]
    return loaded["src"], loaded["tgt"]


def train_filters(data: DataConfig) -> FilterSettings:
    """The filters of the training corpora: the recipe's [data] settings."""
    return FilterSettings(
        max_length=data.max_length, max_length_ratio=data.max_length_ratio, skip_identical=data.skip_identical,
        skip_empty=True, skip_invalid_utf8=data.invalid_utf8 == "skip",
    )


def valid_filters(data: DataConfig, model_config: ModelConfig) -> FilterSettings:
    """The filters of the validation set: none but what the model cannot take (over max_positions tokens,
    EOS included: the decoder's input is BOS + target, as long as the target + EOS) and invalid UTF-8 as
    the recipe says, so validation scores the whole set as `tfm translate` would."""
    return FilterSettings(max_length=model_config.max_positions, skip_empty=False,
                          skip_invalid_utf8=data.invalid_utf8 == "skip")


def prepare_data(
    recipe: Recipe, run_dir: Path, resume: bool, on_event: Callable[[Event], None], init: InitModel | None = None,
    should_stop: Callable[[], bool] | None = None, world: World = World(),
) -> PreparedData:
    """Tokenizers first, then the training and validation corpora, each read once into the cache.

    A run started with --init (`init`) takes its tokenizers and model config from that checkpoint.
    Ranks other than 0 find everything rank 0 prepared (a missing entry is an error, not a second preparation).
    """
    data = recipe.data
    if init is not None:
        src_tokenizer, tgt_tokenizer = init.src_tokenizer, init.tgt_tokenizer
        model_config = init.model_config(recipe.model)
    else:
        src_tokenizer, tgt_tokenizer = prepare_tokenizers(recipe, run_dir, resume, on_event, should_stop)
        if recipe.model.share_embeddings and src_tokenizer.model_bytes != tgt_tokenizer.model_bytes:
            raise TfmError(
                "model.share_embeddings needs one joint sentencepiece model for both sides "
                "(tokenizer.joint = true, or no tokenizer.tgt_model)"
            )
        model_config = recipe.model_config(src_tokenizer.vocab_size, tgt_tokenizer.vocab_size)
    cache_dir = cache_folder(data, run_dir)
    sets = {"train": ([(c.src, c.tgt) for c in data.train_corpora], train_filters(data))}
    if data.valid_src:
        sets["valid"] = ([(data.valid_src, data.valid_tgt)], valid_filters(data, model_config))
    corpora, checks = {}, []
    for name, (inputs, filters) in sets.items():
        on_event(PhaseEvent(f"preparing the {name} data"))
        prepared = prepare_corpus(
            inputs, src_tokenizer, tgt_tokenizer, filters, cache_dir, name, model_config.eos_id,
            on_progress=lambda progress: on_event(PrepareEvent(progress)), should_stop=should_stop,
            must_exist=not world.is_main, check_tokens=world.is_main,
            on_wait=lambda message: on_event(PhaseEvent(message)),
        )
        if prepared.content_check is not None:
            checks.append(prepared.content_check)
            on_event(PhaseEvent(f"the {name} data was found by its files' fingerprints; their SHA-256 is checked "
                                "while training starts"))
        corpus = prepared.corpus
        src_tokens, tgt_tokens = count_tokens(corpus)
        labels = [f"{Path(src).name} / {Path(tgt).name}" for src, tgt in inputs]
        on_event(DataEvent(name, tuple(zip(labels, corpus.stats)), filters.active(), prepared.from_cache,
                           src_tokens, tgt_tokens, prepared.changed))
        corpora[name] = corpus
    if len(corpora["train"]) == 0:
        raise TfmError(f"no training pairs left after filtering {data.train_src} / {data.train_tgt}")
    valid = corpora.get("valid")
    if valid is not None and len(valid) == 0:
        raise TfmError(f"no validation pairs left after filtering {data.valid_src} / {data.valid_tgt}")
    references = []
    if valid is not None:
        lines = read_lines(data.valid_tgt, strict_utf8=data.invalid_utf8 == "fail")
        references = [lines[i] for i in valid.line_numbers.tolist()]
    weights = tuple(corpus.weight for corpus in data.train_corpora)
    links = None
    if data.train_alignment:
        links = prepare_word_links(data, corpora["train"], src_tokenizer, tgt_tokenizer, model_config, on_event)
    return PreparedData(model_config, src_tokenizer, tgt_tokenizer, corpora["train"], valid, references, weights,
                        tuple(checks), links)


def prepare_word_links(
    data: DataConfig, corpus: TokenizedCorpus, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
    model_config: ModelConfig, on_event: Callable[[Event], None],
) -> WordLinks:
    """The word links of data.train_alignment for the training rows filtering kept (guided alignment).

    Read afresh every session, never cached: an edited alignment file is never served stale, and a
    resumed run gets the same links for the same rows. Raises TfmError for a file that does not match
    the training text (line count, a link beyond a line's words).
    """
    on_event(PhaseEvent(f"reading the word alignments {data.train_alignment}"))
    links, untokenizable = corpus_word_links(
        data.train_alignment, data.train_src, data.train_tgt, corpus, PieceTable.of(src_tokenizer),
        PieceTable.of(tgt_tokenizer), SpecialIds.of(model_config),
    )
    guided = int(((links.offsets[1:] - links.offsets[:-1]) > 0).sum())
    message = f"guided alignment: {links.links.size(0):,} links in {guided:,} of {len(corpus):,} training pairs"
    if untokenizable:
        message += (f"; {untokenizable:,} pairs whose subwords make other words than their spaces are not guided "
                    "(a tokenizer that normalises spaces?)")
    on_event(PhaseEvent(message))
    return links


def prepare_on_rank0_first(
    recipe: Recipe, run_dir: Path, resume: bool, device: torch.device, world: World, on_event: Callable[[Event], None],
    init: InitModel | None = None, should_stop: Callable[[], bool] | None = None,
) -> PreparedData:
    """prepare_run on rank 0, which then tells the other ranks whether it worked; they prepare after it.

    Rank 0 trains the tokenizers and fills the cache; the others then map its files. They wait in a
    group of their own whose timeout (distributed.PREPARE_TIMEOUT_S) is not train.dist_timeout: preparing
    a large corpus takes longer than any training collective should. If rank 0 fails, the others
    raise TfmError at once with its message.
    """
    group = distributed.preparation_group(world)
    if world.is_main:
        if world.distributed:
            on_event(PhaseEvent(f"rank 0 prepares the data; {world.world_size - 1} other rank(s) wait for it"))
        try:
            distributed.prepare_delay_hook()
            data = prepare_run(recipe, run_dir, resume, world, on_event, init, should_stop)
        except BaseException as error:
            message = str(error) if isinstance(error, TfmError) else f"{type(error).__name__}: {error}"
            with contextlib.suppress(Exception):  # rank 0's own error is the one to report
                distributed.broadcast_text(message or type(error).__name__, world, device, group)
            raise
        distributed.broadcast_text(None, world, device, group)
        return data
    failure = distributed.broadcast_text(None, world, device, group)
    if failure is not None:
        raise TfmError(f"rank 0 failed while preparing the data: {failure}")
    return prepare_run(recipe, run_dir, resume, world, on_event, init, should_stop)


def prepare_run(
    recipe: Recipe, run_dir: Path, resume: bool, world: World, on_event: Callable[[Event], None],
    init: InitModel | None = None, should_stop: Callable[[], bool] | None = None,
) -> PreparedData:
    """Check the run directory, then prepare_data; ranks other than 0 reuse rank 0's tokenizers and cache."""
    check_run_dir(recipe, run_dir, resume)
    cache_dir = cache_folder(recipe.data, run_dir)
    if world.is_main:
        # Saves killed mid-write (SIGKILL) leave hidden temp files; the other ranks wait for rank 0.
        stale = remove_stale_temp_files(run_dir, RUN_FILES) if resume else []
        if cache_dir.is_dir():
            # A shared cache folder (data.cache_dir) may have other runs writing in it: only the temp
            # folders of preparations that provably died are removed there.
            if not recipe.data.cache_dir and resume:
                stale += remove_stale_temp_files(cache_dir, CACHE_FILES)
            stale += remove_dead_temp_folders(cache_dir)
        if stale:
            names = ", ".join(path.name for path in stale)
            on_event(PhaseEvent(f"removed {len(stale)} temp file(s) left by an interrupted save or preparation: {names}"))
    make_folder(run_dir, "run folder")
    return prepare_data(recipe, run_dir, resume or not world.is_main, on_event, init, should_stop, world)

