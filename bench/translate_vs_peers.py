"""Translation speed of tfm against the same weights in MarianMTModel.generate and CTranslate2.

One run measures, side by side and interleaved, every engine on the same token ids:
  tfm         tfm_cli.inference.search.greedy_search / beam_search (incremental cache), float32, on the
              same batches as the peers
  tfm-int8, tfm-bf16  the same, the model loaded with --dtype int8 / bf16 (tfm_cli/model/precision.py)
  tfm-translate  the `tfm translate` library path (tfm_cli.inference.translation.Translator.translate_chunk on
              the raw lines: tokenization, its own equal-source-length batching with its default
              --batch-size/--max-tokens, beam_search also for beam 1, detokenization), float32
  hf-marian   transformers MarianMTModel.generate on `tfm export --to marian`'s folder, float32
  ct2-float32 CTranslate2 Translator on `tfm export --to ctranslate2`'s model
  ct2-int8    the same, weights quantized to int8 (`--quantization int8`)
  ct2-bf16    the float32 model run with compute_type="bfloat16", where CTranslate2 offers it on
              this CPU (ctranslate2.get_supported_compute_types("cpu")); dropped with a note elsewhere
A second table pairs each tfm precision with CTranslate2 in the same precision (tfm-int8 with
ct2-int8, ...): "tfm faster by" > 1 means tfm is faster.
Each (OMP_WAIT_POLICY, beam, engine, repeat) runs in its own subprocess, because OpenMP reads
OMP_WAIT_POLICY once when torch or CTranslate2 loads. The subprocess loads the model, decodes
the first batch once as a warm-up, then times decoding of all batches (tokenization excluded).
Reported: median of the repeats' sentences/s and target tokens/s, tfm/peer ratios (of the
medians; and per repeat, whose runs are adjacent in time: their median and range), and output
agreement with tfm (whole-sentence identical outputs). The engines' order flips every repeat.
The two tfm engines start by calling tfm_cli.allocator.keep_freed_memory(), as `tfm translate` does.

Fairness settings (all engines): the same sentences, tokenized once with the checkpoint's
sentencepiece model (+ EOS), sorted by length and cut into the same batches; the same beam;
no length normalisation (tfm alpha 0, HF length_penalty 0, CTranslate2 length_penalty 0: the
three define it differently); the same number of decoder steps: at most --max-steps, where tfm's
last step is its forced EOS. Threads: intra-op 2 (torch.set_num_threads, CTranslate2
intra_threads), inter 1. A CTranslate2 worker imports neither torch nor tfm (see load_ctranslate2).

With --reference (the target side of --source), a BLEU column scores each engine's detokenized
output with sacrebleu (default settings), which is how the int8 rows' quality loss is reported.

With --isa avx2, every engine is capped at AVX2 (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS,
ATEN_CPU_CAPABILITY, CT2_FORCE_CPU_ISA): how an AVX-512 machine's kernels compare to the ones an
AVX2-only CPU runs (the same cores, so not a measurement of another CPU model). With
ATEN_CPU_CAPABILITY=avx2, tfm-int8 runs the int8 layers of CPUs without AVX512-VNNI
(Int8LinearWithoutVnni: oneDNN's u8 x s8 product with 7-bit weights), as an AVX2-only CPU would.

Usage: python bench/translate_vs_peers.py [--model CKPT] [--runs 3] [--policies PASSIVE,ACTIVE] [--reference REF] [--isa avx2]
Without --model, a random Multi30k-size model that never emits EOS is made (bench/bench_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MULTI30K = BENCH_DIR.parents[1] / "shared" / "data" / "multi30k"
ENGINES = ("tfm", "tfm-int8", "tfm-bf16", "tfm-translate", "hf-marian", "ct2-float32", "ct2-int8", "ct2-bf16")
TFM_DTYPES = {"tfm": "float32", "tfm-int8": "int8", "tfm-bf16": "bf16"}
# Each tfm precision and its CTranslate2 counterpart, for the same-precision table.
SAME_PRECISION = (("tfm", "ct2-float32"), ("tfm-int8", "ct2-int8"), ("tfm-bf16", "ct2-bf16"))
# Environment variables that cap each engine's kernels at AVX2 (--isa avx2).
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "CT2_FORCE_CPU_ISA": "AVX2"}


@dataclass(frozen=True)
class Job:
    """One timed decoding run, as the worker subprocess receives it (JSON)."""

    engine: str
    beam: int
    max_steps: int
    threads: int
    isa: str
    checkpoint: str
    source: str
    workdir: str
    batches_file: str
    output_file: str


def prepare(checkpoint: Path, workdir: Path, source: Path, batch_size: int, limit: int) -> Path:
    """Convert the checkpoint (MarianMT, CTranslate2 float32/int8) and write the batches as JSON.

    Also writes pieces.json: {"source": [...], "target": [...]}, each vocabulary's pieces by id.
    Returns the batches file: a list of batches, each a list of [line_index, source ids + EOS],
    sorted by source length (longest first) and cut into `batch_size` sentences.
    """
    import shutil

    from tfm_cli.checkpoints.format import checkpoint_tokenizers, load_model, read_checkpoint
    from tfm_cli.interop.exporting import export_model
    from tfm_cli.textio.streams import iter_lines

    loaded = load_model(checkpoint)
    exported = read_checkpoint(checkpoint)
    src_tokenizer, tgt_tokenizer = checkpoint_tokenizers(checkpoint, exported)
    for target, folder, quantization in (("marian", "marian", "float32"), ("ctranslate2", "ct2-float32", "float32"),
                                         ("ctranslate2", "ct2-int8", "int8")):
        shutil.rmtree(workdir / folder, ignore_errors=True)
        export_model(exported, src_tokenizer, tgt_tokenizer, target, workdir / folder, quantization)
    # CTranslate2's workers map ids to pieces and back with these lists, so they need neither torch nor tfm.
    pieces = {side: [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
              for side, tokenizer in (("source", loaded.src_tokenizer), ("target", loaded.tgt_tokenizer))}
    (workdir / "pieces.json").write_text(json.dumps(pieces))
    lines = list(iter_lines(str(source)))[:limit]
    eos = loaded.config.eos_id
    ids = [loaded.src_tokenizer.encode_ids(line) + [eos] for line in lines]
    order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
    batches = [[[i, ids[i]] for i in order[start : start + batch_size]] for start in range(0, len(order), batch_size)]
    path = workdir / "batches.json"
    path.write_text(json.dumps(batches))
    return path


def run_job(job: Job) -> None:
    """Worker: decode every batch with one engine, write {seconds, outputs by line index} to job.output_file."""
    batches = json.loads(Path(job.batches_file).read_text())
    if job.engine == "tfm-translate":
        # The library path takes the raw lines in one chunk and batches them itself.
        from tfm_cli.textio.streams import iter_lines

        lines = list(iter_lines(job.source))[: sum(len(batch) for batch in batches)]
        batches = [[[i, line] for i, line in enumerate(lines)]]
        warmup = [[i, lines[i]] for i in range(32)]
    else:
        warmup = batches[0]
    decode = load_engine(job)
    decode(warmup)  # warm-up: first call allocations, lazy initialisation
    start = time.perf_counter()
    outputs: dict[int, list[int]] = {}
    for batch in batches:
        for (index, _), tokens in zip(batch, decode(batch)):
            outputs[index] = tokens
    seconds = time.perf_counter() - start
    Path(job.output_file).write_text(json.dumps({"seconds": seconds, "outputs": outputs}))


def load_engine(job: Job):
    """Returns decode(batch) -> list of output id lists (EOS excluded), for the job's engine."""
    if job.engine.startswith("ct2-"):
        return load_ctranslate2(job)
    import torch

    torch.set_num_threads(job.threads)
    torch.set_num_interop_threads(1)
    workdir = Path(job.workdir)
    if job.engine in (*TFM_DTYPES, "tfm-translate"):
        from tfm_cli.allocator import keep_freed_memory

        keep_freed_memory()  # what `tfm translate` does at start-up
    if job.engine in TFM_DTYPES:
        from tfm_cli.checkpoints.format import load_model
        from tfm_cli.config import DecodeConfig
        from tfm_cli.inference.search import beam_search, greedy_search

        model = load_model(job.checkpoint, dtype=TFM_DTYPES[job.engine]).model
        pad = model.config.pad_id
        # tfm counts its forced EOS as a step: max_steps - 1 tokens, then EOS.
        decode_config = DecodeConfig(beam_size=job.beam, length_penalty=0.0, max_len_a=0.0, max_len_b=job.max_steps - 1)

        def decode(batch):
            src = padded([ids for _, ids in batch], pad)
            if job.beam == 1:
                return [h.tokens for h in greedy_search(model, src, 0.0, job.max_steps - 1)]
            return [hyps[0].tokens for hyps in beam_search(model, src, decode_config)]

        return decode
    if job.engine == "tfm-translate":
        from tfm_cli.checkpoints.format import load_model
        from tfm_cli.config import DecodeConfig
        from tfm_cli.inference.translation import BatchingConfig, Translator, TranslationStats

        decode_config = DecodeConfig(beam_size=job.beam, length_penalty=0.0, max_len_a=0.0, max_len_b=job.max_steps - 1)
        translator = Translator(load_model(job.checkpoint), decode_config, BatchingConfig())

        def decode(batch):
            translated = translator.translate_chunk([line for _, line in batch], 0, TranslationStats())
            return [line.outputs[0].ids if line.outputs else [] for line in translated]

        return decode
    if job.engine == "hf-marian":
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(workdir / "marian", dtype=torch.float32).eval()
        config = model.config

        @torch.inference_mode()
        def decode(batch):
            src = padded([ids for _, ids in batch], config.pad_token_id)
            generated = model.generate(
                input_ids=src, attention_mask=(src != config.pad_token_id).long(), num_beams=job.beam,
                do_sample=False, max_new_tokens=job.max_steps, length_penalty=0.0, early_stopping=False,
            )
            return [strip_marian(row.tolist(), config.eos_token_id, config.pad_token_id) for row in generated]

        return decode
    raise ValueError(f"unknown engine {job.engine}")


