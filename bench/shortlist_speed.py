"""`tfm translate --shortlist` against the full output layer: whole processes, side by side, in one run.

Rows, each a fresh `tfm translate` process on the same source file, timed from start to exit; full and
shortlisted rows alternate run by run and the table shows medians, lines/s, the shortlist's speed as a
multiple of the full layer's in the same precision and beam, BLEU (sacrebleu, cased, 13a) against
--reference when given, and the share of lines whose translation changed:
  --beams 1,5 x --dtypes float32,int8, each without and with --shortlist.
--translate-options go to every row (e.g. "--min-len 24 --max-len-a 0 --max-len-b 24" for equal work).
With --ct2, CTranslate2 (a Python script as its users write it, on `tfm export --to ctranslate2` of the
model in the same precision; max_batch_size 32) joins each (dtype, beam) with its full vocabulary, once per
--ct2-settings entry (inter_threads x intra_threads; default 1x2 and 2x1, the two ways of using two
cores), and with --ct2-vmap also with its own vocabulary map (use_vmap) made from the same shortlist:
the same frequent tokens and per-source candidates, as vmap.txt lines `source piece<TAB>target pieces`.
--ct2-length L fixes its output length as the options above fix tfm's (min = max decoding length L).

Two ways to give the model:
  --model M --shortlist S           a tfm checkpoint and a shortlist built for it (`tfm shortlist`)
  --base-shape DIR --corpus-src F --corpus-tgt F
                                    a random MarianMTModel of OPUS-MT's Transformer-base shape (d_model 512,
                                    6+6 layers, FFN 2048, 8 heads, 58,101 vocabulary entries: sentencepiece
                                    models of the corpus, 6,000 pieces a side, padded with unused entries as
                                    OPUS-MT's joint vocabularies are large), imported with `tfm import`, and its
                                    shortlist built from the corpus; made once in DIR and reused. Its outputs are
                                    random text: only the speed means something (fix the length as above).

Usage: python bench/shortlist_speed.py --model M --shortlist S --src test.de [--reference test.en]
       [--lines 1000] [--runs 3] [--threads 2] [--beams 1,5] [--dtypes float32,int8]
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prepare_corpus import cpu_flags  # noqa: E402
from student_speed import tfm_command, timed  # noqa: E402
from translate_memory import export_ctranslate2  # noqa: E402
from whole_process import bleu  # noqa: E402

BASE_VOCABULARY = 58_101  # opus-mt-de-en's vocabulary.json entries
BASE_PIECES = 6_000  # per side, from the corpus (Multi30k's German allows at most ~7,800)


def train_spm(lines_path: Path, vocab_size: int) -> bytes:
    """A unigram sentencepiece model of `lines_path`, as Marian's are (sentencepiece's default ids)."""
    import sentencepiece as spm

    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(lines_path), model_writer=writer, vocab_size=vocab_size, minloglevel=2)
    return writer.getvalue()


def build_base_shape(folder: Path, corpus_src: Path, corpus_tgt: Path) -> tuple[Path, Path]:
    """The imported random base-shape model and its shortlist in `folder` (made once): (model, shortlist)."""
    import sentencepiece as spm
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    model_path, shortlist_path = folder / "base.safetensors", folder / "base.shortlist.safetensors"
    if model_path.exists() and shortlist_path.exists():
        return model_path, shortlist_path
    marian = folder / "marian"
    marian.mkdir(parents=True, exist_ok=True)
    models = [train_spm(corpus_src, BASE_PIECES), train_spm(corpus_tgt, BASE_PIECES)]
    (marian / "source.spm").write_bytes(models[0])
    (marian / "target.spm").write_bytes(models[1])
    pieces = ["</s>", "<unk>"]
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i) and piece not in pieces:
                pieces.append(piece)
    pieces += [f"<unused{i}>" for i in range(BASE_VOCABULARY - 1 - len(pieces))] + ["<pad>"]
    vocabulary = {piece: index for index, piece in enumerate(pieces)}
    (marian / "vocab.json").write_text(json.dumps(vocabulary), encoding="utf-8")
    pad_id = vocabulary["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocabulary), decoder_vocab_size=len(vocabulary), d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
        max_position_embeddings=512, activation_function="swish", scale_embedding=True, dropout=0.0,
        pad_token_id=pad_id, eos_token_id=0, decoder_start_token_id=pad_id, forced_eos_token_id=0,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    model.generation_config = GenerationConfig(decoder_start_token_id=pad_id, eos_token_id=0, pad_token_id=pad_id,
                                               forced_eos_token_id=0, bad_words_ids=[[pad_id]], num_beams=5)
    model.save_pretrained(marian)
    tokenizer_config = {"separate_vocabs": False, "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
                        "model_max_length": 512, "tokenizer_class": "MarianTokenizer"}
    (marian / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    tfm = [sys.executable, "-m", "tfm_cli"]
    subprocess.run([*tfm, "import", str(marian), "-o", str(model_path)], check=True)
    subprocess.run([*tfm, "shortlist", "-m", str(model_path), "--src", str(corpus_src), "--tgt", str(corpus_tgt),
                    "-o", str(shortlist_path)], check=True)
    return model_path, shortlist_path


CTRANSLATE2 = """
import sys, ctranslate2, sentencepiece
folder, spm_model, source, output, beam, inter, threads, length, use_vmap = sys.argv[1:10]
tokenizer = sentencepiece.SentencePieceProcessor(model_file=spm_model)
translator = ctranslate2.Translator(folder, device="cpu", inter_threads=int(inter), intra_threads=int(threads))
lines = open(source, encoding="utf-8").read().splitlines()
limits = dict(min_decoding_length=int(length), max_decoding_length=int(length)) if int(length) else dict(max_decoding_length=256)
results = translator.translate_batch(
    [tokens + ["</s>"] for tokens in tokenizer.encode(lines, out_type=str)], beam_size=int(beam),
    max_batch_size=32, use_vmap=use_vmap == "1", **limits,
)
with open(output, "w", encoding="utf-8") as out:
    for result in results:
        out.write(tokenizer.decode(result.hypotheses[0]) + "\\n")
