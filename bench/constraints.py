"""Lexically constrained decoding on a test set: constraint coverage, BLEU and throughput, in one run.

The standard evaluation (Post & Vilar 2018; Hu et al. 2019): each line gets 1-3 constraints, each a
random phrase of 1-3 consecutive reference words (not overlapping, not punctuation only), drawn
with a fixed seed. Reported:
  coverage     the share of satisfiable constraints (none dropped for length or vocabulary) whose
               text appears in the output
  BLEU         sacrebleu's corpus BLEU without and with the constraints (beam 5)
  throughput   lines/s with exactly 0, 1, 2 and 4 one-word constraints per line (beam 5), as the
               median of --repeats rounds in rotating order, and the ratio to 0 constraints
Everything runs in this process through the library (Translator), on --threads threads.

Usage: python bench/constraints.py -m MODEL --src test.en --ref test.fr [--speed-lines 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import date

import sacrebleu
import torch

from prepare_corpus import cpu_flags
from tfm_cli.checkpoints.format import load_model
from tfm_cli.config import DecodeConfig
from tfm_cli.inference.text_preparation import TextOptions
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator


def draw_phrases(reference: str, rng: random.Random, count: int, max_words: int) -> list[str]:
    """Up to `count` non-overlapping phrases of 1..max_words consecutive words of `reference`, each
    with at least one letter or digit, in the order drawn."""
    words = reference.split()
    taken: set[int] = set()
    phrases = []
    for _ in range(20 * count):
        if len(phrases) == count:
            break
        length = rng.randint(1, max_words)
        start = rng.randrange(max(1, len(words) - length + 1))
        span = range(start, min(start + length, len(words)))
        phrase = " ".join(words[i] for i in span)
        if taken.intersection(span) or not any(ch.isalnum() for ch in phrase):
            continue
        taken.update(span)
        phrases.append(phrase)
    return phrases


def translate(translator: Translator, lines: list[str]) -> list:
    """TranslatedLines for `lines`, one chunk."""
    return translator.translate_chunk(lines, 0, TranslationStats())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--speed-lines", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sources = open(args.src, encoding="utf-8").read().splitlines()
    references = open(args.ref, encoding="utf-8").read().splitlines()
    loaded = load_model(args.model)
    decode = DecodeConfig(beam_size=5, length_penalty=loaded.decode_defaults.get("length_penalty", 0.6))
    batching = BatchingConfig(buffer_size=len(sources))
    plain = Translator(loaded, decode, batching)
    constrained = Translator(loaded, decode, batching, text=TextOptions(constraint_fields=True))

    rng = random.Random(args.seed)
    phrases = [draw_phrases(ref, rng, rng.randint(1, 3), 3) for ref in references]
    unconstrained_out = [r.outputs[0].text if r.outputs else "" for r in translate(plain, sources)]
    results = translate(constrained, ["\t".join([s, *p]) for s, p in zip(sources, phrases)])
    constrained_out = [r.outputs[0].text if r.outputs else "" for r in results]
    satisfiable = met = dropped = 0
    for line_phrases, result, text in zip(phrases, results, constrained_out):
        if any("were not used" in w or "without them" in w for w in result.warnings):
            dropped += len(line_phrases)
            continue
        satisfiable += len(line_phrases)
        met += sum(phrase in text for phrase in line_phrases)
    metric = sacrebleu.BLEU()
    bleu_plain = metric.corpus_score(unconstrained_out, [references])
    bleu_constrained = metric.corpus_score(constrained_out, [references])
    signature = metric.get_signature()

    speed_sources = sources[: args.speed_lines]
    speed_refs = references[: args.speed_lines]
    speed_rng = random.Random(args.seed + 1)
    inputs = {}
    for count in (0, 1, 2, 4):
        lines = []
        for source, ref in zip(speed_sources, speed_refs):
            drawn = draw_phrases(ref, speed_rng, count, 1) if count else []
            lines.append("\t".join([source, *drawn]))
        inputs[count] = lines
    timings: dict[int, list[float]] = {count: [] for count in inputs}
    translate(constrained, inputs[2][:20])  # warm-up
    for repeat in range(args.repeats):
        order = list(inputs)[repeat % len(inputs):] + list(inputs)[: repeat % len(inputs)]
        for count in order:
            translator = plain if count == 0 else constrained
            lines = [line.split("\t")[0] for line in inputs[0]] if count == 0 else inputs[count]
            start = time.perf_counter()
            translate(translator, lines)
            timings[count].append(time.perf_counter() - start)

    print(f"# bench/constraints.py, {date.today()}, {cpu_flags()}, torch {torch.__version__}, {args.threads} threads")
    print(f"# model {args.model}; {len(sources)} lines; {sum(map(len, phrases))} constraints "
          f"({sum(map(len, phrases)) / len(phrases):.2f} per line); beam 5, length penalty {decode.length_penalty}")
    print()
    print("| decoding | BLEU | constraints met |")
    print("|---|---:|---:|")
    print(f"| unconstrained | {bleu_plain.score:.2f} | - |")
    print(f"| constrained | {bleu_constrained.score:.2f} | {met}/{satisfiable} satisfiable "
          f"({100 * met / max(satisfiable, 1):.2f}%); {dropped} dropped as unsatisfiable |")
    print(f"\nBLEU signature: {signature}")
    print()
    base = statistics.median(timings[0])
    print(f"| constraints per line | lines/s (median of {args.repeats}, {len(speed_sources)} lines) | vs 0 |")
    print("|---:|---:|---:|")
    for count in inputs:
        seconds = statistics.median(timings[count])
        print(f"| {count} | {len(speed_sources) / seconds:.1f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
