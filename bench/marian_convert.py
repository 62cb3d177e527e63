"""Convert a tfm checkpoint into a Hugging Face MarianMT directory and a CTranslate2 model (bench only).

Both tfm and Marian are post-norm encoder-decoder Transformers with sqrt(d_model)-scaled embeddings
and sinusoidal positions, so the weights map one to one, with three differences handled here:
  * tfm fuses projections (self-attention qkv_proj = [W_q; W_k; W_v] rows, cross-attention kv_proj =
    [W_k; W_v]); Marian keeps q_proj / k_proj / v_proj: the fused rows are split.
  * tfm's position table interleaves sin/cos (section 3.5: PE(pos, 2i) = sin, PE(pos, 2i+1) = cos);
    Marian's MarianSinusoidalPositionalEmbedding puts every sin first and every cos second. Positions
    are not parameters in either, so the Marian model's tables are overwritten with tfm's after
    loading (`load_marian`); CTranslate2 reads them from the loaded module (`embed_positions.weight`).
  * CTranslate2's Marian loader assumes the Opus-MT layout (pad is the LAST vocabulary entry and is
    dropped; decoding starts from a zero vector). tfm's pad is id 0 and tfm starts from the BOS
    embedding, so `TfmMarianLoader` keeps the whole vocabulary and starts from BOS (id 2).

Usage: python bench/marian_convert.py -m model.safetensors -o OUTDIR [--check]
writes OUTDIR/marian (config.json, model.safetensors, source.spm, target.spm),
OUTDIR/ct2-float32 and OUTDIR/ct2-int8.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from ctranslate2.converters.transformers import BartLoader, MarianMTLoader, TransformersConverter
from transformers import GenerationConfig, MarianConfig, MarianMTModel

from tfm_cli.checkpoint import Checkpoint, build_model, read_checkpoint
from tfm_cli.config import ModelConfig
from tfm_cli.model.layers import sinusoidal_table
from tfm_cli.tokenizer import Tokenizer

SRC_SPM = "source.spm"
TGT_SPM = "target.spm"


def marian_config(config: ModelConfig) -> MarianConfig:
    """The MarianConfig with the same sizes, special ids and sharing as the tfm `config` (dropout off)."""
    if config.norm_first:
        raise ValueError("Marian is post-norm only; this checkpoint is pre-norm (norm_first=true)")
    if config.layer_norm_eps != 1e-5:
        raise ValueError(f"Marian's LayerNorm eps is fixed at 1e-5; the checkpoint uses {config.layer_norm_eps}")
    if not (config.share_embeddings or config.tie_output):
        raise ValueError("only checkpoints with a tied output projection map onto MarianMTModel's lm_head")
    return MarianConfig(
        vocab_size=config.src_vocab_size,
        decoder_vocab_size=config.tgt_vocab_size,
        d_model=config.d_model,
        encoder_layers=config.n_enc_layers,
        decoder_layers=config.n_dec_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function=config.activation,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=config.max_positions,
        scale_embedding=True,
        normalize_before=False,
        share_encoder_decoder_embeddings=config.share_embeddings,
        tie_word_embeddings=True,
        pad_token_id=config.pad_id,
        eos_token_id=config.eos_id,
        bos_token_id=config.bos_id,
        decoder_start_token_id=config.bos_id,
        forced_eos_token_id=None,
    )


def split_rows(weight: torch.Tensor, n_parts: int) -> tuple[torch.Tensor, ...]:
    """A fused projection's weight (n_parts * D, D) or bias (n_parts * D,) -> n_parts equal row blocks."""
    return tuple(part.clone() for part in weight.chunk(n_parts, dim=0))


