"""Whole processes with decoding workers: `tfm translate --workers 2` against one process on 2 threads,
and CTranslate2 with its two ways of using 2 cores, start to finish, side by side in one run.

Engines (every one a fresh process, timed from start to exit, as whole_process.py times them):
  tfm               `tfm translate -m CKPT -i SOURCE -o OUT --threads 2` (one process, 2 threads)
  tfm --workers 2   the same with `--workers 2` (two forked one-thread processes search the batches)
  ct2 intra 2       the CTranslate2 script of whole_process.py: intra_threads 2, inter_threads 1
  ct2 inter 2       the same script with intra_threads 1, inter_threads 2 (two batches at a time)
all with --beam, --dtype / compute type, length penalty 0 and the same length limit; CTranslate2
takes batches of 32 sentences (translate_file's default), tfm its defaults (up to 128). Engines
alternate run by run; medians of --runs. Memory is measured in one more run of each engine, apart
from the timed ones (reading /proc slows the process it reads): the peak, over the run, of the summed
PSS of the process and its children (sampled every 20 ms from /proc/PID/smaps_rollup: shared pages
counted once in total, so forked workers are not counted twice), beside the largest single
process's peak RSS (getrusage). BLEU is sacrebleu's on the output files. Linux only (/proc).

Usage: python bench/decoding_workers.py --model CKPT [--runs 3] [--beams 5,1] [--dtypes float32,int8]
       [--policy PASSIVE|ACTIVE]   (OMP_WAIT_POLICY for every process; default: as inherited)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from translate_memory import export_ctranslate2  # noqa: E402
from whole_process import CTRANSLATE2, add_run_arguments, bleu, run_header  # noqa: E402

# Peak summed PSS of a process tree, sampled, plus the largest single process's ru_maxrss.
MEASURE_TREE = """
import json, os, resource, subprocess, sys, time

def tree(root):
    pids, parents = [root], {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    for pid in pids:
        pids += [child for child, parent in parents.items() if parent == pid]
    return pids

def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0

sample = sys.argv[1] == "sample"
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
peak = 0
while sample and child.poll() is None:
    peak = max(peak, sum(pss_kib(pid) for pid in tree(child.pid)))
    time.sleep(0.02)
child.wait()
seconds = time.perf_counter() - start
stderr = child.stderr.read()
if child.returncode != 0:
    sys.exit(stderr.decode(errors="replace"))
print(json.dumps({"seconds": seconds, "peak_pss_kib": peak,
                  "max_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

ENGINES = ("tfm", "tfm --workers 2", "ct2 intra 2", "ct2 inter 2")


def measure(command: list[str], env: dict[str, str], memory: bool = False) -> dict:
    """Run `command` under a fresh measuring process; returns {seconds, peak_pss_kib, max_rss_kib}
    (peak_pss_kib 0 unless `memory`: sampling it slows the command)."""
    result = subprocess.run([sys.executable, "-c", MEASURE_TREE, "sample" if memory else "time", *command],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"bench/decoding_workers.py: {' '.join(command[:4])}... failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def main() -> None:
    """Print a markdown table per beam and precision: wall time, speed against one tfm process, BLEU, memory."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, workdir=Path("/tmp/tfm-bench-workers"))
    args = parser.parse_args()
    env = dict(os.environ, **({"OMP_WAIT_POLICY": args.policy} if args.policy else {}))
    folders = export_ctranslate2(args.model, args.workdir)
    spm = args.workdir / "spm.model"

    def command(engine: str, output: Path, beam: str, dtype: str) -> list[str]:
        if engine.startswith("tfm"):
            return [*shlex.split(args.tfm), "translate", "-q", "-m", str(args.model), "-i", str(args.source), "-o", str(output),
                    "--threads", "2", "--beam", beam, "--length-penalty", "0", "--max-len-a", "0",
                    "--max-len-b", str(args.max_len_b), "--dtype", dtype] + (["--workers", "2"] if "workers" in engine else [])
        script = CTRANSLATE2
        if engine == "ct2 inter 2":
            script = script.replace("inter_threads=1, intra_threads=2", "inter_threads=2, intra_threads=1")
        return [sys.executable, "-c", script, str(folders[dtype]), str(spm), str(args.source), str(output),
                beam, "32", str(args.max_len_b + 1)]

    print(run_header(args, env))
    print("\n| beam | precision | engine | wall s | per run | vs tfm | vs ct2 intra 2 | BLEU | peak PSS of all "
          "its processes MiB (one more run) | largest process peak RSS MiB (same run) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for beam in args.beams.split(","):
        for dtype in args.dtypes.split(","):
            results = {engine: [] for engine in ENGINES}
            outputs = {engine: args.workdir / f"out-{engine.replace(' ', '_')}-{beam}-{dtype}.txt" for engine in ENGINES}
            for run in range(args.runs):
                order = ENGINES if run % 2 == 0 else tuple(reversed(ENGINES))
                for engine in order:
                    results[engine].append(measure(command(engine, outputs[engine], beam, dtype), env))
            memory = {engine: measure(command(engine, outputs[engine], beam, dtype), env, memory=True) for engine in ENGINES}
            seconds = {engine: statistics.median(r["seconds"] for r in runs) for engine, runs in results.items()}
            for engine, runs in results.items():
                times = [r["seconds"] for r in runs]
                print(f"| {beam} | {dtype} | {engine} | {seconds[engine]:.2f} | {min(times):.2f}-{max(times):.2f} | "
                      f"{seconds['tfm'] / seconds[engine]:.2f}x | **{seconds['ct2 intra 2'] / seconds[engine]:.2f}x** | "
                      f"{bleu(outputs[engine], args.reference):.2f} | "
                      f"{memory[engine]['peak_pss_kib'] / 1024:.0f} | {memory[engine]['max_rss_kib'] / 1024:.0f} |", flush=True)
            same = outputs["tfm"].read_bytes() == outputs["tfm --workers 2"].read_bytes()
            print(f"|  |  | tfm and tfm --workers 2 outputs {'byte-identical' if same else 'DIFFER'} |  |  |  |  |  |  |  |",
                  flush=True)


if __name__ == "__main__":
    main()