"""


def write_vmap(shortlist_path: Path, model: Path, folder: Path) -> None:
    """CTranslate2's vmap.txt in `folder` from a tfm shortlist: one line of the frequent target pieces after an
    empty key, then one line per source piece with candidates: the piece, a TAB, its candidate pieces."""
    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.inference.shortlist import NO_CANDIDATE, load_shortlist

    loaded, shortlist = load_model(model), load_shortlist(shortlist_path)
    source, target = loaded.src_tokenizer, loaded.tgt_tokenizer
    lines = ["\t" + " ".join(target.id_to_piece(i) for i in shortlist.frequent.tolist())]
    for source_id, candidates in enumerate(shortlist.candidates.tolist()):
        ids = [i for i in candidates if i != NO_CANDIDATE]
        if ids:
            lines.append(source.id_to_piece(source_id) + "\t" + " ".join(target.id_to_piece(i) for i in ids))
    (folder / "vmap.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--shortlist", type=Path)
    parser.add_argument("--base-shape", type=Path, help="folder for the random base-shape model (made once)")
    parser.add_argument("--corpus-src", type=Path)
    parser.add_argument("--corpus-tgt", type=Path)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--translate-options", default="", help="more `tfm translate` options for every row")
    parser.add_argument("--ct2", action="store_true", help="add CTranslate2 rows with its full vocabulary")
    parser.add_argument("--ct2-vmap", action="store_true", help="and with its vocabulary map made from the shortlist")
    parser.add_argument("--ct2-length", type=int, default=0, help="CTranslate2's min = max decoding length (0: free)")
    parser.add_argument("--ct2-settings", default="1x2,2x1", help="CTranslate2's inter_threads x intra_threads, comma-separated")
    args = parser.parse_args()
    if args.base_shape is not None:
        if args.corpus_src is None or args.corpus_tgt is None:
            parser.error("--base-shape needs --corpus-src and --corpus-tgt")
        args.model, args.shortlist = build_base_shape(args.base_shape, args.corpus_src, args.corpus_tgt)
    elif args.model is None or args.shortlist is None:
        parser.error("give --model and --shortlist, or --base-shape")

    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    extra = shlex.split(args.translate_options)
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        source = folder / "source.txt"
        lines = args.src.read_text(encoding="utf-8").splitlines()[: args.lines]
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        reference = None
        if args.reference is not None:
            reference = folder / "reference.txt"
            reference.write_text("\n".join(args.reference.read_text(encoding="utf-8").splitlines()[: args.lines]) + "\n",
                                 encoding="utf-8")
        rows: dict[str, tuple[list[str], Path]] = {}
        exported = export_ctranslate2(args.model, folder / "ct2") if args.ct2 else {}
        for model_folder in exported.values() if args.ct2_vmap else ():
            write_vmap(args.shortlist, args.model, model_folder)
        for dtype in args.dtypes.split(","):
            for beam in args.beams.split(","):
                for shortlisted in (False, True):
                    name = f"{dtype}, beam {beam}, {'--shortlist' if shortlisted else 'full'}"
                    output = folder / f"{len(rows)}.txt"
                    options = ["--beam", beam, "--dtype", dtype, *extra]
                    if shortlisted:
                        options += ["--shortlist", str(args.shortlist)]
                    rows[name] = (tfm_command(args.model, source, output, args.threads, *options), output)
                for setting in args.ct2_settings.split(",") if args.ct2 else ():
                    inter, intra = setting.split("x")
                    for vmap in (False, True) if args.ct2_vmap else (False,):
                        name = (f"CTranslate2 {dtype}, beam {beam}, inter {inter} intra {intra}, "
                                f"{'use_vmap' if vmap else 'full'}")
                        output = folder / f"{len(rows)}.txt"
                        rows[name] = ([sys.executable, "-c", CTRANSLATE2, str(exported[dtype]),
                                       str(folder / "ct2" / "spm.model"), str(source), str(output), beam, inter, intra,
                                       str(args.ct2_length), "1" if vmap else "0"], output)
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.runs):
            for name, (command, _) in rows.items():
                times[name].append(timed(command))
        outputs = {name: output.read_text(encoding="utf-8").splitlines() for name, (_, output) in rows.items()}
        scores = {name: bleu(output, reference) if reference else None for name, (_, output) in rows.items()}

    print(f"{len(lines)} lines of {args.src.name}, model {args.model.name}, --threads {args.threads}, "
          f"options {' '.join(extra) or '(none)'}, median of {args.runs} whole processes (rows alternating), "
          f"{started}, CPU: {cpu_flags()}\n")
    print("| row | seconds | lines/s | shortlist (vmap) speed-up | BLEU | lines changed |")
    print("|---|---:|---:|---:|---:|---:|")
    names = list(rows)
    for index, name in enumerate(names):
        seconds = statistics.median(times[name])
        full = names[index - 1] if name.endswith(("--shortlist", "use_vmap")) else name
        speedup = statistics.median(times[full]) / seconds
        changed = sum(a != b for a, b in zip(outputs[name], outputs[full]))
        score = f"{scores[name]:.2f}" if scores[name] is not None else "-"
        print(f"| {name} | {seconds:.2f} | {len(lines) / seconds:.1f} | {speedup:.2f} | {score} | {changed} |")
    if args.ct2:
        print_against_best_ct2({name: statistics.median(seconds) for name, seconds in times.items()})


def print_against_best_ct2(seconds: dict[str, float]) -> None:
    """Print, per precision and beam, tfm's full layer and shortlist as multiples of CTranslate2's fastest row."""
    print("\n| precision, beam | CTranslate2's fastest row | tfm full vs it | tfm --shortlist vs it |")
    print("|---|---|---:|---:|")
    for name, full_seconds in seconds.items():
        if name.startswith("CTranslate2") or not name.endswith(", full"):
            continue
        setting = name.removesuffix(", full")
        ct2 = {row: value for row, value in seconds.items() if row.startswith(f"CTranslate2 {setting}, ")}
        fastest = min(ct2, key=ct2.get)
        shortlisted = seconds[f"{setting}, --shortlist"]
        print(f"| {setting} | {fastest.removeprefix('CTranslate2 ')} | {ct2[fastest] / full_seconds:.2f}x | "
              f"{ct2[fastest] / shortlisted:.2f}x |")


if __name__ == "__main__":
    main()
