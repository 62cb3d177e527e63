"""`tfm export`: a tfm checkpoint as a Hugging Face MarianMT folder or a CTranslate2 model folder.

Both targets compute what tfm computes, with two differences bridged here:
  * tfm fuses attention projections (self-attention qkv_proj = [W_q; W_k; W_v] rows, cross-attention
    kv_proj = [W_k; W_v]); MarianMT keeps q_proj / k_proj / v_proj, so the fused rows are split.
    CTranslate2 fuses them as tfm does.
  * MarianMT's position table puts every sine first and every cosine second ("halves"); tfm's own
    models interleave them (section 3.5). Positions are not weights in MarianMT (it rebuilds its
    table), so an interleaved model is exported in a permuted basis of the d_model dimensions: the
    permutation that turns the interleaved table into the halves one, applied to every weight that
    reads or writes the residual stream. LayerNorm and attention are indifferent to the order of
    dimensions, so the permuted model computes the same function. CTranslate2 takes the table as
    it is, so no permutation is needed there.
Neither target needs `transformers`; CTranslate2 needs the `ctranslate2` package (the `bench` extra).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tfm_cli.checkpoints.format import Checkpoint
from tfm_cli.config import DecodeConfig, ModelConfig, config_to_dict
from tfm_cli.errors import TfmError
from tfm_cli.length_penalty import length_penalty_of
from tfm_cli.interop.marian_names import MARIAN_ACTIVATION, TFM_LENGTH_PENALTY_KIND, TFM_MAX_LEN, layer_modules
from tfm_cli.model.layers import sinusoidal_table
from tfm_cli.textio.atomic_files import creation_mode
from tfm_cli.textio.paths import check_output_folder

MARIAN_LAYER_NORM_EPS = 1e-5  # MarianMT's LayerNorm epsilon is fixed
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16")
NEVER_LOGIT_BIAS = -1e4  # a logit bias no token comes back from; float16 holds it


def check_exportable(config: ModelConfig, target: str) -> None:
    """Raise TfmError naming the config field that `target` ("marian" or "ctranslate2") cannot express."""
    if target == "marian":
        if config.norm_first:
            raise TfmError("--to marian: MarianMT is post-norm only, this model is pre-norm (model.norm_first = true)")
        if config.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
            raise TfmError(
                f"--to marian: MarianMT's LayerNorm epsilon is {MARIAN_LAYER_NORM_EPS}, this model's "
                f"model.layer_norm_eps is {config.layer_norm_eps}"
            )
        if config.d_model % 2:
            raise TfmError(f"--to marian: MarianMT's position table needs an even d_model, got {config.d_model}")


# --- MarianMT -------------------------------------------------------------------------------------


def halves_permutation(config: ModelConfig) -> torch.Tensor | None:
    """The d_model permutation p with halves_table[:, j] = tfm_table[:, p[j]] (None if the model already
    uses the halves layout): the even (sine) dimensions first, then the odd (cosine) ones."""
    if config.sinusoid_layout == "halves":
        return None
    return torch.cat([torch.arange(0, config.d_model, 2), torch.arange(1, config.d_model, 2)])


def residual_basis_weights(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The checkpoint's weights (float32) expressed in MarianMT's basis of the residual stream.

    For an interleaved model every tensor that reads the stream has its input columns permuted and
    every tensor that writes it has its output rows permuted (see the module docstring).
    """
    weights = {name: tensor.to(torch.float32) for name, tensor in checkpoint.weights.items()}
    order = halves_permutation(checkpoint.config)
    if order is None:
        return weights
    reads_stream = ("_embed.weight", "output_proj.weight", "qkv_proj.weight", "cross_attn.q_proj.weight",
                    "kv_proj.weight", "ffn.linear1.weight")
    writes_stream = ("out_proj", "ffn.linear2")
    permuted = {}
    for name, tensor in weights.items():
        if name.endswith(reads_stream):
            tensor = tensor[:, order]  # (rows, D): columns are stream dimensions
        elif name.endswith(".norm.weight") or name.endswith(".norm.bias"):
            tensor = tensor[order]  # (D,)
        elif any(f"{part}." in name for part in writes_stream):
            tensor = tensor[order]  # weight (D, cols) rows or bias (D,)
        permuted[name] = tensor.contiguous()
    return permuted


