"""`tfm tokenize train|encode|decode`: sentencepiece models with tfm's fixed special ids, as a Unix filter."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import List

import typer

from tfm_cli.commands import TfmCommand, TfmCommandGroup
from tfm_cli.console import print_info, stderr_console
from tfm_cli.errors import TfmError

GROUP_EPILOG = (
    "Examples:\n\n"
    "  tfm tokenize train train.de train.en -o spm --vocab-size 8000\n\n"
    "  tfm tokenize encode -m spm.model < train.de > train.pieces.de\n\n"
    "  tfm tokenize encode -m spm.model --ids -i val.de | tfm tokenize decode -m spm.model --ids\n\n"
    "Special ids are fixed: pad=0 unk=1 bos=2 eos=3. See `tfm tokenize COMMAND --help`."
)
app = typer.Typer(
    cls=TfmCommandGroup,
    help="Train sentencepiece models and encode/decode text with them (line for line).",
    epilog=GROUP_EPILOG,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

TRAIN_EPILOG = (
    "Examples:\n\n"
    "  tfm tokenize train train.de train.en -o spm --vocab-size 8000      \n\n"
    "  tfm tokenize train train.de -o spm.de --model-type bpe --vocab-size 8000\n\n"
    "  cat extra.txt | tfm tokenize train - -o spm --user-symbol '<sep>'"
)
ENCODE_EPILOG = (
    "Examples:\n\n"
    "  tfm tokenize encode -m spm.model < train.de > train.pieces.de\n\n"
    "  echo 'Ein Mann fährt Fahrrad.' | tfm tokenize encode -m spm.model --ids\n\n"
    "  tfm tokenize encode -m model.safetensors --side tgt -i ref.en"
)
DECODE_EPILOG = (
    "Examples:\n\n"
    "  tfm tokenize decode -m spm.model < hyp.pieces > hyp.txt\n\n"
    "  tfm tokenize encode -m spm.model --ids < a.txt | tfm tokenize decode -m spm.model --ids\n\n"
    "Pieces decode to exactly the text encode split (with the default identity normalization), "
    "characters outside the vocabulary included: encode keeps them as pieces of their own. Ids do not: "
    "encode --ids maps every such character to <unk> (id 1), which decodes as ' ⁇ '. For ids that "
    "round-trip all text, train the model with `tfm tokenize train --byte-fallback` (unknown characters "
    "become UTF-8 byte pieces)."
)

# encode and decode read lines in chunks of at most this many (textio.read_chunks): whatever arrived
# before an input pause is answered at once, and a file is written a chunk per write.
CHUNK_LINES = 1000

MODEL_HELP = "A sentencepiece .model from `tfm tokenize train`, or a tfm checkpoint (.safetensors)."
SIDE_HELP = "With a checkpoint: which side's tokenizer to use (src or tgt)."


def load_tokenizer(model: str, side: str):
    """Load a Tokenizer from a .model file, or a checkpoint's own tokenizer for `side`."""
    from tfm_cli.checkpoints.format import (
        checkpoint_tokenizers,
        is_safetensors_file,
        read_checkpoint,
    )
    from tfm_cli.textio.paths import as_regular_file, check_input_file
    from tfm_cli.tokenization.tokenizer import Tokenizer

    if side not in ("src", "tgt"):
        raise TfmError(f"--side must be 'src' or 'tgt', got {side!r}")
    path = check_input_file(model, "a sentencepiece .model or a tfm checkpoint")
    with as_regular_file(path) as regular:  # a pipe is read once, into a temp file
        if model.endswith(".safetensors") or is_safetensors_file(regular):
            try:
                src, tgt = checkpoint_tokenizers(model, read_checkpoint(regular))
            except TfmError as error:
                raise TfmError(str(error).replace(str(regular), model)) from None
            return src if side == "src" else tgt
        return Tokenizer(regular.read_bytes(), origin=model)


