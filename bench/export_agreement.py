"""Do exported models translate like tfm? Greedy outputs of `tfm translate -b 1` against MarianMTModel
(`tfm export --to marian`) and CTranslate2 (`tfm export --to ctranslate2`, each --quantization given).

Every engine decodes the same lines greedily with a length limit no sentence reaches (each stops
at its own EOS); the table gives, per engine, the share of lines identical to tfm's and the BLEU of
each against the reference when one is given. Not timed: see translate_vs_peers.py for speed.

Usage: python bench/export_agreement.py --model CKPT [--source SRC] [--reference REF] [--quantizations float32,int8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
MAX_TOKENS = 200


def tfm_greedy(model: Path, source: Path) -> list[str]:
    """`tfm translate -b 1` on every line of `source`, in a subprocess, as a user runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", str(model), "-i", str(source), "-b", "1",
         "--max-len-a", "0", "--max-len-b", str(MAX_TOKENS), "-q"],
        capture_output=True, text=True, check=True,
    )
    return result.stdout.splitlines()


def marian_greedy(folder: Path, lines: list[str]) -> list[str]:
    """MarianMTModel.generate(num_beams=1) with MarianTokenizer, batches of 32."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(folder).eval()
    tokenizer = MarianTokenizer.from_pretrained(folder)
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(lines), 32):
            batch = tokenizer(lines[start : start + 32], return_tensors="pt", padding=True)
            generated = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_TOKENS)
            outputs += tokenizer.batch_decode(generated, skip_special_tokens=True)
    return outputs


def ctranslate2_greedy(folder: Path, model: Path, lines: list[str]) -> list[str]:
    """ctranslate2.Translator.translate_batch(beam_size=1) on the checkpoint's own source pieces."""
    import ctranslate2

    from tfm_cli.checkpoints.format import load_model

    loaded = load_model(model)
    src, tgt = loaded.src_tokenizer, loaded.tgt_tokenizer
    eos = src.id_to_piece(loaded.config.eos_id)
    pieces = [[src.id_to_piece(i) for i in src.encode_ids(line)] + [eos] for line in lines]
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=2)
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=MAX_TOKENS, max_batch_size=32)
    return [tgt.decode_ids([tgt.piece_to_id(p) for p in result.hypotheses[0]]) for result in results]


def main() -> None:
    """Export, decode with every engine, print a markdown table."""
    import sacrebleu

    from tfm_cli.checkpoints.format import checkpoint_tokenizers, read_checkpoint
    from tfm_cli.interop.exporting import export_model
    from tfm_cli.textio.streams import read_lines

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="tfm checkpoint (.safetensors)")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--reference", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--quantizations", default="float32,int8")
    args = parser.parse_args()
    lines = read_lines(str(args.source))
    references = read_lines(str(args.reference)) if args.reference and args.reference.exists() else None
    checkpoint = read_checkpoint(args.model)
    src, tgt = checkpoint_tokenizers(args.model, checkpoint)
    outputs = {"tfm translate -b 1": tfm_greedy(args.model, args.source)}
    with tempfile.TemporaryDirectory(prefix="tfm-export-") as work:
        export_model(checkpoint, src, tgt, "marian", Path(work) / "marian")
        outputs["MarianMTModel (--to marian)"] = marian_greedy(Path(work) / "marian", lines)
        for quantization in args.quantizations.split(","):
            folder = Path(work) / f"ct2-{quantization}"
            export_model(checkpoint, src, tgt, "ctranslate2", folder, quantization)
            outputs[f"CTranslate2 {quantization}"] = ctranslate2_greedy(folder, args.model, lines)
    reference_outputs = outputs["tfm translate -b 1"]
    print(f"# {args.model}: {len(lines)} lines of {args.source}, greedy, at most {MAX_TOKENS} tokens")
    print("| engine | lines identical to tfm | BLEU |")
    print("|---|---|---|")
    for engine, hypotheses in outputs.items():
        same = sum(a == b for a, b in zip(hypotheses, reference_outputs))
        bleu = f"{sacrebleu.corpus_bleu(hypotheses, [references]).score:.2f}" if references else "-"
        print(f"| {engine} | {same} / {len(lines)} ({100 * same / len(lines):.1f}%) | {bleu} |")


if __name__ == "__main__":
    main()
