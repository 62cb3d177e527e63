"""`tfm export`: a tfm checkpoint as a Hugging Face MarianMT folder or a CTranslate2 model folder."""

from __future__ import annotations

from pathlib import Path

import typer

from tfm_cli.console import print_info

# rich renders --help and takes a bare [name] for markup (dropping it): brackets are written \\[.
EPILOG = (
    "Examples:\n\n"
    "  tfm export -m runs/de-en/average.safetensors --to marian de-en-marian\n\n"
    "  tfm export -m runs/de-en/average.safetensors --to ctranslate2 --quantization int8 de-en-ct2\n\n"
    "  python -c \"import ctranslate2; print(ctranslate2.Translator('de-en-ct2').translate_batch([['▁Ein', '▁Hund', '</s>']]))\"\n\n"
    "--to marian needs nothing beyond tfm (transformers' MarianMTModel and MarianTokenizer load the "
    "folder); --to ctranslate2 needs the ctranslate2 package: pip install 'tfm-cli\\[ctranslate2]'. "
    "The folder is written whole or not at all, and must be new or empty."
)


def export(
    folder: Path = typer.Argument(..., help="The folder to write (new, or empty)."),
    model: str = typer.Option(..., "-m", "--model", help="The tfm checkpoint (.safetensors) to export."),
    to: str = typer.Option(..., "--to", help="marian (Hugging Face MarianMT) or ctranslate2."),
    quantization: str = typer.Option(
        "float32", "--quantization",
        help="With --to ctranslate2: float32, int8, int8_float32, int8_float16, int8_bfloat16, float16 or bfloat16.",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Export a checkpoint for other engines: MarianMT (transformers) or CTranslate2, computing what tfm computes."""
    from tfm_cli.checkpoints.format import checkpoint_tokenizers, read_checkpoint
    from tfm_cli.errors import TfmError
    from tfm_cli.interop.exporting import export_model

    if to == "marian" and quantization != "float32":
        raise TfmError("--quantization goes with --to ctranslate2; a MarianMT folder is float32")
    checkpoint = read_checkpoint(model)
    src, tgt = checkpoint_tokenizers(model, checkpoint)
    export_model(checkpoint, src, tgt, to, folder, quantization)
    what = "a MarianMT folder" if to == "marian" else f"a CTranslate2 model ({quantization})"
    print_info(f"wrote {folder}: {what}", quiet=quiet)
