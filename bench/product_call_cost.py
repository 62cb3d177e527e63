"""What one linear-layer product costs at the row counts of decoding steps: packed oneDNN against F.linear.

For each shape of the Multi30k model's linear layers (and a tiny 8 x 8 one, which shows the fixed
cost of a call), each row count and each thread count, the mean time of one call to
`kernels.packed_linear` (oneDNN, the weight packed once, rows padded to kernels.row_bucket) and to
F.linear (MKL's sgemm), side by side in one process, with GFLOP/s. No model is needed.

Usage: python bench/product_call_cost.py [--rows 8,16,24,32,160] [--threads 1,2] [--calls 300]
       [--shapes 8x8,256x256,256x768,256x1024,1024x256,256x8000]   (in_features x out_features)
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    """Time every (threads, shape, rows) cell and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="8,16,24,32,160")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shapes", default="8x8,256x256,256x768,256x1024,1024x256,256x8000")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| threads | in x out | rows | F.linear us | packed oneDNN us | F.linear GFLOP/s | oneDNN GFLOP/s | oneDNN / F.linear time |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for shape in args.shapes.split(","):
                in_features, out_features = (int(n) for n in shape.split("x"))
                layer = Linear(in_features, out_features)
                layer.pack()  # packed as `tfm translate` packs it
                weight, bias, packed = layer.weight.detach(), layer.bias.detach(), layer.packed_weight
                for rows in (int(r) for r in args.rows.split(",")):
                    x = torch.randn(rows, in_features)
                    plain_us = mean_call_us(lambda: F.linear(x, weight, bias), args.calls)
                    packed_us = mean_call_us(lambda: packed_linear(x, packed, bias), args.calls)
                    gflop = 2 * rows * in_features * out_features / 1e9
                    print(f"| {threads} | {shape} | {rows} | {plain_us:.1f} | {packed_us:.1f} | {gflop / plain_us * 1e6:.1f} "
                          f"| {gflop / packed_us * 1e6:.1f} | {packed_us / plain_us:.2f} |", flush=True)


if __name__ == "__main__":
    main()
