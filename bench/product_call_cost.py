"""What one linear-layer product costs at the row counts of decoding steps: packed oneDNN against F.linear.

For each shape of the Multi30k model's linear layers (and a tiny 8 x 8 one, which shows the fixed
cost of a call), each row count and each thread count, the mean time of one call to
`kernels.packed_linear` (oneDNN, the weight packed once, rows padded to kernels.row_bucket) and to
F.linear (MKL's sgemm), side by side in one process, with GFLOP/s. No model is needed.

--copies N (default 1) makes N copies of each weight and calls them in turn, so that the weights of
consecutive calls do not share the cache: a decoding step multiplies by 19 different weights (the
Multi30k model's, ~19 MB) before it meets the first again, so its products read their weights from
L3 or memory, not from the core's L2, as the default single weight does. The table then also gives the
weight bytes read per second, and a line above it what torch.sum reads per second from a 200 MB tensor
on the same threads (how fast this machine streams memory).

The last two columns say whether the packed product's result has the same bits as F.linear's, and as
`sequential_reference` (each output a chain of x[k] * w[k] additions in the order k = 0, 1, ..., the
bias added last): which other kernel could replace it without changing a translation.

Usage: python bench/product_call_cost.py [--rows 8,16,24,32,160] [--threads 1,2] [--calls 300] [--copies 1]
       [--shapes 8x8,256x256,256x768,256x1024,1024x256,256x8000]   (in_features x out_features)
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tfm_cli.model.kernels import Linear, packed_linear


def mean_call_us(function: Callable[[], torch.Tensor], calls: int) -> float:
    """The mean wall time of one call of `function` in microseconds, after calls // 10 warm-up calls."""
    for _ in range(max(1, calls // 10)):
        function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e6


def streaming_gb_per_s() -> float:
    """GB/s that torch.sum reads from a 200 MB float32 tensor (best of 5 passes)."""
    values = torch.ones(50_000_000)
    best = min(mean_call_us(values.sum, 1) for _ in range(5))
    return values.numel() * 4 / 1e9 / best * 1e6


def sequential_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x (R, K) @ weight.T (K, N) + bias, summing over k in order 0..K-1 (one addcmul per k), bias last."""
    total = torch.zeros(x.size(0), weight.size(0))
    columns = weight.t().contiguous()
    for k in range(x.size(1)):
        total = torch.addcmul(total, x[:, k : k + 1], columns[k : k + 1])
    return total + bias


def main() -> None:
    """Time every (threads, shape, rows) cell and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="8,16,24,32,160")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shapes", default="8x8,256x256,256x768,256x1024,1024x256,256x8000")
    parser.add_argument("--copies", type=int, default=1, help="distinct copies of each weight, called in turn")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"# {args.copies} cop{'y' if args.copies == 1 else 'ies'} of each weight, called in turn; mean of {args.calls} calls")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        print(f"# {threads} thread{'s' if threads > 1 else ''}: torch.sum streams {streaming_gb_per_s():.1f} GB/s")
    print("| threads | in x out | rows | F.linear us | packed oneDNN us | F.linear GFLOP/s | oneDNN GFLOP/s | oneDNN / F.linear time "
          "| oneDNN weight GB/s | oneDNN = F.linear bits | oneDNN = sequential sum bits |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for shape in args.shapes.split(","):
                in_features, out_features = (int(n) for n in shape.split("x"))
                layers = [Linear(in_features, out_features) for _ in range(args.copies)]
                for layer in layers:
                    layer.pack()  # packed as `tfm translate` packs it
                plain = itertools.cycle([(layer.weight.detach(), layer.bias.detach()) for layer in layers])
                packed = itertools.cycle([(layer.packed_weight, layer.bias.detach()) for layer in layers])
                for rows in (int(r) for r in args.rows.split(",")):
                    x = torch.randn(rows, in_features)
                    plain_us = mean_call_us(lambda: F.linear(x, *next(plain)), args.calls)
                    packed_us = mean_call_us(lambda: packed_linear(x, *next(packed)), args.calls)
                    gflop = 2 * rows * in_features * out_features / 1e9
                    weight_gb = 4 * in_features * out_features / 1e9
                    weight, bias = layers[0].weight.detach(), layers[0].bias.detach()
                    result = packed_linear(x, layers[0].packed_weight, bias)
                    same_as_mkl = torch.equal(result, F.linear(x, weight, bias))
                    same_as_sequential = torch.equal(result, sequential_reference(x, weight, bias))
                    print(f"| {threads} | {shape} | {rows} | {plain_us:.1f} | {packed_us:.1f} | {gflop / plain_us * 1e6:.1f} "
                          f"| {gflop / packed_us * 1e6:.1f} | {packed_us / plain_us:.2f} | {weight_gb / packed_us * 1e6:.1f} "
                          f"| {'yes' if same_as_mkl else 'no'} | {'yes' if same_as_sequential else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