def marian_weights(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """MarianMTModel's tensors (names as `save_pretrained` writes them) for `checkpoint`.

    Tied weights are stored once, as Hugging Face stores them: `model.shared.weight` for a joint
    vocabulary, else the two embeddings (and `lm_head.weight` only when untied).
    """
    config = checkpoint.config
    w = residual_basis_weights(checkpoint)
    state: dict[str, torch.Tensor] = {}
    if config.share_embeddings:
        state["model.shared.weight"] = w["src_embed.weight"]
    else:
        state["model.encoder.embed_tokens.weight"] = w["src_embed.weight"]
        state["model.decoder.embed_tokens.weight"] = w["tgt_embed.weight"]
        if not config.tie_output:
            state["lm_head.weight"] = w["output_proj.weight"]
    bias = w.get("output_proj.bias", torch.zeros(config.tgt_vocab_size))
    state["final_logits_bias"] = bias.reshape(1, -1).contiguous()

    for module, marian_modules, _ in layer_modules(config):
        # A fused tfm matrix splits into its MarianMT modules' row blocks, in order (marian_names).
        for kind in ("weight", "bias"):
            for name, part in zip(marian_modules, w[f"{module}.{kind}"].chunk(len(marian_modules), dim=0)):
                state[f"{name}.{kind}"] = part.contiguous()
    return state


def marian_config(config: ModelConfig) -> dict[str, Any]:
    """The config.json of the MarianMT model (dropout off: an exported model is for inference)."""
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": config.src_vocab_size,
        "decoder_vocab_size": config.tgt_vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.n_enc_layers,
        "decoder_layers": config.n_dec_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": MARIAN_ACTIVATION[config.activation],
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "max_position_embeddings": config.max_positions,
        "scale_embedding": True,
        "normalize_before": False,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": config.share_embeddings or config.tie_output,
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "decoder_start_token_id": config.bos_id,
        "forced_eos_token_id": None,
        "is_encoder_decoder": True,
        "use_cache": True,
    }


def never_generated(checkpoint: Checkpoint) -> list[int]:
    """The target ids tfm's searches never emit for this model: padding, BOS and its banned ids."""
    config = checkpoint.config
    return sorted({config.pad_id, config.bos_id, *checkpoint.decode_defaults.get("banned_ids", ())})


def generation_config(checkpoint: Checkpoint) -> dict[str, Any]:
    """generation_config.json: how tfm decodes this model by default, as far as `generate` can say it.

    The beam size, the length penalty (as generate applies it: exact for the `hf` rule of imported
    models; GNMT's has no `generate` equivalent, so its alpha stands as is, with the rule's name under
    tfm_length_penalty_kind), forced EOS, the minimum length and the never-generated tokens carry over
    (`tfm import` reads them all back). A fixed length limit
    (max_len_a = 0, as imported models have) becomes max_length; tfm's own limit, proportional to the
    source length, has no `generate` equivalent, so the model's position limit stands in for it and
    the limit itself goes under tfm_max_len, for `tfm import` to read back.
    """
    config = checkpoint.config
    defaults = {**config_to_dict(DecodeConfig()), **checkpoint.decode_defaults}
    fixed_limit = defaults["max_len_a"] == 0
    generation = {
        "decoder_start_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "pad_token_id": config.pad_id,
        "forced_eos_token_id": config.eos_id if defaults["forced_eos"] else None,
        "bad_words_ids": [[token] for token in never_generated(checkpoint)],
        "num_beams": int(defaults["beam_size"]),
        "length_penalty": length_penalty_of(defaults["length_penalty_kind"], defaults["length_penalty"]).generate_length_penalty(),
        # generate counts the decoder start token and EOS in max_length; tfm's max_len_b counts neither.
        "max_length": int(defaults["max_len_b"]) + 2 if fixed_limit else config.max_positions,
        "renormalize_logits": bool(defaults["renormalize"]),
    }
    if defaults["min_len"] > 0:  # generate's min_length counts the decoder start token, tfm's min_len does not
        generation["min_length"] = int(defaults["min_len"]) + 1
    if not fixed_limit:
        generation[TFM_MAX_LEN] = {"a": float(defaults["max_len_a"]), "b": int(defaults["max_len_b"])}
    if defaults["length_penalty_kind"] != "hf":
        # generate keeps keys it does not know and ignores them; `tfm import` reads this one back, so
        # the imported model ranks and stops its beams as the exported one did.
        generation[TFM_LENGTH_PENALTY_KIND] = defaults["length_penalty_kind"]
    return generation


