"""Corpora of real size: memory and time of preparing 1M-10M synthetic pairs for `tfm train`, beside
sentencepiece's own encode; then a first update and a resume on the prepared cache, and the memory of
4 torchrun ranks sharing it.

Each part prints a markdown table on stdout (progress goes to stderr):
  corpus    N pairs, each 2 random Multi30k training pairs joined by a space and lightly perturbed
            (seeded); written under --work, never in the repository; not a result
  prepare   `tfm train --prepare-only`, a fresh process per size: (a) the run trains its tokenizer,
            (b) the tokenizer is given (`tfm tokenize train` once, up front, on the largest corpus)
  spm       sentencepiece's encode of the same files with the same model and threads; the ratio
            of tfm's tokenizing time to it
  first     a new run on the largest prepared cache (max_steps 1), then a --resume to step 2
  ranks     torchrun with 4 ranks against 1 process on the same cache: max RSS, PSS, private memory

Every measured command runs as the only child of a small measuring process (this file, --measure):
wall time, CPU time and peak RSS come from os.wait4 on that child. A child's peak RSS starts from its
parent's at the fork, exec or not (/bin/true under a 500 MiB parent: 511 MiB), so measuring from this
bigger process would overstate small children.

Usage: python bench/prepare_corpus.py [--sizes 1000000,3000000,10000000] [--work /tmp/tfm-bench-corpus]
       python bench/prepare_corpus.py --make-corpus --sizes 1000000,3000000,10000000   (only write it)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
MULTI30K = Path(os.environ.get("MULTI30K_DIR") or REPO.parent / "shared" / "data" / "multi30k")
CHUNK_LINES = 100_000  # lines written (corpus) or encoded (spm baseline) at a time
CORPUS_VERSION = 1  # bump when the generator changes, so old corpora are not reused
SAMPLE_SECONDS = 0.5
MIB = 1024  # KiB per MiB

RECIPE = """\
# Written by bench/prepare_corpus.py. A tiny model, so that preparing the data is what costs; every
# command sets data.train_src / data.train_tgt (and data.cache_dir) with --set.
[data]
train_src = {valid_src}
train_tgt = {valid_tgt}
valid_src = {valid_src}
valid_tgt = {valid_tgt}
max_length = 256

[tokenizer]                    # no src_model: the run trains a joint model (variant a)
vocab_size = 8000
model_type = "unigram"
joint = true

[model]
d_model = 64
n_heads = 2
d_ff = 128
n_enc_layers = 1
n_dec_layers = 1
share_embeddings = true
max_positions = 256

