"""The seam between the searches and the model: a step decoder (start, one step to log-probs, reorder).

search.py's greedy, beam and sampling loops see only `StepDecoder`; `TransformerDecoder` runs it
on the Transformer's incremental cache. This module also owns batch invariance, behind one switch
(`TransformerDecoder(batch_invariant=...)`): a sentence gets the same bits whatever else shares its
batch. That needs three things, all here:
- sources padded to a width that depends on their own length only (`padded_length`), so softmax
  and sums over padded keys never see another sentence's length;
- every matrix multiply with at least MIN_STEP_ROWS rows (`padded_rows`): CPU BLAS (MKL)
  multiplies fewer than ~12 rows with a different kernel, which rounds differently. Not needed
  when every linear layer gives a row the same bits in a call of any size (`products_need_padding`:
  oneDNN's packed float32 product, and the int8 layers, whose integer sums are exact): then a step
  runs on its real rows only;
- decoder attention by its explicit formula softmax(QK^T)V: torch's fused CPU kernel, for one
  query row per sequence, splits its work by batch size (measured with torch 2.13, AVX2 and AVX-512).
"""

from __future__ import annotations

from typing import Protocol

import torch

from tfm_cli.config import ModelConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.shortlist import ShortlistBatch
from tfm_cli.model import DecoderState, Transformer
from tfm_cli.model.kernels import Linear
from tfm_cli.model.precision import linear_layers
from tfm_cli.model.step_threads import StepMode, StepThreads, one_thread, step_mode

MIN_STEP_ROWS = 16
# A source is always padded to the next multiple of this many tokens, alone or in a batch.
LENGTH_BUCKET = 8


class StepDecoder(Protocol):
    """What a search needs from a model, for a batch of N source sentences.

    Rows are hypotheses, sentence-major: after `start(k, ...)` rows i*k .. i*k+k-1 belong to
    sentence i. The vocabulary has `vocab_size` entries, with the special ids given.
    """

    n_sentences: int
    vocab_size: int
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int

    def max_lengths(self, max_len_a: float, max_len_b: int) -> list[int]:
        """Per sentence, the most output tokens (EOS excluded) it may get: a * source length + b, capped."""

    def start(self, rows_per_sentence: int, grouped: bool) -> None:
        """Begin decoding with `rows_per_sentence` rows per sentence (grouped: they stay together)."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (R,) int64, each row's previous output (BOS first) -> (R, V) float32 log-probs.

        The result is a new tensor, which the search may change in place.
        """

    def select(self, rows: torch.Tensor, group_width: int = 1) -> None:
        """Keep rows `rows` (R',) int64, in that order, in groups of `group_width` rows of one sentence."""


