"""The root Typer app: registers the subcommands and turns user errors into one red line on stderr.

Nothing here (or in tfm_cli/commands at import time) imports torch, so `tfm --help` stays fast.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys

import typer

from tfm_cli import __version__
from tfm_cli.commands import (
    TfmCommand,
    TfmCommandGroup,
    align,
    average,
    cache,
    export,
    import_model,
    inspect_attention,
    score,
    serve,
    shortlist,
    tokenize,
    train,
    train_aligner,
    translate,
)
from tfm_cli.console import print_error, print_hint
from tfm_cli.errors import TfmError

EXIT_USER_ERROR = 1
EXIT_USAGE = 2  # a command line the parser refuses (Click's convention, kept)
# An interrupted command exits 128 + the signal's number, as a process the signal killed reports to
# a shell: 130 for Ctrl-C (SIGINT), 143 for SIGTERM (what process supervisors send, and expect back).
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_BROKEN_PIPE = 141  # what a Unix tool killed by SIGPIPE reports: `tfm ... | head` stays quiet
# Errors of writing the output that are the machine's state, not a bug: one line, exit 1.
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM}
# Errors of a path in the wrong shape that slipped past the commands' own checks (a folder that
# vanished, a name too long): one line naming the path, exit 1.
PATH_ERRORS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.ENXIO}


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# Click's error for a command line it cannot parse (a bad option value, an unknown option or
# command, a missing option). Typer exports only its subclass BadParameter, so it is found from there.
UsageError = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the program is: it unwinds as Ctrl-C does (a half-written output is
    removed), then the command exits EXIT_TERMINATED rather than EXIT_INTERRUPTED."""


def interrupted_exit(error: KeyboardInterrupt) -> int:
    """Say that the command was interrupted (one line) and return its exit code: 143 for SIGTERM, else 130."""
    terminated = isinstance(error, Terminated)
    print_error("terminated (SIGTERM)" if terminated else "interrupted")
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