[train]
max_tokens = 4096
max_steps = 1                  # a limit every run needs; the training commands set their own
valid_bleu = false             # validation at the end of a run: the loss only, no decoding ...
best_metric = "loss"           # ... so checkpoint_best follows the loss
"""


# -- the machine ---------------------------------------------------------------------------------


def cpu_flags() -> str:
    """The vector extensions lscpu lists, as `avx2 yes, avx512f no, ...` (amx: the amx_* flags present)."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "lscpu unavailable"
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("Flags:")), [])
    shown = [f"{name} {'yes' if name in flags else 'no'}" for name in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_vp2intersect")]
    amx = [flag for flag in flags if flag.startswith("amx")]
    return ", ".join(shown + [f"amx {' '.join(amx) if amx else 'no'}"])


def memory_gib() -> float:
    """Total memory of the machine in GiB (MemTotal of /proc/meminfo)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def versions() -> str:
    """python, torch and sentencepiece versions, read in a subprocess (this process stays small)."""
    code = "import sys, torch, sentencepiece as s; print(sys.version.split()[0], torch.__version__, s.__version__)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    python, torch, spm = found.split()
    return f"python {python}, torch {torch}, sentencepiece {spm}"


# -- the corpus ----------------------------------------------------------------------------------


def corpus_paths(folder: Path, size: int) -> tuple[Path, Path]:
    """The (source, target) files of the corpus of `size` pairs."""
    return folder / f"train-{size}.de", folder / f"train-{size}.en"


def read_words(path: Path) -> list[list[str]]:
    """Each line of a text file split into words."""
    with path.open(encoding="utf-8") as lines:
        return [line.split() for line in lines]


def perturb(words: list[str], rng: random.Random) -> list[str]:
    """`words` with one edit at a random place: drop a word, repeat a word, or swap two neighbours."""
    if len(words) < 2:
        return words
    edit, place = rng.randrange(3), rng.randrange(len(words) - 1)
    if edit == 0:
        del words[place]
    elif edit == 1:
        words.insert(place, words[place])
    else:
        words[place], words[place + 1] = words[place + 1], words[place]
    return words


def generate_lines(multi30k: Path, count: int, seed: int) -> Iterator[tuple[list[str], list[str]]]:
    """Chunks of (source lines, target lines), `count` pairs in all: each pair is two random Multi30k
    training pairs (the same two on both sides) joined by a space, each side then perturbed on its own."""
    src_words, tgt_words = read_words(multi30k / "train.de"), read_words(multi30k / "train.en")
    rng = random.Random(seed)
    n = len(src_words)
    for start in range(0, count, CHUNK_LINES):
        src_lines, tgt_lines = [], []
        for _ in range(min(CHUNK_LINES, count - start)):
            first, second = rng.randrange(n), rng.randrange(n)
            src_lines.append(" ".join(perturb(src_words[first] + src_words[second], rng)))
            tgt_lines.append(" ".join(perturb(tgt_words[first] + tgt_words[second], rng)))
        yield src_lines, tgt_lines


def write_corpus(multi30k: Path, folder: Path, sizes: list[int], seed: int) -> float:
    """Write train-N.de/.en for every size in one pass (each smaller file is a prefix of the largest),
    val.de/.en (Multi30k's) and manifest.json. Returns the seconds it took."""
    start = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").unlink(missing_ok=True)
    outputs = {size: [path.open("w", encoding="utf-8") for path in corpus_paths(folder, size)] for size in sizes}
    written = 0
    for src_lines, tgt_lines in generate_lines(multi30k, max(sizes), seed):
        for size, files in outputs.items():
            keep = max(0, min(len(src_lines), size - written))
            for file, lines in zip(files, (src_lines, tgt_lines)):
                if keep:
                    file.write("\n".join(lines[:keep]) + "\n")
        written += len(src_lines)
        if written % 1_000_000 == 0:
            progress(f"corpus: {written:,} of {max(sizes):,} pairs")
    for files in outputs.values():
        for file in files:
            file.close()
    for side in ("de", "en"):
        shutil.copyfile(multi30k / f"val.{side}", folder / f"val.{side}")
    manifest = {"version": CORPUS_VERSION, "seed": seed, "sizes": sorted(sizes), "multi30k": str(multi30k)}
    (folder / "manifest.json").write_text(json.dumps(manifest) + "\n")
    return time.perf_counter() - start


def corpus_ready(folder: Path, sizes: list[int], seed: int) -> bool:
    """Whether manifest.json says a finished corpus of this generator and seed holds every size."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        manifest.get("version") == CORPUS_VERSION and manifest.get("seed") == seed
        and set(sizes) <= set(manifest.get("sizes", []))
        and all(path.is_file() for size in sizes for path in corpus_paths(folder, size))
    )


def read_through(paths: list[Path]) -> None:
    """Read files once, so every measured process finds them in the page cache alike."""
    for path in paths:
        with path.open("rb") as file:
            while file.read(16 * 2**20):
                pass


# -- measuring a process (runs in the small measuring process) -----------------------------------


def smaps(pid: int) -> dict[str, int] | None:
    """{rss, pss, private} in KiB from /proc/PID/smaps_rollup, or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            fields[parts[0][:-1]] = int(parts[1])
    if "Rss" not in fields:
        return None
    return {"rss": fields["Rss"], "pss": fields["Pss"], "private": fields["Private_Clean"] + fields["Private_Dirty"]}


def descendants(root: int) -> list[int]:
    """The pids of every live process below `root` (parents read from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name in parentheses may hold spaces: the parent pid is the 2nd field after it.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def rank_of(pid: int) -> str | None:
    """The RANK torchrun gave the process (its environment), or None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((item[5:].decode() for item in environ if item.startswith(b"RANK=")), None)


def sample_memory(root: int, ranks: bool) -> dict[str, dict[str, int]]:
    """{name: smaps} now: the torchrun workers below `root` by rank if `ranks`, else `root` itself as "0"."""
    pids = {rank: pid for pid in descendants(root) if (rank := rank_of(pid)) is not None} if ranks else {"0": root}
    sampled = {rank: smaps(pid) for rank, pid in pids.items()}
    return {rank: memory for rank, memory in sampled.items() if memory is not None}


def measure_child(argv: list[str]) -> None:
    """--measure {none|self|ranks} LOG_PREFIX -- COMMAND...: run COMMAND (stdout and stderr to
    LOG_PREFIX.out/.err) and print one JSON line: exit, seconds, cpu_seconds, max_rss_kib (wait4), and
    with self/ranks the maxima of /proc smaps sampled every SAMPLE_SECONDS (per process, and of the sums)."""
    mode, prefix, separator, *command = argv
    assert separator == "--" and mode in ("none", "self", "ranks"), argv
    peaks: dict[str, dict[str, int]] = {}
    totals = {"rss": 0, "pss": 0, "private": 0}
    start = next_sample = time.perf_counter()
    with open(f"{prefix}.out", "wb") as out, open(f"{prefix}.err", "wb") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err)
        while True:
            pid, status, usage = os.wait4(process.pid, 0 if mode == "none" else os.WNOHANG)
            if pid:
                break
            time.sleep(0.02)  # polls often, so the wall time ends within 20 ms of the exit
            if time.perf_counter() < next_sample:
                continue
            next_sample += SAMPLE_SECONDS
            now = sample_memory(process.pid, mode == "ranks")
            for rank, memory in now.items():
                peak = peaks.setdefault(rank, dict.fromkeys(memory, 0))
                for key, value in memory.items():
                    peak[key] = max(peak[key], value)
            for key, value in totals.items():
                totals[key] = max(value, sum(memory[key] for memory in now.values()))
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4 already
    result = {
        "exit": process.returncode, "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_kib": usage.ru_maxrss,
    }
    if mode != "none":
        result |= {"peaks": dict(sorted(peaks.items(), key=lambda item: int(item[0]))), "totals": totals}
    print(json.dumps(result))


def spm_encode(argv: list[str]) -> None:
    """--spm-encode MODEL THREADS FILE...: encode each file CHUNK_LINES lines at a time with
    sentencepiece, discarding the ids; print JSON {seconds (after loading the model), lines, tokens}."""
    import sentencepiece as spm

    model, threads, *paths = argv
    processor = spm.SentencePieceProcessor(model_file=model)
    start = time.perf_counter()
    lines, tokens = [], []
    for path in paths:
        lines.append(0)
        tokens.append(0)
        with open(path, encoding="utf-8") as file:
            while chunk := [line.rstrip("\n") for _, line in zip(range(CHUNK_LINES), file)]:
                ids = processor.encode(chunk, out_type=int, num_threads=int(threads))
                lines[-1] += len(chunk)
                tokens[-1] += sum(map(len, ids))
    print(json.dumps({"seconds": time.perf_counter() - start, "lines": lines, "tokens": tokens}))


def map_entry(argv: list[str]) -> None:
    """--map-entry ENTRY HOLD_SECONDS: map a prepared cache entry the way `tfm train` does
    (corpus/entry.read_entry), read every token of it, wait HOLD_SECONDS (so that the other readers
    have mapped it too), print one JSON line of /proc/self/smaps_rollup figures in KiB, and wait again
    (so that it is still mapped while the others read theirs)."""
    from tfm_cli.corpus.cache_folder import read_manifest
    from tfm_cli.corpus.entry import read_entry

    entry, hold = Path(argv[0]), float(argv[1])
    corpus = read_entry(entry, read_manifest(entry), 1 << 30, 1 << 30, check_tokens=False)
    touched = int(corpus.src_tokens.sum()) + int(corpus.tgt_tokens.sum())  # every page of both sides
    time.sleep(hold)
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            fields[parts[0][:-1]] = int(parts[1])
    print(json.dumps({"rss": fields["Rss"], "pss": fields["Pss"], "shared": fields["Shared_Clean"],
                      "private": fields["Private_Clean"] + fields["Private_Dirty"], "touched": touched > 0}), flush=True)
    time.sleep(hold)  # stay mapped while the others read their figures


ENTRY_POINTS = {"--measure": measure_child, "--spm-encode": spm_encode, "--map-entry": map_entry}


# -- running the commands (in this process) -------------------------------------------------------


class Bench:
    """The work folder, the commands run so far, and how to measure one more."""

    def __init__(self, work: Path, threads: int) -> None:
        self.work = work
        self.threads = threads
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.commands: list[tuple[str, list[str]]] = []

    def measure(self, name: str, command: list[str], sample: str = "none", cache: Path | None = None) -> dict:
        """Run `command` under --measure; returns its JSON result plus `name`, `error` (what stderr names)
        when it failed, and `cache_writes` (files the command added or changed under `cache`) if given."""
        self.commands.append((name, command))
        before = files_under(cache) if cache is not None else {}
        prefix = self.logs / name
        helper = [sys.executable, str(Path(__file__).resolve()), "--measure", sample, str(prefix), "--", *command]
        result = json.loads(subprocess.run(helper, capture_output=True, text=True, check=True).stdout)
        result["name"] = name
        if cache is not None:
            after = files_under(cache)
            result["cache_writes"] = sum(after[path] != before.get(path) for path in after)
        if result["exit"] != 0:
            result["error"] = last_message(Path(f"{prefix}.err"))
            progress(f"{name}: FAILED (exit {result['exit']}): {result['error']}; log {prefix}.err")
        else:
            progress(f"{name}: {result['seconds']:.1f} s, peak RSS {result['max_rss_kib'] / MIB:,.0f} MiB")
        return result

    def tfm(self, *args: str) -> list[str]:
        """The command line of `tfm ARGS` (this interpreter's tfm_cli)."""
        return [sys.executable, "-m", "tfm_cli", *args]

    def run_dir(self, name: str) -> Path:
        """An empty run folder work/runs/NAME (an old one is removed)."""
        path = self.work / "runs" / name
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def files_under(folder: Path) -> dict[Path, tuple[int, int]]:
    """{path: (size, mtime in ns)} of every file below `folder` (none if it does not exist)."""
    stats = {path: path.stat() for path in folder.rglob("*") if path.is_file()}
    return {path: (stat.st_size, stat.st_mtime_ns) for path, stat in stats.items()}


def last_message(path: Path) -> str:
    """The error a failed command's stderr names: its first `error: ...` line (tfm's own) or
    `SomeError: ...` line (a traceback's, under torchrun the first rank's), else the last line with
    text; without rich's box drawing, at most 200 characters."""
    lines = [line.strip("│╭╮╰╯─═= \t") for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if re.match(r"(error|[\w.]*(error|exception)): ", line, re.IGNORECASE)]
    if errors:
        return errors[0][:200]
    return lines[-1][:200] if lines else "(nothing on stderr)"


def data_settings(corpus: tuple[Path, Path], cache: Path, tokenizer: Path | None) -> list[str]:
    """--set options for the training files, the cache folder and (variant b) the given tokenizer."""
    settings = [f"data.train_src={corpus[0]}", f"data.train_tgt={corpus[1]}", f"data.cache_dir={cache}"]
    if tokenizer is not None:
        settings.append(f"tokenizer.src_model={tokenizer}")
    return [option for setting in settings for option in ("--set", setting)]


def mib(result: dict, key: str = "max_rss_kib") -> str:
    """A KiB figure of a result in MiB, or `-` for a failed one."""
    return f"{result[key] / MIB:,.0f}" if result["exit"] == 0 else "-"


def seconds(result: dict, key: str = "seconds") -> str:
    """A time of a result in seconds, or `-` for a failed one."""
    return f"{result[key]:.1f}" if result["exit"] == 0 else "-"


def figures(result: dict) -> list[str]:
    """[wall s, CPU s, peak RSS MiB] of a result, or [the failure, -, -]."""
    if result["exit"] != 0:
        return [failure(result), "-", "-"]
    return [seconds(result), seconds(result, "cpu_seconds"), mib(result)]


def failure(result: dict) -> str:
    """What failed, for the first figure of a table row: `failed (exit N): error` (`|` escaped)."""
    return f"failed (exit {result['exit']}): {result['error']}".replace("|", "\\|")


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A markdown table under a `## title` line, on stdout."""
    print(f"\n## {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.stdout.flush()


def progress(message: str) -> None:
    """One line for the people watching, on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the parts ------------------------------------------------------------------------------------


def prepare(
    bench: Bench, recipe: Path, files: tuple[Path, Path], tokenizer: Path | None, name: str
) -> tuple[Path, dict]:
    """`tfm train --prepare-only` on `files` into an emptied cache folder work/cache/NAME, training its
    tokenizer when `tokenizer` is None; returns (the cache folder, the measured result)."""
    cache = bench.work / "cache" / name
    shutil.rmtree(cache, ignore_errors=True)
    read_through(list(files))
    command = bench.tfm(
        "train", str(recipe), "--run", str(bench.run_dir(f"prepare-{name}")), "--prepare-only",
        *data_settings(files, cache, tokenizer), "--threads", str(bench.threads), "-q",
    )
    return cache, bench.measure(f"prepare-{name}", command)


def prepare_and_encode(bench: Bench, recipe: Path, corpus: Path, sizes: list[int], tokenizer: Path) -> dict[int, Path]:
    """Parts 2 and 3: per size, `--prepare-only` training its tokenizer (a), with `tokenizer` given (b),
    and the sentencepiece baseline. Prints both tables; returns {size: cache folder of (b)}."""
    imports = "import torch, sentencepiece, safetensors.torch, tfm_cli.cli"
    floor = bench.measure("floor", [sys.executable, "-c", imports])
    prepare_rows = [["-", "python + import torch, sentencepiece, tfm_cli (floor)", *figures(floor)]]
    spm_rows, caches = [], {}
    for size in sizes:
        files = corpus_paths(corpus, size)
        cache, trains = prepare(bench, recipe, files, None, f"{size}-a")
        shutil.rmtree(cache, ignore_errors=True)  # only (b)'s cache is used later
        caches[size], given = prepare(bench, recipe, files, tokenizer, f"{size}-b")
        for what, result in (("(a) trains its tokenizer", trains), ("(b) tokenizer given", given)):
            prepare_rows.append([f"{size:,}", what, *figures(result)])
        read_through(list(files))
        spm = bench.measure(f"spm-{size}", [sys.executable, str(Path(__file__).resolve()), "--spm-encode",
                                            str(tokenizer), str(bench.threads), *map(str, files)])
        spm_rows.append(spm_row(bench, size, spm, given, floor))
    print_table("Preparation: `tfm train --prepare-only`, one fresh process each",
                ["pairs", "process", "wall s", "CPU s", "peak RSS MiB"], prepare_rows)
    print_table(f"Baseline: sentencepiece encode of the same files, {bench.threads} threads",
                ["pairs", "spm wall s", "spm encode s", "spm peak RSS MiB", "tokens/line de / en",
                 "tfm (b) - floor s", "tfm / spm"], spm_rows)
    return caches


def spm_row(bench: Bench, size: int, spm: dict, prepared: dict, floor: dict) -> list[str]:
    """A row of the baseline table: spm's figures, and tfm's (b) time less the import floor against
    spm's in-process encode time (reading the files included in both)."""
    if spm["exit"] != 0:
        return [f"{size:,}", failure(spm), "-", "-", "-", "-", "-"]
    encoded = json.loads((bench.logs / f"spm-{size}.out").read_text())
    tokens = " / ".join(f"{t / n:.1f}" for t, n in zip(encoded["tokens"], encoded["lines"]))
    if prepared["exit"] != 0 or floor["exit"] != 0:
        return [f"{size:,}", seconds(spm), f"{encoded['seconds']:.1f}", mib(spm), tokens, "-", "-"]
    tfm_seconds = prepared["seconds"] - floor["seconds"]
    return [f"{size:,}", seconds(spm), f"{encoded['seconds']:.1f}", mib(spm), tokens, f"{tfm_seconds:.1f}",
            f"{tfm_seconds / encoded['seconds']:.2f}"]


def first_update(bench: Bench, recipe: Path, files: tuple[Path, Path], cache: Path, tokenizer: Path) -> None:
    """Part 4: a new run on the prepared cache to step 1, then --resume to step 2; prints the table."""
    run = bench.run_dir("first-update")
    first = bench.measure("first-update", bench.tfm(
        "train", str(recipe), "--run", str(run), *data_settings(files, cache, tokenizer),
        "--set", "train.max_steps=1", "--set", "train.valid_every=1000000", "--threads", str(bench.threads),
        "--device", "cpu", "-q",
    ), cache=cache)
    resumed = bench.measure("resume", bench.tfm(
        "train", "--run", str(run), "--resume", "--set", "train.max_steps=2", "--threads", str(bench.threads),
        "--device", "cpu", "-q",
    ), cache=cache)
    rows = [[what, *figures(result), str(result["cache_writes"])]
            for what, result in (("new run, max_steps 1", first), ("--resume, max_steps 2", resumed))]
    print_table(f"First update on the prepared cache ({files[0].name}; the end-of-run validation loss and "
                "checkpoint included)", ["run", "wall s", "CPU s", "peak RSS MiB", "files written to the cache"], rows)


def ranks_memory(
    bench: Bench, recipe: Path, files: tuple[Path, Path], cache: Path, tokenizer: Path, ranks: int
) -> None:
    """Part 5: `ranks` torchrun workers against one process, 20 steps on the prepared cache, smaps
    sampled every SAMPLE_SECONDS; prints per-rank maxima, totals and the PSS ratio."""
    train = ["train", str(recipe), "--run-dir", "RUN", *data_settings(files, cache, tokenizer),
             "--set", "train.max_steps=20", "--set", "train.valid_every=1000000", "--device", "cpu", "--threads", "1",
             "-q"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), "-m",
                "tfm_cli"]
    results = {}
    for name, launcher, sample in ((f"{ranks} ranks", torchrun, "ranks"), ("1 process", bench.tfm(), "self")):
        run = bench.run_dir(name.replace(" ", "-"))
        command = launcher + [str(run) if arg == "RUN" else arg for arg in train]
        results[name] = bench.measure(name.replace(" ", "-"), command, sample, cache)
    rows = []
    for name, result in results.items():
        if result["exit"] != 0:
            rows.append([name, "-", failure(result), "-", "-", "-", "-"])
            continue
        for rank, peak in result["peaks"].items():
            rows.append([name, rank, "", f"{peak['rss'] / MIB:,.0f}", f"{peak['pss'] / MIB:,.0f}",
                         f"{peak['private'] / MIB:,.0f}", ""])
        totals = result["totals"]
        rows.append([name, "total", seconds(result), f"{totals['rss'] / MIB:,.0f}", f"{totals['pss'] / MIB:,.0f}",
                     f"{totals['private'] / MIB:,.0f}", mib(result)])
    print_table(f"Memory of {ranks} torchrun ranks against 1 process ({files[0].name}, 20 steps, sampled every "
                f"{SAMPLE_SECONDS} s)", ["processes", "rank", "wall s", "max RSS MiB", "max PSS MiB",
                                         "max private MiB", "wait4 peak RSS MiB"], rows)
    many, one = results[f"{ranks} ranks"], results["1 process"]
    if many["exit"] == 0 and one["exit"] == 0 and one["totals"]["pss"]:
        print(f"\ntotal PSS, {ranks} ranks / 1 process: {many['totals']['pss'] / one['totals']['pss']:.2f}; files "
              f"written to the cache: {many['cache_writes']} ({ranks} ranks), {one['cache_writes']} (1 process)")


