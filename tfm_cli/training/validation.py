"""Validation: loss and perplexity of the references, and sacreBLEU of the model's own output.

The output is decoded through translation.search_batches, the code `tfm translate` runs, so a
logged validation BLEU is what `tfm translate -b N` gives for the saved checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from tfm_cli.config import DecodeConfig, TrainConfig
from tfm_cli.corpus.batching import SpecialIds, batch_indices, collate
from tfm_cli.corpus.tokenized import TokenizedCorpus
from tfm_cli.inference.translation import BatchingConfig, search_batches
from tfm_cli.model import Transformer
from tfm_cli.model.kernels import packed_weights
from tfm_cli.tokenization.tokenizer import Tokenizer
from tfm_cli.training.objective import batch_loss
from tfm_cli.training.step import StepSettings, autocast


@dataclass
class ValidResult:
    """Validation figures: per-token loss (nats), perplexity, BLEU of decoded output."""

    loss: float
    nll_loss: float
    ppl: float
    bleu: float | None
    bleu_signature: str | None
    hypotheses: list[str] = field(default_factory=list)


def decode_corpus(model: Transformer, corpus: TokenizedCorpus, tgt_tokenizer: Tokenizer, config: TrainConfig) -> list[str]:
    """Detokenized model output for every source sentence of `corpus`, in corpus order.

    Decoded exactly as `tfm translate -b N --max-len-a A --max-len-b B` decodes (the same batches,
    the same search): greedy, or beam search (length penalty 0.6, section 6.1) with
    config.valid_beam_size > 1.
    """
    decode = DecodeConfig(
        beam_size=config.valid_beam_size, max_len_a=config.valid_max_len_a, max_len_b=config.valid_max_len_b
    )
    offsets = corpus.src_offsets.tolist()
    tokens = corpus.src_tokens.tolist()
    sources = {row: tokens[offsets[row] : offsets[row + 1] - 1] for row in range(len(corpus))}  # EOS dropped
    # An empty source line translates to an empty line, as in `tfm translate`: nothing to search.
    sources = {row: ids for row, ids in sources.items() if ids}
    outputs: list[str] = [""] * len(corpus)
    for batch, hypotheses in search_batches(model, sources, decode, BatchingConfig()):
        for row, nbest in zip(batch, hypotheses):
            outputs[row] = tgt_tokenizer.decode_ids(nbest[0].tokens) if nbest else ""
    return outputs


def validation_autocast(settings: StepSettings) -> contextlib.AbstractContextManager:
    """Training's autocast on CUDA; float32 on the CPU, where `tfm translate` and `tfm score` run in
    float32 by default, so the logged figures are the ones a fresh evaluation of the checkpoint gives."""
    return autocast(settings) if settings.device_type == "cuda" else contextlib.nullcontext()


def validate(
    model: Transformer,
    corpus: TokenizedCorpus,
    references: list[str],
    tgt_tokenizer: Tokenizer,
    config: TrainConfig,
    settings: StepSettings,
    device: torch.device,
) -> ValidResult:
    """Loss and perplexity of the references, and (if config.valid_bleu) sacreBLEU of decoded output.

    `references` are the raw target lines of the corpus rows, in corpus order. Leaves the model in
    training mode.
    """
    import sacrebleu

    model.eval()
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    with packed_weights(model), torch.inference_mode(), validation_autocast(settings):
        for indices in batch_indices(corpus.src_lengths, corpus.tgt_lengths, config.max_tokens, None):
            batch = collate(corpus, indices, SpecialIds.of(model.config)).to(device)
            loss, nll = batch_loss(model, batch, config.label_smoothing)
            loss_sum += float(loss)
            nll_sum += float(nll)
            n_tokens += batch.n_tgt_tokens
    bleu = signature = None
    hypotheses: list[str] = []
    if config.valid_bleu:
        with packed_weights(model), validation_autocast(settings):
            hypotheses = decode_corpus(model, corpus, tgt_tokenizer, config)
        metric = sacrebleu.metrics.BLEU()
        bleu = metric.corpus_score(hypotheses, [references]).score
        signature = str(metric.get_signature())
    model.train()
    nll_loss = nll_sum / max(n_tokens, 1)
    return ValidResult(loss_sum / max(n_tokens, 1), nll_loss, math.exp(min(nll_loss, 100.0)), bleu, signature, hypotheses)