def load_ctranslate2(job: Job):
    """decode(batch) for a CTranslate2 engine, in a process that imports neither torch nor tfm.

    torch's OpenMP runtime and CTranslate2's are separate libraries, each with its own threads on the
    same cores. A worker that had also imported torch and loaded tfm's model made CTranslate2 1.4-1.5x
    slower on a 2-core AVX2 VM (bench/RESULTS.md, section "The decoder alone with CTranslate2 in
    torch-free workers"), which flattered tfm in every decoder-only ratio measured that way.
    """
    import ctranslate2

    workdir = Path(job.workdir)
    pieces = json.loads((workdir / "pieces.json").read_text())
    src_pieces = pieces["source"]
    tgt_ids = {piece: index for index, piece in enumerate(pieces["target"])}
    folder, compute_type = ("ct2-float32", "bfloat16") if job.engine == "ct2-bf16" else (job.engine, "default")
    translator = ctranslate2.Translator(
        str(workdir / folder), device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=job.threads
    )

    def decode(batch):
        results = translator.translate_batch(
            [[src_pieces[i] for i in ids] for _, ids in batch], beam_size=job.beam, length_penalty=0.0,
            max_decoding_length=job.max_steps, max_batch_size=len(batch), return_scores=False,
        )
        return [[tgt_ids[piece] for piece in result.hypotheses[0]] for result in results]

    return decode