def mapped_memory(cache: Path, readers: int) -> None:
    """Part 6: `readers` processes map the same prepared entry and read all of it at once, against one
    process alone: the entry is one copy in the page cache, so total PSS grows by the per-process floor only."""
    (entry,) = [path for path in cache.iterdir() if path.is_dir() and path.name.startswith("train-")]
    size = sum(path.stat().st_size for path in entry.iterdir()) / 2**20
    rows, totals = [], {}
    for count in (1, readers):
        processes = [subprocess.Popen([sys.executable, __file__, "--map-entry", str(entry), "8"],
                                      stdout=subprocess.PIPE, text=True) for _ in range(count)]
        figures_of = [json.loads(process.communicate()[0]) for process in processes]
        for index, item in enumerate(figures_of):
            rows.append([str(count), str(index), *(f"{item[key] / MIB:,.0f}" for key in ("rss", "pss", "shared", "private"))])
        totals[count] = sum(item["pss"] for item in figures_of)
        rows.append([str(count), "total", f"{sum(item['rss'] for item in figures_of) / MIB:,.0f}",
                     f"{totals[count] / MIB:,.0f}", "", ""])
    print_table(f"One copy: processes mapping the prepared entry {entry.name} ({size:,.0f} MiB) and reading all of it",
                ["processes", "process", "RSS MiB", "PSS MiB", "shared MiB", "private MiB"], rows)
    print(f"\ntotal PSS, {readers} processes / 1 process: {totals[readers] / totals[1]:.2f}")


