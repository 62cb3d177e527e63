"""`tfm shortlist`: build a lexical shortlist for a model from a parallel corpus (for `translate --shortlist`)."""

from __future__ import annotations

import typer

from tfm_cli.commands import model_runs
from tfm_cli.console import print_info
from tfm_cli.errors import TfmError

EPILOG = (
    "Examples:\n\n"
    "  tfm shortlist -m de-en.safetensors --src train.de --tgt train.en -o de-en.shortlist.safetensors\n\n"
    "  tfm translate -m de-en.safetensors --shortlist de-en.shortlist.safetensors -i test.de\n\n"
    "The shortlist keeps the --frequent most frequent target tokens of the corpus and, per source token, "
    "the --per-source target tokens most associated with it (Dice coefficient over the sentence pairs, "
    "tokenized by the model's own tokenizers). `translate --shortlist` then computes the output layer for "
    "those tokens only: faster where the vocabulary is large; translations may change (measure BLEU on "
    "your validation set). The defaults were chosen on Multi30k's validation set (bench/RESULTS.md)."
)

DEFAULT_FREQUENT = 200
DEFAULT_PER_SOURCE = 20


def shortlist(
    model: str = typer.Option(..., "-m", "--model", help="The tfm checkpoint the shortlist is for (its tokenizers cut the corpus)."),
    src: str = typer.Option(..., "--src", help="Source side of a parallel corpus, one sentence per line (raw text)."),
    tgt: str = typer.Option(..., "--tgt", help="Target side, line-parallel to --src."),
    output: str = typer.Option(..., "-o", "--output", help="The shortlist file to write (.safetensors)."),
    frequent: int = typer.Option(DEFAULT_FREQUENT, "--frequent", help="The most frequent target tokens every sentence may use."),
    per_source: int = typer.Option(DEFAULT_PER_SOURCE, "--per-source", help="Target tokens kept per source token (best Dice coefficient first)."),
    progress: bool = model_runs.progress_option(),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr (warnings and errors still show)."),
) -> None:
    """Build a lexical shortlist: per source token, the target tokens a translation may use."""
    from pathlib import Path

    from tfm_cli.checkpoints.format import load_model
    from tfm_cli.corpus.parallel_text import ReadReport, read_pairs
    from tfm_cli.inference.shortlist import count_corpus, save_shortlist, tokenizer_fingerprint
    from tfm_cli.textio.paths import check_input_file, check_output_path

    if frequent < 0 or per_source < 1:
        raise TfmError(f"--frequent must be 0 or more and --per-source 1 or more, got {frequent} and {per_source}")
    check_input_file(src, "--src")
    check_input_file(tgt, "--tgt")
    check_output_path(Path(output))
    loaded = load_model(model)
    src_tokenizer, tgt_tokenizer = loaded.src_tokenizer, loaded.tgt_tokenizer
    report = ReadReport()
    total_bytes = Path(src).stat().st_size + Path(tgt).stat().st_size

    def encoded_chunks(on_bytes):
        for chunk in read_pairs(src, tgt, "shortlist corpus", skip_invalid=False, report=report):
            src_ids = src_tokenizer.encode_ids_batch(chunk.src)
            tgt_ids = tgt_tokenizer.encode_ids_batch(chunk.tgt)
            yield [(s, t) for s, t in zip(src_ids, tgt_ids) if s and t]
            on_bytes(chunk.bytes_read)

    with model_runs.progress_bar(model_runs.shows_progress(progress, quiet)) as bar:
        task = bar.add_task("counting token pairs (bytes)", total=total_bytes)
        counts = count_corpus(
            encoded_chunks(lambda done: bar.update(task, completed=done)),
            loaded.config.src_vocab_size, loaded.config.tgt_vocab_size,
        )
    if counts.pairs == 0:
        raise TfmError(f"{src} and {tgt} hold no sentence pair with text on both sides: nothing to build a shortlist from")
    built = counts.shortlist(frequent, per_source, tokenizer_fingerprint(src_tokenizer), tokenizer_fingerprint(tgt_tokenizer))
    provenance = {
        "model": str(model), "src": str(src), "tgt": str(tgt), "src_sha256": report.src_sha256,
        "tgt_sha256": report.tgt_sha256, "pairs": str(counts.pairs), "frequent": str(frequent),
        "per_source": str(per_source), "score": "dice",
    }
    save_shortlist(output, built, provenance)
    sources_with = int((built.candidates[:, 0] >= 0).sum())
    print_info(
        f"wrote {output}: {built.frequent.numel()} frequent target tokens, up to {per_source} per source token "
        f"for {sources_with:,} of {built.src_vocab_size:,} source tokens, from {counts.pairs:,} sentence pairs",
        quiet=quiet,
    )