def marian_state_dict(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """tfm weights renamed (and fused projections split) into MarianMTModel's parameter names."""
    w = {name: tensor.to(torch.float32) for name, tensor in checkpoint.weights.items()}
    config = checkpoint.config
    state: dict[str, torch.Tensor] = {}
    if config.share_embeddings:
        state["model.shared.weight"] = w["src_embed.weight"]
    state["model.encoder.embed_tokens.weight"] = w["src_embed.weight"]
    state["model.decoder.embed_tokens.weight"] = w["src_embed.weight" if config.share_embeddings else "tgt_embed.weight"]
    state["lm_head.weight"] = state["model.decoder.embed_tokens.weight"]
    state["final_logits_bias"] = torch.zeros(1, config.tgt_vocab_size)

    def attention(prefix: str, tfm_prefix: str, fused: str, names: tuple[str, ...]) -> None:
        for kind in ("weight", "bias"):
            for name, part in zip(names, split_rows(w[f"{tfm_prefix}.{fused}.{kind}"], len(names))):
                state[f"{prefix}.{name}.{kind}"] = part
            state[f"{prefix}.out_proj.{kind}"] = w[f"{tfm_prefix}.out_proj.{kind}"]

    def copy(prefix: str, tfm_prefix: str) -> None:
        for kind in ("weight", "bias"):
            state[f"{prefix}.{kind}"] = w[f"{tfm_prefix}.{kind}"]

    for side, n_layers in (("encoder", config.n_enc_layers), ("decoder", config.n_dec_layers)):
        for i in range(n_layers):
            hf, tfm = f"model.{side}.layers.{i}", f"{side}_layers.{i}"
            attention(f"{hf}.self_attn", f"{tfm}.self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj"))
            copy(f"{hf}.self_attn_layer_norm", f"{tfm}.self_attn_sublayer.norm")
            if side == "decoder":
                copy(f"{hf}.encoder_attn.q_proj", f"{tfm}.cross_attn.q_proj")
                attention(f"{hf}.encoder_attn", f"{tfm}.cross_attn", "kv_proj", ("k_proj", "v_proj"))
                copy(f"{hf}.encoder_attn_layer_norm", f"{tfm}.cross_attn_sublayer.norm")
            copy(f"{hf}.fc1", f"{tfm}.ffn.linear1")
            copy(f"{hf}.fc2", f"{tfm}.ffn.linear2")
            copy(f"{hf}.final_layer_norm", f"{tfm}.ffn_sublayer.norm")
    return state


def set_tfm_positions(model: MarianMTModel) -> None:
    """Overwrite both Marian position tables (P, D) with tfm's interleaved sin/cos table."""
    config = model.config
    table = sinusoidal_table(config.max_position_embeddings, config.d_model)
    with torch.no_grad():
        model.model.encoder.embed_positions.weight.copy_(table)
        model.model.decoder.embed_positions.weight.copy_(table)


def tfm_to_marian(checkpoint: Checkpoint) -> MarianMTModel:
    """A MarianMTModel (float32, eval mode) computing the same function as the tfm checkpoint."""
    model = MarianMTModel(marian_config(checkpoint.config))
    state = marian_state_dict(checkpoint)
    own = model.state_dict()
    expected = {name for name in own if "embed_positions" not in name}
    if expected != set(state):
        raise ValueError(f"weight names differ: missing {sorted(expected - set(state))}, extra {sorted(set(state) - expected)}")
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)
    set_tfm_positions(model)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=checkpoint.config.bos_id,
        eos_token_id=checkpoint.config.eos_id,
        pad_token_id=checkpoint.config.pad_id,
    )
    return model.eval()


def save_marian(checkpoint: Checkpoint, directory: Path) -> MarianMTModel:
    """Write the MarianMT directory (config.json, model.safetensors, source.spm, target.spm); returns the model."""
    model = tfm_to_marian(checkpoint)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    (directory / SRC_SPM).write_bytes(checkpoint.src_tokenizer_bytes)
    (directory / TGT_SPM).write_bytes(checkpoint.tgt_tokenizer_bytes)
    return model


def load_marian(directory: Path) -> MarianMTModel:
    """Load a directory written by `save_marian`, with tfm's position tables restored (eval mode)."""
    model = MarianMTModel.from_pretrained(directory, dtype=torch.float32)
    set_tfm_positions(model)
    return model.eval()


@dataclass(frozen=True)
class Vocabularies:
    """The sentencepiece pieces by id, standing in for the HF tokenizer CTranslate2's loaders expect."""

    src: list[str]
    tgt: list[str]
    bos: str
    eos: str
    unk: str