class TfmGroup(TfmCommandGroup):
    """The root group: maps TfmError, usage errors, Ctrl-C and a closed stdout to clean exits (no traceback)."""

    def main(self, *args, **kwargs):
        """Run the CLI; a usage error is one `error:` line and a hint on stderr, exit 2 (not Click's box)."""
        kwargs["standalone_mode"] = False  # errors come back here instead of being printed by Click
        try:
            result = super().main(*args, **kwargs)
        except UsageError as error:
            if type(error).__name__ == "NoArgsIsHelpError":  # bare `tfm` or `tfm tokenize`: the help
                error.show()
                sys.exit(error.exit_code)
            print_error(" ".join(error.format_message().split()))
            command = error.ctx.command_path if error.ctx is not None else self.command_named(kwargs.get("args"))
            print_hint(f"run '{command} --help' for its options and examples")
            sys.exit(EXIT_USAGE)
        except typer.Abort:
            print_error("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        # Without standalone mode, an exit (typer.Exit, --help, --version) returns its code.
        sys.exit(result if isinstance(result, int) else 0)

    def command_named(self, args: list[str] | None) -> str:
        """`tfm SUBCOMMAND` for the first subcommand name on the command line (`args`, else sys.argv), else `tfm`:
        what a usage error that Click reports without a context (`tfm translate -m`) is about."""
        words = sys.argv[1:] if args is None else args
        return next((f"tfm {word}" for word in words if word in self.commands), "tfm")

    def make_context(self, *args, **kwargs):
        """Parse the command line; an interrupt meanwhile exits as one in a command does (Typer would exit 130 silently)."""
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt as error:
            raise typer.Exit(interrupted_exit(error)) from None

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except TfmError as error:
            print_error(str(error))
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM (Terminated)
            raise typer.Exit(interrupted_exit(error)) from None
        except BrokenPipeError:
            silence_stdout()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except OSError as error:
            if error.errno not in WRITE_ERRORS | PATH_ERRORS:
                raise  # anything else is a bug to see, with its traceback
            if error.errno in WRITE_ERRORS:
                print_error(f"{error.filename or '<stdout>'}: {error.strerror}; nothing more was written")
            else:
                print_error(f"{error.filename or 'a path'}: {error.strerror}")
            silence_stdout()  # the interpreter's last flush of the failed stdout must not fail again
            raise typer.Exit(EXIT_USER_ERROR) from None


app = typer.Typer(
    cls=TfmGroup,
    name="tfm",
    help=(
        "tfm: neural machine translation with the Transformer, from the shell.\n\n"
        "Tokenize parallel text, train, average checkpoints, translate, score and inspect the "
        "attention alignments. Data goes to stdout, messages to stderr; `-` means stdin/stdout."
    ),
    epilog=(
        "Examples:\n\n"
        "  tfm tokenize train train.de train.en -o spm --vocab-size 8000\n\n"
        "  tfm train recipes/tiny.toml --run runs/tiny --set train.max_steps=200\n\n"
        "  cat test.de | tfm translate -m runs/tiny/checkpoint_best.safetensors > hyp.en"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def show_version(value: bool) -> None:
    """Print the version and exit (eager --version option)."""
    if value:
        typer.echo(f"tfm {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=show_version, is_eager=True, help="Print the tfm version and exit."
    ),
) -> None:
    """tfm: neural machine translation with the Transformer, from the shell."""


app.add_typer(tokenize.app, name="tokenize")
app.command("train", epilog=train.EPILOG, cls=TfmCommand)(train.train)
app.command("average", epilog=average.EPILOG, cls=TfmCommand)(average.average)
app.command("translate", epilog=translate.EPILOG, cls=TfmCommand)(translate.translate)
app.command("score", epilog=score.EPILOG, cls=TfmCommand)(score.score)
app.command("align", epilog=align.EPILOG, cls=TfmCommand)(align.align)
app.command("train-aligner", epilog=train_aligner.EPILOG, cls=TfmCommand)(train_aligner.train_aligner)
app.command("inspect-attention", epilog=inspect_attention.EPILOG, cls=TfmCommand)(inspect_attention.inspect_attention)
app.command("import", epilog=import_model.EPILOG, cls=TfmCommand)(import_model.import_model)
app.command("export", epilog=export.EPILOG, cls=TfmCommand)(export.export)
app.command("serve", epilog=serve.EPILOG, cls=TfmCommand)(serve.serve)
app.command("shortlist", epilog=shortlist.EPILOG, cls=TfmCommand)(shortlist.shortlist)
app.add_typer(cache.app, name="cache")


def interrupt_on_sigterm(signum: int, frame) -> None:
    """SIGTERM ends a command as Ctrl-C does (an output being written is removed), with exit 143.

    (`tfm train` installs its own handler while it trains: save, then stop, then exit 143 too.)
    """
    raise Terminated


def buffer_unbuffered_stdout() -> None:
    """Give stdout a buffered binary layer when Python runs unbuffered (PYTHONUNBUFFERED, `python -u`).

    Unbuffered, stdout's text layer writes straight to the raw file, and a short write (a full disk
    or a file-size limit reached in the middle of a line) loses the rest of the line without an
    error: the output would end cut short with exit 0. A BufferedWriter writes everything or raises.
    Line buffering keeps each line going out as soon as it is written.
    """
    stdout = sys.stdout
    if stdout is None or not isinstance(getattr(stdout, "buffer", None), io.RawIOBase):
        return
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(stdout.buffer), encoding=stdout.encoding, errors=stdout.errors, line_buffering=True
    )


def exit_status(code: object) -> int:
    """The process exit status sys.exit(code) gives: None is 0, an int itself, anything else (a message) 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
    return 1


def end_process(status: int) -> None:
    """Flush stdout and stderr, then end the process at once with `status`, without Python's teardown.

    With torch loaded, the interpreter's teardown (freeing every module and object one by one) takes
    longer than loading a model and translating a line (bench/RESULTS.md, "Whole processes"). Every
    command has closed its files and joined its work by the time it returns, and tfm registers no
    atexit work, so nothing is lost by skipping it. A profiler or tracer (cProfile, coverage) gets the
    normal exit, since it writes its results at teardown.
    """
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            status = status or EXIT_BROKEN_PIPE
        except (OSError, ValueError):  # a closed stream, or a full disk reported by the command already
            status = status or EXIT_USER_ERROR
    os._exit(status)


def main() -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    buffer_unbuffered_stdout()
    try:
        app()
    except SystemExit as finished:
        end_process(exit_status(finished.code))
