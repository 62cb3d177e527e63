"""The checkpoint contract: one self-contained .safetensors file, validated on load, written atomically.

Layout (format version 1):
  tensors   every model parameter under its `Transformer.named_parameters()` name (tied weights
            stored once, under their first name), plus the sentencepiece model bytes as uint8
            tensors `tokenizer.src` and, when the target side has its own model, `tokenizer.tgt`.
            A tokenizer whose ids come from a piece table (vocabulary.MappedTokenizer: imported
            Marian models) adds the table as UTF-8 JSON in `tokenizer.src_vocab` and, when the
            target's differs, `tokenizer.tgt_vocab`.
  metadata  format="tfm-checkpoint", format_version="1", model_config (JSON of ModelConfig),
            provenance (free-form JSON: step, recipe, averaged inputs, ...), and optionally
            decode_defaults (JSON: DecodeConfig fields an imported model's generation config sets),
            and alignment (JSON of AlignmentConfig: the attention that aligns words best).
            A trained aligner (model/aligner.py) adds its tensors under `aligner.`, and alignment then
            says `aligner: true` with its sizes.
Nothing here ever unpickles: files are read through safetensors only.
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from tfm_cli.checkpoints.metadata import (
    FORMAT_NAME,
    FORMAT_VERSION,
    read_alignment,
    read_decode_defaults,
    read_metadata,
)
from tfm_cli.config import AlignmentConfig, ModelConfig, config_from_dict, config_to_dict
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer, parameter_shapes
from tfm_cli.model.aligner import ALIGNER_PREFIX, Aligner, aligner_shapes
from tfm_cli.model.embedding_rows import Embedding, reads_rows_from_files
from tfm_cli.model.kernels import Linear
from tfm_cli.model.precision import convert_linear_layers
from tfm_cli.textio.atomic_files import atomic_write_bytes
from tfm_cli.textio.paths import as_regular_file, check_input_file
from tfm_cli.tokenization.tokenizer import Tokenizer
from tfm_cli.tokenization.vocabulary import MappedTokenizer, decode_vocabulary, encode_vocabulary

SRC_TOKENIZER_KEY = "tokenizer.src"
TGT_TOKENIZER_KEY = "tokenizer.tgt"
SRC_VOCAB_KEY = "tokenizer.src_vocab"
TGT_VOCAB_KEY = "tokenizer.tgt_vocab"
# Every file a checkpoint embeds as bytes: the one list read_checkpoint checks (dtype, shape) before use.
EMBEDDED_FILE_KEYS = (SRC_TOKENIZER_KEY, TGT_TOKENIZER_KEY, SRC_VOCAB_KEY, TGT_VOCAB_KEY)
TOKENIZER_PREFIX = "tokenizer."
HEADER_LIMIT = 100 * 1024 * 1024  # the safetensors format's own limit on the JSON header
SENTENCEPIECE_LIMIT = 64 * 1024 * 1024  # larger files are not tried as sentencepiece models


@dataclass
class Checkpoint:
    """A checkpoint's contents, validated, before (or without) building a model from it."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]  # parameter name -> tensor, exactly the model's parameters
    src_tokenizer_bytes: bytes
    tgt_tokenizer_bytes: bytes  # the same bytes as the source for a joint vocabulary
    provenance: dict[str, Any] = field(default_factory=dict)
    # Piece tables (id -> piece) of tokenizers whose ids are not the sentencepiece model's (None: they are).
    src_vocab: tuple[str, ...] | None = None
    tgt_vocab: tuple[str, ...] | None = None
    # DecodeConfig fields (config.CHECKPOINT_DECODE_KEYS) this model decodes with by default; {} = tfm's defaults.
    decode_defaults: dict[str, Any] = field(default_factory=dict)
    # AlignmentConfig fields of the attention that aligns best (a guided run's head); {} = tfm's defaults.
    alignment: dict[str, Any] = field(default_factory=dict)
    # A trained aligner's tensors (names start with ALIGNER_PREFIX); {} without one.
    aligner_weights: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class LoadedModel:
    """A model ready to run, with the tokenizers, provenance and decoding defaults of its checkpoint."""

    model: Transformer
    src_tokenizer: Tokenizer | MappedTokenizer
    tgt_tokenizer: Tokenizer | MappedTokenizer
    provenance: dict[str, Any]
    decode_defaults: dict[str, Any] = field(default_factory=dict)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)  # the checkpoint's, else the default
    aligner: Aligner | None = None  # the checkpoint's trained aligner, if it has one

    @property
    def config(self) -> ModelConfig:
        """The model's config."""
        return self.model.config


