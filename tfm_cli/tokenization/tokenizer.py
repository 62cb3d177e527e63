"""Sentencepiece training and loading with tfm's fixed special ids; text <-> pieces <-> ids.

The special ids (special_ids.py) are fixed at training time (sentencepiece has no pad id by
default) so that every model config and checkpoint agrees on them: pad=0, unk=1, bos=2, eos=3.
The training settings, TokenizerTrainConfig, live with the other configs in config.py.
"""

from __future__ import annotations

import io
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from tfm_cli.config import TokenizerTrainConfig
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tfm_cli.textio.atomic_files import atomic_write_pair
from tfm_cli.textio.paths import check_input_file, check_output_path, make_folder
from tfm_cli.textio.streams import DecodeStats, iter_lines

# The sentences a tokenizer is trained on are sampled with this seed, so the same corpus and
# settings give the same model every time (sentencepiece's own sampling is seeded at random).
SAMPLE_SEED = 1


@dataclass(frozen=True)
class SentenceSample:
    """What tokenizer training read: how many sentences the inputs hold and how many it learned from."""

    total: int
    used: int


def sample_sentences(
    input_paths: list[Path], limit: int, seed: int = SAMPLE_SEED, skip_invalid_utf8: bool = False,
    line_counts: dict[Path, int] | None = None,
) -> tuple[list[str] | None, int]:
    """Read every line of `input_paths` (checking UTF-8) and keep a uniform sample of at most `limit`.

    Returns (the sample in reading order, the number of lines), or (None, lines) when there are no
    more than `limit` lines or `limit` is 0 (all are used). Reservoir sampling (Vitter's algorithm R)
    with random.Random(seed): memory holds `limit` lines whatever the corpus size. Invalid UTF-8 is
    a TfmError naming file and line, or with `skip_invalid_utf8` a line left out of the sample.
    `line_counts`, if given, receives each file's number of lines.
    """
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    count = 0
    for path in input_paths:
        # sentencepiece would silently drop invalid UTF-8; iter_lines refuses it, naming file and line.
        skipped = 0
        repaired = DecodeStats()
        start = count
        for line in iter_lines(str(path), strict_utf8=not skip_invalid_utf8, stats=repaired):
            if repaired.invalid_utf8_lines > skipped:
                skipped += 1
                continue
            if limit and len(reservoir) < limit:
                reservoir.append((count, line))
            elif limit:
                slot = rng.randrange(count + 1)
                if slot < limit:
                    reservoir[slot] = (count, line)
            count += 1
        if line_counts is not None:
            line_counts[path] = count - start + repaired.invalid_utf8_lines
    if not limit or count <= limit:
        return None, count
    return [line for _, line in sorted(reservoir)], count


def train_sentencepiece(
    input_paths: list[Path], model_prefix: Path, config: TokenizerTrainConfig, verbose: bool = False,
    on_sample: Callable[[SentenceSample], None] | None = None, skip_invalid_utf8: bool = False,
    line_counts: dict[Path, int] | None = None,
) -> Path:
    """Train a sentencepiece model on the text files `input_paths` (jointly, if several).

    Writes `{model_prefix}.model` and `{model_prefix}.vocab` atomically and returns the .model path.
    The model records the input paths but no output or temp path: the same inputs and config give
    the same bytes. Inputs with more than config.input_sentence_size lines in all are sampled down to
    that many (seeded, see sample_sentences); `on_sample` is told the counts either way.
    Raises TfmError for unreadable inputs or a vocabulary larger than the data allows, or invalid
    UTF-8 unless `skip_invalid_utf8`; `line_counts` receives each input's number of lines.
    """
    for path in input_paths:
        check_input_file(path, "tokenizer training needs existing text files")
        if path.stat().st_size == 0:
            raise TfmError(f"{path}: the file is empty; tokenizer training needs text")
    sample, total = sample_sentences(
        input_paths, config.input_sentence_size, skip_invalid_utf8=skip_invalid_utf8, line_counts=line_counts
    )
    if on_sample is not None:
        on_sample(SentenceSample(total, total if sample is None else len(sample)))
    model_path, vocab_path = Path(f"{model_prefix}.model"), Path(f"{model_prefix}.vocab")
    make_folder(model_prefix.parent, "output folder")  # before minutes of training, not after
    check_output_path(model_path)
    check_output_path(vocab_path)
    # sentencepiece hands the model to a writer instead of saving it under a prefix, which it would
    # record inside the model (a temp path, making every training's bytes differ).
    model_writer = io.BytesIO()
    # A sample is handed over as an iterator: nothing is written, and no temp path enters the model.
    source = {"input": ",".join(str(p) for p in input_paths)} if sample is None else {"sentence_iterator": iter(sample)}
    options = dict(
        **source,
        model_writer=model_writer,
        vocab_size=config.vocab_size,
        model_type=config.model_type,
        character_coverage=config.character_coverage,
        byte_fallback=config.byte_fallback,
        normalization_rule_name=config.normalization,
        remove_extra_whitespaces=config.normalization != "identity",
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        num_threads=max(1, min(os.cpu_count() or 1, 16)),
        minloglevel=0 if verbose else 2,
    )
    if config.user_defined_symbols:
        options["user_defined_symbols"] = list(config.user_defined_symbols)
    try:
        spm.SentencePieceTrainer.train(**options)
    except (RuntimeError, ValueError) as error:
        # The usual cause is a vocab size larger than the text supports; sentencepiece says so.
        message = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
        raise TfmError(f"sentencepiece training failed: {message}") from None
    model_bytes = model_writer.getvalue()
    atomic_write_pair((model_path, model_bytes), (vocab_path, format_vocab(model_bytes).encode("utf-8")))
    return model_path


