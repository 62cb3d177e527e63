"""The one table between MarianMT's tensor names (as Hugging Face's `save_pretrained` writes them) and
tfm's, for every layer's linear and norm modules: the importer reads it one way, the exporter the other.

tfm fuses the query, key and value projections (self-attention) and the key and value projections
(cross-attention) into one matrix each: such a module lists several MarianMT modules, whose weights are
the row blocks of tfm's, in order. Two names of tfm's own travel in generation_config.json too.
"""

from __future__ import annotations

from collections.abc import Iterator

from tfm_cli.config import ACTIVATIONS, ModelConfig

# The generation_config.json key naming a length penalty rule other than generate's (length_penalty.KINDS).
TFM_LENGTH_PENALTY_KIND = "tfm_length_penalty_kind"
# The generation_config.json key holding a length limit proportional to the source, {"a": float, "b": int}
# (max_len_a * source tokens + max_len_b), which generate cannot state.
TFM_MAX_LEN = "tfm_max_len"
# MarianMT's activation_function for each of tfm's activations (model.activation), and back: the
# importer also takes "silu", transformers' other name for swish.
MARIAN_ACTIVATION = {name: name for name in ACTIVATIONS}
TFM_ACTIVATION = {**{marian: tfm for tfm, marian in MARIAN_ACTIVATION.items()}, "silu": "swish"}
BOTH = ("encoder", "decoder")
# (stacks that have it, tfm module in a layer, MarianMT modules in a layer, shape of each MarianMT
# module's weight in d (d_model) and ff (d_ff); a norm's is (d,), and every module has a bias of its rows)
LAYER_MODULES = (
    (BOTH, "self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("d", "d")),
    (BOTH, "self_attn.out_proj", ("self_attn.out_proj",), ("d", "d")),
    (BOTH, "self_attn_sublayer.norm", ("self_attn_layer_norm",), ("d",)),
    (("decoder",), "cross_attn.q_proj", ("encoder_attn.q_proj",), ("d", "d")),
    (("decoder",), "cross_attn.kv_proj", ("encoder_attn.k_proj", "encoder_attn.v_proj"), ("d", "d")),
    (("decoder",), "cross_attn.out_proj", ("encoder_attn.out_proj",), ("d", "d")),
    (("decoder",), "cross_attn_sublayer.norm", ("encoder_attn_layer_norm",), ("d",)),
    (BOTH, "ffn.linear1", ("fc1",), ("ff", "d")),
    (BOTH, "ffn.linear2", ("fc2",), ("d", "ff")),
    (BOTH, "ffn_sublayer.norm", ("final_layer_norm",), ("d",)),
)


def layer_modules(config: ModelConfig) -> Iterator[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    """(tfm module, its MarianMT modules, the weight shape of each MarianMT module) for every linear and
    norm module of every layer, encoder layers first. Parameters are MODULE.weight and MODULE.bias."""
    dims = {"d": config.d_model, "ff": config.d_ff}
    for stack, count in (("encoder", config.n_enc_layers), ("decoder", config.n_dec_layers)):
        for index in range(count):
            for stacks, tfm, marian, shape in LAYER_MODULES:
                if stack in stacks:
                    yield (f"{stack}_layers.{index}.{tfm}", tuple(f"model.{stack}.layers.{index}.{m}" for m in marian),
                           tuple(dims[symbol] for symbol in shape))
