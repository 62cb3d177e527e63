"""Whole processes as a user runs them: `tfm translate` against a CTranslate2 script, start to finish.

Every row is one fresh process, timed from its start to its exit (interpreter start, imports,
model load, tokenization, decoding, detokenization, writing the output file), with its peak RSS
read from getrusage(RUSAGE_CHILDREN) in a dedicated parent so that only that child counts:
  tfm             `tfm translate -m CKPT -i SOURCE -o OUT --threads 2 --length-penalty 0
                  --max-len-a 0 --max-len-b L` with --beam and --dtype (float32 or int8), the rest
                  its defaults (batches of up to 128 sentences)
  ct2             a Python script as a CTranslate2 user writes it: sentencepiece with the
                  checkpoint's model, ctranslate2.Translator on `tfm export --to ctranslate2`
                  (float32, or --quantization int8), intra_threads 2, translate_batch with
                  max_batch_size 32 (translate_file's default; --ct2-batch-size), length_penalty 0, the same length
                  limit, detokenize, write the file
  one line        `echo 'Ein Hund rennt.' | tfm translate -m CKPT` (all defaults), against
                  `python -c "import torch"` and the CTranslate2 script on that one line
Engines alternate run by run; medians of --runs. BLEU is sacrebleu's on the output files (cased,
13a). OMP_WAIT_POLICY is left as the user's environment has it unless --policy sets it for all.

--device cuda runs everything on the GPU: `tfm translate --device cuda` (no --threads) in each
--dtypes precision (float32, bf16) against two peers, each in its own row: CTranslate2 with
device="cuda" on the float32 export, converted at load to compute_type float32 for tfm's float32
and to bfloat16 and float16 for tfm's bf16; and a MarianMTModel script as a transformers user
writes it (MarianTokenizer, generate() with num_beams, length_penalty 0 and max_new_tokens L + 1 on
batches of --ct2-batch-size lines of similar length, batch_decode) on `tfm export --to marian`, in
float32 or bfloat16. The one-line rows run on the GPU too, and the peak-RSS rows are left out. A
peer that fails (a CTranslate2 wheel built for another CUDA than the machine's, say) gives a row
that says so.

Usage: python bench/whole_process.py --model CKPT [--runs 3] [--beams 5,1] [--dtypes float32,int8]
       [--memory-batch-sizes 32,128]   (peak RSS rows at equal batch sizes; "" to skip)
       python bench/whole_process.py --model CKPT --device cuda --dtypes float32,bf16 --beams 5 --tfm "python3 -m tfm_cli"
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from translate_memory import export_ctranslate2  # noqa: E402  (tfm export --to ctranslate2, float32 and int8)

MULTI30K = BENCH_DIR.parents[1] / "shared" / "data" / "multi30k"
ONE_LINE = "Ein Hund rennt."

MEASURE = """
import json, resource, subprocess, sys, time
stdin = open(sys.argv[1], "rb") if sys.argv[1] != "-" else subprocess.DEVNULL
start = time.perf_counter()
child = subprocess.run(sys.argv[2:], stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
seconds = time.perf_counter() - start
if child.returncode != 0:
    sys.exit(child.stderr.decode(errors="replace"))
print(json.dumps({"max_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "seconds": seconds}))
"""

CTRANSLATE2 = """
import sys, ctranslate2, sentencepiece
folder, spm_model, source, output, beam, batch_size, max_length = sys.argv[1:8]
device, compute_type = (sys.argv[8:10] + ["cpu", "default"][len(sys.argv[8:10]):])
tokenizer = sentencepiece.SentencePieceProcessor(model_file=spm_model)
translator = ctranslate2.Translator(folder, device=device, compute_type=compute_type, inter_threads=1, intra_threads=2)
lines = (open(source, encoding="utf-8") if source != "-" else sys.stdin).read().splitlines()
results = translator.translate_batch(
    [tokens + ["</s>"] for tokens in tokenizer.encode(lines, out_type=str)], beam_size=int(beam),
    max_batch_size=int(batch_size), max_decoding_length=int(max_length), length_penalty=0.0,
)
with (open(output, "w", encoding="utf-8") if output != "-" else sys.stdout) as out:
    for result in results:
        out.write(tokenizer.decode(result.hypotheses[0]) + "\\n")
"""


HF_MARIAN = """
import sys, torch
from transformers import MarianMTModel, MarianTokenizer
folder, source, output, beam, batch_size, max_length, device, dtype = sys.argv[1:]
tokenizer = MarianTokenizer.from_pretrained(folder)
model = MarianMTModel.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
lines = (open(source, encoding="utf-8") if source != "-" else sys.stdin).read().splitlines()
order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
outputs = [""] * len(lines)
with torch.inference_mode():
    for start in range(0, len(order), int(batch_size)):
        rows = order[start:start + int(batch_size)]
        batch = tokenizer([lines[i] for i in rows], return_tensors="pt", padding=True).to(device)
        generated = model.generate(**batch, num_beams=int(beam), max_new_tokens=int(max_length), length_penalty=0.0,
                                   do_sample=False)
        for i, text in zip(rows, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            outputs[i] = text
with (open(output, "w", encoding="utf-8") if output != "-" else sys.stdout) as out:
    out.writelines(text + "\\n" for text in outputs)
"""


class CommandFailed(Exception):
    """A measured command exited with an error (the message ends with its stderr)."""


def measure(command: list[str], stdin: Path | None, env: dict[str, str], may_fail: bool = False) -> dict:
    """Run `command` as the only child of a fresh measuring process; returns {max_rss_kib, seconds}.

    A failing command ends the bench with its stderr, or raises CommandFailed when `may_fail`.
    """
    result = subprocess.run([sys.executable, "-c", MEASURE, str(stdin) if stdin else "-", *command],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        message = f"bench/whole_process.py: {' '.join(command[:4])}... failed: {result.stderr.strip()[-2000:]}"
        if may_fail:
            raise CommandFailed(message)
        sys.exit(message)
    return json.loads(result.stdout)


def export_marian(checkpoint: Path, workdir: Path) -> Path:
    """`tfm export --to marian` of the checkpoint into workdir/marian (MarianMTModel and MarianTokenizer load it)."""
    import shutil

    folder = workdir / "marian"
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "tfm_cli", "export", "-q", "-m", str(checkpoint), "--to", "marian", str(folder)],
                   check=True)
    return folder


def hf_marian(folder: Path, source: Path, output: Path, beam: str, dtype: str, device: str, batch_size: str,
              max_length: str) -> list[str]:
    """The command of the MarianMTModel script: MarianTokenizer, generate() on batches of similar length, decode."""
    return [sys.executable, "-c", HF_MARIAN, str(folder), str(source), str(output), beam, batch_size, max_length,
            device, dtype]

def last_line(text: str) -> str:
    """The last non-empty line of `text` (an error's message), with table pipes escaped."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else text).replace("|", "\\|")


def bleu(hypotheses: Path, reference: Path) -> float:
    """Corpus BLEU (sacrebleu defaults) of a hypothesis file against a reference file."""
    import sacrebleu

    hyps = hypotheses.read_text(encoding="utf-8").splitlines()
    refs = reference.read_text(encoding="utf-8").splitlines()
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def cpu_flags() -> str:
    """The CPU model name and its vector flags (avx*, amx*) from lscpu."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Flags")), [])
    return f"{model}; flags: {' '.join(flag for flag in flags if flag.startswith(('avx', 'amx')))}"


def run_header(args: argparse.Namespace, env: dict[str, str]) -> str:
    """The line a table starts with: when, which CPU (its vector flags), the wait policy, the model, the runs."""
    return (f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_flags()}; "
            f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', '(unset)')}; model {args.model}; {args.runs} runs")


def add_run_arguments(parser: argparse.ArgumentParser, workdir: Path) -> None:
    """The options of a whole-process comparison: model, data, runs, beams, precisions, length limit,
    work folder, the tfm script and the OpenMP wait policy (bench/decoding_workers.py shares them)."""
    parser.add_argument("--model", type=Path, required=True, help="tfm checkpoint (.safetensors)")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--reference", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--beams", default="5,1")
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--max-len-b", type=int, default=79, help="at most this many tokens + EOS per output")
    parser.add_argument("--policy", default="", help="set OMP_WAIT_POLICY for every process (default: as inherited)")
    parser.add_argument("--workdir", type=Path, default=workdir)
    parser.add_argument("--tfm", default=str(Path(sys.executable).with_name("tfm")),
                        help='the tfm command: its console script, or e.g. "python3 -m tfm_cli" (split like a shell)')


def main() -> None:
    """Print markdown tables: whole-process wall time and BLEU per engine, the one-line cost, peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, workdir=Path("/tmp/tfm-bench-whole"))
    parser.add_argument("--memory-batch-sizes", default="32,128", help="peak RSS rows at these equal batch sizes")
    parser.add_argument("--one-line-runs", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: both engines on the GPU (see above)")
    parser.add_argument("--ct2-batch-size", default="32", help="CTranslate2's max_batch_size (translate_file's default: 32)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.policy:
        env["OMP_WAIT_POLICY"] = args.policy
    on_gpu = args.device != "cpu"
    folders = export_ctranslate2(args.model, args.workdir)
    spm = args.workdir / "spm.model"
    limit = str(args.max_len_b)

    def tfm(output: Path, beam: str, dtype: str, batch_size: str | None = None) -> list[str]:
        where = ["--device", args.device] if on_gpu else ["--threads", "2"]
        command = [*shlex.split(args.tfm), "translate", "-q", "-m", str(args.model), "-i", str(args.source), "-o",
                   str(output), *where, "--beam", beam, "--length-penalty", "0", "--max-len-a", "0", "--max-len-b",
                   limit, "--dtype", dtype]
        return command + (["--batch-size", batch_size] if batch_size else [])

    def ct2(output: Path, beam: str, dtype: str, batch_size: str = "32", compute_type: str = "default") -> list[str]:
        folder = folders["float32"] if on_gpu else folders[dtype]
        return [sys.executable, "-c", CTRANSLATE2, str(folder), str(spm), str(args.source), str(output),
                beam, batch_size, str(args.max_len_b + 1), args.device, compute_type]

    # The peers each tfm precision is compared with: on a CPU, CTranslate2 in the export's own precision;
    # on a GPU, CTranslate2 in each matching compute type and MarianMTModel in the same precision.
    peers = {dtype: [("CTranslate2", functools.partial(ct2, dtype=dtype, batch_size=args.ct2_batch_size))]
             for dtype in args.dtypes.split(",")}
    if on_gpu:
        marian = export_marian(args.model, args.workdir)
        for dtype, (ct2_types, hf_dtype) in {"float32": (["float32"], "float32"),
                                             "bf16": (["bfloat16", "float16"], "bfloat16")}.items():
            peers[dtype] = [(f"CTranslate2 {compute_type}", functools.partial(ct2, dtype=dtype, compute_type=compute_type,
                                                                             batch_size=args.ct2_batch_size))
                            for compute_type in ct2_types]
            peers[dtype].append((f"MarianMTModel {hf_dtype}", functools.partial(
                hf_marian, marian, args.source, dtype=hf_dtype, device=args.device, batch_size=args.ct2_batch_size,
                max_length=str(args.max_len_b + 1))))
    print(run_header(args, env) + (f"; device {args.device}" if on_gpu else ""))
    peer_header = "peer" if on_gpu else "CTranslate2"
    print(f"\n| beam | precision | tfm wall s | {peer_header} wall s | tfm faster by | per run | tfm BLEU | "
          f"{'peer' if on_gpu else 'CT2'} BLEU | tfm peak RSS MiB | {'peer' if on_gpu else 'CT2'} peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for beam in args.beams.split(","):
        for dtype in args.dtypes.split(","):
            for peer_name, peer in peers[dtype]:
                precision = f"tfm {dtype}, {peer_name}" if on_gpu else dtype
                times = {"tfm": [], "peer": []}
                rss = {"tfm": [], "peer": []}
                tag = peer_name.replace(" ", "-")
                outputs = {name: args.workdir / f"out-{name}-{beam}-{dtype}-{tag}.txt" for name in times}
                try:
                    for run in range(args.runs):
                        for name in (("tfm", "peer") if run % 2 == 0 else ("peer", "tfm")):
                            command = tfm(outputs[name], beam, dtype) if name == "tfm" else peer(outputs[name], beam)
                            result = measure(command, None, env, may_fail=on_gpu and name == "peer")
                            times[name].append(result["seconds"])
                            rss[name].append(result["max_rss_kib"] / 1024)
                except CommandFailed as failure:
                    print(f"| {beam} | {precision} | {peer_name} failed: {last_line(str(failure))} |", flush=True)
                    continue
                ratios = sorted(c / t for t, c in zip(times["tfm"], times["peer"]))
                print(f"| {beam} | {precision} | {statistics.median(times['tfm']):.2f} | "
                      f"{statistics.median(times['peer']):.2f} | "
                      f"**{statistics.median(times['peer']) / statistics.median(times['tfm']):.2f}x** | "
                      f"{ratios[0]:.2f}-{ratios[-1]:.2f} | {bleu(outputs['tfm'], args.reference):.2f} | "
                      f"{bleu(outputs['peer'], args.reference):.2f} | {statistics.median(rss['tfm']):.0f} | "
                      f"{statistics.median(rss['peer']):.0f} |", flush=True)

    one_line = args.workdir / "one-line.txt"
    one_line.write_text(ONE_LINE + "\n", encoding="utf-8")
    rows = {
        'python -c "import torch"': ([sys.executable, "-c", "import torch"], None),
        f"echo '{ONE_LINE}' | tfm translate -m CKPT": (
            [*shlex.split(args.tfm), "translate", "-m", str(args.model), *(["--device", args.device] if on_gpu else [])],
            one_line),
        "the CTranslate2 script on that line (float32)": (
            [sys.executable, "-c", CTRANSLATE2, str(folders["float32"]), str(spm), "-", "-", "5", "32", "256", args.device,
             "float32" if on_gpu else "default"], one_line),
        'python -c "import ctranslate2, sentencepiece"': ([sys.executable, "-c", "import ctranslate2, sentencepiece"], None),
    }
    one_times = {name: [] for name in rows}
    failed = {}  # row -> why (a peer that cannot run on this GPU)
    for _ in range(max(args.one_line_runs, 0)):
        for name, (command, stdin) in rows.items():
            if name in failed:
                continue
            try:
                one_times[name].append(measure(command, stdin, env, may_fail=on_gpu)["seconds"])
            except CommandFailed as failure:
                failed[name] = last_line(str(failure))
    if args.one_line_runs >= 1:
        floor = statistics.median(one_times['python -c "import torch"'])
        print("\n| one short line | wall s, median | min-max | / import torch |")
        print("|---|---|---|---|")
        for name, values in one_times.items():
            if name in failed:
                print(f"| {name} | failed: {failed[name]} | | |")
            else:
                print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} | "
                      f"{statistics.median(values) / floor:.2f}x |")

    if on_gpu:
        return  # peak RSS says nothing about GPU memory
    batch_sizes = [size for size in args.memory_batch_sizes.split(",") if size]
    if not batch_sizes:
        return
    floors = {
        "tfm": [measure([sys.executable, "-c", "import torch"], None, env)["max_rss_kib"] / 1024 for _ in range(args.runs)],
        "ct2": [measure([sys.executable, "-c", "import ctranslate2, sentencepiece"], None, env)["max_rss_kib"] / 1024
                for _ in range(args.runs)],
    }
    floor_mib = {name: statistics.median(values) for name, values in floors.items()}
    print(f"\nImport floors (peak RSS, MiB): torch {floor_mib['tfm']:.0f}, ctranslate2 + sentencepiece "
          f"{floor_mib['ct2']:.0f}. Beam {args.beams.split(',')[0]}, equal batch sizes, medians of {args.runs} runs.")
    print("\n| batch | precision | tfm peak RSS | CT2 peak RSS | tfm above floor | CT2 above floor | ratio above floor |")
    print("|---|---|---|---|---|---|---|")
    beam = args.beams.split(",")[0]
    for batch_size in batch_sizes:
        for dtype in args.dtypes.split(","):
            peaks = {"tfm": [], "ct2": []}
            for run in range(args.runs):
                for name in (("tfm", "ct2") if run % 2 == 0 else ("ct2", "tfm")):
                    output = args.workdir / f"mem-{name}.txt"
                    command = tfm(output, beam, dtype, batch_size) if name == "tfm" else ct2(output, beam, dtype, batch_size)
                    peaks[name].append(measure(command, None, env)["max_rss_kib"] / 1024)
            above = {name: statistics.median(values) - floor_mib[name] for name, values in peaks.items()}
            print(f"| {batch_size} | {dtype} | {statistics.median(peaks['tfm']):.0f} | {statistics.median(peaks['ct2']):.0f} | "
                  f"{above['tfm']:.0f} | {above['ct2']:.0f} | **{above['tfm'] / above['ct2']:.2f}x** |", flush=True)


if __name__ == "__main__":
    main()