def padded_length(n_tokens: int) -> int:
    """The width a source of `n_tokens` (EOS included) is padded to: the next multiple of LENGTH_BUCKET."""
    return -(-n_tokens // LENGTH_BUCKET) * LENGTH_BUCKET


def source_batch(sources: list[list[int]], config: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """Source id lists (EOS not included) -> (N, S) int64, each + EOS, padded to one bucketed width.

    The width is padded_length of the longest source (capped at max_positions); TransformerDecoder
    encodes each run of sources of one padded width at its own width (`source_runs`).
    """
    width = min(padded_length(max(len(ids) for ids in sources) + 1), config.max_positions)
    rows = [ids + [config.eos_id] + [config.pad_id] * (width - len(ids) - 1) for ids in sources]
    return torch.tensor(rows, dtype=torch.long, device=device)


def max_output_lengths(src_lengths: torch.Tensor, max_len_a: float, max_len_b: int, limit: int) -> torch.Tensor:
    """Per sentence, the most output tokens (EOS excluded) allowed: a * src_len + b, capped at `limit`.

    src_lengths: (B,) int64, counting the source EOS. Returns (B,) int64.
    """
    lengths = (src_lengths.to(torch.float64) * max_len_a).floor().to(torch.int64) + max_len_b
    return lengths.clamp(min=1, max=limit)


def padded_rows(rows: torch.Tensor, group_width: int = 1, min_rows: int = MIN_STEP_ROWS) -> torch.Tensor:
    """rows: (R,) int64 state rows to keep, in groups of `group_width` -> (R',), R' >= min_rows.

    Pads with copies of the last group (whole groups, so the state's grouping still holds, and the
    groups stay in order, as a state of several source widths needs); returns `rows` itself when it
    is long enough.
    """
    missing = min_rows - rows.numel()
    if missing <= 0:
        return rows
    copies = -(-missing // group_width)  # ceil: whole groups
    return torch.cat([rows, rows[-group_width:].repeat(copies)])


def products_need_padding(layers: list[torch.nn.Module]) -> bool:
    """Whether batch invariance needs every product of a step padded to MIN_STEP_ROWS rows: True unless
    each of `layers` rounds a row the same in a call of any size (`rows_independent`: kernels.Linear on
    oneDNN's packed float32 product, tests/test_kernels.py, and precision's int8 layers). MKL's F.linear
    and bf16 layers pad."""
    return not all(getattr(layer, "rows_independent", False) for layer in layers)


class ShortlistOutput:
    """The output layer of one batch restricted to its shortlist (inference/shortlist.py).

    Computes logits for the batch's K target ids only, from the float32 output weights (a oneDNN-packed
    copy of those K rows on the CPU, whatever precision the rest of the model runs in). Each row then gets
    -inf for the ids outside its own sentence's list and is spread into the full vocabulary (-inf
    elsewhere) before the log-softmax: the row's values sit at the same places whatever its batch
    computed besides, so the result is batch-invariant as the full output layer is (a column's product
    does not depend on which other columns share it: tests/test_shortlist.py).
    """

    def __init__(self, model: Transformer, batch: ShortlistBatch) -> None:
        weight, bias = output_weights(model)
        device = weight.device
        if model.tgt_embed.rows is not None:  # an embedding that holds only the rows looked up so far
            model.tgt_embed.rows.ensure(batch.target_ids)
        self.target_ids = batch.target_ids.to(device)  # (K,)
        self.allowed = batch.allowed.to(device)  # (N, K)
        self.vocab_size = weight.size(0)
        self.layer = Linear(weight.size(1), self.target_ids.numel(), bias=bias is not None).to(device)
        with torch.no_grad():
            self.layer.weight.copy_(weight[self.target_ids])
            if bias is not None:
                self.layer.bias.copy_(bias[self.target_ids])
        self.layer.requires_grad_(False)
        self.layer.pack()

    def log_probs(self, logits: torch.Tensor, row_sentences: torch.Tensor) -> torch.Tensor:
        """logits: (R, K) float32 from `layer` (changed in place), row_sentences: (R,) int64 -> (R, V) log-probs,
        each row normalised over its own sentence's ids, -inf elsewhere."""
        logits.masked_fill_(~self.allowed[row_sentences], float("-inf"))
        full = logits.new_full((logits.size(0), self.vocab_size), float("-inf"))
        full.index_copy_(1, self.target_ids, logits)
        return torch.log_softmax(full, dim=-1, out=full)


def output_weights(model: Transformer) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output projection's float32 weight (V, D) and bias (V,) or None, for a shortlist's rows.

    The weight is the target embedding's when the model ties them (tfm's recipes, OPUS-MT models), which
    stays float32 in every precision; an untied projection keeps no float32 copy once converted.
    """
    config = model.config
    if not (config.share_embeddings or config.tie_output):
        raise TfmError(
            "--shortlist needs a model whose output layer shares the target embedding (tfm's recipes and "
            "OPUS-MT models do); this one has its own output weights"
        )
    bias = getattr(model.output_proj, "bias", None)
    return model.tgt_embed.weight.detach(), None if bias is None else bias.detach().float()


class TransformerDecoder:
    """A StepDecoder over the Transformer's incremental cache for one source batch.

    src: (N, S) int64 padded with pad_id, each row ending in EOS. The encoder runs once in `start`;
    with `batch_invariant` (the default) it uses the explicit attention formula and, where the
    model's products need it (products_need_padding), pads every product to MIN_STEP_ROWS rows, so
    that a row's log-probs never depend on the other rows. With a
    `shortlist` (the batch's, inference/shortlist.py) the output layer computes only its target ids.
    """

    def __init__(
        self, model: Transformer, src: torch.Tensor, batch_invariant: bool = True, shortlist: ShortlistBatch | None = None
    ) -> None:
        config = model.config
        self.model, self.src, self.batch_invariant = model, src, batch_invariant
        self.n_sentences = src.size(0)
        self.vocab_size = config.tgt_vocab_size
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = config.pad_id, config.unk_id, config.bos_id, config.eos_id
        self.src_lengths = (src != config.pad_id).sum(1)  # (N,) counting the source EOS
        self.state: DecoderState | None = None
        self.rows = 0  # real rows; the state may hold more (padding copies)
        self.row_sentences = torch.arange(self.n_sentences, device=src.device)  # (rows,) each real row's sentence
        self.step_threads = StepThreads.for_model(config, model.inference_dtype)
        self.linear_layers = linear_layers(model)
        self.shortlist = None if shortlist is None else ShortlistOutput(model, shortlist)
        if self.shortlist is not None:
            self.linear_layers.append(self.shortlist.layer)
        # The fewest rows a product runs on: the state holds copies of a sentence's rows up to it.
        self.min_rows = MIN_STEP_ROWS if batch_invariant and products_need_padding(self.linear_layers) else 1

    def max_lengths(self, max_len_a: float, max_len_b: int) -> list[int]:
        """Per sentence, a * src_len + b output tokens (EOS excluded, src_len counting the source EOS).

        Capped at max_positions - 2: BOS takes a position, and the output ends with EOS.
        """
        limit = self.model.config.max_positions - 2
        return max_output_lengths(self.src_lengths, max_len_a, max_len_b, limit).tolist()

    def start(self, rows_per_sentence: int, grouped: bool) -> None:
        """Encode the sources and make `rows_per_sentence` decoder rows per sentence.

        With `grouped`, a sentence's rows share one copy of its memory keys/values (DecoderState)
        and must stay together in `select`. With batch invariance each run of consecutive sources of
        one padded width (`source_runs`) is encoded at that width, as it would be alone, and attends to
        its own memory. The encoder, too, runs on at least `min_rows` token rows (copies of a run's
        first sentence pad it; the state drops them at once).
        """
        encoded, groups, offset = [], [], 0  # offset: the state's first group of the run
        group_sentences = []  # the sentence of each of the state's groups (a padding copy: its run's first)
        for start, end, width in self.source_runs():
            src = self.src[start:end, :width]
            extra = max(0, -(-self.min_rows // width) - src.size(0))
            padded_src = torch.cat([src, src[:1].expand(extra, width)]) if extra else src
            encoded.append(self.model.encode(padded_src))
            groups.append(torch.arange(offset, offset + end - start, device=src.device))
            group_sentences += list(range(start, end)) + [start] * extra
            offset += padded_src.size(0)
        self.state = self.model.start_decoding(encoded if len(encoded) > 1 else encoded[0])
        self.row_sentences = torch.tensor(group_sentences, device=self.src.device)  # the state's one row per group
        rows = torch.cat(groups).repeat_interleave(rows_per_sentence)
        self.select(rows, rows_per_sentence if grouped else 1)

    def source_runs(self) -> list[tuple[int, int, int]]:
        """(first sentence, end, width) of each run of consecutive sources with one padded width.

        A source's width is padded_length of its length (capped at the batch's width); without batch
        invariance the whole batch is one run at the batch's width.
        """
        n_sentences, batch_width = self.src.shape
        if not self.batch_invariant:
            return [(0, n_sentences, batch_width)]
        widths = [min(padded_length(int(length)), batch_width) for length in self.src_lengths.tolist()]
        runs, start = [], 0
        for index in range(1, n_sentences + 1):
            if index == n_sentences or widths[index] != widths[start]:
                runs.append((start, index, widths[start]))
                start = index
        return runs

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (R,) int64 -> (R, V) float32 log-probs of each row's next token, on the model's device."""
        tokens = tokens.to(self.src.device)
        tokens = padded_rows(tokens, self.state.group_width, self.min_rows)
        output_layer = None if self.shortlist is None else self.shortlist.layer
        with step_mode(self.step_threads.mode(tokens.numel()), self.linear_layers):
            output = self.model.decode_step(tokens, self.state, explicit_attention=self.batch_invariant, output_layer=output_layer)
        logits = output.logits[: self.rows].float()  # (R, V) or (R, K), a fresh tensor no one else holds
        if self.shortlist is not None:
            return self.shortlist.log_probs(logits, self.row_sentences)
        # In place: the largest tensor of a step (rows x vocabulary) is not allocated twice.
        return torch.log_softmax(logits, dim=-1, out=logits)

    def select(self, rows: torch.Tensor, group_width: int = 1) -> None:
        """Keep `rows` (R',) int64 of the state, in order; groups of `group_width` rows share a sentence."""
        self.rows = rows.numel()
        rows = rows.to(self.src.device)
        self.row_sentences = self.row_sentences[rows]
        with one_thread(self.step_threads.mode(rows.numel()) is not StepMode.ALL_THREADS):
            self.state.select(padded_rows(rows, group_width, self.min_rows), group_width)
