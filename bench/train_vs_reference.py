"""Training throughput of tfm's step against a plain torch.nn.Transformer step, and model FLOPs utilisation.

In one process, on the same batches of Multi30k de->en ($MULTI30K_DIR, else ../shared/data/multi30k;
tfm_cli.corpus.batching token-budget batching, seeded):
  tfm        tfm_cli.training.step.train_step on tfm_cli.model.Transformer (what `tfm train` runs per update)
  reference  torch.nn.Transformer (batch_first, post-norm) with the same sizes, a shared embedding
             tied to the output projection, sinusoidal positions, the usual masks, projection of
             every position then F.cross_entropy(label_smoothing, ignore_index=pad): the loop most
             people write first.
Both: dropout 0.1, Adam(0.9, 0.98, eps 1e-9) at lr 1e-4, label smoothing 0.1, no clipping, float32.
Steps alternate between the two on each batch (who goes first alternates too) so load changes hit both.
Reported per thread count: target tokens/s (real target tokens, EOS included, per second of
forward + backward + optimizer), the ratio, and MFU = model FLOPs / time / measured peak, where the
peak is the best rate of a 2048x2048 float32 matmul loop timed before every round at the same thread count, and model
FLOPs = 6 * params * target tokens (the usual rough form; an encoder-decoder figure is also given:
6 * (encoder params * source tokens + (decoder params + output projection) * target tokens)).

With --bf16, both engines also run under bf16 autocast (what train.precision = "bf16" runs:
float32 master weights and optimizer, products in bfloat16, the loss in float32), each on a copy
of its own initial weights: the step-level speed-up bf16 gives on a CPU with native bfloat16
(AVX512-BF16, AMX) or a GPU. On the CPU, MFU stays measured against the float32 matmul peak.

--device cuda runs every engine on the GPU (--threads is then ignored; times are taken after
torch.cuda.synchronize). The measured peak is then that of an 8192^3 product in the step's own
precision (bfloat16 for the autocast rows, float32 with TF32 off for the others), and
--nominal-tflops adds MFU against the datasheet's dense bf16 figure (989 for an H100 SXM or H200).
--shape base runs a Transformer-base shape (d_model 512, 8 heads, d_ff 2048, 6+6 layers) instead
of the Multi30k recipe's (d_model 256, 4 heads, d_ff 1024, 3+3 layers).

Usage: python bench/train_vs_reference.py [--threads 1,2] [--rounds 3] [--steps 6] [--bf16]
       python bench/train_vs_reference.py --device cuda --bf16 --shape base --max-tokens 8192 [--nominal-tflops 989]
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tfm_cli.allocator import keep_all_freed_memory
from tfm_cli.config import ModelConfig
from tfm_cli.corpus.batching import Batch, batch_indices, collate, epoch_generator
from tfm_cli.corpus.cache import prepare_corpus
from tfm_cli.corpus.filters import FilterSettings
from tfm_cli.model import Transformer, count_parameters
from tfm_cli.model.layers import sinusoidal_table
from tfm_cli.special_ids import EOS_ID, PAD_ID
from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece
from tfm_cli.training.step import StepSettings, train_step

BENCH_DIR = Path(__file__).resolve().parent
MULTI30K = Path(os.environ.get("MULTI30K_DIR", BENCH_DIR.parents[1] / "shared" / "data" / "multi30k"))
LABEL_SMOOTHING = 0.1


class ReferenceTransformer(nn.Module):
    """A plain encoder-decoder on torch.nn.Transformer: shared embedding, tied output, sinusoidal positions."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.embed = nn.Embedding(config.src_vocab_size, config.d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=config.d_model**-0.5)
        self.register_buffer("positions", sinusoidal_table(config.max_positions, config.d_model), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        self.transformer = nn.Transformer(
            d_model=config.d_model, nhead=config.n_heads, num_encoder_layers=config.n_enc_layers,
            num_decoder_layers=config.n_dec_layers, dim_feedforward=config.d_ff, dropout=config.dropout,
            batch_first=True, norm_first=False,
        )
        self.output = nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        self.output.weight = self.embed.weight

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, D): scaled embedding plus positions, with dropout."""
        return self.dropout(self.embed(tokens) * math.sqrt(self.d_model) + self.positions[: tokens.size(1)])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src: (B, S), tgt_in: (B, T) int64 -> logits (B, T, V)."""
        causal = torch.ones(tgt_in.size(1), tgt_in.size(1), dtype=torch.bool, device=tgt_in.device).triu(1)  # (T, T) True above the diagonal
        src_pad, tgt_pad = src == PAD_ID, tgt_in == PAD_ID  # True = ignore (nn.Transformer's convention)
        hidden = self.transformer(
            self.embed_tokens(src), self.embed_tokens(tgt_in), tgt_mask=causal, src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True,
        )
        return self.output(hidden)


