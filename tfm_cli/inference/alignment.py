"""Attention maps -> word-level matrices -> hard word alignments (Pharaoh "src-tgt" pairs).

Words are tokenization/words.py's: runs of non-whitespace in the text, and the same words read on the
pieces (word_spans), so piece spans and character offsets of the same sentence line up.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from tfm_cli.config import AlignmentConfig
from tfm_cli.inference.decoding import MIN_STEP_ROWS, padded_length
from tfm_cli.model import Transformer
from tfm_cli.model.aligner import Aligner
from tfm_cli.tokenization.words import Span

AlignmentPair = tuple[int, int]


def merge_to_words(matrix: torch.Tensor, tgt_spans: list[Span], src_spans: list[Span]) -> torch.Tensor:
    """Piece-level attention (T_pieces, S_pieces) -> word-level (T_words, S_words).

    A target word's row is the MEAN of its pieces' rows; a source word's column is the SUM of its
    pieces' columns. So each row still sums to what the piece rows summed to (1 for attention over
    all source pieces): a word's weight is the probability mass given to any of its pieces, averaged
    over the pieces that make up the attending word.
    """
    src_merge = torch.zeros(len(src_spans), matrix.size(1), dtype=matrix.dtype, device=matrix.device)
    for word, (start, end) in enumerate(src_spans):
        src_merge[word, start:end] = 1.0
    tgt_merge = torch.zeros(len(tgt_spans), matrix.size(0), dtype=matrix.dtype, device=matrix.device)
    for word, (start, end) in enumerate(tgt_spans):
        tgt_merge[word, start:end] = 1.0 / (end - start)
    return tgt_merge @ matrix @ src_merge.T  # (T_words, T) @ (T, S) @ (S, S_words)


def chosen_attention(cross_attention: list[torch.Tensor], alignment: AlignmentConfig) -> torch.Tensor:
    """The cross-attention `alignment` names: per-layer (..., H, T, S) maps -> (..., T, S).

    Its layer, then one head or the mean over heads (head None).
    """
    weights = cross_attention[alignment.layer]  # (..., H, T, S)
    return weights.mean(dim=-3) if alignment.head is None else weights.select(-3, alignment.head)


def aligning_attention(
    model: Transformer, aligner: Aligner | None, alignment: AlignmentConfig, src: torch.Tensor, tgt_in: torch.Tensor
) -> torch.Tensor:
    """The attention word alignments read, from one teacher-forced pass: src (B, S) with EOS, tgt_in (B, T)
    with BOS -> (B, T, S) float32 on the CPU. With `alignment.aligner`, the trained `aligner`'s
    probabilities; otherwise the cross-attention `alignment` names (chosen_attention)."""
    encoded = model.encode(src)
    if alignment.aligner:
        if aligner is None:
            raise ValueError("alignment.aligner is set but no aligner was given")
        decoded = model.decode(tgt_in, encoded, keep_states=True)
        states = torch.cat(decoded.layer_states, dim=-1).float()  # (B, T, L * D)
        tgt_mask = tgt_in != model.config.pad_id  # (B, T)
        return aligner(states, encoded.memory.float(), encoded.src_mask, tgt_mask).exp().cpu()
    decoded = model.decode(tgt_in, encoded, attention_layer=alignment.layer, full_context=alignment.full_context)
    return chosen_attention([decoded.layer_cross_attention], replace(alignment, layer=0)).float().cpu()


def forced_attention(
    model: Transformer, aligner: Aligner | None, alignment: AlignmentConfig, sources: list[list[int]],
    outputs: list[list[int]], device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """aligning_attention of each (source, output) id pair, teacher-forced: per pair a (T, S) float32 CPU
    tensor, T = len(output) + 1 rows (BOS, then the output), S = len(source) + 1 columns (then EOS).

    Batch-invariant, as the searches are: pairs are grouped by their padded source and output widths
    (decoding.padded_length) and each group runs at those widths, on at least MIN_STEP_ROWS token rows
    on both sides (copies of its first pair fill it up), so a pair's attention has the same bits
    whatever else is aligned with it.
    """
    config = model.config
    groups: dict[tuple[int, int], list[int]] = {}
    for index, (source, output) in enumerate(zip(sources, outputs)):
        widths = (padded_length(len(source) + 1), padded_length(len(output) + 1))
        groups.setdefault(tuple(min(width, config.max_positions) for width in widths), []).append(index)
    attention: list[torch.Tensor | None] = [None] * len(sources)
    for (src_width, tgt_width), members in groups.items():
        copies = max(0, -(-MIN_STEP_ROWS // min(src_width, tgt_width)) - len(members))
        rows = members + members[:1] * copies
        src = torch.full((len(rows), src_width), config.pad_id, dtype=torch.long)
        tgt_in = torch.full((len(rows), tgt_width), config.pad_id, dtype=torch.long)
        for row, index in enumerate(rows):
            src[row, : len(sources[index]) + 1] = torch.tensor(sources[index] + [config.eos_id])
            tgt_in[row, : len(outputs[index]) + 1] = torch.tensor([config.bos_id] + outputs[index])
        group = aligning_attention(model, aligner, alignment, src.to(device), tgt_in.to(device))  # (G, T, S)
        for row, index in enumerate(members):
            attention[index] = group[row, : len(outputs[index]) + 1, : len(sources[index]) + 1]
    return attention


def piece_rows(attention: torch.Tensor, n_pieces: int, shift: bool) -> torch.Tensor:
    """The attention row that links each of `n_pieces` output pieces: (T, S) -> (n_pieces, S).

    Row t of a teacher-forced decoder pass reads <s> + pieces[:t] and predicts piece t (row
    n_pieces predicts </s>). Unshifted, piece t takes row t; shifted, row t + 1: the step that has
    piece t as its input.
    """
    start = 1 if shift else 0
    return attention[start : start + n_pieces]


def null_weights(matrix: torch.Tensor, tgt_spans: list[Span], eos_column: int) -> torch.Tensor:
    """Each target word's weight on the source's EOS: piece-level (T_pieces, S_pieces) -> (T_words,),
    the mean over the word's pieces of column `eos_column` (as merge_to_words averages rows)."""
    return merge_to_words(matrix, tgt_spans, [(eos_column, eos_column + 1)])[:, 0]


