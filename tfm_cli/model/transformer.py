"""The encoder-decoder Transformer: embeddings, encoder, decoder, output projection, incremental decoding.

Read top to bottom: Transformer.encode -> Transformer.decode (training, full target: each layer's
`forward`) or Transformer.start_decoding + Transformer.decode_step (inference, one token at a time
with a cache: each layer's `step`, on (B, D) rows).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from tfm_cli.config import ModelConfig
from tfm_cli.errors import TfmError
from tfm_cli.model.attention import KeyValueCache, SelfAttentionCache
from tfm_cli.model.dropout import Dropout
from tfm_cli.model.embedding_rows import Embedding
from tfm_cli.model.kernels import Linear
from tfm_cli.model.layers import DecoderLayer, EncoderLayer, sinusoidal_table


@dataclass
class Encoded:
    """The encoder's output: the memory Z and which source positions are real."""

    memory: torch.Tensor  # (B, S, D)
    src_mask: torch.Tensor  # (B, S) bool, True at real tokens
    self_attention: list[torch.Tensor] = field(default_factory=list)  # per layer (B, H, S, S), if asked


@dataclass
class Decoded:
    """The decoder's output over a whole target prefix."""

    hidden: torch.Tensor  # (B, T, D), before the output projection
    self_attention: list[torch.Tensor] = field(default_factory=list)  # per layer (B, H, T, T), if asked
    cross_attention: list[torch.Tensor] = field(default_factory=list)  # per layer (B, H, T, S), if asked
    # One layer's cross-attention (B, H, T, S), if asked by `attention_layer` (guided-alignment training).
    layer_cross_attention: torch.Tensor | None = None
    layer_states: list[torch.Tensor] = field(default_factory=list)  # per layer its output (B, T, D), if asked


@dataclass
class SourcePart:
    """The encoder memory of consecutive groups whose sources were encoded at one width S_p."""

    mask: torch.Tensor  # (G_p, 1, 1, S_p) bool
    cross_caches: list[KeyValueCache]  # per decoder layer, the memory's keys/values (G_p, H, S_p, Dh), fixed

    @property
    def groups(self) -> int:
        """G_p, the groups (sentences) of this part."""
        return self.mask.size(0)

    def select(self, indices: torch.Tensor) -> None:
        """Keep groups `indices` (G_p',) int64 of this part, in that order."""
        self.mask = self.mask.index_select(0, indices)
        for cache in self.cross_caches:
            cache.select(indices)


@dataclass
class DecoderState:
    """Everything incremental decoding keeps between steps, for a batch of B hypotheses (rows).

    Rows come in G groups of `group_width` consecutive rows that decode the same source sentence
    (the beams of a sentence); the cross-attention caches and the memory mask hold one entry per
    group, not per row, so a beam search keeps one copy of each sentence's memory keys/values.
    The groups are in `parts` (SourcePart), runs of consecutive groups whose sources were encoded at
    one width: a batch of sources of several widths attends to each width's memory apart, so that a
    sentence's attention has the rounding it has alone. With several parts, `select` keeps the groups
    in order (a part's groups stay consecutive).
    """

    parts: list[SourcePart]
    self_caches: list[SelfAttentionCache]  # per decoder layer, keys/values (B, H, t, Dh) growing by 1 per step
    group_sentences: torch.Tensor  # (G,) int64: the encoded sentence of each group
    group_width: int = 1  # rows per group w; B = G * w
    position: int = 0  # number of target tokens decoded so far

    def select(self, indices: torch.Tensor, group_width: int = 1) -> None:
        """Keep rows `indices` (B',) int64, in that order: beam reordering and dropping finished rows.

        The kept rows form groups of `group_width` consecutive rows; every row of a group must come
        from the same sentence (a ValueError otherwise). Returns nothing; the state changes in place.
        """
        if indices.numel() % group_width:
            raise ValueError(f"{indices.numel()} rows do not split into groups of {group_width}")
        unchanged = (
            group_width == self.group_width
            and indices.numel() == self.batch_size
            and torch.equal(indices, torch.arange(self.batch_size, device=indices.device))
        )
        if unchanged:
            return  # nothing moves (greedy steps, beam steps that keep every beam in place)
        for cache in self.self_caches:
            cache.select(indices)
        source_groups = indices // self.group_width  # (B',) the old group of each kept row
        row_sentences = self.group_sentences.index_select(0, source_groups)  # (B',)
        first_rows = source_groups.view(-1, group_width)[:, 0]  # (G',) the old group each new group copies
        group_sentences = row_sentences.view(-1, group_width)[:, 0]  # (G',)
        if group_width > 1 and not torch.equal(row_sentences, group_sentences.repeat_interleave(group_width)):
            raise ValueError(f"a group of {group_width} rows mixes sentences")
        # A beam reorder keeps every group on its own sentence, so the cross-attention keys/values
        # (the largest cache) stay in place: copying them each step cost as much as the step's matmuls.
        if not torch.equal(group_sentences, self.group_sentences):
            self.select_groups(first_rows)
        self.group_sentences = group_sentences
        self.group_width = group_width

    def select_groups(self, first_rows: torch.Tensor) -> None:
        """Keep groups `first_rows` (G',) int64 of every part; with several parts they must be in order."""
        if len(self.parts) == 1:
            self.parts[0].select(first_rows)
            return
        if bool((first_rows[1:] < first_rows[:-1]).any()):
            raise ValueError("a batch of several source widths keeps its groups in order")
        kept, start = [], 0
        for part in self.parts:
            end = start + part.groups
            mine = first_rows[(first_rows >= start) & (first_rows < end)] - start
            if mine.numel():
                if not torch.equal(mine, torch.arange(part.groups, device=mine.device)):
                    part.select(mine)
                kept.append(part)
            start = end
        self.parts = kept

    @property
    def memory_masks(self) -> list[torch.Tensor]:
        """Each part's memory mask (G_p, 1, 1, S_p), in order."""
        return [part.mask for part in self.parts]

    @property
    def batch_size(self) -> int:
        """The number of hypotheses (rows) B the state currently holds."""
        return self.group_sentences.numel() * self.group_width


