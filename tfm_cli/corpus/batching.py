"""Batches for training: epochs of token-budget batches of a TokenizedCorpus, and padding.

Nothing here knows about models or optimizers; batches are plain padded tensors.
"""

from __future__ import annotations

import array
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tfm_cli.allocator import return_freed_memory
from tfm_cli.config import derive_seed
from tfm_cli.corpus.tokenized import TokenizedCorpus
from tfm_cli.distributed import World
from tfm_cli.errors import TfmError
from tfm_cli.special_ids import BOS_ID, EOS_ID, PAD_ID

BATCHING_CHUNK = 1 << 20  # sorted lengths turned into Python ints this many at a time (bounded memory)


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
class EpochBatches:
    """The batches of one epoch without a tensor per batch: batch k is
    order[starts[k]:starts[k + 1]], k in training order."""

    order: torch.Tensor  # (M,) int64 corpus rows, batch after batch
    starts: torch.Tensor  # (batches + 1,) int64

    def __len__(self) -> int:
        return self.starts.numel() - 1

    def batch(self, k: int) -> torch.Tensor:
        """(B,) int64 corpus rows of batch k."""
        return self.order[int(self.starts[k]) : int(self.starts[k + 1])]

    def truncated(self, count: int) -> EpochBatches:
        """The first `count` batches."""
        return EpochBatches(self.order[: int(self.starts[count])], self.starts[: count + 1])


def sorted_batches(
    src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, max_tokens: int, generator: torch.Generator | None
) -> EpochBatches:
    """Group sentence indices into batches of similar length within a token budget.

    Each batch satisfies B * max(src len) <= max_tokens and B * max(tgt len) <= max_tokens
    (a sentence longer than the budget gets a batch of its own). With a generator, ties in length
    are broken randomly and the batch order is shuffled; without one, batches follow length order.
    Returns EpochBatches over indices into the length tensors (N,).
    """
    count = src_lengths.numel()
    order = torch.randperm(count, generator=generator) if generator is not None else torch.arange(count)
    # Two stable sorts: by target length, then by source length, so lengths within a batch are close.
    order = order[torch.sort(tgt_lengths[order], stable=True).indices]
    order = order[torch.sort(src_lengths[order], stable=True).indices]
    longest_sorted = torch.maximum(src_lengths[order], tgt_lengths[order])  # (N,)
    starts = array.array("q", [0])
    start = longest = 0
    for base in range(0, count, BATCHING_CHUNK):
        for i, length in enumerate(longest_sorted[base : base + BATCHING_CHUNK].tolist(), start=base):
            longest = max(longest, length)
            if i > start and (i - start + 1) * longest > max_tokens:
                starts.append(i)
                start, longest = i, length
    if count:
        starts.append(count)
    bounds = torch.frombuffer(starts, dtype=torch.int64).clone()  # (batches + 1,)
    if generator is not None:
        # Shuffle the batches: gather each one's rows in the new order.
        permutation = torch.randperm(len(bounds) - 1, generator=generator)
        sizes = (bounds[1:] - bounds[:-1])[permutation]
        new_starts = torch.zeros_like(bounds)
        torch.cumsum(sizes, 0, out=new_starts[1:])
        # Row j of the new order comes from old position bounds[batch] + (j - new_starts[batch]).
        batch_of_row = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
        source = bounds[permutation][batch_of_row] + torch.arange(count) - new_starts[batch_of_row]
        order, bounds = order[source], new_starts
    return EpochBatches(order, bounds)


def batch_indices(
    src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, max_tokens: int, generator: torch.Generator | None
) -> list[torch.Tensor]:
    """sorted_batches as a list of (B,) int64 index tensors, in batch order (for small corpora)."""
    batches = sorted_batches(src_lengths, tgt_lengths, max_tokens, generator)
    return [batches.batch(k) for k in range(len(batches))]


def epoch_rows(parts: list[tuple[int, int, float]], seed: int, epoch: int) -> torch.Tensor | None:
    """The corpus rows epoch `epoch` trains on, given (first row, rows, weight) of each input corpus.

    A weight w takes every row of its corpus floor(w) times plus a random share w - floor(w) of them,
    drawn from (seed, epoch) alone. Returns (M,) int64 rows, or None when every weight is 1 (each row once).
    """
    if all(weight == 1.0 for _, _, weight in parts):
        return None
    generator = torch.Generator().manual_seed(derive_seed(seed, "corpus sampling", epoch))
    pieces = []
    for first, rows, weight in parts:
        whole = math.floor(weight)
        pieces.extend([torch.arange(first, first + rows)] * whole)
        share = round((weight - whole) * rows)
        if share:
            pieces.append(first + torch.randperm(rows, generator=generator)[:share].sort().values)
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