def padded(rows: list[list[int]], pad: int):
    """Lists of ids -> (B, S) int64 tensor, right-padded with `pad`."""
    import torch

    width = max(len(row) for row in rows)
    return torch.tensor([row + [pad] * (width - len(row)) for row in rows], dtype=torch.long)


def strip_marian(row: list[int], eos: int, pad: int) -> list[int]:
    """A generate() row [start, y1, ..., EOS, pad...] -> [y1, ...] (EOS and what follows dropped)."""
    tokens = row[1:]
    return tokens[: tokens.index(eos)] if eos in tokens else [t for t in tokens if t != pad]


def run_in_subprocess(job: Job, policy: str) -> dict:
    """Run `job` in a fresh interpreter with OMP_WAIT_POLICY=policy ("unset": without the variable, as most
    users run); returns its JSON result."""
    env = dict(os.environ, OMP_NUM_THREADS=str(job.threads), TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    if job.isa == "avx2":
        env.update(AVX2_ONLY)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), env.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job.__dict__)],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )
    return json.loads(Path(job.output_file).read_text())


def target_tokens(outputs: dict[str, list[int]], max_steps: int) -> int:
    """Decoder positions produced: each output's tokens plus its EOS, capped at max_steps per sentence."""
    return sum(min(len(tokens) + 1, max_steps) for tokens in outputs.values())


