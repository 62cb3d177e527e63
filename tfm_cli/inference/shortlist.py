"""Lexical shortlists: the target tokens a sentence may produce, so the output layer computes only those.

A shortlist (Marian's and Bergamot's `--shortlist`, CTranslate2's vocabulary map) holds the `frequent`
most common target tokens of a parallel corpus and, for each source token, the `per_source` target
tokens most associated with it there (Dice coefficient over the sentence pairs that contain them). A
sentence may produce those of its own source tokens, the frequent ones and EOS (plus its constraint
tokens, which the caller adds). One batch computes logits for the union of its sentences' tokens only;
each row is then normalised over its own sentence's tokens (decoding.TransformerDecoder), so a sentence
gets the same output whatever else shares its batch. Translations can differ from the full output
layer's: the shortlist is opt-in, and its BLEU is measured (bench/RESULTS.md).

The file is safetensors: `frequent` (F,) int64, `candidates` (source vocabulary, per_source) int64
(-1 where a source token has fewer), and JSON metadata naming both tokenizers by SHA-256, so a
shortlist built for another model is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from tfm_cli.errors import TfmError

FORMAT = "tfm-shortlist/1"
NO_CANDIDATE = -1


@dataclass(frozen=True)
class Shortlist:
    """The frequent target ids and each source id's candidate target ids, for one pair of tokenizers."""

    frequent: torch.Tensor  # (F,) int64 target ids, most frequent first
    candidates: torch.Tensor  # (source vocabulary size, C) int64 target ids, best first, NO_CANDIDATE padded
    tgt_vocab_size: int
    src_tokenizer_sha256: str
    tgt_tokenizer_sha256: str

    @property
    def src_vocab_size(self) -> int:
        return self.candidates.size(0)

    def sentence_ids(self, source: list[int], extra: Iterable[int] = ()) -> torch.Tensor:
        """The sorted unique target ids (K,) int64 a sentence with source ids `source` may produce:
        the frequent ids, its source ids' candidates and `extra` (the caller's EOS, constraint ids)."""
        own = self.candidates[torch.tensor(source, dtype=torch.long)].flatten()
        extra_ids = torch.tensor(list(extra), dtype=torch.long)
        ids = torch.cat([self.frequent, own[own != NO_CANDIDATE], extra_ids])
        return torch.unique(ids)  # sorted


@dataclass(frozen=True)
class ShortlistBatch:
    """One batch's shortlist: the target ids its output layer computes, and which belong to each sentence."""

    target_ids: torch.Tensor  # (K,) int64, sorted, the union of the sentences' ids
    allowed: torch.Tensor  # (N, K) bool: sentence i may produce target_ids[k]


def batch_shortlist(shortlist: Shortlist, sources: list[list[int]], extra: list[list[int]]) -> ShortlistBatch:
    """The ShortlistBatch of N sentences (source ids without EOS) with their extra target ids (N lists)."""
    per_sentence = [shortlist.sentence_ids(source, more) for source, more in zip(sources, extra)]
    target_ids = torch.unique(torch.cat(per_sentence))
    allowed = torch.zeros(len(sources), target_ids.numel(), dtype=torch.bool)
    for i, ids in enumerate(per_sentence):
        allowed[i, torch.searchsorted(target_ids, ids)] = True
    return ShortlistBatch(target_ids=target_ids, allowed=allowed)


def tokenizer_fingerprint(tokenizer: object) -> str:
    """The SHA-256 of a tokenizer's sentencepiece model and its pieces in id order (an imported model's
    vocabulary maps pieces to its own ids): what a shortlist file names its tokenizers by."""
    digest = hashlib.sha256(tokenizer.model_bytes)
    for piece_id in range(tokenizer.vocab_size):
        digest.update(b"\n" + tokenizer.id_to_piece(piece_id).encode("utf-8"))
    return digest.hexdigest()