def hard_alignment(matrix: torch.Tensor, null: torch.Tensor | None = None) -> list[AlignmentPair]:
    """Argmax per target row of `matrix` (T, S): one (src_index, tgt_index) pair per target row,
    except that with `null` (T,), each row's weight on the source's EOS (null_weights), a row whose
    EOS weight exceeds its best source weight is left unaligned (AlignmentConfig.null).

    Pairs come in target order; ties go to the first (leftmost) source position. An empty matrix
    (no target or no source positions) gives [].
    """
    if matrix.numel() == 0:
        return []
    best_weight, best = matrix.max(dim=1)  # (T,), (T,)
    linked = [True] * matrix.size(0) if null is None else (best_weight >= null).tolist()
    return [(src, tgt) for tgt, (src, keep) in enumerate(zip(best.tolist(), linked)) if keep]


def transpose_pairs(pairs: list[AlignmentPair]) -> list[AlignmentPair]:
    """Swap each (a, b) into (b, a): turns a reverse model's (tgt, src) pairs into (src, tgt)."""
    return [(b, a) for a, b in pairs]


def pharaoh(pairs: list[AlignmentPair]) -> str:
    """Pharaoh format: "src-tgt" pairs separated by spaces, in the given order, e.g. "0-0 1-2"."""
    return " ".join(f"{src}-{tgt}" for src, tgt in pairs)


def parse_pharaoh(line: str) -> list[AlignmentPair]:
    """The (src, tgt) pairs of a Pharaoh line such as "0-0 1-2" (also accepts "0?1" possible links).

    Raises ValueError for a malformed pair.
    """
    pairs = []
    for item in line.split():
        parts = re.split(r"[-?]", item)
        if len(parts) != 2 or not all(part.isascii() and part.isdigit() for part in parts):
            raise ValueError(f"not a Pharaoh alignment pair: {item!r}")
        pairs.append((int(parts[0]), int(parts[1])))
    return pairs