def model_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's parameters by canonical name (tied weights once), detached, contiguous, on the CPU."""
    return {name: param.detach().cpu().contiguous() for name, param in model.named_parameters()}


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """Serialise `checkpoint` to safetensors bytes (see the module docstring for the layout)."""
    tensors = dict(checkpoint.weights) | dict(checkpoint.aligner_weights)
    tensors[SRC_TOKENIZER_KEY] = byte_tensor(checkpoint.src_tokenizer_bytes)
    if checkpoint.tgt_tokenizer_bytes != checkpoint.src_tokenizer_bytes:
        tensors[TGT_TOKENIZER_KEY] = byte_tensor(checkpoint.tgt_tokenizer_bytes)
    if (checkpoint.src_vocab is None) != (checkpoint.tgt_vocab is None):
        raise ValueError("a checkpoint's tokenizers are both mapped through a vocabulary or neither is")
    if checkpoint.src_vocab is not None:
        tensors[SRC_VOCAB_KEY] = byte_tensor(encode_vocabulary(checkpoint.src_vocab))
        if checkpoint.tgt_vocab != checkpoint.src_vocab:
            tensors[TGT_VOCAB_KEY] = byte_tensor(encode_vocabulary(checkpoint.tgt_vocab))
    metadata = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "model_config": json.dumps(config_to_dict(checkpoint.config), sort_keys=True),
        "provenance": json.dumps(checkpoint.provenance, sort_keys=True),
    }
    if checkpoint.decode_defaults:
        metadata["decode_defaults"] = json.dumps(checkpoint.decode_defaults, sort_keys=True)
    if checkpoint.alignment:
        metadata["alignment"] = json.dumps(checkpoint.alignment, sort_keys=True)
    return save(tensors, metadata=metadata)


def byte_tensor(data: bytes) -> torch.Tensor:
    """Bytes as a (N,) uint8 tensor (how a checkpoint stores tokenizer files)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write `checkpoint` to `path` atomically (temp file in the same folder, fsync, rename)."""
    atomic_write_bytes(Path(path), encode_checkpoint(checkpoint))


def save_model(
    path: Path,
    model: Transformer,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    provenance: dict[str, Any] | None = None,
) -> None:
    """Write a self-contained checkpoint of `model` and its tokenizers to `path` atomically."""
    write_checkpoint(path, make_checkpoint(model.config, model_weights(model), src_tokenizer, tgt_tokenizer, provenance))


def make_checkpoint(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    src_tokenizer: Tokenizer | MappedTokenizer,
    tgt_tokenizer: Tokenizer | MappedTokenizer,
    provenance: dict[str, Any] | None = None,
    decode_defaults: dict[str, Any] | None = None,
    alignment: dict[str, Any] | None = None,
) -> Checkpoint:
    """A Checkpoint of `weights` with everything the tokenizers need to be rebuilt (bytes and piece tables)."""
    return Checkpoint(
        config=config,
        weights=weights,
        src_tokenizer_bytes=src_tokenizer.model_bytes,
        tgt_tokenizer_bytes=tgt_tokenizer.model_bytes,
        provenance=provenance or {},
        src_vocab=src_tokenizer.vocabulary,
        tgt_vocab=tgt_tokenizer.vocabulary,
        decode_defaults=decode_defaults or {},
        alignment=alignment or {},
    )