def read_vocabularies(directory: Path) -> Vocabularies:
    """The pieces of the MarianMT directory's source.spm / target.spm, and tfm's special pieces."""
    src = Tokenizer((directory / SRC_SPM).read_bytes(), origin=str(directory / SRC_SPM))
    tgt = Tokenizer((directory / TGT_SPM).read_bytes(), origin=str(directory / TGT_SPM))
    src_pieces = [src.id_to_piece(i) for i in range(src.vocab_size)]
    tgt_pieces = [tgt.id_to_piece(i) for i in range(tgt.vocab_size)]
    config = ModelConfig(src_vocab_size=len(src_pieces), tgt_vocab_size=len(tgt_pieces))
    return Vocabularies(
        src_pieces, tgt_pieces, tgt_pieces[config.bos_id], tgt_pieces[config.eos_id], tgt_pieces[config.unk_id]
    )


class TfmMarianLoader(MarianMTLoader):
    """CTranslate2's own Marian loader, minus its Opus-MT assumptions (see the module docstring)."""

    def _remove_pad_weights(self, spec) -> None:
        """Keep every vocabulary row: tfm's pad is id 0, not an extra trailing entry."""

    def set_decoder(self, spec, decoder) -> None:
        """Start decoding from the BOS embedding (tfm) rather than a zero vector (Opus-MT)."""
        BartLoader.set_decoder(self, spec, decoder)

    def set_config(self, config, model, tokenizer: Vocabularies) -> None:
        """Special tokens as tfm's sentencepiece model names them; decoding starts from BOS."""
        config.bos_token = tokenizer.bos
        config.eos_token = tokenizer.eos
        config.unk_token = tokenizer.unk
        config.decoder_start_token = tokenizer.bos

    def get_vocabulary(self, model, tokenizer: Vocabularies) -> tuple[list[str], list[str]]:
        """Both vocabularies, each in id order."""
        return tokenizer.src, tokenizer.tgt

    def set_vocabulary(self, spec, tokens: tuple[list[str], list[str]]) -> None:
        """Register the source and target pieces separately (equal lists for a joint vocabulary)."""
        spec.register_source_vocabulary(tokens[0])
        spec.register_target_vocabulary(tokens[1])


class TfmMarianConverter(TransformersConverter):
    """TransformersConverter for a `save_marian` directory: tfm positions restored, TfmMarianLoader."""

    def _load(self):
        directory = Path(self._model_name_or_path)
        with torch.no_grad():
            return TfmMarianLoader()(load_marian(directory), read_vocabularies(directory))


def convert_to_ctranslate2(marian_dir: Path, output_dir: Path, quantization: str | None) -> Path:
    """Convert a `save_marian` directory with CTranslate2's converter; returns the output directory."""
    return Path(TfmMarianConverter(str(marian_dir)).convert(str(output_dir), quantization=quantization, force=True))


def max_logit_difference(checkpoint: Checkpoint, marian: MarianMTModel, seed: int = 0) -> float:
    """Largest |tfm logits - Marian logits| on a random padded batch (B=3, S<=9, T<=7) in float32."""
    config = checkpoint.config
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, config.src_vocab_size, (3, 9), generator=generator)
    tgt_in = torch.randint(4, config.tgt_vocab_size, (3, 7), generator=generator)
    src[:, -1] = config.eos_id
    src[1, 5:] = config.pad_id  # a shorter, padded source
    src[1, 4] = config.eos_id
    tgt_in[:, 0] = config.bos_id
    tfm = build_model(checkpoint)
    with torch.inference_mode():
        expected = tfm(src, tgt_in)
        actual = marian(
            input_ids=src, attention_mask=(src != config.pad_id).long(), decoder_input_ids=tgt_in
        ).logits
    # Padded target positions need no mask in tfm (causal); compare every position.
    return float((expected - actual).abs().max())


def main() -> None:
    """Command line: convert one checkpoint to MarianMT + CTranslate2 float32/int8, optionally check logits."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, required=True, help="tfm checkpoint (.safetensors)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    parser.add_argument("--check", action="store_true", help="compare tfm and Marian logits (must be ~1e-5)")
    args = parser.parse_args()
    checkpoint = read_checkpoint(args.model)
    marian = save_marian(checkpoint, args.output / "marian")
    if args.check:
        print(f"max |tfm - marian| logit difference: {max_logit_difference(checkpoint, load_marian(args.output / 'marian')):.2e}")
    for quantization in ("float32", "int8"):
        convert_to_ctranslate2(args.output / "marian", args.output / f"ct2-{quantization}", quantization)
    print(f"wrote {args.output}/marian, ct2-float32, ct2-int8")
    del marian


if __name__ == "__main__":
    main()
