"""Before/after: tfm's search speed at two git revisions, on the same model and sentences, in one run.

Each revision is checked out once into a temporary git worktree; every timed run is a fresh
subprocess with that worktree first on PYTHONPATH (so it imports that revision's tfm_cli), and the
two revisions alternate, so a change in machine load hits both alike. Reported per beam: median
seconds, target tokens/s, the ratio after/before, and whether the outputs are identical.

Usage: python bench/ab_commits.py --before REV [--after HEAD] --model CKPT [--source FILE]
       [--lines 1000] [--beams 1,5] [--runs 3] [--threads 2] [--batch-size 32] [--dtype float32]
       [--whole-process ["MORE TRANSLATE OPTIONS"]]
The worker decodes batches of --batch-size sentences sorted by length with tfm_cli.inference.search
(greedy_search for beam 1, beam_search otherwise), default length limits, no length penalty.
With --whole-process each run is instead a whole `python -m tfm_cli translate` process (start to exit,
--beam, --dtype and the options given; the process set-up a user gets, its allocator settings
included), and the table adds its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


def worker(model_path: str, source: str, lines: int, beam: int, threads: int, batch_size: int, dtype: str) -> dict:
    """Decode the lines with the tfm_cli on sys.path; returns {seconds, tokens, outputs}."""
    import torch

    import tfm_cli
    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.config import DecodeConfig
    from tfm_cli.inference.search import beam_search, greedy_search

    torch.set_num_threads(threads)
    loaded = load_model(model_path, dtype=dtype)
    model, config = loaded.model, loaded.config
    text = Path(source).read_text(encoding="utf-8").splitlines()[:lines]
    ids = [loaded.src_tokenizer.encode_ids(line) + [config.eos_id] for line in text]
    order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    decode_config = DecodeConfig(beam_size=beam, length_penalty=0.0)

    def decode(batch: list[int]) -> list[list[int]]:
        width = max(len(ids[i]) for i in batch)
        src = torch.tensor([ids[i] + [config.pad_id] * (width - len(ids[i])) for i in batch], dtype=torch.long)
        if beam == 1:
            return [h.tokens for h in greedy_search(model, src)]
        return [hyps[0].tokens for hyps in beam_search(model, src, decode_config)]

    decode(batches[0])  # warm-up
    outputs: dict[int, list[int]] = {}
    start = time.perf_counter()
    for batch in batches:
        outputs.update(zip(batch, decode(batch)))
    seconds = time.perf_counter() - start
    tokens = sum(len(tokens) + 1 for tokens in outputs.values())
    return {"seconds": seconds, "tokens": tokens, "outputs": [outputs[i] for i in range(len(ids))],
            "imported_from": tfm_cli.__file__}


def run_at(worktree: Path, args: argparse.Namespace, beam: int) -> dict:
    """One timed worker run importing tfm_cli from `worktree`."""
    env = dict(os.environ, PYTHONPATH=str(worktree), OMP_NUM_THREADS=str(args.threads))
    request = json.dumps([str(args.model), str(args.source), args.lines, beam, args.threads, args.batch_size, args.dtype])
    done = subprocess.run([sys.executable, __file__, "--worker", request], env=env, check=True,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    result = json.loads(done.stdout)
    if not Path(result["imported_from"]).resolve().is_relative_to(worktree.resolve()):
        raise SystemExit(f"the worker imported {result['imported_from']}, not the worktree {worktree}")
    return result


def run_process_at(worktree: Path, args: argparse.Namespace, beam: int, source: Path, output: Path) -> dict:
    """One whole `tfm translate` process importing tfm_cli from `worktree`: {seconds, peak_mib, outputs}."""
    env = dict(os.environ, PYTHONPATH=str(worktree))
    command = [sys.executable, "-m", "tfm_cli", "translate", "-m", str(args.model), "-i", str(source), "-o", str(output),
               "--threads", str(args.threads), "-q", "--beam", str(beam), "--dtype", args.dtype,
               *shlex.split(args.whole_process)]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=tempfile.gettempdir(), stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[:8])}... failed:\n{process.stderr.read().decode()[-2000:]}")
    lines = output.read_text(encoding="utf-8").splitlines()
    return {"seconds": seconds, "peak_mib": usage.ru_maxrss / 1024, "tokens": len(lines), "outputs": lines}


def main() -> None:
    """Check out both revisions, alternate timed runs, print a Markdown table."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(*json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="float32", help="float32, bf16 or int8 (load_model's dtype)")
    parser.add_argument("--whole-process", nargs="?", const="", default=None,
                        help="time whole `tfm translate` processes, with these more options")
    args = parser.parse_args()
    args.model = args.model.resolve()
    args.source = args.source.resolve()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {}
        for name, rev in (("before", args.before), ("after", args.after)):
            trees[name] = Path(scratch) / name
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(trees[name]), rev],
                           check=True, capture_output=True)
        try:
            print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; before {args.before}, after {args.after}; "
                  f"{args.lines} lines of {args.source.name}; {args.dtype}; batch {args.batch_size}; {args.threads} threads; "
                  f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; median of {args.runs}")
            whole = args.whole_process is not None
            if whole:
                source = Path(scratch) / "source.txt"
                text = args.source.read_text(encoding="utf-8").splitlines()[: args.lines]
                source.write_text("\n".join(text) + "\n", encoding="utf-8")
                print(f"# whole processes: tfm translate --beam B --dtype {args.dtype} {args.whole_process}; tok/s = lines/s")
            print("| beam | before s | after s | before tok/s | after tok/s | after / before speed | identical outputs |"
                  + (" peak MiB before | after |" if whole else ""))
            print("|---|---|---|---|---|---|---|" + ("---|---|" if whole else ""))
            for beam in (int(b) for b in args.beams.split(",")):
                results: dict[str, list[dict]] = {"before": [], "after": []}
                for repeat in range(args.runs):
                    for name in ("before", "after"):
                        if whole:
                            result = run_process_at(trees[name], args, beam, source, Path(scratch) / f"{name}.txt")
                        else:
                            result = run_at(trees[name], args, beam)
                        results[name].append(result)
                        print(f"  beam {beam} {name} run {repeat + 1}: {result['seconds']:.2f} s", file=sys.stderr)
                median = {name: statistics.median(r["seconds"] for r in runs) for name, runs in results.items()}
                tokens = {name: runs[0]["tokens"] for name, runs in results.items()}
                same = results["before"][0]["outputs"] == results["after"][0]["outputs"]
                print(f"| {beam} | {median['before']:.2f} | {median['after']:.2f} | "
                      f"{tokens['before'] / median['before']:.0f} | {tokens['after'] / median['after']:.0f} | "
                      f"{median['before'] / median['after']:.2f}x | {'yes' if same else 'NO'} |"
                      + (f" {max(r['peak_mib'] for r in results['before']):.0f} | "
                         f"{max(r['peak_mib'] for r in results['after']):.0f} |" if whole else ""), flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


if __name__ == "__main__":
    main()
