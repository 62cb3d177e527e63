"""CTranslate2's ways of using the cores, side by side: which setting a user tuning it would pick here.

For one CTranslate2 model folder (`tfm export --to ctranslate2`, or `ct2-transformers-converter` for a
MarianMT folder) and its source sentencepiece model, translates the first --lines of --source with
`translate_batch(max_batch_size=32)` (translate_file's default) under each (inter_threads,
intra_threads) of --settings, in each --compute-types and at each --beams, alternating settings run
by run; prints the median seconds of --runs (the decoder alone: the model is loaded and warmed up
before timing) and each setting's speed relative to the first. --length N makes every output exactly
N tokens (min = max decoding length: equal work whatever the weights). Nothing here is a test.

    python bench/ctranslate2_threads.py --model CT2_FOLDER --spm source.spm \\
        --source ../shared/data/multi30k/test_2016_flickr.de --settings 1x2,2x1,1x1
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import lscpu_model, table  # noqa: E402


def parse_settings(text: str) -> list[tuple[int, int]]:
    """'1x2,2x1' -> [(1, 2), (2, 1)]: (inter_threads, intra_threads) pairs."""
    pairs = []
    for item in text.split(","):
        inter, intra = item.split("x")
        pairs.append((int(inter), int(intra)))
    return pairs


def main() -> int:
    import ctranslate2
    import sentencepiece

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a CTranslate2 model folder")
    parser.add_argument("--spm", required=True, help="the source sentencepiece model")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--settings", default="1x2,2x1", help="inter_threads x intra_threads, comma-separated")
    parser.add_argument("--compute-types", default="float32,int8")
    parser.add_argument("--beams", default="5,1")
    parser.add_argument("--length", type=int, default=0, help="every output exactly this many tokens (0: free, at most 80)")
    parser.add_argument("--append-eos", action="store_true", help="end each source with </s> (Marian models expect it)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pieces = sentencepiece.SentencePieceProcessor(model_file=args.spm)
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.lines]
    tokens = [pieces.encode(line, out_type=str) + (["</s>"] if args.append_eos else []) for line in lines]
    limits = (dict(min_decoding_length=args.length, max_decoding_length=args.length) if args.length
              else dict(max_decoding_length=80))
    settings = parse_settings(args.settings)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for compute_type in args.compute_types.split(","):
        translators = {
            setting: ctranslate2.Translator(args.model, device="cpu", compute_type=compute_type,
                                            inter_threads=setting[0], intra_threads=setting[1])
            for setting in settings
        }
        for beam in [int(b) for b in args.beams.split(",")]:
            seconds: dict[tuple[int, int], list[float]] = {setting: [] for setting in settings}
            for setting, translator in translators.items():  # warm-up
                translator.translate_batch(tokens[:32], beam_size=beam, max_batch_size=32, **limits)
            for _ in range(args.runs):
                for setting, translator in translators.items():
                    start = time.perf_counter()
                    translator.translate_batch(tokens, beam_size=beam, max_batch_size=32, length_penalty=0, **limits)
                    seconds[setting].append(time.perf_counter() - start)
            first = statistics.median(seconds[settings[0]])
            for setting in settings:
                median = statistics.median(seconds[setting])
                rows.append([compute_type, beam, f"inter {setting[0]}, intra {setting[1]}", f"{median:.2f}",
                             f"{len(lines) / median:.1f}", f"{first / median:.2f}x"])
        del translators
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/ctranslate2_threads.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {cpu_flags()}; ctranslate2 {ctranslate2.__version__}\n")
    print(table(["compute type", "beam", "setting", "median s", "lines/s", f"vs inter {settings[0][0]}, intra {settings[0][1]}"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
