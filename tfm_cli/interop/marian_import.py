"""Hugging Face MarianMT folders (OPUS-MT) -> tfm Checkpoints: config, weights, tokenizers, generation defaults.

Reads only JSON, safetensors and sentencepiece files (transformers is not needed) and never unpickles
(a pytorch_model.bin-only folder is refused). Every setting of the folder either maps onto a
ModelConfig field or is refused with one line naming it: nothing is converted silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from tfm_cli.checkpoints.format import Checkpoint, check_weights, read_header
from tfm_cli.config import ModelConfig
from tfm_cli.errors import TfmError
from tfm_cli.interop.marian_names import TFM_ACTIVATION, TFM_LENGTH_PENALTY_KIND, TFM_MAX_LEN, layer_modules
from tfm_cli.length_penalty import KINDS
from tfm_cli.model.layers import halves_sinusoidal_table
from tfm_cli.textio.paths import file_sha256
from tfm_cli.tokenization.tokenizer import load_sentencepiece

CONFIG_FILE, GENERATION_FILE, WEIGHTS_FILE = "config.json", "generation_config.json", "model.safetensors"
SRC_SPM, TGT_SPM, VOCAB_FILE, TGT_VOCAB_FILE = "source.spm", "target.spm", "vocab.json", "target_vocab.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
HOW_TO_DOWNLOAD = "download the whole folder with `hf download OWNER/NAME --local-dir DIR`"
# Fields of older (BART-derived) Marian configs that Hugging Face's MarianMT ignores: each must have
# the value that describes what MarianMT computes, else the folder is not a model tfm (or MarianMT) runs.
MARIAN_LAYOUT = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "layernorm_embedding": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,
    "do_blenderbot_90_layernorm": False,
    "is_encoder_decoder": True,
}
# Generation settings tfm's searches do not have: any value but the neutral one is refused.
HF_LENGTH_PENALTY = 1.0  # GenerationConfig's default length_penalty
NEUTRAL_GENERATION = {
    "do_sample": False,
    "early_stopping": False,  # the stop tfm's `hf` length penalty rule implements
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}


def find_marian_folder(source: str) -> Path:
    """The local folder SOURCE names; a hub id (OWNER/NAME) that is no folder is downloaded with
    huggingface_hub where it is installed. Returns the folder; raises TfmError saying how to get it."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise TfmError(f"{source}: is a file; tfm import takes a model's folder (config.json, model.safetensors, ...)")
    if not HUB_ID.fullmatch(source):
        raise TfmError(f"{source}: no such folder")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise TfmError(
            f"{source}: no such folder; to import that hub model, download it first: "
            f"hf download {source} --local-dir DIR, then tfm import DIR (or pip install huggingface_hub)"
        ) from None
    patterns = [CONFIG_FILE, GENERATION_FILE, WEIGHTS_FILE, SRC_SPM, TGT_SPM, VOCAB_FILE, TGT_VOCAB_FILE, TOKENIZER_CONFIG_FILE]
    try:
        return Path(snapshot_download(source, allow_patterns=patterns))
    except Exception as error:  # network, authentication, missing repository: huggingface_hub has many error types
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TfmError(
            f"{source}: downloading from the Hugging Face hub failed ({reason}); "
            f"download it with `hf download {source} --local-dir DIR` and import DIR"
        ) from None


def import_marian(folder: Path) -> Checkpoint:
    """Read the MarianMT folder `folder` into a tfm Checkpoint (weights float32).

    Raises TfmError with one line naming the file and field for a missing file, a damaged one, or a
    setting tfm does not implement.
    """
    check_files(folder)
    try:
        return read_folder(folder)
    except TfmError as error:
        message = str(error)
        if message.startswith((CONFIG_FILE, GENERATION_FILE, TOKENIZER_CONFIG_FILE)):  # a setting: name its file in full
            raise TfmError(f"{folder}/{message}") from None
        raise


