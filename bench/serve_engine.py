"""`tfm serve`'s engine alone, without HTTP: how long one request waits, and how many lines per second it
translates when requests of one sentence arrive together, beside `Translator.translate_chunk` on the
same lines in one call (what `tfm translate` does with a file).

In one process, the model loaded once (float32, CPU) on one thread, then for each --threads value, all
translating in one TorchThread with that many torch threads (as `tfm serve` runs, serving/torch_thread.py):
- latency: --latency-requests one-sentence requests one after another (nothing else queued): p50/p90/p99;
- throughput: the --lines sentences submitted at once as one-sentence requests (the queue large enough
  to take them all): lines/s, and the same lines through one translate_chunk call (the file's rate).
With --ct2 FOLDER (the same model, `tfm export --to ctranslate2`), CTranslate2 translates the latency
lines one at a time as well, with the model's beam, in a torch-free subprocess (CTranslate2 in a process
that has imported torch ran 1.4x slower on an AVX2 VM), with intra_threads = each --threads value and
inter_threads 1: what LibreTranslate and other CTranslate2 servers spend on one sentence, without HTTP.
Its length penalty is its own (length_penalty 1.0 in CTranslate2's formula), so the outputs can differ
in a few words; the table gives the mean output length of both.
Prints a markdown table with the date, the command and the `lscpu` flags. Nothing here is a test.

    python bench/serve_engine.py --model runs/multi30k-de-en/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de [--ct2 FOLDER]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import lscpu_model, percentile, table  # noqa: E402

from tfm_cli.allocator import keep_freed_memory  # noqa: E402
from tfm_cli.checkpoints.format import load_model, read_checkpoint  # noqa: E402
from tfm_cli.inference.translation import BatchingConfig, Translator, TranslationStats  # noqa: E402
from tfm_cli.inference.settings import resolve_decode  # noqa: E402
from tfm_cli.serving.engine import Engine, RequestSettings  # noqa: E402
from tfm_cli.serving.torch_thread import TorchThread  # noqa: E402


CTRANSLATE2_LATENCY = """
import json, sys, time, ctranslate2, sentencepiece
folder, spm_model, lines_file, beam, threads = sys.argv[1:]
tokenizer = sentencepiece.SentencePieceProcessor(model_file=spm_model)
translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=int(threads))
lines = json.load(open(lines_file, encoding="utf-8"))
def translate(line):
    pieces = tokenizer.encode(line, out_type=str) + ["</s>"]
    return translator.translate_batch([pieces], beam_size=int(beam), max_decoding_length=256)[0].hypotheses[0]
for line in lines["warm_up"]:
    translate(line)
seconds, tokens = [], 0
for line in lines["timed"]:
    started = time.perf_counter()
    tokens += len(translate(line))
    seconds.append(time.perf_counter() - started)
print(json.dumps({"seconds": seconds, "tokens": tokens}))
"""


def engine_latencies(engine: Engine, lines: list[str]) -> tuple[list[float], int]:
    """Seconds per one-sentence request, each sent when the one before is answered, and the output
    tokens of all answers."""
    seconds, tokens = [], 0
    for line in lines:
        started = time.perf_counter()
        answer = engine.submit(RequestSettings(), [line]).result()
        seconds.append(time.perf_counter() - started)
        tokens += sum(len(translated.outputs[0].ids) for translated in answer.lines if translated.outputs)
    return seconds, tokens


def ctranslate2_latencies(folder: Path, spm_model: Path, warm_up: list[str], timed: list[str], beam: int,
                          threads: int) -> tuple[list[float], int]:
    """Seconds per sentence of CTranslate2 (a torch-free subprocess) translating `timed` one at a time,
    and its output tokens (EOS excluded)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as lines_file:
        json.dump({"warm_up": warm_up, "timed": timed}, lines_file)
    result = subprocess.run([sys.executable, "-c", CTRANSLATE2_LATENCY, str(folder), str(spm_model), lines_file.name,
                             str(beam), str(threads)], capture_output=True, text=True, check=True)
    Path(lines_file.name).unlink()
    answer = json.loads(result.stdout)
    return answer["seconds"], answer["tokens"]


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


def latency_cells(seconds: list[float], tokens: int, sentences: int) -> list[str]:
    """p50, p90, p99 in ms and the mean output tokens per sentence, formatted for the table."""
    return [f"{percentile(seconds, q) * 1000:.1f}" for q in (50, 90, 99)] + [f"{tokens / sentences:.1f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a tfm checkpoint")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--threads", default="1,2", help="torch threads to try, comma-separated")
    parser.add_argument("--lines", type=int, default=500, help="sentences for the throughput rows")
    parser.add_argument("--latency-requests", type=int, default=100)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--ct2", type=Path, help="the same model for CTranslate2 (tfm export --to ctranslate2)")
    args = parser.parse_args()
    keep_freed_memory()
    lines = [line.rstrip("\n") for line in open(args.source, encoding="utf-8")]
    started = datetime.datetime.now(datetime.timezone.utc)
    torch.set_num_threads(1)  # the main thread starts no OpenMP team of its own (serving/torch_thread.py)
    loaded = load_model(args.model, device=torch.device("cpu"), dtype="float32")
    decode = resolve_decode({}, loaded.decode_defaults)
    timed = lines[100 : 100 + args.latency_requests]
    spm_model = None
    if args.ct2:
        spm_model = Path(tempfile.mkdtemp()) / "spm.model"
        spm_model.write_bytes(read_checkpoint(Path(args.model)).src_tokenizer_bytes)
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
        seconds, tokens = engine_latencies(engine, timed)
        rate = engine_rate(engine, lines[: args.lines])
        engine.stop()
        torch_thread.stop()
        rows.append(["tfm engine", threads, *latency_cells(seconds, tokens, len(timed)), f"{rate:.1f}", f"{file_rate:.1f}",
                     f"{rate / file_rate:.2f}"])
        if args.ct2:
            ct2_seconds, ct2_tokens = ctranslate2_latencies(args.ct2, spm_model, lines[:10], timed, decode.beam_size, threads)
            rows.append([f"CTranslate2 (intra_threads {threads})", threads, *latency_cells(ct2_seconds, ct2_tokens, len(timed)),
                         "", "", ""])
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/serve_engine.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {cpu_flags()}")
    print(f"Decoding: the model's own (beam {decode.beam_size}, length penalty {decode.length_penalty})\n")
    print(table(["engine", "threads", "1-sentence request p50 ms", "p90 ms", "p99 ms", "output tokens per sentence",
                 f"{args.lines} one-sentence requests lines/s", "one translate_chunk lines/s", "engine / chunk"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