class EpochSampler:
    """The batches of every epoch in training order, a function of (seed, epoch) only, and a rank's share.

    With W ranks an epoch's batch list is cut to a multiple of W (dropping fewer than W batches,
    which the next epoch's shuffle puts elsewhere) so that every rank does the same updates. An
    update takes the next update_freq * W batches; rank r trains on every W-th of them from the r-th.
    Corpora with weights other than 1 (`parts`: first row, rows, weight) are sampled per epoch (epoch_rows).
    Where every epoch has its own segmentation of the corpus (subword_sampling.py), `epoch_lengths`
    gives that epoch's (src, tgt) lengths and the lengths given are not used.
    """

    def __init__(
        self, src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, max_tokens: int, seed: int,
        update_freq: int, world: World, parts: list[tuple[int, int, float]] | None = None,
        epoch_lengths: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        # int32 halves what every rank keeps per pair; lengths are below max_length anyway.
        self.src_lengths, self.tgt_lengths = src_lengths.to(torch.int32), tgt_lengths.to(torch.int32)
        self.epoch_lengths = epoch_lengths
        self.max_tokens, self.seed, self.update_freq, self.world = max_tokens, seed, update_freq, world
        self.parts = parts or [(0, src_lengths.numel(), 1.0)]
        self.cached: tuple[int, EpochBatches] | None = None
        self.epoch0_updates: int | None = None

    def epoch_batches(self, epoch: int) -> EpochBatches:
        """The batches of epoch `epoch`, the same on every rank.

        Raises TfmError (on every rank alike) if there are fewer batches than ranks: a rank would have none.
        """
        if self.cached is None or self.cached[0] != epoch:
            generator = epoch_generator(self.seed, epoch)
            rows = epoch_rows(self.parts, self.seed, epoch)
            src_lengths, tgt_lengths = self.src_lengths, self.tgt_lengths
            if self.epoch_lengths is not None:
                src_lengths, tgt_lengths = (lengths.to(torch.int32) for lengths in self.epoch_lengths(epoch))
            if rows is None:
                batches = sorted_batches(src_lengths, tgt_lengths, self.max_tokens, generator)
            else:
                batches = sorted_batches(src_lengths[rows], tgt_lengths[rows], self.max_tokens, generator)
                batches = EpochBatches(rows[batches.order], batches.starts)
            world_size = self.world.world_size
            if len(batches) < world_size:
                raise TfmError(
                    f"the training data makes {len(batches)} batch(es) (train.max_tokens={self.max_tokens}) "
                    f"but there are {world_size} processes and each needs at least one; lower train.max_tokens "
                    "or use fewer processes"
                )
            self.cached = (epoch, batches.truncated(len(batches) // world_size * world_size))
            return_freed_memory()  # the sorts' temporaries, which glibc would keep for the whole run
        return self.cached[1]

    def position(self, epoch: int, batch_in_epoch: int) -> tuple[int, int]:
        """(epoch, batch_in_epoch) of the next batch: the start of the next epoch for a position past
        the end of `epoch` (a resume with a larger train.max_tokens makes fewer batches)."""
        if batch_in_epoch >= len(self.epoch_batches(epoch)):
            return epoch + 1, 0
        return epoch, batch_in_epoch

    def update(self, epoch: int, batch_in_epoch: int) -> tuple[list[torch.Tensor], int, int]:
        """This rank's batches for the update at (epoch, batch_in_epoch), and the position after it.

        Returns (index tensors, next epoch, next batch_in_epoch); batch_in_epoch counts all ranks'
        batches. A position past the end of the epoch (a resume with a larger train.max_tokens makes
        fewer batches) starts the next epoch.
        """
        epoch, batch_in_epoch = self.position(epoch, batch_in_epoch)
        batches = self.epoch_batches(epoch)
        world = self.world
        end = min(batch_in_epoch + self.update_freq * world.world_size, len(batches))
        group = [batches.batch(k) for k in range(batch_in_epoch + world.rank, end, world.world_size)]
        batch_in_epoch = end
        if batch_in_epoch >= len(batches):
            epoch, batch_in_epoch = epoch + 1, 0
        return group, epoch, batch_in_epoch

    def updates_per_epoch(self) -> int:
        """Optimizer updates in an epoch (that of epoch 0: with fractional corpus weights, later epochs
        sample other pairs and may differ by a few). Counted once: the schedule asks at every update,
        and rebuilding epoch 0 there would evict the current epoch's batches."""
        if self.epoch0_updates is None:
            self.epoch0_updates = -(-len(self.epoch_batches(0)) // (self.update_freq * self.world.world_size))
        return self.epoch0_updates


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that orders epoch `epoch` (0-based): the data order depends on (seed, epoch) only.

    So a resumed run rebuilds the same batches and skips the ones already done, with no generator state saved.
    """
    return torch.Generator().manual_seed(derive_seed(seed, "epoch order", epoch))


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
    # Guided-alignment training only (training/guided_alignment.py): the reference cross-attention
    # (B, T, S) float32 of each decoder row, and how many rows have one.
    alignment: torch.Tensor | None = None
    n_aligned_rows: int = 0

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
        alignment = None if self.alignment is None else self.alignment.to(device, non_blocking=True)
        return Batch(src, tgt_in, tgt_out, target_index, targets, self.indices, self.n_src_tokens, alignment,
                     self.n_aligned_rows)


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