def read_folder(folder: Path) -> Checkpoint:
    """import_marian of a folder that has every file a MarianMT folder needs."""
    config_json = read_json_object(folder / CONFIG_FILE)
    check_architecture(config_json)
    tokenizer_json = read_json_object(folder / TOKENIZER_CONFIG_FILE) if (folder / TOKENIZER_CONFIG_FILE).is_file() else {}
    separate = tokenizer_json.get("separate_vocabs", False)
    if not isinstance(separate, bool):
        raise TfmError(f"{folder / TOKENIZER_CONFIG_FILE}: separate_vocabs must be true or false, got {separate!r}")
    if separate and not (folder / TGT_VOCAB_FILE).is_file():
        raise TfmError(f"{folder}: tokenizer_config.json sets separate_vocabs but there is no {TGT_VOCAB_FILE}; {HOW_TO_DOWNLOAD}")
    shared = config_bool(config_json, "share_encoder_decoder_embeddings", True)
    src_vocab_size = config_int(config_json, "vocab_size")
    tgt_vocab_size = src_vocab_size if shared else config_int(config_json, "decoder_vocab_size", src_vocab_size)
    src_vocab = read_vocabulary(folder / VOCAB_FILE, src_vocab_size)
    tgt_vocab = read_vocabulary(folder / TGT_VOCAB_FILE, tgt_vocab_size) if separate else src_vocab
    if tgt_vocab_size != len(tgt_vocab):
        raise TfmError(
            f"{folder / VOCAB_FILE}: one vocabulary serves both sides, but config.json has decoder_vocab_size="
            f"{tgt_vocab_size} and vocab_size={src_vocab_size}; a separate target vocabulary needs "
            f"{TGT_VOCAB_FILE} and separate_vocabs in {TOKENIZER_CONFIG_FILE}"
        )
    special = special_ids(folder, config_json, tokenizer_json, src_vocab, tgt_vocab, separate)
    tensors = read_tensors(folder / WEIGHTS_FILE)
    bias = tensors.get("final_logits_bias")
    output_bias = bias is not None and bool((bias != 0).any())
    config = model_config(config_json, src_vocab_size, tgt_vocab_size, special, output_bias)
    weights = convert_weights(folder / WEIGHTS_FILE, tensors, config)
    check_weights(folder / WEIGHTS_FILE, config, weights)
    src_bytes, tgt_bytes = read_sentencepiece(folder / SRC_SPM), read_sentencepiece(folder / TGT_SPM)
    provenance = {
        "imported_from": {
            "format": "huggingface-marian",
            "folder": str(folder.resolve()),
            "name_or_path": str(config_json.get("_name_or_path", "")),
            "model_sha256": file_sha256(folder / WEIGHTS_FILE),
        },
        "step": None,
    }
    decode_defaults = generation_defaults(folder, config_json, special)
    return Checkpoint(config, weights, src_bytes, tgt_bytes, provenance, src_vocab, tgt_vocab, decode_defaults)


def check_files(folder: Path) -> None:
    """Raise TfmError for the first file a MarianMT folder must have and `folder` lacks (pickles refused)."""
    if not (folder / WEIGHTS_FILE).is_file():
        pickles = [name for name in PICKLE_WEIGHTS if (folder / name).is_file()]
        if pickles:
            raise TfmError(
                f"{folder}: has {pickles[0]} but no {WEIGHTS_FILE}; tfm never loads pickled weights. Get the "
                f"safetensors file: `hf download OWNER/NAME {WEIGHTS_FILE} --local-dir {folder}` (most OPUS-MT "
                "repositories have one, some under the refs/pr/N revision of the hub's safetensors conversion)"
            )
    for name in (CONFIG_FILE, WEIGHTS_FILE, SRC_SPM, TGT_SPM, VOCAB_FILE):
        if not (folder / name).is_file():
            raise TfmError(f"{folder}: no {name} (a MarianMT folder has {CONFIG_FILE}, {WEIGHTS_FILE}, {SRC_SPM}, "
                           f"{TGT_SPM}, {VOCAB_FILE}); {HOW_TO_DOWNLOAD}")


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object. Raises TfmError naming `path` otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TfmError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise TfmError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def check_architecture(config: dict[str, Any]) -> None:
    """Raise TfmError unless config.json describes a MarianMT model whose layout tfm implements."""
    model_type = config.get("model_type")
    if model_type != "marian":
        raise TfmError(
            f"{CONFIG_FILE}: model_type {model_type!r} is not supported; tfm imports MarianMT models "
            "(model_type 'marian', as the Helsinki-NLP/opus-mt-* models)"
        )
    architectures = config.get("architectures")
    if architectures is not None and architectures != ["MarianMTModel"]:
        raise TfmError(f"{CONFIG_FILE}: architectures {architectures!r} is not supported; tfm imports MarianMTModel")
    for name, value in MARIAN_LAYOUT.items():
        if name in config and config[name] != value:
            raise TfmError(f"{CONFIG_FILE}: {name}={json.dumps(config[name])} is not supported (MarianMT needs {json.dumps(value)})")
    if config.get("scale_embedding") is not True:
        raise TfmError(
            f"{CONFIG_FILE}: scale_embedding={json.dumps(config.get('scale_embedding', False))} is not supported; "
            "tfm scales embeddings by sqrt(d_model), as Marian does (scale_embedding=true)"
        )
    for encoder, decoder in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config_int(config, encoder) != config_int(config, decoder):
            raise TfmError(f"{CONFIG_FILE}: {encoder}={config[encoder]} differs from {decoder}={config[decoder]}; tfm needs them equal")
    activation = config.get("activation_function", "gelu")
    if activation not in TFM_ACTIVATION:
        raise TfmError(
            f"{CONFIG_FILE}: activation_function {activation!r} is not supported (tfm has {', '.join(sorted(TFM_ACTIVATION))})"
        )
    if config_bool(config, "share_encoder_decoder_embeddings", True) and not config_bool(config, "tie_word_embeddings", True):
        raise TfmError(
            f"{CONFIG_FILE}: tie_word_embeddings=false with share_encoder_decoder_embeddings=true is not supported "
            "(tfm ties the output projection to a shared embedding)"
        )


