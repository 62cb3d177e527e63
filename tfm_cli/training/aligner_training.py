"""Training a word aligner (model/aligner.py) for a frozen translation model, toward given word links
(a statistical aligner's, e.g. eflomal's grow-diag-final-and) of the very pairs it will align.

The model runs once over the pairs, teacher-forced, and what the aligner reads (every decoder layer's
output and the encoder's output) is kept in memory as float16; the aligner then trains for several
epochs on those states alone, which costs a fraction of a model pass per epoch. Its target is guided
alignment's reference attention (training/guided_alignment.py) with shifted rows and a NULL word, so
the aligner is read like a shifted, null-aware head. Never prints: progress goes through callbacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from collections import Counter
from itertools import groupby

import torch

from tfm_cli.checkpoints.format import LoadedModel
from tfm_cli.config import TARGET_CONTEXT_HEADS, AlignmentConfig, check_seed
from tfm_cli.corpus.batching import SpecialIds
from tfm_cli.errors import TfmError
from tfm_cli.inference.alignment import AlignmentPair
from tfm_cli.inference.decoding import source_batch
from tfm_cli.inference.translation import BatchingConfig
from tfm_cli.inference.word_alignment import WordAligner, WordPair
from tfm_cli.model.aligner import Aligner
from tfm_cli.training.guided_alignment import PieceTable, real_tokens, reference_attention, word_index
from tfm_cli.training.lr_schedules import OneCycle, ScheduleSettings

STATE_DTYPE = torch.float16  # kept states: half the memory of float32, far inside its range
MAX_WIDTH = 1 << 16  # --hidden and --dim: far above a useful aligner, below widths torch fails to allocate
MAX_HELD_OUT_PAIRS = 2000  # enough for a loss to within ~1%; more only costs preparation time


@dataclass(frozen=True)
class AlignerTrainingConfig:
    """How `tfm train-aligner` trains: epochs over the pairs, pairs per batch, the aligner's sizes and
    whether it has a self-attention layer over the target (model/aligner.TargetContext), Adam's peak
    learning rate of a one-cycle schedule (10% warm-up, cosine down), the share of the pairs held out to
    measure the loss on (at most MAX_HELD_OUT_PAIRS; 0: none), and the epochs without a better held-out
    loss after which training stops (the best epoch's aligner is kept)."""

    epochs: int = 12
    batch_size: int = 64
    hidden: int = 512
    dim: int = 256
    context: bool = True
    lr: float = 1e-3
    seed: int = 1
    held_out: float = 0.02
    patience: int = 2

    def check(self) -> None:
        """Raise TfmError for a setting out of range, naming its option."""
        for name in ("epochs", "batch_size", "hidden", "dim", "patience"):
            if getattr(self, name) < 1:
                raise TfmError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("hidden", "dim"):
            if getattr(self, name) > MAX_WIDTH:
                raise TfmError(f"--{name} must be at most {MAX_WIDTH:,}, got {getattr(self, name):,}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise TfmError(f"--lr must be a positive number, got {self.lr}")
        if not (0 <= self.held_out <= 0.5):
            raise TfmError(f"--held-out is the share of the pairs to hold out, from 0 to 0.5, got {self.held_out}")
        check_seed(self.seed, "--seed")
        if self.context and self.dim % TARGET_CONTEXT_HEADS:
            raise TfmError(f"--dim must be divisible by {TARGET_CONTEXT_HEADS} for the target context, got {self.dim} (or --no-context)")


@dataclass
class AlignerBatch:
    """The frozen model's states for a batch of pairs, and the attention each decoder row should have."""

    states: torch.Tensor  # (B, T, L * D) STATE_DTYPE: every decoder layer's output, concatenated
    memory: torch.Tensor  # (B, S, D) STATE_DTYPE: the encoder's output
    src_mask: torch.Tensor  # (B, S) bool, True at real source tokens
    tgt_mask: torch.Tensor  # (B, T) bool, True at real target positions (BOS and pieces)
    reference: torch.Tensor  # (B, T, S) float32, rows summing to 1 where supervised, 0 elsewhere
    repeat: int = 1  # times an epoch this batch is trained (its pairs were given that many times)


@dataclass
class PreparedPairs:
    """Batches ready to train on, and what was left out (counts of input pairs)."""

    batches: list[AlignerBatch] = field(default_factory=list)
    used: int = 0
    empty: int = 0  # a side without words
    too_long: int = 0  # a side longer than the model's positions
    resplit: int = 0  # the tokenizer made other words than the whitespace split (no links can be placed)
    bytes: int = 0  # memory the batches take


@torch.no_grad()
def prepare_batches(
    loaded: LoadedModel, pairs: list[WordPair], links: list[list[AlignmentPair]], batch_size: int,
    on_pairs: Callable[[int], None] | None = None, max_bytes: int | None = None,
) -> PreparedPairs:
    """Run the frozen model over `pairs` (words of each side) and build the batches the aligner trains on,
    with `links[i]` (source word, target word) the reference of pair i. A pair given k times (same words,
    same links) is kept once, in batches of pairs given as often, and those batches are trained k times
    an epoch (AlignerBatch.repeat): a weight without duplicates inside a batch. Within that, pairs are
    sorted by length so a batch pads little. `on_pairs(n)` is called as n input pairs are done. Raises
    TfmError as soon as the kept batches take more than `max_bytes` (None: no limit).
    """
    model, config = loaded.model, loaded.config
    special = SpecialIds.of(config)
    src_table, tgt_table = PieceTable.of(loaded.src_tokenizer), PieceTable.of(loaded.tgt_tokenizer)
    encoder = WordAligner(loaded, AlignmentConfig(), BatchingConfig())
    device = next(model.parameters()).device
    prepared = PreparedPairs()
    counts: dict[tuple, int] = {}  # (source words, target words, links) -> times given
    first_index: dict[tuple, int] = {}
    for index, (src_words, tgt_words) in enumerate(pairs):
        if not src_words or not tgt_words:
            prepared.empty += 1
            continue
        key = (tuple(src_words), tuple(tgt_words), tuple(links[index]))
        counts[key] = counts.get(key, 0) + 1
        first_index.setdefault(key, index)
    times = {first_index[key]: count for key, count in counts.items()}
    usable = sorted(times, key=lambda i: (times[i], len(pairs[i][0]) + len(pairs[i][1]), i))
    batches = []  # (pair indices, times given): no batch mixes pairs given a different number of times
    for count, same_count in groupby(usable, key=times.get):  # usable is sorted by count first
        group = list(same_count)
        batches += [(group[start : start + batch_size], count) for start in range(0, len(group), batch_size)]
    for rows, repeat in batches:
        encoded = encoder.encode([pairs[i] for i in rows])
        kept = []
        for i, (src_ids, _, tgt_ids, _) in zip(rows, encoded):
            if max(len(src_ids), len(tgt_ids)) > encoder.max_ids:
                prepared.too_long += repeat
            else:
                kept.append((i, src_ids, tgt_ids))
        if kept:
            batch = model_states(loaded, kept, special, device)
            src, tgt_out = batch.pop("src"), batch.pop("tgt_out")
            words = word_index(src, real_tokens(src, special), src_table).amax(dim=1) + 1  # (B,)
            tgt_words = word_index(tgt_out, real_tokens(tgt_out, special), tgt_table).amax(dim=1) + 1
            same = [(int(words[k]), int(tgt_words[k])) == (len(pairs[i][0]), len(pairs[i][1])) for k, (i, _, _) in enumerate(kept)]
            prepared.resplit += same.count(False) * repeat
            row_links = [torch.tensor(links[i], dtype=torch.int64).view(-1, 2) if ok else torch.zeros(0, 2, dtype=torch.int64)
                         for (i, _, _), ok in zip(kept, same)]
            reference, _ = reference_attention(src, tgt_out, row_links, src_table, tgt_table, special, shift=True, null=True)
            reference[~torch.tensor(same)] = 0.0  # a resplit pair's words are not its links' words
            prepared.batches.append(AlignerBatch(reference=reference, repeat=repeat, **batch))
            prepared.used += same.count(True) * repeat
            prepared.bytes += sum(t.numel() * t.element_size() for t in (reference, *batch.values()))
            if max_bytes is not None and prepared.bytes > max_bytes:
                raise TfmError(
                    f"the model's states for {len(prepared.batches):,} of {len(batches):,} batches "
                    f"already take {prepared.bytes / 2**30:.1f} GiB (--max-memory {max_bytes / 2**30:g}); train the "
                    "aligner on fewer pairs (those you align, plus a sample of the rest) or raise --max-memory"
                )
        if on_pairs is not None:
            on_pairs(len(rows) * repeat)
    return prepared


def model_states(
    loaded: LoadedModel, kept: list[tuple[int, list[int], list[int]]], special: SpecialIds, device: torch.device
) -> dict[str, torch.Tensor]:
    """One teacher-forced pass over `kept` (index, source ids, target ids): the aligner's inputs on the
    CPU (states, memory, src_mask, tgt_mask) and the batch's src (B, S) and tgt_out (B, T) ids."""
    model, config = loaded.model, loaded.config
    src = source_batch([src_ids for _, src_ids, _ in kept], config, "cpu")  # (B, S): ids + EOS, padded
    width = max(len(tgt_ids) for _, _, tgt_ids in kept) + 1
    tgt_in = torch.full((len(kept), width), special.pad_id, dtype=torch.long)  # (B, T): BOS + ids
    tgt_out = torch.full((len(kept), width), special.pad_id, dtype=torch.long)  # (B, T): ids + EOS
    for row, (_, _, tgt_ids) in enumerate(kept):
        tgt_in[row, : len(tgt_ids) + 1] = torch.tensor([special.bos_id] + tgt_ids)
        tgt_out[row, : len(tgt_ids) + 1] = torch.tensor(tgt_ids + [special.eos_id])
    encoded = model.encode(src.to(device))
    decoded = model.decode(tgt_in.to(device), encoded, keep_states=True)
    return {
        "states": torch.cat(decoded.layer_states, dim=-1).to("cpu", STATE_DTYPE),
        "memory": encoded.memory.to("cpu", STATE_DTYPE),
        "src_mask": encoded.src_mask.cpu(),
        "tgt_mask": tgt_in != special.pad_id,
        "src": src,
        "tgt_out": tgt_out,
    }


def aligner_loss(aligner: Aligner, batch: AlignerBatch) -> tuple[torch.Tensor, int]:
    """(cross-entropy of the aligner's attention against the batch's reference, summed over rows; rows
    with a reference), computed on the aligner's device. The log-probability of a masked (padding)
    position is never multiplied in."""
    device = next(aligner.parameters()).device
    log_probs = aligner(batch.states.to(device).float(), batch.memory.to(device).float(), batch.src_mask.to(device),
                        batch.tgt_mask.to(device))  # (B, T, S)
    reference = batch.reference.to(device)
    supervised = reference > 0
    loss = -(reference[supervised] * log_probs[supervised]).sum()
    return loss, supervised_rows(batch)


def supervised_rows(batch: AlignerBatch) -> int:
    """The number of decoder rows of `batch` that have a reference (the rest are padding or unlinked)."""
    return int((batch.reference.sum(dim=-1) > 0).sum())


def held_out_split(
    pairs: list[WordPair], links: list[list[AlignmentPair]], share: float, seed: int
) -> tuple[list[int], list[int]]:
    """(indices of the pairs to train on, indices of the pairs held out), each in input order.

    The held-out pairs are round(share x the pairs given once), at most MAX_HELD_OUT_PAIRS, drawn (seeded)
    from the pairs given exactly once with words on both sides and at least one link: a pair given several
    times is always trained (its repeats are a weight its user asked for), and no held-out pair has a copy
    among the trained ones.
    """
    keys = [(tuple(src), tuple(tgt), tuple(pair_links)) for (src, tgt), pair_links in zip(pairs, links)]
    times = Counter(keys)
    once = [i for i, key in enumerate(keys) if times[key] == 1 and key[0] and key[1] and key[2]]
    count = min(round(share * len(once)), MAX_HELD_OUT_PAIRS)
    order = torch.randperm(len(once), generator=torch.Generator().manual_seed(seed)).tolist()
    held = {once[k] for k in order[:count]}
    return [i for i in range(len(pairs)) if i not in held], sorted(held)


def held_out_loss(aligner: Aligner, batches: list[AlignerBatch]) -> float:
    """The aligner's mean cross-entropy per supervised row over `batches` (each counted `repeat` times),
    computed in eval mode without gradients; the aligner is left in the mode it was in."""
    was_training = aligner.training
    aligner.eval()
    total, rows = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            loss, batch_rows = aligner_loss(aligner, batch)
            total += float(loss) * batch.repeat
            rows += batch_rows * batch.repeat
    aligner.train(was_training)
    return total / max(rows, 1)


@dataclass(frozen=True)
class EpochResult:
    """What one epoch of aligner training measured."""

    epoch: int  # 1-based
    training_loss: float  # the mean of its steps' losses per supervised row
    held_out_loss: float | None  # per supervised row of the held-out pairs; None without any
    best: bool  # the best held-out loss so far (every epoch is, without held-out pairs)


@dataclass
class TrainedAligner:
    """A trained aligner (in eval mode: the best epoch's), and every epoch's results in order."""

    aligner: Aligner
    epochs: list[EpochResult]
    best_epoch: int  # 1-based


def train_aligner(
    batches: list[AlignerBatch], model_config, config: AlignerTrainingConfig,
    on_step: Callable[[int, float], None] | None = None, held_out: list[AlignerBatch] | None = None,
    on_epoch: Callable[[EpochResult], None] | None = None, device: torch.device | str = "cpu",
) -> TrainedAligner:
    """Train a fresh Aligner on `batches` on `device` for up to config.epochs (batch order shuffled each
    epoch, seeded); `on_step(epoch, mean loss per supervised row)` after every batch, `on_epoch(result)`
    after every epoch. With `held_out` batches, their loss is measured after each epoch, training stops
    once config.patience epochs in a row did not lower it, and the aligner of the best epoch is returned.

    A step's loss is its rows' summed loss over the mean number of supervised rows in a step, not over
    its own rows: Adam makes every step about the same size whatever its loss's scale, so a batch of
    one pair given 40 times, divided by its own rows, would take 40 full steps an epoch on one sentence
    and throw the aligner off. Divided by the mean, a small batch moves it as little as its rows weigh.
    """
    # A pair split into other words is kept in a batch with no reference rows: it teaches nothing.
    if not any(supervised_rows(batch) for batch in batches):
        raise TfmError("no pair to train the aligner on: every pair was empty, too long, or split into other words")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    aligner = Aligner(model_config, config.hidden, config.dim, config.context).to(device)
    optimizer = torch.optim.Adam(aligner.parameters(), lr=config.lr)
    plan = [index for index, batch in enumerate(batches) for _ in range(batch.repeat)]  # one epoch's steps
    rows_per_step = sum(supervised_rows(batch) * batch.repeat for batch in batches) / len(plan)
    total_steps = config.epochs * len(plan)
    schedule = OneCycle(ScheduleSettings(config.lr, warmup_steps=max(1, total_steps // 10), total_steps=total_steps))
    step = 0
    results: list[EpochResult] = []
    best_state, best_epoch, best_loss = None, 0, math.inf
    aligner.train()
    for epoch in range(config.epochs):
        step_losses = []
        for position in torch.randperm(len(plan), generator=generator).tolist():
            loss, rows = aligner_loss(aligner, batches[plan[position]])
            optimizer.zero_grad()
            (loss / max(rows_per_step, 1.0)).backward()
            step += 1
            for group in optimizer.param_groups:
                group["lr"] = schedule.rate(step)
            optimizer.step()
            step_losses.append(float(loss.detach()) / max(rows, 1))
            if on_step is not None:
                on_step(epoch, step_losses[-1])
        measured = held_out_loss(aligner, held_out) if held_out else None
        best = measured is None or measured < best_loss
        if best:
            best_epoch, best_loss = epoch + 1, math.inf if measured is None else measured
            best_state = {name: value.detach().clone() for name, value in aligner.state_dict().items()}
        results.append(EpochResult(epoch + 1, sum(step_losses) / len(step_losses), measured, best))
        if on_epoch is not None:
            on_epoch(results[-1])
        if epoch + 1 - best_epoch >= config.patience:
            break
    if best_state is None:  # every held-out loss was NaN
        raise TfmError(f"the aligner's training diverged (its held-out loss is not a number); lower --lr (it was {config.lr:g})")
    aligner.load_state_dict(best_state)
    if not all(bool(param.isfinite().all()) for param in aligner.parameters()):  # no checkpoint could hold them
        raise TfmError(f"the aligner's training diverged (its weights are not finite); lower --lr (it was {config.lr:g})")
    return TrainedAligner(aligner.eval(), results, best_epoch)