def agreement(reference: dict[str, list[int]], other: dict[str, list[int]], max_steps: int) -> float:
    """Percent of sentences whose outputs are identical over the first max_steps - 1 tokens."""
    same = sum(reference[k][: max_steps - 1] == other[k][: max_steps - 1] for k in reference)
    return 100.0 * same / len(reference)


def corpus_bleu(checkpoint: Path, outputs: dict[str, list[int]], reference: Path) -> float:
    """sacreBLEU (default: cased, 13a) of the outputs (line index -> target ids), detokenized by the checkpoint."""
    import sacrebleu

    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.textio.streams import iter_lines

    tokenizer = load_model(checkpoint).tgt_tokenizer
    hypotheses = [tokenizer.decode_ids(outputs[str(i)]) for i in range(len(outputs))]
    references = list(iter_lines(str(reference)))[: len(hypotheses)]
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def ct2_has_cpu_bfloat16() -> bool:
    """Whether CTranslate2 runs bfloat16 on this machine's CPU (in its own process: OMP settings)."""
    command = "import ctranslate2; print('bfloat16' in ctranslate2.get_supported_compute_types('cpu'))"
    return subprocess.run([sys.executable, "-c", command], capture_output=True, text=True).stdout.strip() == "True"


def machine_description() -> str:
    """CPU model name and core count (lscpu), Python, torch, transformers and CTranslate2 versions."""
    model, flags = "unknown CPU", []
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("Flags:"):
                flags = [flag for flag in line.split()[1:]
                         if flag.startswith(("avx2", "avx512", "amx")) or "vnni" in flag or "bf16" in flag]
    except OSError:
        pass
    import ctranslate2
    import torch
    import transformers

    return (
        f"{model}, {os.cpu_count()} cores, lscpu flags {' '.join(flags) or 'unknown'}; "
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"ctranslate2 {ctranslate2.__version__}; no GPU"
    )


