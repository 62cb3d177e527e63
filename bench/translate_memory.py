"""Peak resident memory (RSS) of `tfm translate` on Multi30k test_2016_flickr.de, beside CTranslate2.

Each row is one fresh process whose peak RSS is read from getrusage(RUSAGE_CHILDREN) in a
dedicated parent (so only that one child counts):
Beside peak RSS, the peak of the child's RssAnon (its private, anonymous memory: heap, tensors),
sampled every 20 ms from /proc: RSS also counts the pages of shared libraries it maps (torch's
are ~200 MiB), which every process on the machine shares.
  python + torch import     the floor every torch program pays
  python + ctranslate2 import  CTranslate2's floor (with sentencepiece)
  tfm translate             the real CLI: -i the 1000-line file, -o /dev/null, --threads 2, each
                            --dtype and --batch-size given
  ctranslate2 float32/int8  a Python process that tokenizes the same lines with the checkpoint's
                            sentencepiece model and translates them with ctranslate2.Translator
                            (`tfm export --to ctranslate2`), 2 intra-op threads, max_batch_size as
                            the tfm row (32 is CTranslate2's translate_file default), detokenizes
Every row decodes with the same beam and the same length limit (at most --max-len-b tokens + EOS).
The checkpoint file size is printed for scale.

Usage: python bench/translate_memory.py [--model CKPT] [--beams 5] [--dtypes float32,int8,bf16] [--batch-sizes 128,32]
Without --model, the random Multi30k-size model of bench/bench_model.py, which decodes every line
to the length limit; the limit is fixed at --max-len-b 23 tokens + EOS (--max-len-a 0), as in
translate_vs_peers.py, so that the run ends in minutes on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MULTI30K = BENCH_DIR.parents[1] / "shared" / "data" / "multi30k"

MEASURE = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
peak_anon = 0
while child.poll() is None:
    try:
        with open(f"/proc/{child.pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    peak_anon = max(peak_anon, int(line.split()[1]))
    except OSError:
        pass
    time.sleep(0.02)
seconds = time.perf_counter() - start
if child.returncode != 0:
    sys.exit(child.stderr.read().decode(errors="replace"))
print(json.dumps({"max_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "anon_kib": peak_anon,
                  "seconds": seconds}))
"""

CTRANSLATE2 = """
import sys, ctranslate2, sentencepiece
folder, spm_model, source, beam, batch_size, max_length = sys.argv[1:]
tokenizer = sentencepiece.SentencePieceProcessor(model_file=spm_model)
translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=2)
lines = open(source, encoding="utf-8").read().splitlines()
results = translator.translate_batch(
    [tokenizer.encode(line, out_type=str) + ["</s>"] for line in lines], beam_size=int(beam),
    max_batch_size=int(batch_size), max_decoding_length=int(max_length), length_penalty=0.0,
)
outputs = [tokenizer.decode(result.hypotheses[0]) for result in results]
"""


def peak_rss(command: list[str]) -> dict:
    """Run `command` as the only child of a fresh measuring process; returns {max_rss_kib, anon_kib, seconds}."""
    result = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def export_ctranslate2(checkpoint: Path, workdir: Path) -> dict[str, Path]:
    """`tfm export --to ctranslate2` in float32 and int8 into workdir, plus the source sentencepiece model.

    Returns {precision: model folder}.
    """
    import shutil

    from tfm_cli.checkpoints.format import read_checkpoint

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spm.model").write_bytes(read_checkpoint(checkpoint).src_tokenizer_bytes)
    folders = {}
    for precision in ("float32", "int8"):
        folder = workdir / f"memory-ct2-{precision}"
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "tfm_cli", "export", "-q", "-m", str(checkpoint), "--to", "ctranslate2",
                        "--quantization", precision, str(folder)], check=True)
        folders[precision] = folder
    return folders


def main() -> None:
    """Print a markdown table of peak RSS per command."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="tfm checkpoint; default: a random Multi30k-size model")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--beams", default="5")
    parser.add_argument("--dtypes", default="float32,int8,bf16", help="tfm translate --dtype values")
    parser.add_argument("--batch-sizes", default="128,32", help="tfm --batch-size and CTranslate2 max_batch_size values")
    parser.add_argument("--max-len-b", type=int, default=23, help="output length limit (as translate_vs_peers: 24 steps)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-translate"))
    args = parser.parse_args()
    checkpoint = args.model
    if checkpoint is None:
        sys.path.insert(0, str(BENCH_DIR))
        from bench_model import make_bench_checkpoint

        checkpoint = args.workdir / "random.safetensors"
        if not checkpoint.is_file():
            make_bench_checkpoint(checkpoint)
    tfm = [
        sys.executable, "-m", "tfm_cli", "translate", "-m", str(checkpoint), "-i", str(args.source), "-o", "/dev/null",
        "--threads", "2", "--max-len-a", "0", "--max-len-b", str(args.max_len_b),
    ]
    ct2_folders = export_ctranslate2(checkpoint, args.workdir)
    rows = [("python + `import torch`", [sys.executable, "-c", "import torch"]),
            ("python + `import ctranslate2, sentencepiece`", [sys.executable, "-c", "import ctranslate2, sentencepiece"])]
    for beam in args.beams.split(","):
        for batch_size in args.batch_sizes.split(","):
            for dtype in args.dtypes.split(","):
                rows.append((f"tfm translate --beam {beam} --batch-size {batch_size} --dtype {dtype}",
                             [*tfm, "--beam", beam, "--batch-size", batch_size, "--dtype", dtype]))
            for precision, folder in ct2_folders.items():
                command = [sys.executable, "-c", CTRANSLATE2, str(folder), str(args.workdir / "spm.model"),
                           str(args.source), beam, batch_size, str(args.max_len_b + 1)]
                rows.append((f"ctranslate2 {precision}, beam {beam}, max_batch_size {batch_size}", command))
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; model {checkpoint} "
          f"({checkpoint.stat().st_size / 2**20:.1f} MiB); input {args.source}")
    print("| process | peak RSS (MiB) | peak anonymous (MiB, sampled) | wall time (s) |")
    print("|---|---|---|---|")
    for name, command in rows:
        measured = peak_rss(command)
        print(f"| {name} | {measured['max_rss_kib'] / 1024:.0f} | {measured['anon_kib'] / 1024:.0f} | "
              f"{measured['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