def read_header(path: Path) -> dict[str, Any]:
    """Read and check the safetensors JSON header of `path` without loading any tensor.

    Returns the header dict. Raises TfmError if the file is too short, truncated, or not safetensors
    (a pickle file lands here: its first bytes are no valid header length).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise TfmError(f"{path}: not a safetensors file (only {size} bytes)")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > HEADER_LIMIT or header_size > size - 8:
            raise TfmError(f"{path}: not a safetensors file, or truncated (bad header length)")
        try:
            header = json.loads(f.read(header_size))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise TfmError(f"{path}: not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise TfmError(f"{path}: not a safetensors file (header is not a JSON object)")
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            data_end = max(data_end, int(info["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise TfmError(f"{path}: not a safetensors file (bad entry for {name!r})") from None
    if 8 + header_size + data_end > size:
        raise TfmError(
            f"{path}: truncated checkpoint ({size} bytes, the header promises {8 + header_size + data_end}); "
            "use an earlier checkpoint"
        )
    return header


def is_safetensors_file(path: Path) -> bool:
    """Whether `path` starts like a safetensors file: an 8-byte header length, then the header's '{'."""
    with open(path, "rb") as f:
        start = f.read(9)
    return len(start) == 9 and start[8:9] == b"{" and int.from_bytes(start[:8], "little") <= HEADER_LIMIT


def is_sentencepiece_model(path: Path) -> bool:
    """Whether `path` parses as a sentencepiece model (a protobuf): the usual mix-up when -m wants a checkpoint."""
    if path.stat().st_size > SENTENCEPIECE_LIMIT:
        return False
    with open(path, "rb") as f:
        # A serialized ModelProto starts with its pieces (field 1, length-delimited): tag byte 0x0A.
        if f.read(1) != b"\n":
            return False
    try:
        spm.SentencePieceProcessor().LoadFromSerializedProto(path.read_bytes())
    except (RuntimeError, OSError):
        return False
    return True


def read_checkpoint(path: Path | str) -> Checkpoint:
    """Read and validate a tfm checkpoint file. Returns the Checkpoint; raises TfmError naming the file.

    Any readable file will do: a pipe or process substitution (`-m <(ssh host cat model)`) is first
    copied to a temp file, since safetensors reads by size and offset.
    """
    path = check_input_file(path, "checkpoint")
    with as_regular_file(path) as regular:
        try:
            return read_regular_checkpoint(regular)
        except TfmError as error:
            raise TfmError(str(error).replace(str(regular), str(path))) from None  # name what the user gave


def read_regular_checkpoint(path: Path) -> Checkpoint:
    """read_checkpoint of a regular file."""
    try:
        header = read_header(path)
    except TfmError:
        if is_sentencepiece_model(path):
            raise TfmError(
                f"{path}: a sentencepiece model, not a tfm checkpoint; pass the .safetensors checkpoint "
                "`tfm train` writes (e.g. runs/NAME/checkpoint_best.safetensors), which has its tokenizer inside"
            ) from None
        raise
    config, provenance = read_metadata(path, header)
    decode_defaults = read_decode_defaults(path, header, config)
    alignment = read_alignment(path, header, config)
    try:
        # Read, not mapped: each tensor is memory of its own, so a model can take it without a copy
        # (load_model), and the file's pages are not held while the model is built.
        tensors = load_file(str(path), backend="pread")
    except (SafetensorError, OSError, ValueError) as error:
        raise TfmError(f"{path}: unreadable safetensors data ({error})") from None
    files = embedded_files(path, tensors)
    if SRC_TOKENIZER_KEY not in files:
        raise TfmError(f"{path}: checkpoint has no embedded tokenizer ({SRC_TOKENIZER_KEY})")
    src_bytes = files[SRC_TOKENIZER_KEY]
    tgt_bytes = files.get(TGT_TOKENIZER_KEY, src_bytes)
    src_vocab = tgt_vocab = None
    if SRC_VOCAB_KEY in files:
        src_vocab = decode_vocabulary(files[SRC_VOCAB_KEY], f"{path} ({SRC_VOCAB_KEY})")
        tgt_vocab = src_vocab
        if TGT_VOCAB_KEY in files:
            tgt_vocab = decode_vocabulary(files[TGT_VOCAB_KEY], f"{path} ({TGT_VOCAB_KEY})")
    elif TGT_VOCAB_KEY in files:
        raise TfmError(f"{path}: checkpoint has {TGT_VOCAB_KEY} but no {SRC_VOCAB_KEY}")
    aligner_weights = {name: tensors.pop(name) for name in [name for name in tensors if name.startswith(ALIGNER_PREFIX)]}
    check_weights(path, config, tensors)
    check_aligner_weights(path, config, config_from_dict(AlignmentConfig, alignment, "alignment"), aligner_weights)
    return Checkpoint(config, tensors, src_bytes, tgt_bytes, provenance, src_vocab, tgt_vocab, decode_defaults, alignment,
                      aligner_weights)


def embedded_files(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """Take the embedded files (EMBEDDED_FILE_KEYS) out of `tensors`, as bytes by key, each checked first.

    An embedded file is stored as a (N,) uint8 tensor (byte_tensor); any other dtype or shape is a
    crafted or damaged file, refused with a TfmError naming `path` and the tensor before its bytes are used.
    """
    files = {}
    for key in EMBEDDED_FILE_KEYS:
        tensor = tensors.pop(key, None)
        if tensor is None:
            continue
        if tensor.dtype != torch.uint8:
            raise TfmError(
                f"{path}: tensor {key!r} has dtype {tensor.dtype}, expected torch.uint8 (the bytes of an embedded file)"
            )
        if tensor.dim() != 1:
            raise TfmError(
                f"{path}: tensor {key!r} has shape {tuple(tensor.shape)}, expected one dimension "
                "(the bytes of an embedded file)"
            )
        files[key] = tensor.numpy().tobytes()
    return files


def check_weights(
    path: Path, config: ModelConfig, weights: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]] | None = None
) -> None:
    """Raise TfmError naming the first missing, unexpected, mis-shaped or non-float tensor of `expected`
    (name -> shape; default: the model's parameters, parameter_shapes)."""
    if expected is None:
        expected = parameter_shapes(config)  # from the config alone: no model is built
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise TfmError(f"{path}: checkpoint lacks tensor {missing[0]!r} ({len(missing)} missing in all)")
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise TfmError(f"{path}: checkpoint has unexpected tensor {extra[0]!r} ({len(extra)} unexpected in all)")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise TfmError(
                f"{path}: tensor {name!r} has shape {tuple(weights[name].shape)}, the config needs {shape}"
            )
        if not weights[name].is_floating_point():
            raise TfmError(f"{path}: tensor {name!r} has dtype {weights[name].dtype}, expected floating point")
        if not all_finite(weights[name]):
            raise TfmError(
                f"{path}: tensor {name!r} holds NaN or infinite values (training diverged?); use an earlier checkpoint"
            )


