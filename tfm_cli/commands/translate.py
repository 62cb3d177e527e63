"""`tfm translate`: raw text in, translations out, one line per line, in order, as a Unix filter."""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Optional

import typer

from tfm_cli.commands import model_runs
from tfm_cli.commands.options import align_head_option, align_layer_option, align_null_option, align_shift_option
from tfm_cli.commands.options import device_option, dtype_option, ensemble_weights_option, threads_option
from tfm_cli.console import print_info, print_warning
from tfm_cli.errors import TfmError
from tfm_cli.inference.settings import decode_default, model_default_note

if TYPE_CHECKING:
    from tfm_cli.checkpoints.format import LoadedModel
    from tfm_cli.config import DecodeConfig
    from tfm_cli.inference.text_preparation import TextOptions
    from tfm_cli.inference.outputs import TranslatedLine
    from tfm_cli.inference.translation import OutputFormat

# rich renders --help and takes a bare [name] for markup (dropping it): brackets are written \\[.
EPILOG = (
    "Examples:\n\n"
    "  cat test.de | tfm translate -m model.safetensors > hyp.en\n\n"
    "  tfm translate -m model.safetensors -i test.de --beam 5 --length-penalty 1.0 --scores\n\n"
    "  echo 'Ein Hund rennt.' | tfm translate -m model.safetensors --alignment --align-head mean --json\n\n"
    "  echo 'A dog runs.' | tfm translate -m opus-mt-en-roa.safetensors --target-lang fra\n\n"
    "  tfm translate -m run1/average.safetensors -m run2/average.safetensors --ensemble-weights 0.6,0.4 -i test.de\n\n"
    "A checkpoint may carry its own defaults for --beam, --length-penalty and the length limit (the "
    "\\[decode] section of the recipe it was trained with, or an imported model's generation config); "
    "flags given here override them, and stderr says which settings were used.\n\n"
    "Scores are natural-log probabilities: the sum over the output tokens, EOS included, divided by "
    "the model's length penalty with n = output tokens + 1 (EOS): GNMT's ((5 + n) / 6) ** alpha for tfm's "
    "models, n ** alpha (as generate) for imported ones; --json states it. They equal "
    "`tfm score -m MODEL --src SRC --tgt OUT --normalize length --length-penalty ALPHA`."
)