def main() -> None:
    """Prepare once, run every configuration interleaved, print a markdown table."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        run_job(Job(**json.loads(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="tfm checkpoint; default: a random Multi30k-size model")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfm-bench-translate"))
    parser.add_argument("--runs", type=int, default=3, help="repeats per configuration (median reported)")
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--policies", default="PASSIVE,ACTIVE", help="OMP_WAIT_POLICY values to run; `unset` runs without the variable")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch, the same for every engine")
    parser.add_argument("--max-steps", type=int, default=24, help="decoder steps per sentence at most (EOS included)")
    parser.add_argument("--limit", type=int, default=1000, help="use the first LIMIT source lines")
    parser.add_argument("--reference", type=Path, help="target side of --source: adds a BLEU column")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native", help="avx2: cap every engine at AVX2")
    args = parser.parse_args()
    sys.path.insert(0, str(BENCH_DIR))
    args.workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.model
    if checkpoint is None:
        from bench_model import make_bench_checkpoint

        checkpoint = make_bench_checkpoint(args.workdir / "random.safetensors")
    batches_file = prepare(checkpoint, args.workdir, args.source, args.batch_size, args.limit)
    engines = args.engines.split(",")
    if "ct2-bf16" in engines and not ct2_has_cpu_bfloat16():
        engines.remove("ct2-bf16")
        print("# ct2-bf16 dropped: CTranslate2 offers no bfloat16 compute type on this CPU")
    n_sentences = sum(len(b) for b in json.loads(batches_file.read_text()))
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine_description()}")
    print(f"# model {checkpoint}; {n_sentences} sentences from {args.source}; batch {args.batch_size} sentences; "
          f"max {args.max_steps} decoder steps; {args.threads} threads; median of {args.runs} runs; ISA {args.isa}")
    pairs_rows = []
    bleu_header, bleu_rule = (" BLEU |", "---|") if args.reference else ("", "")
    print(f"| OMP_WAIT_POLICY | beam | engine | sentences/s | target tokens/s | tfm / engine | per-repeat tfm / engine: "
          f"median (min-max) | agreement with tfm |{bleu_header}")
    print(f"|---|---|---|---|---|---|---|---|{bleu_rule}")
    for policy in args.policies.split(","):
        for beam in (int(b) for b in args.beams.split(",")):
            seconds: dict[str, list[float]] = {e: [] for e in engines}
            outputs: dict[str, dict] = {}
            for repeat in range(args.runs):
                # Interleaved, so load changes hit every engine alike; the order flips every repeat,
                # so no engine always runs first.
                for engine in engines if repeat % 2 == 0 else engines[::-1]:
                    job = Job(engine, beam, args.max_steps, args.threads, args.isa, str(checkpoint), str(args.source),
                              str(args.workdir), str(batches_file), str(args.workdir / f"out-{engine}.json"))
                    result = run_in_subprocess(job, policy)
                    seconds[engine].append(result["seconds"])
                    outputs[engine] = result["outputs"]
                    print(f"  {policy} beam {beam} {engine} run {repeat + 1}: {result['seconds']:.2f} s", file=sys.stderr)
            median = {e: statistics.median(s) for e, s in seconds.items()}
            for engine in engines:
                tokens = target_tokens(outputs[engine], args.max_steps)
                ratio = median[engine] / median["tfm"] if "tfm" in median else float("nan")
                # The same ratio per repeat (the two runs were minutes apart at most): median, min-max.
                paired = sorted(e / t for e, t in zip(seconds[engine], seconds["tfm"])) if "tfm" in seconds else []
                paired_text = f"{statistics.median(paired):.2f} ({paired[0]:.2f}-{paired[-1]:.2f})" if paired else "-"
                agree = agreement(outputs["tfm"], outputs[engine], args.max_steps) if "tfm" in outputs else float("nan")
                bleu = f" {corpus_bleu(checkpoint, outputs[engine], args.reference):.2f} |" if args.reference else ""
                print(f"| {policy} | {beam} | {engine} | {n_sentences / median[engine]:.1f} | "
                      f"{tokens / median[engine]:.0f} | {ratio:.2f} | {paired_text} | {agree:.1f}% |{bleu}", flush=True)
            for tfm_engine, peer in SAME_PRECISION:
                if tfm_engine in seconds and peer in seconds:
                    paired = sorted(p / t for p, t in zip(seconds[peer], seconds[tfm_engine]))
                    pairs_rows.append(f"| {policy} | {beam} | {tfm_engine} / {peer} | "
                                      f"{median[peer] / median[tfm_engine]:.2f} | {paired[0]:.2f}-{paired[-1]:.2f} |")
    if pairs_rows:
        print("\n| OMP_WAIT_POLICY | beam | same precision | tfm faster by (median times) | per repeat min-max |")
        print("|---|---|---|---|---|")
        print("\n".join(pairs_rows))


if __name__ == "__main__":
    main()