def all_finite(tensor: torch.Tensor) -> bool:
    """True when no value of `tensor` is NaN or infinite.

    A NaN or infinite value makes the sum NaN or infinite, so a finite sum settles it in one pass
    without a boolean tensor as large as the weight (a fifth of the load time at the OPUS-MT base
    shape otherwise); only a sum that overflows from finite values needs the element-wise check.
    """
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def check_aligner_weights(
    path: Path, config: ModelConfig, alignment: AlignmentConfig, weights: dict[str, torch.Tensor]
) -> None:
    """Raise TfmError unless `weights` are exactly the tensors of the aligner `alignment` names (none without one)."""
    if not alignment.aligner:
        if weights:
            raise TfmError(f"{path}: checkpoint has aligner tensors ({next(iter(weights))!r}) but its alignment settings name no aligner")
        return
    check_weights(path, config, weights, aligner_shapes(config, alignment.aligner_hidden, alignment.aligner_dim, alignment.aligner_context))


def build_aligner(checkpoint: Checkpoint, device: str | torch.device = "cpu") -> Aligner | None:
    """The checkpoint's trained aligner in float32, in eval mode on `device`; None without one."""
    alignment = config_from_dict(AlignmentConfig, checkpoint.alignment, "alignment")
    if not alignment.aligner:
        return None
    aligner = Aligner(checkpoint.config, alignment.aligner_hidden, alignment.aligner_dim, alignment.aligner_context)
    with torch.no_grad():
        for name, param in aligner.named_parameters():
            param.copy_(checkpoint.aligner_weights[ALIGNER_PREFIX + name].to(torch.float32))
    return aligner.to(device).eval()