class CooccurrenceCounts:
    """Sentence-level counts of a parallel corpus: each source id, each target id, each (source, target) pair
    of ids that occur in one sentence pair, counted once per pair; and target token frequencies."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int) -> None:
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.src_sentences = torch.zeros(src_vocab_size, dtype=torch.long)
        self.tgt_sentences = torch.zeros(tgt_vocab_size, dtype=torch.long)
        self.tgt_tokens = torch.zeros(tgt_vocab_size, dtype=torch.long)
        self.pair_keys = torch.zeros(0, dtype=torch.long)  # source id * tgt_vocab_size + target id, sorted
        self.pair_counts = torch.zeros(0, dtype=torch.long)
        self.pairs = 0

    def add(self, pairs: list[tuple[list[int], list[int]]]) -> None:
        """Count a chunk of sentence pairs (source ids, target ids)."""
        src_sets = [torch.unique(torch.tensor(src, dtype=torch.long)) for src, _ in pairs]
        tgt_sets = [torch.unique(torch.tensor(tgt, dtype=torch.long)) for _, tgt in pairs]
        every_target = torch.tensor([token for _, tgt in pairs for token in tgt], dtype=torch.long)
        self.tgt_tokens += torch.bincount(every_target, minlength=self.tgt_vocab_size)
        src_flat, tgt_flat = torch.cat(src_sets), torch.cat(tgt_sets)
        self.src_sentences += torch.bincount(src_flat, minlength=self.src_vocab_size)
        self.tgt_sentences += torch.bincount(tgt_flat, minlength=self.tgt_vocab_size)
        self.pairs += len(pairs)
        # Every (source id, target id) of each pair: pair p contributes len_s[p] * len_t[p] keys.
        len_s = torch.tensor([ids.numel() for ids in src_sets])
        len_t = torch.tensor([ids.numel() for ids in tgt_sets])
        src_start = torch.cumsum(len_s, 0) - len_s
        tgt_start = torch.cumsum(len_t, 0) - len_t
        products = len_s * len_t
        pair_of = torch.repeat_interleave(torch.arange(len(pairs)), products)  # (P,) the pair of each key
        position = torch.arange(pair_of.numel()) - (torch.cumsum(products, 0) - products)[pair_of]
        src_ids = src_flat[src_start[pair_of] + position // len_t[pair_of]]
        tgt_ids = tgt_flat[tgt_start[pair_of] + position % len_t[pair_of]]
        keys, counts = torch.unique(src_ids * self.tgt_vocab_size + tgt_ids, return_counts=True)
        merged_keys, inverse = torch.unique(torch.cat([self.pair_keys, keys]), return_inverse=True)
        merged_counts = torch.zeros(merged_keys.numel(), dtype=torch.long)
        merged_counts.index_add_(0, inverse, torch.cat([self.pair_counts, counts]))
        self.pair_keys, self.pair_counts = merged_keys, merged_counts

    def shortlist(self, frequent: int, per_source: int, src_sha256: str, tgt_sha256: str) -> Shortlist:
        """The Shortlist of these counts: the `frequent` most frequent target tokens, and per source id its
        `per_source` target ids of highest Dice coefficient 2 c(s, t) / (c(s) + c(t)) (ties: the more
        frequent pair, then the lower id)."""
        src_ids = self.pair_keys // self.tgt_vocab_size
        tgt_ids = self.pair_keys % self.tgt_vocab_size
        dice = 2 * self.pair_counts.double() / (self.src_sentences[src_ids] + self.tgt_sentences[tgt_ids]).double()
        # Best first within each source id: sort by the tie-breakers first, then stably by the keys above them.
        order = torch.argsort(tgt_ids, stable=True)
        order = order[torch.argsort(-self.pair_counts[order], stable=True)]
        order = order[torch.argsort(-dice[order], stable=True)]
        order = order[torch.argsort(src_ids[order], stable=True)]
        sorted_src = src_ids[order]
        group_start = torch.searchsorted(sorted_src, sorted_src)  # first index of each entry's source id
        rank = torch.arange(order.numel()) - group_start
        keep = rank < per_source
        candidates = torch.full((self.src_vocab_size, per_source), NO_CANDIDATE, dtype=torch.long)
        candidates[sorted_src[keep], rank[keep]] = tgt_ids[order][keep]
        by_frequency = torch.argsort(-self.tgt_tokens, stable=True)
        present = by_frequency[self.tgt_tokens[by_frequency] > 0]
        return Shortlist(
            frequent=present[:frequent].clone(), candidates=candidates, tgt_vocab_size=self.tgt_vocab_size,
            src_tokenizer_sha256=src_sha256, tgt_tokenizer_sha256=tgt_sha256,
        )


def count_corpus(
    chunks: Iterable[list[tuple[list[int], list[int]]]], src_vocab_size: int, tgt_vocab_size: int,
    on_chunk: Callable[[int], None] | None = None,
) -> CooccurrenceCounts:
    """CooccurrenceCounts of chunks of (source ids, target ids) pairs; on_chunk(pairs so far) after each."""
    counts = CooccurrenceCounts(src_vocab_size, tgt_vocab_size)
    for chunk in chunks:
        if chunk:
            counts.add(chunk)
        if on_chunk is not None:
            on_chunk(counts.pairs)
    return counts


def save_shortlist(path: str | Path, shortlist: Shortlist, provenance: dict[str, str]) -> None:
    """Write `shortlist` as safetensors (atomically: a temp file renamed); `provenance` (strings) goes
    into the metadata beside the format and tokenizer hashes."""
    from safetensors.torch import save

    from tfm_cli.textio.atomic_files import atomic_write_bytes

    metadata = {
        "format": FORMAT,
        "tgt_vocab_size": str(shortlist.tgt_vocab_size),
        "src_tokenizer_sha256": shortlist.src_tokenizer_sha256,  # tokenizer_fingerprint
        "tgt_tokenizer_sha256": shortlist.tgt_tokenizer_sha256,
        "provenance": json.dumps(provenance, sort_keys=True),
    }
    tensors = {"frequent": shortlist.frequent.contiguous(), "candidates": shortlist.candidates.contiguous()}
    atomic_write_bytes(Path(path), save(tensors, metadata=metadata))


def load_shortlist(path: str | Path) -> Shortlist:
    """Read a shortlist file; TfmError naming the file if it is not one (or is damaged)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from tfm_cli.checkpoints.format import read_header
    from tfm_cli.textio.paths import check_input_file

    path = check_input_file(path, "shortlist")
    what = f"{path} is not a tfm shortlist (make one with `tfm shortlist`)"
    try:
        metadata = read_header(path).get("__metadata__") or {}
        tensors = load_file(str(path)) if metadata.get("format") == FORMAT else {}
    except TfmError:
        raise TfmError(what) from None
    except (SafetensorError, OSError, ValueError):
        raise TfmError(f"{path}: a damaged shortlist file; build it again with `tfm shortlist`") from None
    if metadata.get("format") != FORMAT or set(tensors) != {"frequent", "candidates"}:
        raise TfmError(what)
    frequent, candidates = tensors["frequent"], tensors["candidates"]
    try:
        tgt_vocab_size = int(metadata["tgt_vocab_size"])
        src_sha256, tgt_sha256 = metadata["src_tokenizer_sha256"], metadata["tgt_tokenizer_sha256"]
    except (KeyError, ValueError):
        raise TfmError(what) from None
    valid = (
        frequent.dtype == torch.long and candidates.dtype == torch.long and frequent.dim() == 1 and candidates.dim() == 2
        and bool(((frequent >= 0) & (frequent < tgt_vocab_size)).all())
        and bool(((candidates >= NO_CANDIDATE) & (candidates < tgt_vocab_size)).all())
    )
    if not valid:
        raise TfmError(f"{path}: its token ids are damaged (outside the target vocabulary); build it again with `tfm shortlist`")
    return Shortlist(frequent, candidates, tgt_vocab_size, src_sha256, tgt_sha256)


def check_shortlist_fits(shortlist: Shortlist, path: str, src_tokenizer: object, tgt_tokenizer: object, model: str) -> None:
    """Raise TfmError unless `shortlist` (read from `path`) was built with these tokenizers (`model`'s)."""
    if (shortlist.src_tokenizer_sha256, shortlist.tgt_tokenizer_sha256) != (
        tokenizer_fingerprint(src_tokenizer), tokenizer_fingerprint(tgt_tokenizer)
    ) or (shortlist.src_vocab_size, shortlist.tgt_vocab_size) != (src_tokenizer.vocab_size, tgt_tokenizer.vocab_size):
        raise TfmError(
            f"{path} was built for other tokenizers than {model}'s; build one for this model: "
            f"tfm shortlist -m {model} --src CORPUS.src --tgt CORPUS.tgt -o shortlist.safetensors"
        )