@dataclass
class StepOutput:
    """One decoding step's result."""

    logits: torch.Tensor  # (B, V) for the next token


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need" (batch-first)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.inference_dtype = "float32"  # what precision.convert_linear_layers made the linear layers
        d_model = config.d_model
        # Under with_weights' meta device the parameters get their values afterwards: nothing is drawn,
        # and the embeddings skip nn.Embedding's own normal_, which has no C++ kernel for that device.
        on_meta = torch.get_default_device().type == "meta"

        def new_embedding(vocab_size: int) -> Embedding:
            weight = torch.empty(vocab_size, d_model) if on_meta else None
            return Embedding(vocab_size, d_model, padding_idx=config.pad_id, _weight=weight)

        self.src_embed = new_embedding(config.src_vocab_size)
        if config.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = new_embedding(config.tgt_vocab_size)
        if not on_meta:
            for embedding in {id(e): e for e in (self.src_embed, self.tgt_embed)}.values():
                # Common practice (fairseq, tensor2tensor): N(0, d^-0.5), so embed * sqrt(d) has unit scale.
                nn.init.normal_(embedding.weight, mean=0.0, std=d_model**-0.5)
                nn.init.zeros_(embedding.weight[config.pad_id])
        with torch.device("cpu"):  # also under with_weights' meta device, where arange loads slow Python kernels
            positions = sinusoidal_table(config.max_positions, d_model, config.sinusoid_layout)
        self.register_buffer("positions", positions, persistent=False)
        self.embed_dropout = Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_enc_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_dec_layers))
        # Pre-norm leaves the residual stream unnormalised, so it needs one final LayerNorm per stack.
        self.encoder_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps) if config.norm_first else None
        self.decoder_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps) if config.norm_first else None
        # Marian models add a learned bias to the logits (final_logits_bias); tfm's own have none.
        self.output_proj = Linear(d_model, config.tgt_vocab_size, bias=config.output_bias)
        if config.output_bias:
            nn.init.zeros_(self.output_proj.bias)
        if not (config.share_embeddings or config.tie_output or on_meta):
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=d_model**-0.5)
        self.tie_parameters()

    def tie_parameters(self) -> None:
        """Make the output projection use the target embedding's weight when the config ties them, and
        keep the embeddings' padding rows out of training (called once the parameters exist)."""
        if self.config.share_embeddings or self.config.tie_output:
            self.output_proj.weight = self.tgt_embed.weight
        for embedding in {id(e): e for e in (self.src_embed, self.tgt_embed)}.values():
            # The padding row is not learned: padding_idx keeps lookups from updating it, but a tied
            # output projection would (every softmax pushes the pad logit). With its gradient zeroed,
            # Adam leaves it at exactly zero, and the pad logit stays 0 (searches never emit it).
            embedding.weight.register_hook(functools.partial(zero_gradient_row, row=self.config.pad_id))

    @classmethod
    def with_weights(cls, config: ModelConfig, weights: dict[str, torch.Tensor], take: bool = False) -> Transformer:
        """A Transformer of `config` on the CPU holding copies of `weights` (every parameter by name, any
        float dtype) in float32, in train mode.

        With `take` the caller gives the tensors up: each is removed from `weights` and becomes the
        parameter itself when it is float32 already (converted otherwise), so building holds one copy of
        the weights, and a weight a later conversion replaces (kernels.pack_weights) is freed at once. The
        tensors must then be memory of their own (read_checkpoint's are), never a view of a mapped file.

        Built on the meta device and then given the weights as its parameters, so no parameter is first
        filled with random values only to be overwritten: for a large vocabulary that took longer than
        reading the checkpoint (bench/RESULTS.md, section "Whole processes on the same Intel AMX VM, the
        model loaded without random initialisation"). The new parameter objects are tied again; the
        positional table was computed on the CPU.
        """
        with torch.device("meta"):
            model = cls(config)
        for name, param in list(model.named_parameters()):
            owner, _, attribute = name.rpartition(".")
            value = weights.pop(name).to(torch.float32) if take else weights[name].to(torch.float32, copy=True)
            setattr(model.get_submodule(owner), attribute, nn.Parameter(value, requires_grad=param.requires_grad))
        model.tie_parameters()
        return model

    def embed(self, embedding: Embedding, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """tokens: (B, T) -> (B, T, D): embedding * sqrt(d_model) (section 3.4) + positional encoding."""
        length = tokens.size(1)
        if start + length > self.config.max_positions:
            raise TfmError(
                f"a sequence of {start + length} tokens exceeds the model's max_positions={self.config.max_positions}; "
                "shorten the input"
            )
        x = embedding(tokens) * math.sqrt(self.config.d_model)
        return self.embed_dropout(x + self.positions[start : start + length])

    def encode(self, src: torch.Tensor, need_weights: bool = False) -> Encoded:
        """src: (B, S) int64, padded with pad_id. Returns the memory (B, S, D) and src mask (B, S)."""
        src_mask = src != self.config.pad_id  # (B, S)
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S): every query may see the real keys
        x = self.embed(self.src_embed, src)
        weights = []
        for layer in self.encoder_layers:
            x, layer_weights = layer(x, attn_mask, need_weights=need_weights)
            if need_weights:
                weights.append(layer_weights)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return Encoded(memory=x, src_mask=src_mask, self_attention=weights)

    def decode(
        self, tgt_in: torch.Tensor, encoded: Encoded, need_weights: bool = False, attention_layer: int | None = None,
        full_context: bool = False, keep_states: bool = False,
    ) -> Decoded:
        """Teacher-forced decoding of a whole prefix. tgt_in: (B, T) int64, starting with BOS.

        Returns hidden states (B, T, D); apply `project` for logits. Target padding needs no
        mask: padding sits at the end, and the causal mask already hides later positions.
        `need_weights` returns every layer's attention weights; `attention_layer` (a python-style
        index) only that decoder layer's cross-attention, in `layer_cross_attention`: the other
        layers keep the fused kernel. `full_context` lets every position see the whole target
        (padding masked) instead of its prefix: Garg et al.'s full-context pass for alignments,
        whose hidden states predict nothing. `keep_states` returns every layer's output (what a
        trained aligner reads, model/aligner.py).
        """
        memory_mask = encoded.src_mask[:, None, None, :]  # (B, 1, 1, S)
        target_mask = None
        if full_context:
            target_mask = tgt_in != self.config.pad_id  # (B, T); padding sits at the end
            target_mask[:, 0] = True  # BOS, which is the padding id in Marian models
            target_mask = target_mask[:, None, None, :]  # (B, 1, 1, T)
        x = self.embed(self.tgt_embed, tgt_in)
        self_weights, cross_weights = [], []
        chosen = None if attention_layer is None else range(len(self.decoder_layers))[attention_layer]
        layer_cross_attention = None
        layer_states = []
        for index, layer in enumerate(self.decoder_layers):
            x, layer_self, layer_cross = layer(
                x, encoded.memory, memory_mask, need_weights=need_weights, need_cross_weights=index == chosen,
                target_mask=target_mask,
            )
            if need_weights:
                self_weights.append(layer_self)
                cross_weights.append(layer_cross)
            if index == chosen:
                layer_cross_attention = layer_cross
            if keep_states:
                layer_states.append(x)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return Decoded(hidden=x, self_attention=self_weights, cross_attention=cross_weights,
                       layer_cross_attention=layer_cross_attention, layer_states=layer_states)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., D) -> logits (..., V) over the target vocabulary."""
        return self.output_proj(hidden)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src: (B, S), tgt_in: (B, T) int64 -> logits (B, T, V)."""
        return self.project(self.decode(tgt_in, self.encode(src)).hidden)

    def start_decoding(self, encoded: Encoded | list[Encoded]) -> DecoderState:
        """Prepare incremental decoding: computes every layer's cross-attention keys/values once.

        `encoded`: one batch of sources, or several encoded at their own widths (one SourcePart each,
        their sentences numbered on from the previous part's).
        """
        parts = []
        for one in encoded if isinstance(encoded, list) else [encoded]:
            cross_caches = []
            for layer in self.decoder_layers:
                keys, values = layer.cross_attn.project_memory(one.memory)
                # Contiguous, as every later `select` leaves them: the attention products then take the
                # same kernel (the same rounding) whether or not the rows were ever selected.
                cross_caches.append(KeyValueCache(keys.contiguous(), values.contiguous()))
            parts.append(SourcePart(mask=one.src_mask[:, None, None, :], cross_caches=cross_caches))
        sentences = sum(part.groups for part in parts)
        return DecoderState(
            parts=parts,
            self_caches=[SelfAttentionCache() for _ in self.decoder_layers],
            group_sentences=torch.arange(sentences, device=parts[0].mask.device),
        )

    def decode_step(
        self, tokens: torch.Tensor, state: DecoderState, explicit_attention: bool = False,
        output_layer: nn.Module | None = None,
    ) -> StepOutput:
        """Feed one token per hypothesis. tokens: (B,) int64, the previous output (BOS at step 0).

        Appends this step's self-attention keys/values to `state` and returns next-token logits
        (B, V). `explicit_attention` computes attention by its explicit formula instead of torch's
        fused kernel, so that a row's logits do not depend on the other rows (see attention.attend).
        `output_layer` replaces the output projection (a shortlist's: (B, K) logits of K target ids).
        """
        x = self.embed(self.tgt_embed, tokens[:, None], start=state.position)[:, 0]  # (B, D)
        single = len(state.parts) == 1
        memory_masks = state.parts[0].mask if single else state.memory_masks
        for index, (layer, self_cache) in enumerate(zip(self.decoder_layers, state.self_caches)):
            cross_caches = state.parts[0].cross_caches[index] if single else [part.cross_caches[index] for part in state.parts]
            x = layer.step(x, memory_masks, self_cache, cross_caches, explicit_attention)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        state.position += 1
        return StepOutput(logits=self.project(x) if output_layer is None else output_layer(x))


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The name and shape of every parameter of a Transformer of `config`, as named_parameters() lists
    them (a tied weight once, under its first name), computed without building the model.

    Checking a checkpoint needs only this; building even an empty model (on torch's meta device)
    would import half of torch's compiler stack (its cost: bench/RESULTS.md, section "Other modules").
    tests/test_model.py compares it
    with real models of every shape option.
    """
    d_model, d_ff = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {"src_embed.weight": (config.src_vocab_size, d_model)}
    if not config.share_embeddings:
        shapes["tgt_embed.weight"] = (config.tgt_vocab_size, d_model)

    def add_linear(name: str, out_features: int, in_features: int) -> None:
        shapes[f"{name}.weight"] = (out_features, in_features)
        shapes[f"{name}.bias"] = (out_features,)

    def add_norm(name: str) -> None:
        shapes[f"{name}.weight"] = shapes[f"{name}.bias"] = (d_model,)

    def add_self_attention_and_ffn(prefix: str, with_cross_attention: bool) -> None:
        add_linear(f"{prefix}.self_attn.qkv_proj", 3 * d_model, d_model)
        add_linear(f"{prefix}.self_attn.out_proj", d_model, d_model)
        add_norm(f"{prefix}.self_attn_sublayer.norm")
        if with_cross_attention:
            add_linear(f"{prefix}.cross_attn.q_proj", d_model, d_model)
            add_linear(f"{prefix}.cross_attn.kv_proj", 2 * d_model, d_model)
            add_linear(f"{prefix}.cross_attn.out_proj", d_model, d_model)
            add_norm(f"{prefix}.cross_attn_sublayer.norm")
        add_linear(f"{prefix}.ffn.linear1", d_ff, d_model)
        add_linear(f"{prefix}.ffn.linear2", d_model, d_ff)
        add_norm(f"{prefix}.ffn_sublayer.norm")

    for index in range(config.n_enc_layers):
        add_self_attention_and_ffn(f"encoder_layers.{index}", with_cross_attention=False)
    for index in range(config.n_dec_layers):
        add_self_attention_and_ffn(f"decoder_layers.{index}", with_cross_attention=True)
    if config.norm_first:
        add_norm("encoder_norm")
        add_norm("decoder_norm")
    if not (config.share_embeddings or config.tie_output):
        shapes["output_proj.weight"] = (config.tgt_vocab_size, d_model)
    if config.output_bias:
        shapes["output_proj.bias"] = (config.tgt_vocab_size,)
    return shapes


def zero_gradient_row(grad: torch.Tensor, row: int) -> torch.Tensor:
    """grad: (V, D) -> the same gradient with row `row` set to zero (a parameter hook)."""
    return grad.index_fill(0, torch.tensor([row], device=grad.device), 0.0)


def count_parameters(model: nn.Module) -> int:
    """The number of distinct trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
