"""Translation speed: tfm's cached, batched search vs the same model decoded by a plain full-recompute loop.

    python bench/translate_speed.py                       # random d256 3+3 model, 8k joint vocab
    python bench/translate_speed.py --model runs/multi30k/checkpoint_best.safetensors

Decodes the 1000 lines of Multi30k test_2016_flickr.de with beam 5 and greedy on 2 threads and prints
sentences/s and target tokens/s side by side with a plain loop that re-runs the whole decoder over
the prefix at every step (no cache, padded length-sorted batches, finished rows kept), and the ratio.
A random model rarely chooses EOS, so its outputs run to the length limit: compare tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfm_cli.checkpoints.format import LoadedModel, load_model, save_model  # noqa: E402
from tfm_cli.config import DecodeConfig, ModelConfig  # noqa: E402
from tfm_cli.model import Transformer  # noqa: E402
from tfm_cli.inference.decoding import max_output_lengths  # noqa: E402
from tfm_cli.length_penalty import GnmtPenalty  # noqa: E402
from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece  # noqa: E402
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "multi30k"


def random_model(folder: Path) -> LoadedModel:
    """A same-size random model: d_model 256, 3+3 layers, 8k joint sentencepiece vocab on Multi30k train."""
    spm = train_sentencepiece([DATA / "train.de", DATA / "train.en"], folder / "joint", TokenizerTrainConfig(vocab_size=8000))
    tokenizer = Tokenizer.from_file(spm)
    torch.manual_seed(0)
    config = ModelConfig(
        src_vocab_size=8000, tgt_vocab_size=8000, d_model=256, n_heads=8, d_ff=1024,
        n_enc_layers=3, n_dec_layers=3, dropout=0.0, share_embeddings=True, max_positions=256,
    )
    path = folder / "random.safetensors"
    save_model(path, Transformer(config).eval(), tokenizer, tokenizer)
    return load_model(path)


@torch.inference_mode()
def plain_search(model: Transformer, src: torch.Tensor, beam: int, alpha: float, max_len_a: float, max_len_b: int) -> list[list[int]]:
    """The textbook loop: encoder once, then the full decoder over the whole prefix at every step.

    src: (N, S) padded. Keeps every row until the whole batch is done. Returns the best output per sentence.
    """
    config = model.config
    n = src.size(0)
    encoded = model.encode(src)
    rows = torch.arange(n).repeat_interleave(beam)
    encoded.memory, encoded.src_mask = encoded.memory[rows], encoded.src_mask[rows]
    limit = config.max_positions - 2
    max_len = int(max_output_lengths(encoded.src_mask.sum(1), max_len_a, max_len_b, limit).max())
    prefix = torch.full((n * beam, 1), config.bos_id, dtype=torch.long)
    scores = torch.full((n, beam), float("-inf"))
    scores[:, 0] = 0
    ended = torch.zeros(n * beam, dtype=torch.bool)
    best: list[tuple[float, list[int]]] = [(float("-inf"), []) for _ in range(n)]
    for step in range(max_len + 1):
        log_probs = torch.log_softmax(model.project(model.decode(prefix, encoded).hidden[:, -1]).float(), -1)
        if step == max_len:
            keep_eos = torch.full_like(log_probs, float("-inf"))
            keep_eos[:, config.eos_id] = 0
            log_probs = log_probs + keep_eos
        log_probs[ended] = float("-inf")
        vocab = log_probs.size(1)
        top_scores, top_ids = (scores.view(-1, 1) + log_probs).view(n, -1).topk(beam, dim=1)
        chosen_rows = (torch.arange(n)[:, None] * beam + top_ids // vocab).view(-1)
        tokens = (top_ids % vocab).view(-1)
        prefix = torch.cat([prefix[chosen_rows], tokens[:, None]], dim=1)
        scores = top_scores
        eos = (tokens == config.eos_id) & top_scores.view(-1).isfinite()
        for row in eos.nonzero()[:, 0].tolist():
            score = float(top_scores.view(-1)[row]) / GnmtPenalty(alpha).divisor(step + 1)
            if score > best[row // beam][0]:
                best[row // beam] = (score, prefix[row, 1:-1].tolist())
        scores = scores.masked_fill(eos.view(n, beam), float("-inf"))
        ended = ~scores.view(-1).isfinite()
        if bool(ended.all()):
            break
    return [tokens for _, tokens in best]


def run_plain(loaded: LoadedModel, lines: list[str], beam: int, batch_size: int) -> tuple[float, int]:
    """Decode `lines` with plain_search in padded length-sorted batches; returns (seconds, target tokens)."""
    config = loaded.config
    ids = [i[: config.max_positions - 1] + [config.eos_id] for i in loaded.src_tokenizer.encode_ids_batch(lines)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    tokens = 0
    started = time.perf_counter()
    for start in range(0, len(order), batch_size):
        batch = [ids[i] for i in order[start : start + batch_size]]
        src = torch.zeros(len(batch), max(map(len, batch)), dtype=torch.long)
        for row, seq in enumerate(batch):
            src[row, : len(seq)] = torch.tensor(seq)
        tokens += sum(len(out) + 1 for out in plain_search(loaded.model, src, beam, 0.6, 1.5, 10))
    return time.perf_counter() - started, tokens


def run_tfm(loaded: LoadedModel, lines: list[str], beam: int, batching: BatchingConfig) -> tuple[float, int]:
    """Decode `lines` with tfm's Translator; returns (seconds, target tokens including EOS)."""
    translator = Translator(loaded, DecodeConfig(beam_size=beam), batching)
    stats = TranslationStats()
    started = time.perf_counter()
    for start in range(0, len(lines), batching.buffer_size):
        translator.translate_chunk(lines[start : start + batching.buffer_size], start, stats)
    return time.perf_counter() - started, stats.output_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a tfm checkpoint; default: a random d256 3+3 model with an 8k vocab")
    parser.add_argument("--random-weights", action="store_true", help="keep --model's config and tokenizer, re-draw its weights")
    parser.add_argument("--lines", type=int, default=1000, help="how many test lines (default all 1000)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch, for both decoders")
    parser.add_argument("--skip-plain", action="store_true", help="time tfm only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = (DATA / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[: args.lines]
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(args.model) if args.model else random_model(Path(tmp))
    name = args.model or "random d256 3+3, 8k joint vocab"
    if args.random_weights:
        torch.manual_seed(0)
        loaded.model = Transformer(loaded.config).eval()
        name += " (config and tokenizer; random weights)"
    print(f"model: {name}; {len(lines)} lines; {args.threads} threads; torch {torch.__version__}")
    batching = BatchingConfig(buffer_size=len(lines), batch_size=args.batch_size)
    header = f"{'search':<8} {'decoder':<22} {'seconds':>8} {'sent/s':>8} {'tok/s':>8} {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    for beam, label in ((5, "beam 5"), (1, "greedy")):
        tfm_s, tfm_tokens = run_tfm(loaded, lines, beam, batching)
        row = f"{label:<8} {'tfm (cache, batched)':<22} {tfm_s:8.2f} {len(lines) / tfm_s:8.1f} {tfm_tokens / tfm_s:8.0f}"
        if args.skip_plain:
            print(row)
            continue
        plain_s, plain_tokens = run_plain(loaded, lines, beam, args.batch_size)
        speedup = (tfm_tokens / tfm_s) / (plain_tokens / plain_s)
        print(f"{row} {speedup:8.2f}x")
        print(f"{label:<8} {'plain (no cache)':<22} {plain_s:8.2f} {len(lines) / plain_s:8.1f} {plain_tokens / plain_s:8.0f} {'1.00x':>9}")


if __name__ == "__main__":
    main()
