"""A distilled student against its teacher (and CTranslate2 running the teacher): whole processes, one run.

Rows, each a fresh process on the same source file, timed from start to exit; the rows alternate run
by run and the table shows medians, lines/s, speed as a multiple of the teacher's and BLEU (sacrebleu,
cased, 13a) against --reference:
  teacher             `tfm translate -m TEACHER` with the checkpoint's [decode] settings (the recipe's)
  teacher int8        the same with --dtype int8
  student greedy      `tfm translate -m STUDENT --beam 1` (the student's other [decode] settings)
  student greedy int8 the same with --dtype int8
  student beam        `tfm translate -m STUDENT` with its [decode] settings (the recipe's beam)
  ct2 teacher ...     with --ct2: a Python script as a CTranslate2 user writes it on `tfm export --to
                      ctranslate2` of the teacher (float32 and int8; sentencepiece, translate_batch with
                      --ct2-beam, --ct2-length-penalty, max_batch_size 32, intra_threads --threads)
--threads applies to every row (`tfm translate --threads`).

Usage: python bench/student_speed.py --teacher T.safetensors --student S.safetensors --src test.de
       --reference test.en [--runs 3] [--threads 2] [--ct2] [--ct2-beam 8] [--ct2-length-penalty 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prepare_corpus import cpu_flags  # noqa: E402
from translate_memory import export_ctranslate2  # noqa: E402
from whole_process import bleu  # noqa: E402

CTRANSLATE2_TEACHER = """
import sys, ctranslate2, sentencepiece
folder, spm_model, source, output, beam, length_penalty, threads = sys.argv[1:8]
tokenizer = sentencepiece.SentencePieceProcessor(model_file=spm_model)
translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=int(threads))
lines = open(source, encoding="utf-8").read().splitlines()
results = translator.translate_batch(
    [tokens + ["</s>"] for tokens in tokenizer.encode(lines, out_type=str)], beam_size=int(beam),
    max_batch_size=32, max_decoding_length=256, length_penalty=float(length_penalty),
)
with open(output, "w", encoding="utf-8") as out:
    for result in results:
        out.write(tokenizer.decode(result.hypotheses[0]) + "\\n")
"""


def timed(command: list[str]) -> float:
    """Seconds one process takes, start to exit; ends the bench with its stderr when it fails."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[:6])}... failed:\n{result.stderr[-2000:]}")
    return seconds


def tfm_command(model: Path, source: Path, output: Path, threads: int, *options: str) -> list[str]:
    """`tfm translate` of a file into a file with `options`."""
    return [sys.executable, "-m", "tfm_cli", "translate", "-m", str(model), "-i", str(source), "-o", str(output),
            "--threads", str(threads), "-q", *options]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ct2", action="store_true", help="add CTranslate2 running the teacher")
    parser.add_argument("--ct2-beam", type=int, default=8)
    parser.add_argument("--ct2-length-penalty", type=float, default=1.0)
    args = parser.parse_args()

    lines = len(args.src.read_text(encoding="utf-8").splitlines())
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        rows: dict[str, tuple[list[str], Path]] = {}  # name: (command, its output file)

        def add(name: str, model: Path, *options: str) -> None:
            output = folder / f"{len(rows)}.txt"
            rows[name] = (tfm_command(model, args.src, output, args.threads, *options), output)

        add("teacher, its [decode] settings", args.teacher)
        add("teacher int8", args.teacher, "--dtype", "int8")
        add("student greedy", args.student, "--beam", "1")
        add("student greedy int8", args.student, "--beam", "1", "--dtype", "int8")
        add("student, its [decode] settings", args.student)
        if args.ct2:
            exported = export_ctranslate2(args.teacher, folder / "ct2")
            for precision, model_folder in exported.items():
                output = folder / f"ct2-{precision}.txt"
                rows[f"CTranslate2 teacher {precision}, beam {args.ct2_beam}"] = ([
                    sys.executable, "-c", CTRANSLATE2_TEACHER, str(model_folder), str(folder / "ct2" / "spm.model"),
                    str(args.src), str(output), str(args.ct2_beam), str(args.ct2_length_penalty), str(args.threads)],
                    output)
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.runs):
            for name, (command, _) in rows.items():
                times[name].append(timed(command))
        scores = {name: bleu(output, args.reference) for name, (_, output) in rows.items()}

    base = statistics.median(times["teacher, its [decode] settings"])
    print(f"{lines} lines of {args.src.name}, --threads {args.threads}, median of {args.runs} whole processes "
          f"(rows alternating), {started}, CPU: {cpu_flags()}\n")
    print("| row | seconds | lines/s | x the teacher's speed | BLEU |")
    print("|---|---:|---:|---:|---:|")
    for name in rows:
        seconds = statistics.median(times[name])
        print(f"| {name} | {seconds:.2f} | {lines / seconds:.1f} | {base / seconds:.2f} | {scores[name]:.2f} |")


if __name__ == "__main__":
    main()
