"""Looking inside the model for one sentence pair: attention maps, and one head's computation step by step.

The maps come from a teacher-forced pass (model.encode / model.decode with need_weights), which
gives exactly the attention of incremental decoding. The walkthrough recomputes one head from the
module's own weights, the way the seed document does by hand (X, Q, K, V, Q K^T, scaling, softmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tfm_cli.inference.alignment import (
    aligning_attention,
    hard_alignment,
    piece_rows,
    merge_to_words,
    transpose_pairs,
)
from tfm_cli.inference.symmetrization import intersection
from tfm_cli.checkpoints.format import LoadedModel
from tfm_cli.config import AlignmentConfig, DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.model import Transformer
from tfm_cli.model.aligner import Aligner
from tfm_cli.model.attention import CrossAttention, SelfAttention
from tfm_cli.tokenization.words import Span, word_spans
from tfm_cli.inference.translation import BatchingConfig, search_batches
from tfm_cli.textio.output_lines import one_line

KINDS = ("cross", "encoder", "decoder")
BOS_LABEL, EOS_LABEL = "<s>", "</s>"


@dataclass
class AttentionMaps:
    """Every attention matrix of one sentence pair (batch dimension removed)."""

    encoder: list[torch.Tensor]  # per encoder layer (H, S, S); S counts the source EOS
    decoder: list[torch.Tensor]  # per decoder layer (H, T, T); row t predicts output t, column j reads input j
    cross: list[torch.Tensor]  # per decoder layer (H, T, S); T counts the output EOS


@torch.inference_mode()
def attention_maps(model: Transformer, src_ids: list[int], tgt_ids: list[int], full_context: bool = False) -> AttentionMaps:
    """Teacher-force `tgt_ids` (no BOS/EOS) after `src_ids` (no EOS) and collect all attention weights
    (with `full_context`, of a decoder pass in which every position sees the whole target)."""
    config = model.config
    device = next(model.parameters()).device
    src = torch.tensor([src_ids + [config.eos_id]], device=device)  # (1, S)
    tgt_in = torch.tensor([[config.bos_id] + tgt_ids], device=device)  # (1, T)
    encoded = model.encode(src, need_weights=True)
    decoded = model.decode(tgt_in, encoded, need_weights=True, full_context=full_context)
    return AttentionMaps(
        encoder=[w[0].float().cpu() for w in encoded.self_attention],
        decoder=[w[0].float().cpu() for w in decoded.self_attention],
        cross=[w[0].float().cpu() for w in decoded.cross_attention],
    )


@torch.inference_mode()
def aligner_matrix(model: Transformer, aligner: Aligner, src_ids: list[int], tgt_ids: list[int]) -> torch.Tensor:
    """A trained aligner's attention for one pair, laid out as a cross-attention map: (T, S) with the
    output EOS row and the source EOS column."""
    config = model.config
    device = next(model.parameters()).device
    src = torch.tensor([src_ids + [config.eos_id]], device=device)  # (1, S)
    tgt_in = torch.tensor([[config.bos_id] + tgt_ids], device=device)  # (1, T)
    return aligning_attention(model, aligner, AlignmentConfig(aligner=True), src, tgt_in)[0]


def resolve_index(index: int, count: int, option: str, unit: str) -> int:
    """A Python-style index (negative counts from the end) checked against `count`; returns 0..count-1."""
    if not -count <= index < count:
        raise TfmError(
            f"{option} {index} does not exist: the model has {count} {unit} (use 0..{count - 1}, or -1 for the last)"
        )
    return index % count


def select_matrix(maps: AttentionMaps, kind: str, layer: int, head: int | None) -> torch.Tensor:
    """One (rows, cols) matrix: the given layer of `kind`, one head, or the mean over heads (head None)."""
    if kind not in KINDS:
        raise TfmError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    layers = getattr(maps, kind)
    stack = "encoder" if kind == "encoder" else "decoder"
    weights = layers[resolve_index(layer, len(layers), "--layer", f"{stack} layers")]  # (H, rows, cols)
    if head is None:
        return weights.mean(dim=0)
    return weights[resolve_index(head, weights.size(0), "--head", "heads")]


@dataclass(frozen=True)
class Axis:
    """The labels of one axis of an attention matrix, and its word grouping."""

    labels: list[str]  # one per position (pieces, with <s> / </s>)
    word_spans: list[Span]  # groups of positions, one per word (<s> and </s> are words of their own)
    word_labels: list[str]


def piece_axis(pieces: list[str], bos: bool, eos: bool) -> Axis:
    """An axis of `pieces`, optionally preceded by <s> and/or followed by </s>, each its own word."""
    offset = 1 if bos else 0
    spans = [(start + offset, end + offset) for start, end in word_spans(pieces)]
    words = ["".join(pieces[start - offset : end - offset]).replace("\u2581", " ").strip(" ") for start, end in spans]
    labels = ([BOS_LABEL] if bos else []) + list(pieces) + ([EOS_LABEL] if eos else [])
    if bos:
        spans, words = [(0, 1)] + spans, [BOS_LABEL] + words
    if eos:
        spans, words = spans + [(len(labels) - 1, len(labels))], words + [EOS_LABEL]
    return Axis(labels, spans, words)


def matrix_axes(kind: str, src_pieces: list[str], tgt_pieces: list[str]) -> tuple[Axis, Axis]:
    """(row axis, column axis) of a `kind` matrix: cross = output x source, encoder = source x source,
    decoder = output x decoder input (<s> + output pieces)."""
    source = piece_axis(src_pieces, bos=False, eos=True)
    output = piece_axis(tgt_pieces, bos=False, eos=True)
    if kind == "cross":
        return output, source
    if kind == "encoder":
        return source, source
    return output, piece_axis(tgt_pieces, bos=True, eos=False)


def to_words(matrix: torch.Tensor, rows: Axis, cols: Axis) -> torch.Tensor:
    """The word-level matrix (row words, column words): alignment.merge_to_words over both axes."""
    return merge_to_words(matrix, rows.word_spans, cols.word_spans)


@dataclass
class AttentionView:
    """One matrix ready to show: labels, weights, and (cross-attention) the hard alignment it implies."""

    rows: list[str]
    columns: list[str]
    matrix: torch.Tensor  # (len(rows), len(columns)) float
    alignment: list[tuple[int, int]] | None  # cross only: (src, tgt) argmax pairs, </s> row and column left out


def attention_view(
    model: Transformer,
    src_ids: list[int],
    tgt_ids: list[int],
    src_pieces: list[str],
    tgt_pieces: list[str],
    kind: str,
    layer: int,
    head: int | None,
    words: bool,
    shift: bool = False,
    null: bool = False,
    full_context: bool = False,
    aligner: Aligner | None = None,
) -> AttentionView:
    """The `kind` attention of one layer (one head, or the mean for head None), pieces or words; with a
    trained `aligner` (cross only), the aligner's attention instead of the layer's.

    For cross-attention the alignment takes, for each target row, the column with the largest
    weight; the last row and column are </s>, which never align (as fairseq's hard alignments).
    With `shift`, each output piece's link is read from the next row (alignment.piece_rows); with
    `null`, a row whose </s> column outweighs every other is left unaligned (AlignmentConfig.null);
    with `full_context` the decoder pass lets every position see the whole target.
    The matrix shown stays the attention as computed.
    """
    if kind == "cross" and aligner is not None:
        matrix = aligner_matrix(model, aligner, src_ids, tgt_ids)
    else:
        matrix = select_matrix(attention_maps(model, src_ids, tgt_ids, full_context), kind, layer, head)
    rows, columns = matrix_axes(kind, src_pieces, tgt_pieces)
    alignment = None
    if kind == "cross":
        # The </s> row is only a placeholder here: it is dropped with the </s> column below.
        linked = torch.cat([piece_rows(matrix, matrix.size(0) - 1, shift), matrix[-1:]])
        if words:
            linked = to_words(linked, rows, columns)
        alignment = hard_alignment(linked[:-1, :-1], linked[:-1, -1] if null else None)
    if words:
        matrix, row_labels, column_labels = to_words(matrix, rows, columns), rows.word_labels, columns.word_labels
    else:
        row_labels, column_labels = rows.labels, columns.labels
    return AttentionView(row_labels, column_labels, matrix, alignment)


# ---- the walkthrough of one head ------------------------------------------------------------------


@dataclass
class Example:
    """One sentence pair ready to inspect: texts, ids and pieces of both sides."""

    source: str
    target: str
    src_ids: list[int]
    tgt_ids: list[int]
    src_pieces: list[str]
    tgt_pieces: list[str]
    translated: bool = False  # True when `target` is the model's own translation of `source`


def make_example(loaded: LoadedModel, source: str, target: str | None, decode: DecodeConfig) -> Example:
    """Tokenize `source` and `target`; with no target, the model translates `source` first.

    `decode` is settings.resolve_decode's answer, so the translation is the line `tfm translate`
    prints with the same flags (the same padding, the same search, the model's decoding defaults).
    """
    src_tok, tgt_tok = loaded.src_tokenizer, loaded.tgt_tokenizer
    src_ids = src_tok.encode_ids(source)
    translated = target is None
    if translated:
        _, hypotheses = next(search_batches(loaded.model, {0: src_ids}, decode, BatchingConfig()))
        tgt_ids = hypotheses[0][0].tokens
        target = one_line(tgt_tok.decode_ids(tgt_ids), tabs=True)  # as translation.Translator.render writes it
        tgt_pieces = [tgt_tok.id_to_piece(i) for i in tgt_ids]
    else:
        tgt_ids, tgt_pieces = tgt_tok.encode_ids(target), tgt_tok.encode_pieces(target)
    # Pieces of the text rather than of the ids: an unknown character keeps its surface (a tab stays a
    # word boundary, tokenization/words.py) instead of reading '<unk>'.
    return Example(source, target, src_ids, tgt_ids, src_tok.encode_pieces(source), tgt_pieces, translated)


def example_view(
    loaded: LoadedModel, example: Example, kind: str, layer: int, head: int | None, words: bool, shift: bool = False,
    null: bool = False, full_context: bool = False, use_aligner: bool = False,
) -> AttentionView:
    """The AttentionView (see attention_view) of one example under `loaded`'s model (with `use_aligner`,
    cross-attention is its trained aligner's)."""
    return attention_view(
        loaded.model, example.src_ids, example.tgt_ids, example.src_pieces, example.tgt_pieces, kind, layer, head, words,
        shift, null, full_context, loaded.aligner if use_aligner else None,
    )


def intersected_alignment(
    view: AttentionView, reverse: LoadedModel, example: Example, alignment: AlignmentConfig
) -> list[tuple[int, int]]:
    """The word alignment pairs both directions agree on: `view`'s and the reverse model's (target->source).

    `view` must be a word-level cross-attention view of `example`; `alignment` is the reverse
    model's attention to read (resolve_alignment's answer for it). Raises TfmError when the two
    models split the pair into different words (their tokenizers normalise text differently).
    """
    src_ids = reverse.src_tokenizer.encode_ids(example.target)
    tgt_ids = reverse.tgt_tokenizer.encode_ids(example.source)
    swapped = Example(
        example.target, example.source, src_ids, tgt_ids,
        reverse.src_tokenizer.encode_pieces(example.target), reverse.tgt_tokenizer.encode_pieces(example.source),
    )
    backward = example_view(reverse, swapped, "cross", alignment.layer, alignment.head, True, alignment.shift,
                            alignment.null, alignment.full_context, alignment.aligner)
    n_src, n_tgt = len(backward.rows) - 1, len(backward.columns) - 1
    if (n_src, n_tgt) != (len(view.columns) - 1, len(view.rows) - 1):
        raise TfmError(
            f"the reverse model splits the pair into {n_src}+{n_tgt} words, the forward model into "
            f"{len(view.columns) - 1}+{len(view.rows) - 1}; their tokenizers normalise text differently, "
            "so the alignments cannot be intersected"
        )
    return intersection(view.alignment, transpose_pairs(backward.alignment))


@dataclass
class Walkthrough:
    """One attention head computed step by step; rows are query tokens, key columns are key tokens."""

    query_labels: list[str]
    key_labels: list[str]
    x: torch.Tensor  # (T, D) the attention's input rows (queries; keys too for self-attention)
    q: torch.Tensor  # (T, Dh) = X W^Q for this head
    k: torch.Tensor  # (S, Dh) = X W^K (cross-attention: memory W^K)
    v: torch.Tensor  # (S, Dv) = X W^V; Dv = Dh, or D when all of W^V is shown
    scores: torch.Tensor  # (T, S) = Q K^T
    scaled: torch.Tensor  # (T, S) = Q K^T / sqrt(d_k), -inf where masked
    weights: torch.Tensor  # (T, S) = softmax of each scaled row
    output: torch.Tensor  # (T, Dv) = weights V

    @property
    def d_k(self) -> int:
        """The head's key dimension, the one in the 1/sqrt(d_k) scaling."""
        return self.q.size(1)


def head_slice(matrix: torch.Tensor, head: int, n_heads: int) -> torch.Tensor:
    """Columns of head `head` in a (rows, D) projection: (rows, D / n_heads)."""
    width = matrix.size(1) // n_heads
    return matrix[:, head * width : (head + 1) * width]


@torch.inference_mode()
def walk_through(
    attention: SelfAttention | CrossAttention,
    x: torch.Tensor,
    memory: torch.Tensor | None,
    head: int,
    key_mask: torch.Tensor | None,
    is_causal: bool,
    query_labels: list[str],
    key_labels: list[str],
    all_values: bool = False,
) -> Walkthrough:
    """Recompute head `head` of `attention` on x: (T, D) (and memory: (S, D) for cross-attention).

    key_mask: (S,) bool, True = may attend (None = all). With `all_values`, V keeps all d_model
    columns (the seed document's single-head presentation); otherwise V is this head's slice.
    """
    n_heads = attention.n_heads
    head = resolve_index(head, n_heads, "--head", "heads")
    if isinstance(attention, SelfAttention):
        queries, keys, values = attention.qkv_proj(x).chunk(3, dim=-1)  # 3 x (T, D)
    else:
        queries = attention.q_proj(x)  # (T, D)
        keys, values = attention.kv_proj(memory).chunk(2, dim=-1)  # 2 x (S, D)
    q, k = head_slice(queries, head, n_heads), head_slice(keys, head, n_heads)
    v = values if all_values else head_slice(values, head, n_heads)
    scores = q @ k.T  # (T, S)
    # Section 3.2.1: divide by sqrt(d_k) so the dot products' variance does not saturate the softmax.
    scaled = scores / math.sqrt(q.size(1))
    allowed = torch.ones_like(scaled, dtype=torch.bool)
    if key_mask is not None:
        allowed &= key_mask[None, :]
    if is_causal:
        allowed &= torch.ones_like(allowed).tril()
    scaled = scaled.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scaled, dim=-1)
    return Walkthrough(query_labels, key_labels, x, q, k, v, scores, scaled, weights, weights @ v)


@torch.inference_mode()
def model_walkthrough(
    model: Transformer, src_ids: list[int], tgt_ids: list[int], kind: str, layer: int, head: int,
    src_labels: list[str], tgt_labels: list[str],
) -> Walkthrough:
    """The walkthrough of one head of one layer of a trained model, for one sentence pair.

    The attention's input X is captured with a forward pre-hook during a teacher-forced pass (after
    the pre-norm LayerNorm when norm_first). src_labels: S labels (source EOS included); tgt_labels:
    the T output labels (output EOS included).
    """
    if kind not in KINDS:
        raise TfmError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    stack = model.encoder_layers if kind == "encoder" else model.decoder_layers
    block = stack[resolve_index(layer, len(stack), "--layer", f"{'encoder' if kind == 'encoder' else 'decoder'} layers")]
    attention = block.cross_attn if kind == "cross" else block.self_attn
    captured: list[tuple[torch.Tensor, ...]] = []
    hook = attention.register_forward_pre_hook(lambda module, args: captured.append(args))
    try:
        attention_maps(model, src_ids, tgt_ids)
    finally:
        hook.remove()
    x = captured[0][0][0].float()  # (1, T, D) -> (T, D)
    tgt_in_labels = [BOS_LABEL] + tgt_labels[:-1]
    if kind == "encoder":
        return walk_through(attention, x, None, head, None, False, src_labels, src_labels)
    if kind == "decoder":
        return walk_through(attention, x, None, head, None, True, tgt_labels, tgt_in_labels)
    memory = captured[0][1][0].float()  # (1, S, D) -> (S, D)
    return walk_through(attention, x, memory, head, None, False, tgt_labels, src_labels)


# The seed document's "I love your dog" example (shared/seed/README.md), in its x W convention.
SEED_TOKENS = ["I", "love", "your", "dog"]
SEED_X = [[0.12, -0.5, 1.0, 0.0, 0.45, -0.1],
          [0.0, 0.88, 0.1, 1.2, -0.3, 0.5],
          [-0.2, 0.1, 0.95, -0.1, 1.1, 0.0],
          [0.05, -0.1, 0.0, 0.8, 0.3, 1.5]]
SEED_WQ = [[1, 0, 0], [0, 1, 0], [0.5, 0.5, 0], [0, 0, 1], [0, 0.5, 0.5], [1, 0, 1]]
SEED_WK = [[0.6, 0.1, 0.0], [0.0, 0.8, 0.2], [0.4, 0.3, 0.1], [0.1, 0.0, 0.9], [0.0, 0.7, 0.4], [0.5, 0.0, 0.8]]
SEED_WV = [[0.9, 0, 0.1, 0, 0.2, 0], [0, 0.8, 0, 0.2, 0, 0.1], [0.2, 0.1, 0.9, 0, 0.3, 0],
           [0, 0.2, 0, 0.8, 0.1, 0.4], [0.1, 0, 0.3, 0.1, 0.9, 0], [0, 0.1, 0, 0.4, 0, 0.9]]


def seed_walkthrough() -> Walkthrough:
    """The seed document's example through tfm's own SelfAttention (d_model 6, 2 heads, d_k 3).

    Head 0 carries the document's W^Q and W^K; V uses all of W^V (the document's note 2 lets W^V
    output 6 dimensions), so the output rows are softmax rows @ V, as the document writes them.
    """
    attention = SelfAttention(d_model=6, n_heads=2, dropout=0.0).eval()
    weight = torch.zeros(18, 6)
    # nn.Linear computes x @ weight.T, so the document's W (used as x W) goes in transposed.
    weight[0:3] = torch.tensor(SEED_WQ, dtype=torch.float32).T
    weight[6:9] = torch.tensor(SEED_WK, dtype=torch.float32).T
    weight[12:18] = torch.tensor(SEED_WV, dtype=torch.float32).T
    with torch.no_grad():
        attention.qkv_proj.weight.copy_(weight)
        attention.qkv_proj.bias.zero_()
    x = torch.tensor(SEED_X, dtype=torch.float32)
    return walk_through(attention, x, None, 0, None, False, SEED_TOKENS, SEED_TOKENS, all_values=True)
