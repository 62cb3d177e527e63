"""Parallel text for training: reading with clear errors, filtering, a tokenized cache, token-budget batches.

Sources are stored as `ids + [eos]`, targets as `ids + [eos]` (the decoder input is `[bos] + ids`).
Nothing here knows about models or optimizers; batches are plain padded tensors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID
from tfm_cli.textio import atomic_write_bytes, check_input_file, make_folder
from tfm_cli.tokenizer import Tokenizer

CACHE_VERSION = 1


@dataclass(frozen=True)
class SpecialIds:
    """The ids a corpus ends its sentences with (eos), and batches start decoder input with (bos) and pad
    with (pad): the model config's own (tfm's fixed ones by default; an --init'd run uses its checkpoint's)."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    @classmethod
    def of(cls, config) -> SpecialIds:
        """The special ids of a model config (anything with pad_id, bos_id and eos_id attributes)."""
        return cls(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)


@dataclass(frozen=True)
class TextFile:
    """The lines of one UTF-8 text file (line endings removed) and the SHA-256 of its bytes."""

    path: Path
    lines: list[str]
    sha256: str


@dataclass(frozen=True)
class ParallelText:
    """Source and target lines of equal count."""

    src: TextFile
    tgt: TextFile


def read_text_file(path: str | Path, what: str) -> TextFile:
    """Read a whole UTF-8 text file. Raises TfmError with file:line for invalid UTF-8.

    LF and CRLF endings are both removed; a missing final newline is fine.
    """
    path = check_input_file(path, what)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1)
        raise TfmError(
            f"{path}:{line}: invalid UTF-8 at byte {column} of the line; convert the file to UTF-8"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    return TextFile(path=path, lines=lines, sha256=hashlib.sha256(data).hexdigest())


def read_parallel(src_path: str | Path, tgt_path: str | Path, what: str) -> ParallelText:
    """Read a source and a target file; raises TfmError naming both files if their line counts differ."""
    src = read_text_file(src_path, f"{what} source")
    tgt = read_text_file(tgt_path, f"{what} target")
    if len(src.lines) != len(tgt.lines):
        raise TfmError(
            f"{what} data: {src.path} has {len(src.lines)} lines but {tgt.path} has {len(tgt.lines)}; "
            "parallel files need one sentence per line on both sides"
        )
    return ParallelText(src, tgt)


@dataclass(frozen=True)
class FilterStats:
    """What filtering kept and skipped."""

    read: int
    kept: int
    empty: int  # pairs with an empty (or whitespace-only) side
    too_long: int  # pairs with more than max_length tokens on a side, EOS included

    def to_dict(self) -> dict[str, int]:
        """The counts as a JSON-ready dict."""
        return {"read": self.read, "kept": self.kept, "empty": self.empty, "too_long": self.too_long}


@dataclass
class TokenizedCorpus:
    """Kept sentence pairs as flat token tensors with offsets (cheap to cache, slice and batch)."""

    src_tokens: torch.Tensor  # (total source tokens,) int32, each sentence ending in EOS
    src_offsets: torch.Tensor  # (N + 1,) int64: sentence i is src_tokens[off[i]:off[i+1]]
    tgt_tokens: torch.Tensor  # (total target tokens,) int32, each sentence ending in EOS
    tgt_offsets: torch.Tensor  # (N + 1,) int64
    line_numbers: torch.Tensor  # (N,) int64, the 0-based input line of each kept pair
    stats: FilterStats

    def __len__(self) -> int:
        return self.line_numbers.numel()

    @property
    def src_lengths(self) -> torch.Tensor:
        """(N,) int64 source lengths, EOS included."""
        return self.src_offsets[1:] - self.src_offsets[:-1]

    @property
    def tgt_lengths(self) -> torch.Tensor:
        """(N,) int64 target lengths, EOS included (= decoder input length with BOS)."""
        return self.tgt_offsets[1:] - self.tgt_offsets[:-1]


def flatten(sequences: list[list[int]], eos_id: int = EOS_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (flat (total,) int32 with `eos_id` after each, offsets (N + 1,) int64)."""
    lengths = torch.tensor([len(s) + 1 for s in sequences], dtype=torch.int64)
    offsets = torch.zeros(len(sequences) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = [token for sequence in sequences for token in (*sequence, eos_id)]
    return torch.tensor(flat, dtype=torch.int32), offsets


def tokenize_parallel(
    text: ParallelText, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, max_length: int, eos_id: int = EOS_ID
) -> TokenizedCorpus:
    """Encode every pair (each side + `eos_id`), skipping (and counting) empty pairs and pairs over
    `max_length` tokens with EOS. Returns the kept pairs as a TokenizedCorpus."""
    candidates = [i for i, (s, t) in enumerate(zip(text.src.lines, text.tgt.lines)) if s.strip() and t.strip()]
    src_ids = src_tokenizer.encode_ids_batch([text.src.lines[i] for i in candidates])
    tgt_ids = tgt_tokenizer.encode_ids_batch([text.tgt.lines[i] for i in candidates])
    kept = [k for k in range(len(candidates)) if len(src_ids[k]) < max_length and len(tgt_ids[k]) < max_length]
    src_tokens, src_offsets = flatten([src_ids[k] for k in kept], eos_id)
    tgt_tokens, tgt_offsets = flatten([tgt_ids[k] for k in kept], eos_id)
    stats = FilterStats(
        read=len(text.src.lines),
        kept=len(kept),
        empty=len(text.src.lines) - len(candidates),
        too_long=len(candidates) - len(kept),
    )
    line_numbers = torch.tensor([candidates[k] for k in kept], dtype=torch.int64)
    return TokenizedCorpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets, line_numbers, stats)


def cache_key(text: ParallelText, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, max_length: int) -> str:
    """A hex digest of everything the tokenized corpus depends on: file bytes, tokenizer bytes (and the
    piece table that numbers an imported model's pieces), max_length."""
    parts = [
        f"v{CACHE_VERSION}",
        text.src.sha256,
        text.tgt.sha256,
        hashlib.sha256(src_tokenizer.model_bytes).hexdigest(),
        hashlib.sha256(tgt_tokenizer.model_bytes).hexdigest(),
        str(max_length),
    ]
    for tokenizer in (src_tokenizer, tgt_tokenizer):
        if tokenizer.vocabulary is not None:
            parts.append(hashlib.sha256(json.dumps(list(tokenizer.vocabulary)).encode()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def load_or_tokenize(
    text: ParallelText, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, max_length: int, cache_dir: Path, name: str,
    eos_id: int = EOS_ID,
) -> tuple[TokenizedCorpus, bool]:
    """The tokenized corpus from `cache_dir` if an entry with the same key exists, else tokenize and store it.

    Returns (corpus, True if it came from the cache). A damaged cache file is ignored and rewritten.
    The key leaves `eos_id` out: it is the tokenizer's own EOS, which the tokenizer bytes already fix.
    """
    key = cache_key(text, src_tokenizer, tgt_tokenizer, max_length)
    path = cache_dir / f"{name}-{key[:20]}.safetensors"
    if path.is_file():
        corpus = read_cached(path, key, src_tokenizer.vocab_size, tgt_tokenizer.vocab_size)
        if corpus is not None:
            return corpus, True
    corpus = tokenize_parallel(text, src_tokenizer, tgt_tokenizer, max_length, eos_id)
    make_folder(cache_dir, "cache folder")
    tensors = {
        "src_tokens": corpus.src_tokens,
        "src_offsets": corpus.src_offsets,
        "tgt_tokens": corpus.tgt_tokens,
        "tgt_offsets": corpus.tgt_offsets,
        "line_numbers": corpus.line_numbers,
    }
    metadata = {"key": key, "stats": json.dumps(corpus.stats.to_dict())}
    atomic_write_bytes(path, save(tensors, metadata=metadata))
    return corpus, False


def read_cached(path: Path, key: str, src_vocab_size: int, tgt_vocab_size: int) -> TokenizedCorpus | None:
    """A cached corpus, or None if the file is unreadable, inconsistent, or was written for another key."""
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            metadata = json.loads(f.read(header_size)).get("__metadata__", {})
        if metadata.get("key") != key:
            return None
        stats = FilterStats(**json.loads(metadata["stats"]))
        corpus = TokenizedCorpus(
            tensors["src_tokens"], tensors["src_offsets"], tensors["tgt_tokens"], tensors["tgt_offsets"],
            tensors["line_numbers"], stats,
        )
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if corpus.line_numbers.dim() != 1:
        return None
    sides = ((corpus.src_tokens, corpus.src_offsets, src_vocab_size), (corpus.tgt_tokens, corpus.tgt_offsets, tgt_vocab_size))
    return corpus if all(consistent_side(*side, len(corpus.line_numbers)) for side in sides) else None


def consistent_side(tokens: torch.Tensor, offsets: torch.Tensor, vocab_size: int, pairs: int) -> bool:
    """Whether one side of a cached corpus is well formed: `pairs` + 1 non-decreasing integer offsets
    from 0 to len(tokens), and token ids in [0, vocab_size)."""
    if tokens.dim() != 1 or offsets.dim() != 1 or tokens.is_floating_point() or offsets.is_floating_point():
        return False
    if len(offsets) != pairs + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != len(tokens):
        return False
    if bool((offsets[1:] < offsets[:-1]).any()):
        return False
    return len(tokens) == 0 or (int(tokens.min()) >= 0 and int(tokens.max()) < vocab_size)


def batch_indices(
    src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, max_tokens: int, generator: torch.Generator | None
) -> list[torch.Tensor]:
    """Group sentence indices into batches of similar length within a token budget.

    Each batch satisfies B * max(src len) <= max_tokens and B * max(tgt len) <= max_tokens
    (a sentence longer than the budget gets a batch of its own). With a generator, ties in length
    are broken randomly and the batch order is shuffled; without one, batches follow length order.
    Returns a list of (B,) int64 index tensors.
    """
    count = src_lengths.numel()
    order = torch.randperm(count, generator=generator) if generator is not None else torch.arange(count)
    # Two stable sorts: by target length, then by source length, so lengths within a batch are close.
    order = order[torch.sort(tgt_lengths[order], stable=True).indices]
    order = order[torch.sort(src_lengths[order], stable=True).indices]
    src_sorted = src_lengths[order].tolist()
    tgt_sorted = tgt_lengths[order].tolist()
    batches, start, longest_src, longest_tgt = [], 0, 0, 0
    for i, (s, t) in enumerate(zip(src_sorted, tgt_sorted)):
        new_src, new_tgt = max(longest_src, s), max(longest_tgt, t)
        if i > start and (i - start + 1) * max(new_src, new_tgt) > max_tokens:
            batches.append(order[start:i])
            start, new_src, new_tgt = i, s, t
        longest_src, longest_tgt = new_src, new_tgt
    if start < count:
        batches.append(order[start:])
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


class EpochSampler:
    """The batches of every epoch in training order, a function of (seed, epoch) only, and a rank's share.

    With W ranks an epoch's batch list is cut to a multiple of W (dropping fewer than W batches,
    which the next epoch's shuffle puts elsewhere) so that every rank does the same updates. An
    update takes the next update_freq * W batches; rank r trains on every W-th of them from the r-th.
    """

    def __init__(
        self, src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, max_tokens: int, seed: int,
        update_freq: int, world: World,
    ) -> None:
        self.src_lengths, self.tgt_lengths = src_lengths, tgt_lengths
        self.max_tokens, self.seed, self.update_freq, self.world = max_tokens, seed, update_freq, world
        self.cached: tuple[int, list[torch.Tensor]] | None = None

    def epoch_batches(self, epoch: int) -> list[torch.Tensor]:
        """The batches (index tensors) of epoch `epoch`, the same list on every rank.

        Raises TfmError (on every rank alike) if there are fewer batches than ranks: a rank would have none.
        """
        if self.cached is None or self.cached[0] != epoch:
            generator = epoch_generator(self.seed, epoch)
            batches = batch_indices(self.src_lengths, self.tgt_lengths, self.max_tokens, generator)
            world_size = self.world.world_size
            if len(batches) < world_size:
                raise TfmError(
                    f"the training data makes {len(batches)} batch(es) (train.max_tokens={self.max_tokens}) "
                    f"but there are {world_size} processes and each needs at least one; lower train.max_tokens "
                    "or use fewer processes"
                )
            self.cached = (epoch, batches[: len(batches) // world_size * world_size])
        return self.cached[1]

    def update(self, epoch: int, batch_in_epoch: int) -> tuple[list[torch.Tensor], int, int]:
        """This rank's batches for the update at (epoch, batch_in_epoch), and the position after it.

        Returns (index tensors, next epoch, next batch_in_epoch); batch_in_epoch counts all ranks'
        batches. A position past the end of the epoch (a resume with a larger train.max_tokens makes
        fewer batches) starts the next epoch.
        """
        batches = self.epoch_batches(epoch)
        if batch_in_epoch >= len(batches):
            epoch, batch_in_epoch = epoch + 1, 0
            batches = self.epoch_batches(epoch)
        world = self.world
        group = batches[batch_in_epoch : batch_in_epoch + self.update_freq * world.world_size]
        batch_in_epoch += len(group)
        if batch_in_epoch >= len(batches):
            epoch, batch_in_epoch = epoch + 1, 0
        return group[world.rank :: world.world_size], epoch, batch_in_epoch

    def updates_per_epoch(self) -> int:
        """Optimizer updates in one epoch: the sorted batch boundaries, so the count, are the same every epoch."""
        return -(-len(self.epoch_batches(0)) // (self.update_freq * self.world.world_size))


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that orders epoch `epoch` (0-based): the data order depends on (seed, epoch) only.

    So a resumed run rebuilds the same batches and skips the ones already done, with no generator state saved.
    """
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


@dataclass
class Batch:
    """One padded batch, with the non-pad target positions precomputed on the host."""

    src: torch.Tensor  # (B, S) int64, each row `ids + [eos]` then padding
    tgt_in: torch.Tensor  # (B, T) int64, `[bos] + ids` then padding
    tgt_out: torch.Tensor  # (B, T) int64, `ids + [eos]` then padding
    target_index: torch.Tensor  # (N,) int64 flat positions in (B * T) where tgt_out is not padding
    targets: torch.Tensor  # (N,) int64 = tgt_out.view(-1)[target_index]
    indices: torch.Tensor  # (B,) int64 corpus rows of this batch
    n_src_tokens: int  # real source tokens, EOS included (counted on the host: no device sync to log it)

    @property
    def n_tgt_tokens(self) -> int:
        """Real target tokens (the positions the loss counts)."""
        return self.targets.numel()

    @property
    def n_padded_tokens(self) -> int:
        """Source plus target positions, padding included."""
        return self.src.numel() + self.tgt_out.numel()

    def to(self, device: torch.device) -> Batch:
        """The same batch on `device` (non-blocking copies from the host)."""
        src, tgt_in, tgt_out, target_index, targets = (
            t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out, self.target_index, self.targets)
        )
        return Batch(src, tgt_in, tgt_out, target_index, targets, self.indices, self.n_src_tokens)


def pad_rows(tokens: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor, pad_id: int = PAD_ID) -> torch.Tensor:
    """Sentences `rows` (B,) of a flat token tensor, right-padded with `pad_id`: (B, longest) int64."""
    starts, lengths = offsets[rows], offsets[rows + 1] - offsets[rows]  # (B,), (B,)
    steps = torch.arange(int(lengths.max()))  # (L,)
    real = steps[None, :] < lengths[:, None]  # (B, L)
    positions = (starts[:, None] + steps[None, :]).clamp(max=tokens.numel() - 1)  # (B, L)
    return tokens[positions].long().masked_fill(~real, pad_id)


def collate(corpus: TokenizedCorpus, indices: torch.Tensor, ids: SpecialIds = SpecialIds()) -> Batch:
    """Pad the sentence pairs `indices` (B,) of `corpus` into a Batch, with the special ids `ids`."""
    src = pad_rows(corpus.src_tokens, corpus.src_offsets, indices, ids.pad_id)  # (B, S)
    tgt_out = pad_rows(corpus.tgt_tokens, corpus.tgt_offsets, indices, ids.pad_id)  # (B, T)
    # Decoder input: BOS then the target without its EOS (EOS becomes padding where it ended the row).
    tgt_in = torch.cat([torch.full((indices.numel(), 1), ids.bos_id, dtype=torch.long), tgt_out[:, :-1]], dim=1)
    tgt_in = tgt_in.masked_fill(tgt_in == ids.eos_id, ids.pad_id)
    flat = tgt_out.view(-1)  # (B * T,)
    target_index = (flat != ids.pad_id).nonzero().squeeze(1)
    n_src_tokens = int(corpus.src_offsets[indices + 1].sum() - corpus.src_offsets[indices].sum())
    return Batch(src, tgt_in, tgt_out, target_index, flat[target_index], indices, n_src_tokens)


def count_tokens(corpus: TokenizedCorpus) -> tuple[int, int]:
    """(source tokens, target tokens) of the whole corpus, EOS included."""
    return int(corpus.src_offsets[-1]), int(corpus.tgt_offsets[-1])