def translate(
    ctx: typer.Context,
    model: list[str] = typer.Option(..., "-m", "--model", help="A tfm checkpoint (.safetensors) with its tokenizer inside. Repeat for an ensemble: one search over the weighted mean of the models' log-probs; they must share both vocabularies, and tokenizers, decoding defaults and alignments come from the first."),
    ensemble_weights: Optional[str] = ensemble_weights_option(),
    input: str = typer.Option("-", "-i", "--input", help="Raw source text, one sentence per line; `-` = stdin."),
    output: str = typer.Option("-", "-o", "--output", help="Where to write; `-` = stdout."),
    # Flags a checkpoint may bring defaults for default to None (= not given; see inference/settings.py),
    # the others to DecodeConfig's own defaults.
    beam: Optional[int] = typer.Option(None, "-b", "--beam", help=f"Beam size (1 = greedy); {model_default_note('beam_size')}."),
    length_penalty: Optional[float] = typer.Option(None, "--length-penalty", "--alpha", help=f"Length-penalty alpha, applied by the model's rule (GNMT's ((5 + n) / 6) ** alpha; n ** alpha for imported models); 0 = raw sum of log-probs; {model_default_note('length_penalty')}."),
    max_len_a: Optional[float] = typer.Option(None, "--max-len-a", help=f"Output length limit a * src_len + b (subword tokens): a; {model_default_note('max_len_a')}."),
    max_len_b: Optional[int] = typer.Option(None, "--max-len-b", help=f"Output length limit a * src_len + b: b; {model_default_note('max_len_b')}."),
    min_len: Optional[int] = typer.Option(None, "--min-len", help=f"No end of sentence before this many output tokens (0 lets an empty translation win; the length limit still ends it); {model_default_note('min_len')}."),
    nbest: int = typer.Option(decode_default("nbest"), "--nbest", help="Hypotheses per line (<= beam), best first, TAB-separated on the same line."),
    sample: bool = typer.Option(decode_default("sample"), "--sample", help="Sample instead of beam search (--nbest samples per line)."),
    top_k: int = typer.Option(decode_default("sample_top_k"), "--top-k", help="With --sample: draw only from the k most likely tokens (0 = all)."),
    top_p: float = typer.Option(decode_default("sample_top_p"), "--top-p", help="With --sample: draw only from the nucleus of probability p."),
    temperature: float = typer.Option(decode_default("temperature"), "--temperature", help="With --sample: softmax temperature."),
    seed: int = typer.Option(decode_default("seed"), "--seed", help="With --sample: random seed (line i uses seed + i)."),
    no_unk: bool = typer.Option(decode_default("no_unk"), "--no-unk", help="Never output the unknown-word token <unk> (padding and <s> never are)."),
    target_lang: Optional[str] = typer.Option(None, "--target-lang", help="Multilingual models: the target language xx of the model's >>xx<< tags (prepended to every source)."),
    scores: bool = typer.Option(False, "--scores", help="Add a TAB and the normalised score (natural log, EOS counted, / the model's length penalty)."),
    alignment: bool = typer.Option(False, "--alignment", help="Add a TAB and the word alignment (Pharaoh 'src-tgt' pairs) from cross-attention."),
    align_layer: Optional[int] = align_layer_option(),
    align_head: Optional[str] = align_head_option(),
    align_shift: Optional[bool] = align_shift_option(),
    align_null: Optional[bool] = align_null_option(),
    constraints: bool = typer.Option(False, "--constraints", help="Each input line is the source, then TAB-separated target phrases every translation must contain (fairseq's format)."),
    glossary: Optional[str] = typer.Option(None, "--glossary", help="A TSV file of `source term<TAB>target term`: each source occurrence of a term requires its target term (whole words; lower-case terms match any case)."),
    markup: Optional[str] = typer.Option(None, "--markup", help="html or xml: take inline tags out, translate, and put them back around the aligned target words."),
    shortlist: Optional[str] = typer.Option(None, "--shortlist", help="A lexical shortlist (`tfm shortlist` builds one from a parallel corpus): each line's output may use only the target tokens its source words were seen with, the most frequent ones and its constraints; faster at large vocabularies, translations may change. Scores are then over that list."),
    split_sentences: bool = typer.Option(False, "--split-sentences", help="Translate each line sentence by sentence (sentencex, the `sentences` extra) and rejoin them on one line."),
    source_lang: str = typer.Option("en", "--source-lang", help="With --split-sentences: the source language code the sentence splitter uses (a code it does not know gets English rules)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line (schema tfm-translate/1, see README)."),
    buffer_size: int = typer.Option(2000, "--buffer-size", help="Lines read and translated at a time (an input pause also answers)."),
    max_tokens: int = typer.Option(8000, "--max-tokens", help="Source tokens per batch."),
    batch_size: int = typer.Option(128, "--batch-size", help="Sentences per batch."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    threads: int = threads_option(),
    workers: int = typer.Option(1, "--workers", help="Processes that search batches side by side, one CPU thread each (CPU only; e.g. one per core; same translations, more memory)."),
    progress: bool = model_runs.progress_option(),
    resume: bool = typer.Option(False, "--resume", help="Write -o FILE through FILE.partial chunk by chunk, so that rerunning the same command after an interruption goes on where it stopped (the same output as one run)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr (warnings and errors still show)."),
) -> None:
    """Translate text: beam search with the model's length penalty, one output line per input line.

    Scores are natural-log probabilities summed over the output tokens with EOS counted, divided by
    the model's length penalty at n = tokens + 1: the number `tfm score -m --normalize length` prints.
    """
    from tfm_cli.inference.search_workers import SearchWorkers
    from tfm_cli.inference.settings import resolve_decode
    from tfm_cli.inference.translation import BatchingConfig, OutputFormat, Translator

    model_runs.set_up_process(ctx, threads)
    check_streams(input, output)
    job = resume_job(ctx.params) if resume else None
    if workers < 1:
        raise TfmError(f"--workers must be at least 1, got {workers}")
    flags = dict(
        beam_size=beam, length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest,
        sample=sample, sample_top_k=top_k, sample_top_p=top_p, temperature=temperature, seed=seed,
        no_unk=no_unk, min_len=min_len,
    )
    resolve_decode(flags, {})  # the flags' own problems are reported before the model is loaded
    warn_ignored_flags(sample, top_k, top_p, temperature, split_sentences, source_lang)
    batching = BatchingConfig(buffer_size=buffer_size, max_tokens=max_tokens, batch_size=batch_size)
    text_options = text_preparation(constraints, glossary, markup, split_sentences, source_lang)
    want_alignment = alignment or as_json or markup is not None
    align_flags = model_runs.alignment_flags(align_layer, align_head, align_shift, align_null)
    loaded, ensemble = model_runs.load_models(model, ensemble_weights, model_runs.resolve_placement(device, dtype, quiet), quiet)
    decode = resolve_decode(flags, loaded.decode_defaults)
    align = model_runs.checked_alignment(loaded, align_flags) if want_alignment else None
    prefix = language_prefix(loaded, target_lang)
    lexical_shortlist = model_runs.load_shortlist(shortlist, loaded, model[0]) if shortlist is not None else None
    if loaded.decode_defaults:
        report_decode_settings(flags, loaded.decode_defaults, decode, quiet)
    # Forked before any thread of tfm's starts (the line reader, the progress bar), with nothing left in
    # the output buffers for a worker to write again when it exits.
    sys.stdout.flush()
    sys.stderr.flush()
    searched = ensemble if ensemble is not None else loaded.model
    with SearchWorkers(searched, decode, workers) if workers > 1 else contextlib.nullcontext() as pool:
        translator = Translator(loaded, decode, batching, align, source_prefix=prefix, text=text_options, workers=pool,
                                ensemble=ensemble, shortlist=lexical_shortlist)
        output_format = OutputFormat(scores=scores, alignment=alignment, json=as_json, length_penalty=translator.length_penalty,
                                     nbest=decode.nbest)
        translate_lines(translator, input, output, output_format, show_progress=progress, quiet=quiet, resume_job=job)


# Options that change how fast or how verbosely translate works, never what it writes (batches are
# batch-invariant): a rerun with --resume may change them.
NOT_IN_RESUME_JOB = {"threads", "workers", "progress", "quiet", "resume", "buffer_size", "max_tokens", "batch_size"}


def resume_job(params: dict) -> dict:
    """What a --resume rerun must match: the options that shape the output, and the stamps (path, size,
    SHA-256) of the files they name. TfmError when the output is stdout or the input stdin."""
    from tfm_cli.textio.resumable_output import file_stamp

    if params["output"] == "-" or params["input"] == "-":
        raise TfmError("--resume continues a file from a file: give -i FILE and -o FILE")
    job = {key: value for key, value in params.items() if key not in NOT_IN_RESUME_JOB}
    named = [*params["model"], params["input"], *(params[key] for key in ("glossary", "shortlist") if params[key])]
    return {"options": job, "files": [file_stamp(path) for path in named]}


def check_streams(input: str, output: str) -> None:
    """Raise TfmError unless the input file (or stdin, for `-`) can be read and stdout (for `-`) is open."""
    from tfm_cli.textio.atomic_files import check_stdout_open
    from tfm_cli.textio.paths import check_input_file
    from tfm_cli.textio.streams import check_stdin_open

    if input != "-":
        check_input_file(input)
    else:
        check_stdin_open()
    if output == "-":
        check_stdout_open()


def warn_ignored_flags(sample: bool, top_k: int, top_p: float, temperature: float, split_sentences: bool, source_lang: str) -> None:
    """Warn on stderr of the flags given that change nothing without --sample or --split-sentences."""
    sampling_only = [name for name, value, default in (
        ("--top-k", top_k, decode_default("sample_top_k")), ("--top-p", top_p, decode_default("sample_top_p")),
        ("--temperature", temperature, decode_default("temperature")),
    ) if value != default]
    if sampling_only and not sample:
        print_warning(f"ignored without --sample: {', '.join(sampling_only)} (they shape sampling only)")
    if source_lang != "en" and not split_sentences:
        print_warning("ignored without --split-sentences: --source-lang (it chooses the sentence splitter's rules)")


def text_preparation(
    constraints: bool, glossary: str | None, markup: str | None, split_sentences: bool, source_lang: str
) -> TextOptions:
    """The TextOptions the text options ask for (the glossary read, the sentence splitter made);
    TfmError for an unknown --markup mode or a bad glossary."""
    from tfm_cli.inference.glossary import Glossary
    from tfm_cli.inference.markup import MARKUP_MODES
    from tfm_cli.inference.sentence_splitting import SentenceSplitter
    from tfm_cli.inference.text_preparation import TextOptions

    if markup is not None and markup not in MARKUP_MODES:
        raise TfmError(f"--markup must be one of {', '.join(MARKUP_MODES)}, got {markup!r}")
    return TextOptions(
        constraint_fields=constraints,
        glossary=Glossary.load(glossary) if glossary is not None else None,
        markup=markup,
        splitter=SentenceSplitter(source_lang) if split_sentences else None,
    )


def language_prefix(loaded: LoadedModel, target_lang: str | None) -> tuple[int, ...]:
    """The source token ids every input starts with: the >>xx<< tag of --target-lang, or none."""
    if target_lang is None:
        return ()
    from tfm_cli.tokenization.vocabulary import language_tag_id

    return (language_tag_id(loaded.src_tokenizer, target_lang),)


def report_decode_settings(flags: dict, model_defaults: dict, decode: DecodeConfig, quiet: bool) -> None:
    """Say on stderr which decoding settings are used, when the checkpoint brought defaults of its own."""
    from tfm_cli.config import CHECKPOINT_DECODE_KEYS

    shown = [
        key for key in CHECKPOINT_DECODE_KEYS
        if (key in flags or key in model_defaults) and not (decode.sample and key == "beam_size")
    ]
    used = ", ".join(f"{key} {getattr(decode, key)}" for key in shown)
    print_info(f"decoding with {used} (the model's defaults where no flag is given)", quiet=quiet)


def translate_lines(
    translator, input: str, output: str, output_format, show_progress: bool, quiet: bool, resume_job: dict | None = None
) -> None:
    """Translate the lines of `input` with `translator` into `output` (paths, or `-` for stdin and
    stdout) in `output_format`, with a progress bar when asked or when the input is a file and stderr
    a terminal; then report on stderr. With `resume_job`, `output` is written resumably (resume_job())."""
    from tfm_cli.inference.translation import TranslationStats, translate_stream
    from tfm_cli.textio.streams import DecodeStats, iter_lines, thread_stdin

    decode_stats, stats = DecodeStats(), TranslationStats()
    # Lines are read in a thread (see translation.read_chunks), which must not touch sys.stdin.buffer.
    lines = iter_lines(input, strict_utf8=False, stats=decode_stats, stream=thread_stdin() if input == "-" else None)
    shown = model_runs.shows_progress(show_progress, quiet, reads_files=input != "-")
    model_runs.hint_stdin("source lines", input == "-", quiet)
    warned = LineWarnings()
    with output_stream(output, resume_job) as (out, done, chunk_done):
        if done:
            print_info(f"--resume: the first {done:,} lines of {input} are done; going on from line {done + 1:,}", quiet=quiet)
        chunks = warned.passing(translate_stream(translator, itertools.islice(lines, done, None), stats, first_index=done))

        def write(chunk: list[TranslatedLine]) -> None:
            write_chunk(out, chunk, output_format)
            chunk_done(len(chunk))

        model_runs.write_with_progress(chunks, write, shown, "translating", input)
    if decode_stats.invalid_utf8_lines:
        print_warning(decode_stats.invalid_utf8_warning())
    if stats.unencodable_lines:
        print_warning(
            f"{stats.unencodable_lines} non-blank line(s) had no characters the model's tokenizer keeps; "
            "their output lines are empty"
        )
    warned.summarise()  # truncated lines are among them, each named
    elapsed = stats.seconds  # translating only: time spent waiting for input lines is not counted
    rate = stats.lines / elapsed if elapsed > 0 else 0.0
    print_info(
        f"translated {stats.lines} lines ({stats.empty_lines} empty) in {elapsed:.1f} s: {rate:.1f} lines/s, "
        f"{stats.output_tokens / max(elapsed, 1e-9):.0f} target tokens/s",
        quiet=quiet,
    )


@contextlib.contextmanager
def output_stream(output: str, resume_job: dict | None) -> Iterator[tuple[IO[str], int, Callable[[int], None]]]:
    """(the stream to write results to, input lines already done, a call after each chunk with its line
    count): the whole-or-nothing output of open_output, or with `resume_job` a ResumableOutput's."""
    from tfm_cli.textio.atomic_files import open_output
    from tfm_cli.textio.resumable_output import ResumableOutput

    if resume_job is None:
        with open_output(output) as out:
            yield out, 0, lambda lines: None
        return
    resumable = ResumableOutput(output, resume_job)
    out, done = resumable.open()
    try:
        yield out, done, resumable.chunk_done
    except BaseException:
        resumable.close()  # FILE.partial and its record stay for the rerun
        raise
    resumable.finish()


def write_chunk(out: IO[str], chunk: list[TranslatedLine], output_format: OutputFormat) -> None:
    """Write a chunk's lines, then flush, so an interactive pipe gets its answers at once."""
    from tfm_cli.inference.translation import format_line

    out.write("".join(format_line(line, output_format) + "\n" for line in chunk))
    out.flush()


class LineWarnings:
    """Prints each line's warnings on stderr as its chunk passes, the first MAX_SHOWN lines in full."""

    MAX_SHOWN = 20

    def __init__(self) -> None:
        self.lines_warned = 0

    def passing(self, chunks):
        """Yield the chunks unchanged, printing their lines' warnings first."""
        for chunk in chunks:
            for line in chunk:
                if line.warnings:
                    self.lines_warned += 1
                    if self.lines_warned <= self.MAX_SHOWN:
                        for warning in line.warnings:
                            print_warning(f"line {line.index + 1}: {warning}")
            yield chunk

    def summarise(self) -> None:
        """Say how many lines' warnings were not shown."""
        if self.lines_warned > self.MAX_SHOWN:
            print_warning(f"{self.lines_warned - self.MAX_SHOWN} more line(s) had warnings (the first {self.MAX_SHOWN} are shown above)")