def config_int(config: dict[str, Any], name: str, default: int | None = None) -> int:
    """config[name] as a positive int (`default` when absent). Raises TfmError naming the field."""
    value = config.get(name, default)
    if value is None:
        raise TfmError(f"{CONFIG_FILE}: {name} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TfmError(f"{CONFIG_FILE}: {name} must be a non-negative integer, got {value!r}")
    return value


def config_bool(config: dict[str, Any], name: str, default: bool) -> bool:
    """config[name] as a bool (`default` when absent). Raises TfmError naming the field."""
    value = config.get(name, default)
    if not isinstance(value, bool):
        raise TfmError(f"{CONFIG_FILE}: {name} must be true or false, got {value!r}")
    return value


def config_rate(config: dict[str, Any], name: str) -> float:
    """A dropout rate config[name] (0 when absent). Raises TfmError naming the field."""
    value = config.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise TfmError(f"{CONFIG_FILE}: {name} must be a number in [0, 1), got {value!r}")
    return float(value)


def read_vocabulary(path: Path, size: int) -> tuple[str, ...]:
    """The piece of every id 0..size-1 from a Marian vocab.json ({piece: id}).

    Ids the file does not use get a placeholder piece no tokenizer produces. Raises TfmError naming
    `path` for anything but an object of strings to distinct ints inside the model's vocabulary.
    """
    table = read_json_object(path)
    pieces: list[str | None] = [None] * size
    for piece, index in table.items():
        if isinstance(index, bool) or not isinstance(index, int):
            raise TfmError(f"{path}: the id of {piece!r} must be an integer, got {index!r}")
        if not 0 <= index < size:
            raise TfmError(f"{path}: {piece!r} has id {index}, outside the model's vocabulary of {size} ids (config.json)")
        if pieces[index] is not None:
            raise TfmError(f"{path}: id {index} is given to both {pieces[index]!r} and {piece!r}")
        pieces[index] = piece
    used = set(table)
    filled = []
    for index, piece in enumerate(pieces):
        if piece is None:
            piece = f"<unused:{index}>"
            if piece in used:
                raise TfmError(f"{path}: id {index} has no piece, and the placeholder {piece!r} is taken")
        filled.append(piece)
    return tuple(filled)


def token_text(value: Any, name: str, default: str) -> str:
    """A special token of tokenizer_config.json: a string, or an AddedToken object with `content`."""
    if value is None:
        return default
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        raise TfmError(f"{TOKENIZER_CONFIG_FILE}: {name} must be a string, got {value!r}")
    return value


def special_ids(
    folder: Path,
    config: dict[str, Any],
    tokenizer: dict[str, Any],
    src_vocab: tuple[str, ...],
    tgt_vocab: tuple[str, ...],
    separate: bool,
) -> dict[str, int]:
    """tfm's special ids {pad_id, unk_id, bos_id, eos_id} from config.json and the vocabularies.

    bos_id is the decoder start token (Marian starts from padding). Raises TfmError when the
    vocabularies put a special token somewhere other than config.json's id (tfm has one id per token).
    """
    if isinstance(config.get("eos_token_id"), list):
        raise TfmError(f"{CONFIG_FILE}: eos_token_id {config['eos_token_id']!r} (several EOS tokens) is not supported")
    ids = {
        "pad_id": config_int(config, "pad_token_id"),
        "eos_id": config_int(config, "eos_token_id"),
        "bos_id": config_int(config, "decoder_start_token_id"),
    }
    tokens = {
        "unk_id": token_text(tokenizer.get("unk_token"), "unk_token", "<unk>"),
        "eos_id": token_text(tokenizer.get("eos_token"), "eos_token", "</s>"),
        "pad_id": token_text(tokenizer.get("pad_token"), "pad_token", "<pad>"),
    }
    said_by = {"pad_id": f"{CONFIG_FILE}'s pad_token_id", "eos_id": f"{CONFIG_FILE}'s eos_token_id", "unk_id": VOCAB_FILE}
    sides = [(VOCAB_FILE, src_vocab)] + ([(TGT_VOCAB_FILE, tgt_vocab)] if separate else [])
    for file, vocab in sides:
        index = {piece: i for i, piece in enumerate(vocab)}
        for name, token in tokens.items():
            if token not in index:
                raise TfmError(f"{folder / file}: has no {token!r} (the {name[:-3]} token of {TOKENIZER_CONFIG_FILE})")
            ids.setdefault(name, index[token])  # the unknown-word id comes from vocab.json itself
            if index[token] != ids[name]:
                raise TfmError(f"{folder / file}: {token!r} has id {index[token]}, but {said_by[name]} says {ids[name]}")
    return ids


def model_config(
    config: dict[str, Any], src_vocab_size: int, tgt_vocab_size: int, special: dict[str, int], output_bias: bool
) -> ModelConfig:
    """The ModelConfig of a MarianMT config.json (already checked by check_architecture)."""
    try:
        return ModelConfig(
            d_model=config_int(config, "d_model"),
            n_heads=config_int(config, "encoder_attention_heads"),
            d_ff=config_int(config, "encoder_ffn_dim"),
            n_enc_layers=config_int(config, "encoder_layers"),
            n_dec_layers=config_int(config, "decoder_layers"),
            dropout=config_rate(config, "dropout"),
            attention_dropout=config_rate(config, "attention_dropout"),
            activation_dropout=config_rate(config, "activation_dropout"),
            norm_first=False,
            activation=TFM_ACTIVATION[config.get("activation_function", "gelu")],
            share_embeddings=config_bool(config, "share_encoder_decoder_embeddings", True),
            tie_output=config_bool(config, "tie_word_embeddings", True),
            max_positions=config_int(config, "max_position_embeddings"),
            layer_norm_eps=1e-5,  # torch's LayerNorm default, which MarianMT uses
            sinusoid_layout="halves",
            output_bias=output_bias,
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            **special,
        )
    except TfmError as error:
        raise TfmError(f"{CONFIG_FILE}: {error}") from None


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file. Raises TfmError for a truncated or damaged file."""
    try:
        read_header(path)
        return load_file(str(path))
    except TfmError as error:  # read_header's words are about checkpoints
        reason = str(error).removeprefix(f"{path}: ").split("; use an earlier checkpoint")[0]
        raise TfmError(f"{path}: {reason.replace('truncated checkpoint', 'truncated file')}; download it again") from None
    except (SafetensorError, OSError, ValueError) as error:
        raise TfmError(f"{path}: unreadable safetensors data ({error}); download it again") from None


def convert_weights(path: Path, tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """MarianMT's tensors -> tfm's parameter names (float32), fusing q/k/v projections as tfm's attention does.

    Every tensor of the file must be used (copies of tied weights must equal the original, stored
    position tables must be Marian's sinusoids); raises TfmError naming the first that is missing,
    mis-shaped, unexpected or different.
    """
    remaining = dict(tensors)

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in remaining:
            raise TfmError(f"{path}: no tensor {name!r}, which a MarianMT model of this config.json has")
        tensor = remaining.pop(name)
        if tuple(tensor.shape) != shape:
            raise TfmError(f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, config.json needs {shape}")
        if not tensor.is_floating_point():
            raise TfmError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected floating point")
        return tensor.to(torch.float32)

    def take_tied(names: list[str], shape: tuple[int, int]) -> torch.Tensor:
        """One weight stored under any of `names` (tied weights: a file may keep any of the copies,
        depending on the tool that wrote it); every other copy present must be equal."""
        present = [name for name in names if name in remaining] or names[:1]
        weight = take(present[0], shape)
        for name in present[1:]:
            if not torch.equal(take(name, shape), weight):
                raise TfmError(f"{path}: tensor {name!r} differs from {present[0]!r}, which config.json ties it to")
        return weight

    d = config.d_model
    weights: dict[str, torch.Tensor] = {}
    src_shape, tgt_shape = (config.src_vocab_size, d), (config.tgt_vocab_size, d)
    output = ["lm_head.weight"] if config.tie_output else []  # share_embeddings implies tie_output (checked)
    if config.share_embeddings:
        names = ["model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
        weights["src_embed.weight"] = take_tied(names + output, src_shape)
    else:
        weights["src_embed.weight"] = take("model.encoder.embed_tokens.weight", src_shape)
        weights["tgt_embed.weight"] = take_tied(["model.decoder.embed_tokens.weight"] + output, tgt_shape)
    if not config.tie_output:
        weights["output_proj.weight"] = take("lm_head.weight", tgt_shape)
    if "final_logits_bias" in remaining:
        bias = take("final_logits_bias", (1, config.tgt_vocab_size))[0]
        if config.output_bias:
            weights["output_proj.bias"] = bias
    table = halves_sinusoidal_table(config.max_positions, d)
    for stack in ("encoder", "decoder"):
        name = f"model.{stack}.embed_positions.weight"
        if name in remaining and not torch.allclose(take(name, tuple(table.shape)), table, atol=1e-5, rtol=0.0):
            raise TfmError(f"{path}: {name} is not Marian's sinusoidal table (learned positions are not supported)")

    for module, marian_modules, shape in layer_modules(config):
        # Several MarianMT modules are the row blocks of one fused tfm matrix, in order (marian_names).
        weights[f"{module}.weight"] = torch.cat([take(f"{source}.weight", shape) for source in marian_modules])
        weights[f"{module}.bias"] = torch.cat([take(f"{source}.bias", shape[:1]) for source in marian_modules])
    if remaining:
        extra = sorted(remaining)
        raise TfmError(
            f"{path}: tensor {extra[0]!r} ({len(extra)} in all) is not part of a MarianMT model of this config.json "
            "(more layers, or another architecture); tfm would not use it"
        )
    return weights


def read_sentencepiece(path: Path) -> bytes:
    """The bytes of a sentencepiece model file. Raises TfmError naming `path` if it is not one."""
    data = path.read_bytes()
    load_sentencepiece(data, str(path))
    return data


def generation_defaults(folder: Path, config: dict[str, Any], special: dict[str, int]) -> dict[str, Any]:
    """The DecodeConfig fields the model's generation settings state (generation_config.json, else the
    legacy fields of config.json): beam size, length penalty, length limits, banned tokens, renormalize
    and forced EOS.

    Settings the folder does not state keep tfm's defaults, but for two that follow generate: the
    length penalty is applied as generate applies it (kind `hf`: n ** alpha and generate's beam stop),
    with generate's default alpha 1.0 when unstated (a folder tfm exported names its own rule under
    tfm_length_penalty_kind), and EOS may come first (min_len 0) unless min_length or min_new_tokens
    says otherwise. HF's max_length counts the decoder start token and EOS, so it becomes
    max_len_b = max_length - 2 with max_len_a = 0, unless tfm_max_len (a folder tfm exported) gives
    the limit proportional to the source. Raises TfmError naming a setting tfm's searches
    do not implement.
    """
    path = folder / GENERATION_FILE
    settings, where = (read_json_object(path), GENERATION_FILE) if path.is_file() else (config, CONFIG_FILE)
    for name, neutral in NEUTRAL_GENERATION.items():
        value = settings.get(name, neutral)
        if value != neutral and not (value == [] and neutral is None):
            raise TfmError(f"{where}: {name}={json.dumps(value)} is not supported by tfm's search")
    for name, own in (("decoder_start_token_id", "bos_id"), ("eos_token_id", "eos_id"), ("pad_token_id", "pad_id"),
                      ("forced_eos_token_id", "eos_id")):
        if settings.get(name) is not None and settings[name] != special[own]:
            raise TfmError(f"{where}: {name}={json.dumps(settings[name])} differs from the model's {special[own]}")
    defaults: dict[str, Any] = {"length_penalty_kind": "hf", "length_penalty": HF_LENGTH_PENALTY}
    # generate's min_length counts the decoder start token (so 0 and 1 both allow EOS first);
    # min_new_tokens counts generated tokens only. Unstated, both leave EOS free from the first step.
    min_length = generation_int(settings, "min_length", where, minimum=0) if settings.get("min_length") is not None else 0
    min_new_tokens = generation_int(settings, "min_new_tokens", where, minimum=0) if settings.get("min_new_tokens") is not None else 0
    defaults["min_len"] = max(min_length - 1, min_new_tokens, 0)
    if TFM_LENGTH_PENALTY_KIND in settings:  # a folder tfm exported: its model's own rule (kinds: length_penalty.py)
        kind = settings[TFM_LENGTH_PENALTY_KIND]
        if not isinstance(kind, str) or kind not in KINDS:
            raise TfmError(f"{where}: {TFM_LENGTH_PENALTY_KIND}={json.dumps(kind)} is not one of {', '.join(KINDS)}")
        defaults["length_penalty_kind"] = kind
    if settings.get("forced_eos_token_id") is not None:  # EOS at generate's length limit scores 0
        defaults["forced_eos"] = True
    if "num_beams" in settings:
        defaults["beam_size"] = generation_int(settings, "num_beams", where, minimum=1)
    if "length_penalty" in settings:
        value = settings["length_penalty"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise TfmError(f"{where}: length_penalty={json.dumps(value)} is not supported (tfm needs a number >= 0)")
        defaults["length_penalty"] = float(value)
    if settings.get("max_new_tokens") is not None:
        defaults.update(max_len_a=0.0, max_len_b=generation_int(settings, "max_new_tokens", where, minimum=2) - 1)
    elif "max_length" in settings:
        defaults.update(max_len_a=0.0, max_len_b=generation_int(settings, "max_length", where, minimum=3) - 2)
    if TFM_MAX_LEN in settings:  # a folder tfm exported: its limit proportional to the source
        defaults.update(proportional_limit(settings[TFM_MAX_LEN], where))
    banned = settings.get("bad_words_ids") or []
    if not isinstance(banned, list) or not all(isinstance(words, list) for words in banned):
        raise TfmError(f"{where}: bad_words_ids must be a list of token id lists, got {json.dumps(banned)}")
    if any(len(words) != 1 for words in banned):
        raise TfmError(f"{where}: bad_words_ids with sequences of several tokens are not supported (only single tokens)")
    if banned:
        defaults["banned_ids"] = sorted({generation_int({"bad_words_ids": words[0]}, "bad_words_ids", where, 0) for words in banned})
    # generate takes log_softmax again after banning bad_words_ids (OPUS-MT bans padding, whose zero
    # row in the converted embeddings gives it a logit of 0): the scores of Marian, which has no padding.
    renormalize = settings.get("renormalize_logits", False)
    if not isinstance(renormalize, bool):
        raise TfmError(f"{where}: renormalize_logits must be true or false, got {json.dumps(renormalize)}")
    if renormalize:
        defaults["renormalize"] = True
    return defaults


def proportional_limit(value: Any, where: str) -> dict[str, Any]:
    """The {"a": a, "b": b} of tfm_max_len as DecodeConfig's max_len_a (float) and max_len_b (int).
    Raises TfmError naming the field when it is not that shape."""
    a, b = (value.get("a"), value.get("b")) if isinstance(value, dict) and set(value) == {"a", "b"} else (None, None)
    if isinstance(a, bool) or not isinstance(a, int | float) or isinstance(b, bool) or not isinstance(b, int):
        raise TfmError(f'{where}: {TFM_MAX_LEN} must be {{"a": number, "b": integer}}, got {json.dumps(value)}')
    return {"max_len_a": float(a), "max_len_b": b}


def generation_int(settings: dict[str, Any], name: str, where: str, minimum: int) -> int:
    """settings[name] as an int >= minimum. Raises TfmError naming the field."""
    value = settings[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TfmError(f"{where}: {name} must be an integer >= {minimum}, got {json.dumps(value)}")
    return value
