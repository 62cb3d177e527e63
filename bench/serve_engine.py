"""`tfm serve`'s engine alone, without HTTP: how long one request waits, and how many lines per second it
translates when requests of one sentence arrive together, beside `Translator.translate_chunk` on the
same lines in one call (what `tfm translate` does with a file).

In one process, the model loaded once (float32, CPU) on one thread, then for each --threads value, all
translating in one TorchThread with that many torch threads (as `tfm serve` runs, serving/torch_thread.py):
- latency: --latency-requests one-sentence requests one after another (nothing else queued): p50/p90/p99;
- throughput: the --lines sentences submitted at once as one-sentence requests (the queue large enough
  to take them all): lines/s, and the same lines through one translate_chunk call (the file's rate).
Prints a markdown table with the date, the command and the `lscpu` flags. Nothing here is a test.

    python bench/serve_engine.py --model runs/multi30k-de-en/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import lscpu_flags, lscpu_model, percentile, table  # noqa: E402

from tfm_cli.allocator import keep_freed_memory  # noqa: E402
from tfm_cli.checkpoints.format import load_model  # noqa: E402
from tfm_cli.inference.translation import BatchingConfig, Translator, TranslationStats  # noqa: E402
from tfm_cli.inference.settings import resolve_decode  # noqa: E402
from tfm_cli.serving.engine import Engine, RequestSettings  # noqa: E402
from tfm_cli.serving.torch_thread import TorchThread  # noqa: E402


def engine_latencies(engine: Engine, lines: list[str]) -> list[float]:
    """Seconds per one-sentence request, each sent when the one before is answered."""
    seconds = []
    for line in lines:
        started = time.perf_counter()
        engine.submit(RequestSettings(), [line]).result()
        seconds.append(time.perf_counter() - started)
    return seconds


def engine_rate(engine: Engine, lines: list[str]) -> float:
    """Lines/s with every line its own request, all queued at once."""
    started = time.perf_counter()
    futures = [engine.submit(RequestSettings(), [line]) for line in lines]
    for future in futures:
        future.result()
    return len(lines) / (time.perf_counter() - started)


def chunk_rate(translator: Translator, lines: list[str]) -> float:
    """Lines/s of one translate_chunk call on all `lines` (tfm translate's batches)."""
    started = time.perf_counter()
    translator.translate_chunk(lines, 0, TranslationStats())
    return len(lines) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a tfm checkpoint")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--threads", default="1,2", help="torch threads to try, comma-separated")
    parser.add_argument("--lines", type=int, default=500, help="sentences for the throughput rows")
    parser.add_argument("--latency-requests", type=int, default=100)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    args = parser.parse_args()
    keep_freed_memory()
    lines = [line.rstrip("\n") for line in open(args.source, encoding="utf-8")]
    started = datetime.datetime.now(datetime.timezone.utc)
    torch.set_num_threads(1)  # the main thread starts no OpenMP team of its own (serving/torch_thread.py)
    loaded = load_model(args.model, device=torch.device("cpu"), dtype="float32")
    decode = resolve_decode({}, loaded.decode_defaults)
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch_thread = TorchThread(threads)
        translator = Translator(loaded, decode, BatchingConfig())
        torch_thread.run(chunk_rate, translator, lines[: 50])  # warm-up
        file_rate = torch_thread.run(chunk_rate, translator, lines[: args.lines])
        engine = Engine(loaded, "xx", lambda _: None, queue_size=args.lines + 1, max_wait_s=args.batch_wait_ms / 1000,
                        torch_thread=torch_thread)
        engine.start()
        engine_latencies(engine, lines[:10])  # warm-up
        seconds = engine_latencies(engine, lines[100 : 100 + args.latency_requests])
        rate = engine_rate(engine, lines[: args.lines])
        engine.stop()
        torch_thread.stop()
        rows.append([threads, f"{percentile(seconds, 50) * 1000:.1f}", f"{percentile(seconds, 90) * 1000:.1f}",
                     f"{percentile(seconds, 99) * 1000:.1f}", f"{rate:.1f}", f"{file_rate:.1f}", f"{rate / file_rate:.2f}"])
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/serve_engine.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {lscpu_flags()}")
    print(f"Decoding: the model's own (beam {decode.beam_size}, length penalty {decode.length_penalty})\n")
    print(table(["threads", "1-sentence request p50 ms", "p90 ms", "p99 ms", f"{args.lines} one-sentence requests lines/s",
                 "one translate_chunk lines/s", "engine / chunk"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