def vocabulary_json(tokenizer) -> bytes:
    """vocab.json: {piece: id} for every id of `tokenizer`, in id order."""
    pieces = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    if len(pieces) != tokenizer.vocab_size:
        raise TfmError("--to marian: the vocabulary has a piece twice; vocab.json cannot hold it")
    return json.dumps(pieces, ensure_ascii=False, indent=1).encode("utf-8")


def write_marian(checkpoint: Checkpoint, src, tgt, folder: Path) -> None:
    """Write the MarianMT files into the existing, empty `folder`: config.json, generation_config.json,
    model.safetensors, source.spm, target.spm, vocab.json (+ target_vocab.json), tokenizer_config.json.

    `src` and `tgt` are the checkpoint's tokenizers (checkpoint.checkpoint_tokenizers).
    """
    config = checkpoint.config
    check_exportable(config, "marian")
    separate = vocabulary_json(src) != vocabulary_json(tgt)
    save_file(marian_weights(checkpoint), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(marian_config(config), indent=2) + "\n", encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps(generation_config(checkpoint), indent=2) + "\n", encoding="utf-8")
    (folder / "source.spm").write_bytes(src.model_bytes)
    (folder / "target.spm").write_bytes(tgt.model_bytes)
    (folder / "vocab.json").write_bytes(vocabulary_json(src))
    if separate:
        (folder / "target_vocab.json").write_bytes(vocabulary_json(tgt))
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "separate_vocabs": separate,
        "eos_token": tgt.id_to_piece(config.eos_id),
        "unk_token": tgt.id_to_piece(config.unk_id),
        "pad_token": tgt.id_to_piece(config.pad_id),
        "model_max_length": config.max_positions,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


# --- CTranslate2 ----------------------------------------------------------------------------------


def ctranslate2_spec(checkpoint: Checkpoint, src, tgt):
    """A ctranslate2 TransformerSpec holding the checkpoint's weights, tokens and decoding start."""
    from ctranslate2.specs import common_spec, transformer_spec

    config = checkpoint.config
    # Copies: CTranslate2's converter quantizes the arrays it is given in place.
    w = {name: tensor.to(torch.float32, copy=True).contiguous() for name, tensor in checkpoint.weights.items()}
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "swish": common_spec.Activation.SWISH}[config.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (config.n_enc_layers, config.n_dec_layers), config.n_heads, pre_norm=config.norm_first, activation=activation,
    )
    positions = sinusoidal_table(config.max_positions, config.d_model, config.sinusoid_layout)

    def linear(spec_part, name: str) -> None:
        spec_part.weight = w[f"{name}.weight"]
        if f"{name}.bias" in w:
            spec_part.bias = w[f"{name}.bias"]

    def norm(spec_part, name: str) -> None:
        spec_part.gamma, spec_part.beta = w[f"{name}.weight"], w[f"{name}.bias"]

    for side, embedding in ((spec.encoder, "src_embed"), (spec.decoder, "tgt_embed")):
        embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        embeddings.weight = w["src_embed.weight" if config.share_embeddings else f"{embedding}.weight"]
        side.scale_embeddings = True  # by sqrt(d_model), as tfm's embed does
        side.position_encodings.encodings = positions
    if config.norm_first:
        norm(spec.encoder.layer_norm, "encoder_norm")
        norm(spec.decoder.layer_norm, "decoder_norm")
    for stack, layers in (("encoder", spec.encoder.layer), ("decoder", spec.decoder.layer)):
        for i, layer in enumerate(layers):
            prefix = f"{stack}_layers.{i}"
            linear(layer.self_attention.linear[0], f"{prefix}.self_attn.qkv_proj")
            linear(layer.self_attention.linear[1], f"{prefix}.self_attn.out_proj")
            norm(layer.self_attention.layer_norm, f"{prefix}.self_attn_sublayer.norm")
            if stack == "decoder":
                linear(layer.attention.linear[0], f"{prefix}.cross_attn.q_proj")
                linear(layer.attention.linear[1], f"{prefix}.cross_attn.kv_proj")
                linear(layer.attention.linear[2], f"{prefix}.cross_attn.out_proj")
                norm(layer.attention.layer_norm, f"{prefix}.cross_attn_sublayer.norm")
            linear(layer.ffn.linear_0, f"{prefix}.ffn.linear1")
            linear(layer.ffn.linear_1, f"{prefix}.ffn.linear2")
            norm(layer.ffn.layer_norm, f"{prefix}.ffn_sublayer.norm")
    tied = config.share_embeddings or config.tie_output
    spec.decoder.projection.weight = w["src_embed.weight" if config.share_embeddings else
                                       "tgt_embed.weight" if tied else "output_proj.weight"]
    # CTranslate2 has no list of tokens never to generate; tfm never generates padding, its BOS or
    # the model's banned ids, so their logits get a bias that rules them out (and fits in float16).
    bias = w.get("output_proj.bias", torch.zeros(config.tgt_vocab_size)).clone()
    bias[never_generated(checkpoint)] = NEVER_LOGIT_BIAS
    spec.decoder.projection.bias = bias
    spec.config.unk_token = tgt.id_to_piece(config.unk_id)
    spec.config.bos_token = tgt.id_to_piece(config.bos_id)
    spec.config.eos_token = tgt.id_to_piece(config.eos_id)
    spec.config.decoder_start_token = tgt.id_to_piece(config.bos_id)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.register_source_vocabulary([src.id_to_piece(i) for i in range(src.vocab_size)])
    spec.register_target_vocabulary([tgt.id_to_piece(i) for i in range(tgt.vocab_size)])
    return spec


