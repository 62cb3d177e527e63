"""`tfm import`: a Hugging Face MarianMT folder (OPUS-MT) in, one self-contained tfm checkpoint out."""

from __future__ import annotations

from pathlib import Path

import typer

from tfm_cli.console import print_info

EPILOG = (
    "Examples:\n\n"
    "  hf download Helsinki-NLP/opus-mt-de-en --local-dir opus-mt-de-en\n\n"
    "  tfm import opus-mt-de-en -o de-en.safetensors && echo 'Ein Hund rennt.' | tfm translate -m de-en.safetensors\n\n"
    "  tfm import Helsinki-NLP/opus-mt-en-roa -o en-roa.safetensors   # a hub id: needs huggingface_hub and a network\n\n"
    "The checkpoint holds the weights, both tokenizers and the model's generation defaults (beam size, "
    "length penalty, length limit), which `tfm translate` uses unless flags override them."
)


def import_model(
    source: str = typer.Argument(..., help="A MarianMT folder (config.json, model.safetensors, source.spm, target.spm, vocab.json), or a hub id OWNER/NAME."),
    output: Path = typer.Option(..., "-o", "--output", help="The tfm checkpoint to write (atomically)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Import a Hugging Face MarianMT model (OPUS-MT) as a tfm checkpoint, exactly (no pickle is loaded).

    Settings tfm does not implement (another architecture, a pre-norm layout, sampling in the
    generation config, ...) are refused with one line naming the field, never converted.
    """
    from tfm_cli.checkpoints.format import checkpoint_tokenizers, write_checkpoint
    from tfm_cli.interop.marian_import import find_marian_folder, import_marian
    from tfm_cli.textio.paths import check_output_path
    from tfm_cli.tokenization.vocabulary import language_tags

    check_output_path(output)
    folder = find_marian_folder(source)
    checkpoint = import_marian(folder)
    src_tokenizer, _ = checkpoint_tokenizers(source, checkpoint)
    write_checkpoint(output, checkpoint)
    config = checkpoint.config
    n_parameters = sum(tensor.numel() for tensor in checkpoint.weights.values())
    sizes = {config.src_vocab_size, config.tgt_vocab_size}
    vocabulary = f"vocabulary {config.src_vocab_size}" if len(sizes) == 1 else f"vocabularies {config.src_vocab_size}/{config.tgt_vocab_size}"
    print_info(
        f"wrote {output}: {config.n_enc_layers}+{config.n_dec_layers} layers, d_model {config.d_model}, "
        f"{config.activation}, {vocabulary}, {n_parameters:,} parameters",
        quiet=quiet,
    )
    tags = language_tags(src_tokenizer)
    if tags:
        print_info(f"a multilingual model: choose the target with --target-lang ({', '.join(sorted(tags))})", quiet=quiet)
    if checkpoint.decode_defaults:
        settings = ", ".join(f"{key}={value}" for key, value in sorted(checkpoint.decode_defaults.items()))
        print_info(f"decoding defaults from the model: {settings}", quiet=quiet)