# -- main ------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,3000000,10000000", help="corpus sizes in pairs, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tfm-bench-corpus"),
                        help="work folder: corpus, tokenizer, caches, runs, logs (never inside the repository)")
    parser.add_argument("--multi30k", type=Path, default=MULTI30K, help="folder with train.de/en and val.de/en")
    parser.add_argument("--seed", type=int, default=1, help="seed of the corpus generator")
    parser.add_argument("--threads", type=int, default=2, help="--threads of tfm, num_threads of sentencepiece")
    parser.add_argument("--ranks", type=int, default=4, help="torchrun workers (--nproc_per_node)")
    parser.add_argument("--ranks-size", type=int, default=3_000_000, help="corpus size of the torchrun part")
    parser.add_argument("--make-corpus", action="store_true", help="(re)write the corpus, then stop")
    parser.add_argument("--skip-generate", action="store_true", help="use the corpus already in --work")
    parser.add_argument("--skip-first-update", action="store_true", help="no first-update/resume part")
    parser.add_argument("--skip-ranks", action="store_true", help="no torchrun part")
    args = parser.parse_args()
    args.sizes = sorted(int(size) for size in args.sizes.split(","))
    args.work = args.work.resolve()
    if args.work == REPO or REPO in args.work.parents:
        parser.error(f"--work {args.work} is inside the repository; choose a folder outside it")
    return args