@app.command("train", epilog=TRAIN_EPILOG, cls=TfmCommand)
def train(
    inputs: List[str] = typer.Argument(..., help="Text files to learn from (several = joint vocabulary); `-` = stdin."),
    output: str = typer.Option(..., "-o", "--output", help="Output prefix: writes PREFIX.model and PREFIX.vocab."),
    vocab_size: int = typer.Option(8000, "--vocab-size", help="Number of pieces, the 4 special ones included."),
    model_type: str = typer.Option("unigram", "--model-type", help="unigram or bpe."),
    character_coverage: float = typer.Option(1.0, "--character-coverage", help="Share of characters covered (1.0 for Latin scripts, ~0.9995 for CJK)."),
    user_symbols: List[str] = typer.Option([], "--user-symbol", help="A symbol kept as one piece (repeatable)."),
    byte_fallback: bool = typer.Option(False, "--byte-fallback", help="Spell unknown characters as UTF-8 bytes instead of <unk>."),
    normalization: str = typer.Option("identity", "--normalization", help="identity (lossless: decode inverts encode) or nmt_nfkc."),
    input_sentence_size: int = typer.Option(500_000, "--max-sentences", help="Learn from a seeded uniform sample of at most this many sentences (0 = all): the same text always gives the same model."),
    verbose: bool = typer.Option(False, "--verbose", help="Show sentencepiece's own training log."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Train a sentencepiece model (ids fixed: pad=0 unk=1 bos=2 eos=3)."""
    from tfm_cli.tokenization.tokenizer import Tokenizer, TokenizerTrainConfig, train_sentencepiece

    config = TokenizerTrainConfig(
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        user_defined_symbols=tuple(user_symbols),
        byte_fallback=byte_fallback,
        normalization=normalization,
        input_sentence_size=input_sentence_size,
    )
    if inputs.count("-") > 1:
        raise TfmError("stdin (-) is given more than once; it can be read only once")
    if "-" in inputs:
        from tfm_cli.textio.streams import check_stdin_open

        check_stdin_open("give the text files to learn from")
    if output.endswith("/") or Path(output).is_dir():
        raise TfmError(f"-o {output}: is a folder; -o takes a file prefix, e.g. -o {output.rstrip('/')}/spm")
    prefix = Path(output)

    def report_sample(sample) -> None:
        if sample.used < sample.total:
            print_info(f"learning from {sample.used:,} of {sample.total:,} sentences (a seeded sample; "
                       "--max-sentences 0 takes all)", quiet=quiet)

    with tempfile.TemporaryDirectory(prefix="tfm-tokenize-") as tmp:
        paths = []
        for number, name in enumerate(inputs):
            # Sentencepiece reads its inputs after tfm has checked them: stdin, a pipe or a FIFO
            # can be read only once, so it is copied first.
            if name == "-" or (Path(name).exists() and not Path(name).is_file() and not Path(name).is_dir()):
                copy = Path(tmp) / f"input{number}.txt"
                with open(copy, "wb") as f:
                    if name == "-":
                        shutil.copyfileobj(sys.stdin.buffer, f)
                    else:
                        with open(name, "rb") as stream:
                            shutil.copyfileobj(stream, f)
                paths.append(copy)
            else:
                paths.append(Path(name))
        console = stderr_console(quiet=quiet)
        with console.status(f"training a {model_type} sentencepiece model ({vocab_size} pieces)"):
            try:
                model_path = train_sentencepiece(paths, prefix, config, verbose=verbose, on_sample=report_sample)
            except TfmError as error:  # name the input the user gave, not its temp copy
                message = str(error)
                for copy, name in zip(paths, inputs):
                    message = message.replace(str(copy), "<stdin>" if name == "-" else name)
                raise TfmError(message) from None
    tokenizer = Tokenizer.from_file(model_path)
    print_info(f"wrote {model_path} and {prefix}.vocab: {tokenizer.vocab_size} pieces", quiet=quiet)


@app.command("encode", epilog=ENCODE_EPILOG, cls=TfmCommand)
def encode(
    model: str = typer.Option(..., "-m", "--model", help=MODEL_HELP),
    input: str = typer.Option("-", "-i", "--input", help="Raw text, one sentence per line; `-` = stdin."),
    output: str = typer.Option("-", "-o", "--output", help="Where to write; `-` = stdout."),
    ids: bool = typer.Option(False, "--ids", help="Write piece ids instead of pieces (characters outside the vocabulary become <unk>, id 1, unless the model was trained with --byte-fallback)."),
    side: str = typer.Option("src", "--side", help=SIDE_HELP),
) -> None:
    """Split raw text into pieces (or ids), line for line; empty lines stay empty."""
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.output_lines import one_line
    from tfm_cli.textio.streams import iter_lines, read_chunks

    tokenizer = load_tokenizer(model, side)
    encode_line = tokenizer.encode_ids if ids else tokenizer.encode_pieces
    with open_output(output) as out:
        for chunk in read_chunks(iter_lines(input), CHUNK_LINES):
            out.write("".join(one_line(" ".join(map(str, encode_line(line)))) + "\n" for line in chunk))
            out.flush()  # answered before the next read blocks (see textio.read_chunks)


@app.command("decode", epilog=DECODE_EPILOG, cls=TfmCommand)
def decode(
    model: str = typer.Option(..., "-m", "--model", help=MODEL_HELP),
    input: str = typer.Option("-", "-i", "--input", help="Space-separated pieces (or ids), one line each; `-` = stdin."),
    output: str = typer.Option("-", "-o", "--output", help="Where to write; `-` = stdout."),
    ids: bool = typer.Option(False, "--ids", help="Read piece ids instead of pieces."),
    side: str = typer.Option("src", "--side", help=SIDE_HELP),
) -> None:
    """Join pieces (or ids) back into text, line for line: pieces invert encode exactly, ids only without <unk>."""
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.output_lines import one_line
    from tfm_cli.textio.streams import iter_lines, read_chunks

    tokenizer = load_tokenizer(model, side)
    name = "<stdin>" if input == "-" else input
    number = 0
    with open_output(output) as out:
        for chunk in read_chunks(iter_lines(input), CHUNK_LINES):
            texts = []
            for line in chunk:
                number += 1
                # Pieces never contain a plain space (sentencepiece writes it as U+2581), so split on ' ' only.
                tokens = line.split(" ") if line else []
                if ids:
                    texts.append(tokenizer.decode_ids(parse_ids(tokens, tokenizer.vocab_size, name, number)))
                else:
                    texts.append(tokenizer.decode_pieces(tokens))
            out.write("".join(one_line(text) + "\n" for text in texts))
            out.flush()  # answered before the next read blocks (see textio.read_chunks)


def parse_ids(tokens: list[str], vocab_size: int, name: str, number: int) -> list[int]:
    """Parse piece ids, raising TfmError with file and line for a non-integer or out-of-range id."""
    values = []
    for token in tokens:
        if not (token.isascii() and token.isdigit()):
            raise TfmError(f"{name}:{number}: {token!r} is not a piece id (decode --ids expects integers)")
        value = int(token)
        if value >= vocab_size:
            raise TfmError(f"{name}:{number}: id {value} is outside the vocabulary (size {vocab_size})")
        values.append(value)
    return values