def model_with_weights(checkpoint: Checkpoint) -> Transformer:
    """A Transformer of the checkpoint's config holding its weights in float32 on the CPU, as trained
    (plain parameters, train mode): what `tfm train --init` starts from."""
    return Transformer.with_weights(checkpoint.config, checkpoint.weights)


def build_model(
    checkpoint: Checkpoint, device: str | torch.device = "cpu", dtype: str = "float32", take_weights: bool = False
) -> Transformer:
    """A Transformer with the checkpoint's weights, in eval mode, on `device`, for inference.

    Its linear layers run in `dtype` ("float32", "bf16" or "int8", see model/precision.py), converted
    or packed once, and on the CPU keep no plain copy of what was packed: the model must not be trained.
    With `take_weights` the model takes the checkpoint's tensors instead of copying them and
    `checkpoint.weights` is left empty: the peak memory of the load is then about the built model's.
    """
    model = Transformer.with_weights(checkpoint.config, checkpoint.weights, take=take_weights).to(device).eval()
    convert_linear_layers(model, dtype)
    return model


def load_model(
    path: Path | str, device: str | torch.device = "cpu", dtype: str = "float32", embedding_rows_on_demand: bool = False
) -> LoadedModel:
    """Read, validate and build (linear layers in `dtype`): the one call translate, score and inspect-attention need.

    The model takes the weights read from the file (no second copy in memory). With
    `embedding_rows_on_demand` its embeddings then keep only the rows it looks up, each read from `path`
    when first needed (model/embedding_rows.py): for a process that only runs the model.
    """
    loaded = loaded_model(path, read_checkpoint(path), device, dtype, take_weights=True)
    if embedding_rows_on_demand:
        read_embedding_rows_on_demand(loaded.model, Path(path))
    return loaded


def loaded_model(
    path: Path | str, checkpoint: Checkpoint, device: str | torch.device = "cpu", dtype: str = "float32",
    take_weights: bool = False,
) -> LoadedModel:
    """load_model of a checkpoint already read from `path` (a command that also rewrites it reads it once).

    take_weights: the model takes `checkpoint.weights`, leaving it empty (build_model).
    """
    src_tokenizer, tgt_tokenizer = checkpoint_tokenizers(path, checkpoint)
    return LoadedModel(
        build_model(checkpoint, device, dtype, take_weights), src_tokenizer, tgt_tokenizer, checkpoint.provenance,
        checkpoint.decode_defaults,
        config_from_dict(AlignmentConfig, checkpoint.alignment, "alignment"), build_aligner(checkpoint, device),
    )


def checkpoint_tokenizers(
    path: Path | str, checkpoint: Checkpoint
) -> tuple[Tokenizer | MappedTokenizer, Tokenizer | MappedTokenizer]:
    """The (source, target) tokenizers of a checkpoint read from `path`, checked against its config.

    Plain sentencepiece tokenizers (tfm's own) when the checkpoint has no piece tables, MappedTokenizers
    (imported Marian models) when it has. Raises TfmError naming `path` when they do not fit the model.
    """
    config = checkpoint.config
    if checkpoint.src_vocab is None:
        src = Tokenizer(checkpoint.src_tokenizer_bytes, origin=f"{path} (source tokenizer)")
        same = checkpoint.tgt_tokenizer_bytes == checkpoint.src_tokenizer_bytes
        tgt = src if same else Tokenizer(checkpoint.tgt_tokenizer_bytes, origin=f"{path} (target tokenizer)")
        check_vocab_sizes(path, config, src, tgt)
        check_special_ids(path, config, src, tgt)
        return src, tgt
    # Decoding drops padding, EOS and the decoder's start token, as sentencepiece drops its control pieces.
    control = frozenset({config.pad_id, config.eos_id, config.bos_id})
    src = MappedTokenizer(
        checkpoint.src_tokenizer_bytes, checkpoint.src_vocab, config.unk_id, control, origin=f"{path} (source tokenizer)"
    )
    tgt = MappedTokenizer(
        checkpoint.tgt_tokenizer_bytes, checkpoint.tgt_vocab, config.unk_id, control, origin=f"{path} (target tokenizer)"
    )
    check_vocab_sizes(path, config, src, tgt)
    return src, tgt