def write_ctranslate2(checkpoint: Checkpoint, src, tgt, folder: Path, quantization: str) -> None:
    """Write a CTranslate2 model (model.bin, config.json, vocabularies) into `folder` (it must not exist)."""
    try:
        from ctranslate2.converters import Converter
    except ImportError:
        raise TfmError("--to ctranslate2 needs the ctranslate2 package: pip install 'tfm-cli[ctranslate2]'") from None
    if quantization not in QUANTIZATIONS:
        raise TfmError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    spec = ctranslate2_spec(checkpoint, src, tgt)

    class SpecConverter(Converter):
        """CTranslate2's converter (validation, quantization, writing) over a spec built in advance."""

        def _load(self):
            return spec

    SpecConverter().convert(str(folder), quantization=quantization)


# --- The output folder ----------------------------------------------------------------------------


@contextlib.contextmanager
def new_folder(folder: Path) -> Iterator[Path]:
    """A temp folder beside `folder` to fill; renamed onto `folder` when the block succeeds, else removed.

    `folder` must not exist, or be an empty folder: an export never mixes with files already there.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise TfmError(f"{folder}: is a file; export writes a folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise TfmError(f"{folder}: the folder is not empty; export into a new or empty folder")
    parent = folder.parent if str(folder.parent) else Path(".")
    check_output_folder(parent, folder)
    # mkdtemp's folder is 0700: the export gets an existing empty folder's mode, or a new folder's.
    mode = stat.S_IMODE(folder.stat().st_mode) if folder.is_dir() else creation_mode(folder=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=parent))
    try:
        yield work
        for path in work.rglob("*"):  # as if each were created by open() or mkdir() (some writers make 0600 files)
            os.chmod(path, creation_mode(folder=path.is_dir()))
        os.chmod(work, mode)
        if folder.is_dir():
            folder.rmdir()  # empty, checked above
        os.replace(work, folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def export_model(checkpoint: Checkpoint, src, tgt, target: str, folder: Path, quantization: str = "float32") -> None:
    """Write `checkpoint` (with its tokenizers `src`, `tgt`) as a `target` ("marian" or "ctranslate2")
    model folder at `folder`, atomically."""
    writers: dict[str, Callable[[Path], None]] = {
        "marian": lambda work: write_marian(checkpoint, src, tgt, work),
        "ctranslate2": lambda work: write_ctranslate2(checkpoint, src, tgt, work / "model", quantization),
    }
    if target not in writers:
        raise TfmError(f"--to must be marian or ctranslate2, got {target!r}")
    check_exportable(checkpoint.config, target)
    with new_folder(folder) as work:
        writers[target](work)
        if target == "ctranslate2":  # its converter writes a folder of its own: move its files up
            for path in (work / "model").iterdir():
                path.rename(work / path.name)
            (work / "model").rmdir()
