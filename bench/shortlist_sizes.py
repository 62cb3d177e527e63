"""Choose a shortlist's sizes on validation, never on a test set: BLEU and coverage per (frequent, per-source).

For every pair of --frequent and --per-source values this builds a shortlist from the training corpus
(`tfm shortlist`), translates the validation source with it (`tfm translate --shortlist`, the model's
[decode] settings plus --translate-options) and prints, beside the full output layer's row: cased
sacreBLEU against the validation references, the share of reference tokens (the model's target
tokenizer) inside their sentence's list (coverage), and the mean number of target tokens per sentence
and per batch of --batch-size sentences (what the output layer computes). Each row is a fresh `tfm`
process. The rule it applies, declared before looking: the smallest mean batch list whose BLEU is
within --tolerance of the full layer's.

    python bench/shortlist_sizes.py -m MODEL --corpus-src train.de --corpus-tgt train.en --src val.de
        --reference val.en [--frequent 50,100,200] [--per-source 10,20,50] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import sacrebleu

sys.path.insert(0, str(Path(__file__).parent))
from prepare_corpus import cpu_flags  # noqa: E402

TFM = [sys.executable, "-m", "tfm_cli"]


def run(command: list[str]) -> str:
    """stdout of a tfm process; ends the bench with its stderr when it fails."""
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, command[:6]))}... failed:\n{result.stderr[-2000:]}")
    return result.stdout


def list_sizes(shortlist_path: Path, model: Path, sources: list[str], references: list[str], batch_size: int):
    """(coverage of the reference tokens, mean tokens per sentence list, mean tokens per batch union)."""
    import torch

    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.inference.shortlist import load_shortlist

    loaded, shortlist = load_model(model), load_shortlist(shortlist_path)
    eos = loaded.config.eos_id
    per_sentence = [shortlist.sentence_ids(ids, [eos]) for ids in loaded.src_tokenizer.encode_ids_batch(sources)]
    covered = total = 0
    for ids, reference in zip(per_sentence, loaded.tgt_tokenizer.encode_ids_batch(references)):
        allowed = set(ids.tolist())
        covered += sum(token in allowed for token in reference)
        total += len(reference)
    unions = [torch.unique(torch.cat(per_sentence[i : i + batch_size])).numel() for i in range(0, len(per_sentence), batch_size)]
    return covered / total, sum(ids.numel() for ids in per_sentence) / len(per_sentence), sum(unions) / len(unions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--corpus-src", type=Path, required=True)
    parser.add_argument("--corpus-tgt", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--frequent", default="50,100,200")
    parser.add_argument("--per-source", default="10,20,50")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch for the union sizes (translate's default)")
    parser.add_argument("--tolerance", type=float, default=0.1, help="BLEU below the full layer's a choice may lose")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--translate-options", default="")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()

    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sources = args.src.read_text(encoding="utf-8").splitlines()
    references = args.reference.read_text(encoding="utf-8").splitlines()
    extra = shlex.split(args.translate_options)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="shortlist-sizes-"))
    workdir.mkdir(parents=True, exist_ok=True)
    translate = [*TFM, "translate", "-m", args.model, "-i", args.src, "--threads", args.threads, "-q", *extra]

    def bleu(output: str) -> float:
        return sacrebleu.corpus_bleu(output.splitlines(), [references]).score

    full = bleu(run(translate))
    rows = []
    for frequent, per_source in itertools.product(args.frequent.split(","), args.per_source.split(",")):
        path = workdir / f"shortlist-{frequent}-{per_source}.safetensors"
        run([*TFM, "shortlist", "-m", args.model, "--src", args.corpus_src, "--tgt", args.corpus_tgt, "-o", path,
             "--frequent", frequent, "--per-source", per_source, "-q"])
        score = bleu(run([*translate, "--shortlist", path]))
        coverage, per_sentence, per_batch = list_sizes(path, args.model, sources, references, args.batch_size)
        rows.append((int(frequent), int(per_source), score, coverage, per_sentence, per_batch))

    print(f"{len(sources)} lines of {args.src.name}, model {args.model}, options {' '.join(extra) or '(the model [decode])'}, "
          f"{started}, CPU: {cpu_flags()}\n")
    print("| --frequent | --per-source | BLEU | vs full | reference tokens covered | tokens per sentence | per batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| full | | {full:.2f} | | 100% | | |")
    for frequent, per_source, score, coverage, per_sentence, per_batch in rows:
        print(f"| {frequent} | {per_source} | {score:.2f} | {score - full:+.2f} | {100 * coverage:.1f}% | "
              f"{per_sentence:.0f} | {per_batch:.0f} |")
    eligible = [row for row in rows if row[2] >= full - args.tolerance]
    if eligible:
        chosen = min(eligible, key=lambda row: (row[5], -row[2]))
        print(f"\nchosen (smallest per-batch list within {args.tolerance} BLEU of full): --frequent {chosen[0]} "
              f"--per-source {chosen[1]}")
    else:
        print(f"\nno size is within {args.tolerance} BLEU of the full output layer")


if __name__ == "__main__":
    main()