def reference_step(
    model: ReferenceTransformer, optimizer: torch.optim.Optimizer, batch: Batch, autocast_dtype: torch.dtype | None = None
) -> None:
    """One update: mean label-smoothed cross-entropy over real target tokens, backward, Adam step.

    autocast_dtype: run the forward pass under autocast to this dtype (the loss in float32), or None.
    """
    device_type = batch.src.device.type
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    loss = F.cross_entropy(
        logits.float().view(-1, logits.size(-1)), batch.tgt_out.view(-1), ignore_index=PAD_ID,
        label_smoothing=LABEL_SMOOTHING, reduction="sum",
    )
    (loss / batch.n_tgt_tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def adam(model: nn.Module) -> torch.optim.Optimizer:
    """Section 5.3's Adam (beta1 0.9, beta2 0.98, eps 1e-9); the lr does not affect speed."""
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def matmul_gflops(threads: int, size: int = 2048, repeats: int = 5, device: torch.device = torch.device("cpu"),
                  dtype: torch.dtype = torch.float32) -> float:
    """The matmul rate (GFLOP/s) of `dtype` on `device` (at `threads` on a CPU): best of 3 timings of
    `repeats` size^3 products."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    best = math.inf
    for _ in range(3):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 * repeats / best / 1e9


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_batches(data_dir: Path, workdir: Path, vocab_size: int, max_tokens: int, n_batches: int) -> tuple[Tokenizer, list[Batch]]:
    """A joint spm on Multi30k train (cached in workdir) and the first n_batches of epoch 0's shuffled batches."""
    spm_path = workdir / "bench-spm.model"
    if not spm_path.is_file():
        train_sentencepiece([data_dir / "train.de", data_dir / "train.en"], workdir / "bench-spm", TokenizerTrainConfig(vocab_size=vocab_size))
    tokenizer = Tokenizer.from_file(spm_path)
    corpus = prepare_corpus(
        [(data_dir / "train.de", data_dir / "train.en")], tokenizer, tokenizer, FilterSettings(max_length=128),
        workdir / "cache", "train", EOS_ID,
    ).corpus
    indices = batch_indices(corpus.src_lengths, corpus.tgt_lengths, max_tokens, epoch_generator(1, 0))
    return tokenizer, [collate(corpus, rows) for rows in indices[:n_batches]]


def model_flops(model: Transformer, batches: list[Batch]) -> tuple[float, float]:
    """(6 * params * target tokens, the encoder-decoder form) summed over `batches`."""
    params = count_parameters(model)
    encoder = sum(p.numel() for p in model.encoder_layers.parameters())
    decoder = sum(p.numel() for p in model.decoder_layers.parameters()) + model.output_proj.weight.numel()
    tgt = sum(b.n_tgt_tokens for b in batches)
    src = sum(b.n_src_tokens for b in batches)
    return 6.0 * params * tgt, 6.0 * (encoder * src + decoder * tgt)


def timed(run_step, batches: list[Batch], device: torch.device = torch.device("cpu")) -> float:
    """Seconds to run `run_step(batch)` over every batch, the GPU's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    for batch in batches:
        run_step(batch)
    synchronize(device)
    return time.perf_counter() - start


def cpu_name() -> str:
    """The lscpu model name."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


SHAPES = {
    "multi30k": dict(d_model=256, n_heads=4, d_ff=1024, n_enc_layers=3, n_dec_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_enc_layers=6, n_dec_layers=6),
}


def machine_name(device: torch.device) -> str:
    """The GPU's name, or the lscpu model name and core count."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return f"{cpu_name()}, {os.cpu_count()} cores, no GPU"


def main() -> None:
    """Measure every thread count; print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the batches per thread count (median)")
    parser.add_argument("--steps", type=int, default=6, help="batches (updates per engine) per round")
    parser.add_argument("--max-tokens", type=int, default=4096, help="token budget per batch and side (TrainConfig default)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-train"))
    parser.add_argument("--bf16", action="store_true", help="also time both engines under bf16 autocast")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (every engine on the GPU)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="multi30k", help="model sizes (see above)")
    parser.add_argument("--nominal-tflops", type=float, help="the device's datasheet bf16 TFLOP/s: adds MFU against it")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 rows multiply in float32, as on the CPU
        threads_list = [torch.get_num_threads()]
    else:
        threads_list = [int(t) for t in args.threads.split(",")]
        keep_all_freed_memory()  # the allocator settings `tfm train` runs with (bench/train_allocator.py)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tokenizer, batches = load_batches(MULTI30K, args.workdir, args.vocab_size, args.max_tokens, args.steps + 1)
    batches = [batch.to(device) for batch in batches]
    warmup, batches = batches[0], batches[1:]
    config = ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, dropout=0.1, share_embeddings=True,
        max_positions=256, **SHAPES[args.shape],
    )
    torch.manual_seed(0)
    tfm = Transformer(config).train()
    reference = ReferenceTransformer(config).train()
    engines = {"tfm": tfm, "torch.nn.Transformer": reference}
    autocast_dtypes = [None, torch.bfloat16] if args.bf16 else [None]
    steps, step_dtypes = {}, {}
    for autocast_dtype in autocast_dtypes:
        for engine_name, initial in engines.items():
            model = (copy.deepcopy(initial) if autocast_dtype is not None else initial).to(device)
            optimizer = adam(model)
            name = engine_name if autocast_dtype is None else f"{engine_name} bf16 autocast"
            if engine_name == "tfm":
                settings = StepSettings(label_smoothing=LABEL_SMOOTHING, clip_norm=0.0, autocast_dtype=autocast_dtype,
                                        device_type=device.type)
                steps[name] = functools.partial(tfm_step, model, optimizer, settings)
            else:
                steps[name] = functools.partial(reference_step, model, optimizer, autocast_dtype=autocast_dtype)
            step_dtypes[name] = autocast_dtype
    tgt_tokens = sum(b.n_tgt_tokens for b in batches)
    flops_rough, flops_encdec = model_flops(tfm, batches)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine_name(device)}; torch "
          f"{torch.__version__}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"# shape {args.shape}: d_model {config.d_model}, {config.n_heads} heads, d_ff {config.d_ff}, "
          f"{config.n_enc_layers}+{config.n_dec_layers} layers, joint vocab {tokenizer.vocab_size}; params: tfm "
          f"{count_parameters(tfm):,}, reference {count_parameters(reference):,}; {len(batches)} batches of <= "
          f"{args.max_tokens} tokens/side ({tgt_tokens} target tokens) x {args.rounds} rounds, median round")
    nominal = "" if args.nominal_tflops is None else f" MFU 6NT vs {args.nominal_tflops:g} TFLOP/s |"
    print(f"| threads | engine | target tokens/s | tfm / engine (same precision) | MFU 6NT | MFU enc-dec | matmul GFLOP/s |{nominal}")
    print("|---|---|---|---|---|---|---|" + ("---|" if nominal else ""))
    peak_dtypes = [torch.float32]  # a CPU's float32 peak serves every row (bf16 autocast included)
    if device.type == "cuda":
        peak_dtypes = sorted({torch.float32 if dtype is None else dtype for dtype in step_dtypes.values()}, key=str)
    for threads in threads_list:
        torch.set_num_threads(threads)
        for run_step in steps.values():
            run_step(warmup)
        seconds = {name: [] for name in steps}
        peaks = {dtype: [] for dtype in peak_dtypes}
        for round_index in range(args.rounds):
            for dtype in peak_dtypes:
                size = 8192 if device.type == "cuda" else 2048
                peaks[dtype].append(matmul_gflops(threads, size=size, device=device, dtype=dtype))
            for name in steps:
                seconds[name].append(0.0)
            for i, batch in enumerate(batches):
                # Step by step, rotating which engine goes first, so load from other processes
                # falls on both alike.
                shift = (i + round_index) % len(steps)
                names = list(steps)[shift:] + list(steps)[:shift]
                for name in names:
                    seconds[name][-1] += timed(steps[name], [batch], device)
        median = {name: statistics.median(s) for name, s in seconds.items()}
        for name in steps:
            # Other processes share the cores: the best matmul rate seen is the closest to the true peak.
            dtype = step_dtypes[name] if device.type == "cuda" and step_dtypes[name] is not None else torch.float32
            peak = max(peaks[dtype])
            mfu_rough = flops_rough / median[name] / 1e9 / peak
            mfu_encdec = flops_encdec / median[name] / 1e9 / peak
            same_precision_tfm = "tfm" if step_dtypes[name] is None else "tfm bf16 autocast"
            row = (f"| {threads} | {name} | {tgt_tokens / median[name]:.0f} | "
                   f"{median[name] / median[same_precision_tfm]:.2f} | "
                   f"{100 * mfu_rough:.1f}% | {100 * mfu_encdec:.1f}% | {peak:.0f} |")
            if args.nominal_tflops is not None:
                row += f" {100 * flops_rough / median[name] / 1e12 / args.nominal_tflops:.1f}% |"
            print(row, flush=True)
        print(f"  threads {threads}: seconds per round {seconds}; matmul GFLOP/s per round {peaks}", file=sys.stderr)


def tfm_step(model: Transformer, optimizer: torch.optim.Optimizer, settings: StepSettings, batch: Batch) -> None:
    """One tfm update on one batch (what `tfm train` runs per update without accumulation)."""
    train_step(model, optimizer, None, [batch], settings)


if __name__ == "__main__":
    main()