def main() -> None:
    """Write (or reuse) the corpus, then run and print every part."""
    args = parse_args()
    corpus = args.work / "corpus"
    all_sizes = sorted(set(args.sizes) | ({args.ranks_size} if not args.skip_ranks else set()))
    print(f"# prepare_corpus.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"CPU: {os.cpu_count()} cores, {memory_gib():.0f} GiB; {cpu_flags()}; {versions()}; threads {args.threads}")
    if args.make_corpus or not (args.skip_generate or corpus_ready(corpus, all_sizes, args.seed)):
        progress(f"writing the corpus ({', '.join(f'{size:,}' for size in all_sizes)} pairs) to {corpus}")
        took = write_corpus(args.multi30k, corpus, all_sizes, args.seed)
        progress(f"corpus written in {took:.0f} s")
    elif not corpus_ready(corpus, all_sizes, args.seed):
        sys.exit(f"--skip-generate: no finished corpus of seed {args.seed} with sizes {all_sizes} in {corpus}")
    print_table(f"Corpus: 2 random Multi30k training pairs per line, one seeded edit per side (seed {args.seed})",
                ["pairs", "source file", "MiB de + en"],
                [[f"{size:,}", str(corpus_paths(corpus, size)[0]),
                  f"{sum(path.stat().st_size for path in corpus_paths(corpus, size)) / 2**20:,.0f}"]
                 for size in all_sizes])
    if args.make_corpus:
        return
    bench = Bench(args.work, args.threads)
    recipe = args.work / "recipe.toml"
    recipe.write_text(RECIPE.format(valid_src=json.dumps(str(corpus / "val.de")),
                                    valid_tgt=json.dumps(str(corpus / "val.en"))))
    spm_folder = args.work / "spm"
    spm_folder.mkdir(exist_ok=True)
    largest = corpus_paths(corpus, max(all_sizes))
    trained = bench.measure("tokenize-train", bench.tfm("tokenize", "train", *map(str, largest),
                                                        "-o", str(spm_folder / "spm"), "--vocab-size", "8000", "-q"))
    print_table(f"The given tokenizer (b): `tfm tokenize train` once, on {largest[0].name} + {largest[1].name}",
                ["process", "wall s", "CPU s", "peak RSS MiB"],
                [["tfm tokenize train (default sample of 500,000 sentences)", *figures(trained)]])
    if trained["exit"] != 0:
        sys.exit("no tokenizer: the other parts need one")
    tokenizer = spm_folder / "spm.model"
    caches = prepare_and_encode(bench, recipe, corpus, args.sizes, tokenizer)
    if not args.skip_first_update:
        first_update(bench, recipe, corpus_paths(corpus, max(args.sizes)), caches[max(args.sizes)], tokenizer)
    if not args.skip_ranks:
        files = corpus_paths(corpus, args.ranks_size)
        if args.ranks_size not in caches:  # prepared for this part only, not a result
            caches[args.ranks_size], _ = prepare(bench, recipe, files, tokenizer, f"{args.ranks_size}-b")
        ranks_memory(bench, recipe, files, caches[args.ranks_size], tokenizer, args.ranks)
        mapped_memory(caches[args.ranks_size], args.ranks)
    print("\n## Commands, in order (logs in " + str(bench.logs) + ")\n")
    for name, command in bench.commands:
        print(f"* {name}: `{shlex.join(command)}`")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ENTRY_POINTS:
        ENTRY_POINTS[sys.argv[1]](sys.argv[2:])
    else:
        main()