def check_vocab_sizes(
    path: Path | str, config: ModelConfig, src: Tokenizer | MappedTokenizer, tgt: Tokenizer | MappedTokenizer
) -> None:
    """Raise TfmError if the tokenizers do not match the model's vocabulary sizes."""
    if src.vocab_size != config.src_vocab_size or tgt.vocab_size != config.tgt_vocab_size:
        raise TfmError(
            f"{path}: tokenizer vocab sizes ({src.vocab_size}, {tgt.vocab_size}) do not match the model's "
            f"({config.src_vocab_size}, {config.tgt_vocab_size})"
        )


def check_special_ids(path: Path | str, config: ModelConfig, src: Tokenizer, tgt: Tokenizer) -> None:
    """Raise TfmError if the model's pad/unk/bos/eos ids are not its tokenizers' own.

    A model whose eos_id is not the tokenizer's EOS would never stop where the text ends.
    """
    for side, tokenizer in (("source", src), ("target", tgt)):
        for name in ("pad", "unk", "bos", "eos"):
            model_id = getattr(config, f"{name}_id")
            tokenizer_id = getattr(tokenizer.processor, f"{name}_id")()
            if model_id != tokenizer_id:
                raise TfmError(
                    f"{path}: model.{name}_id is {model_id} but the {side} tokenizer's {name} id is {tokenizer_id}; "
                    "the checkpoint's config and tokenizer do not belong together"
                )


def read_embedding_rows_on_demand(model: Transformer, path: Path) -> bool:
    """Give each embedding of `model` (a Transformer loaded from the checkpoint `path` for inference)
    a table of rows read on demand (model/embedding_rows.py), where that leaves every product with its own weights. Returns True if it did.

    Nothing changes (False) off the CPU, on platforms without preadv, for a path that is not a regular
    file (a pipe's temp copy is gone after the load), for a float32 output layer that still multiplies by
    the tied plain weight (not packed), or for an embedding the file does not store as float32. A tied
    float32 output layer then keeps only its packed copy (kernels.Linear.plain_weight_freed): its plain
    weight is the table, whose rows are zeros until looked up.
    """
    # A shared embedding is stored once, under src_embed.weight.
    embeddings = {"src_embed": model.src_embed}
    if model.tgt_embed is not model.src_embed:
        embeddings["tgt_embed"] = model.tgt_embed
    weight = model.src_embed.weight
    if not reads_rows_from_files() or not path.is_file() or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    output = model.output_proj
    tied_output = isinstance(output, Linear) and output.weight is model.tgt_embed.weight
    if tied_output and output.packed_weight is None:
        return False
    changed = False
    for name, embedding in embeddings.items():
        offset = safetensors_offset(path, f"{name}.weight", tuple(embedding.weight.shape))
        if offset is not None and isinstance(embedding, Embedding):
            embedding.use_rows_from_file(path, offset)
            changed = True
    if tied_output and model.tgt_embed.rows is not None:
        output.plain_weight_freed = True
    return changed


def safetensors_offset(path: Path, name: str, shape: tuple[int, ...]) -> int | None:
    """The byte offset in `path` (a checkpoint, see read_header) of tensor `name`'s data when it is stored
    with `shape` as little-endian float32 on a little-endian machine, else None."""
    if sys.byteorder != "little":
        return None
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
    info = read_header(path).get(name)
    if not isinstance(info, dict) or info.get("dtype") != "F32" or tuple(info.get("shape", ())) != shape:
        return None
    return 8 + header_size + int(info["data_offsets"][0])