def format_vocab(model_bytes: bytes) -> str:
    """The text of the .vocab file sentencepiece writes beside a model: `piece<TAB>score` per id, in id order."""
    processor = spm.SentencePieceProcessor(model_proto=model_bytes)
    pieces = range(processor.get_piece_size())
    return "".join(f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n" for i in pieces)


def load_sentencepiece(model_bytes: bytes, origin: str) -> spm.SentencePieceProcessor:
    """A SentencePieceProcessor of the serialized model `model_bytes`; TfmError naming `origin` if it is not one."""
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model_bytes)
    except (RuntimeError, OSError):
        raise TfmError(f"{origin}: not a sentencepiece model") from None
    return processor


class Tokenizer:
    """A loaded sentencepiece model, with the bytes it came from (so checkpoints can embed it)."""

    def __init__(self, model_bytes: bytes, origin: str = "<bytes>") -> None:
        self.model_bytes = model_bytes
        self.processor = load_sentencepiece(model_bytes, origin)
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        found = {
            "pad": self.processor.pad_id(),
            "unk": self.processor.unk_id(),
            "bos": self.processor.bos_id(),
            "eos": self.processor.eos_id(),
        }
        if found != expected:
            raise TfmError(
                f"{origin}: special ids are {found}, tfm needs {expected}; train it with `tfm tokenize train`"
            )

    @classmethod
    def from_file(cls, path: Path) -> Tokenizer:
        """Load a `.model` file written by `tfm tokenize train`."""
        check_input_file(path, "a sentencepiece .model")
        return cls(path.read_bytes(), origin=str(path))

    @property
    def vocabulary(self) -> None:
        """None: the ids are the sentencepiece model's own (vocabulary.MappedTokenizer has a table instead)."""
        return None

    @property
    def vocab_size(self) -> int:
        """The number of pieces, special ones included."""
        return self.processor.get_piece_size()

    def encode_ids(self, text: str) -> list[int]:
        """Raw text -> piece ids (no BOS/EOS added)."""
        return self.processor.encode(text, out_type=int)

    def encode_pieces(self, text: str) -> list[str]:
        """Raw text -> pieces (strings such as '▁Ein')."""
        return self.processor.encode(text, out_type=str)

    def encode_ids_batch(self, texts: list[str]) -> list[list[int]]:
        """Many raw texts -> piece ids each, on as many sentencepiece threads as torch uses (--threads)."""
        import torch

        return self.processor.encode(texts, out_type=int, num_threads=torch.get_num_threads())

    def decode_ids(self, ids: list[int]) -> str:
        """Piece ids -> detokenized text (special ids are dropped)."""
        return self.processor.decode(ids)

    def decode_pieces(self, pieces: list[str]) -> str:
        """Pieces -> detokenized text."""
        return self.processor.decode_pieces(pieces)

    def id_to_piece(self, piece_id: int) -> str:
        """The piece string of one id."""
        return self.processor.id_to_piece(piece_id)

    def piece_to_id(self, piece: str) -> int:
        """The id of one piece (unk_id if unknown)."""
        return self.processor.piece_to_id(piece)
