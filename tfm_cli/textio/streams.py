"""Reading lines: `-` for stdin, UTF-8 with clear errors or repairs, a threaded reader that answers
each input pause, and parallel files read as pairs."""

from __future__ import annotations

import codecs
import io
import queue
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from tfm_cli.errors import TfmError
from tfm_cli.textio.paths import check_input_file

STDIO = "-"


def check_stdin_open(instead: str = "give the input file with -i FILE") -> None:
    """TfmError if the process was started with stdin closed, saying what to give `instead`."""
    if sys.stdin is None:
        raise TfmError(f"stdin is closed; {instead}")


NAMED_LINES = 20  # lines a warning names one by one


@dataclass
class DecodeStats:
    """Counts what lenient reading had to repair."""

    invalid_utf8_lines: int = 0
    first_invalid_utf8_lines: list[int] = field(default_factory=list)  # 1-based, the first NAMED_LINES of them

    def invalid_utf8_warning(self) -> str:
        """The warning for the lines repaired: how many, which (the first NAMED_LINES), and what became of the bytes."""
        named = ", ".join(map(str, self.first_invalid_utf8_lines))
        more = f", first {NAMED_LINES} named" if self.invalid_utf8_lines > NAMED_LINES else ""
        return (f"{self.invalid_utf8_lines} line(s) had invalid UTF-8 (line {named}{more}); "
                "bad bytes became U+FFFD")


def open_binary_input(path: str) -> IO[bytes]:
    """Open `path` (or stdin for `-`) for binary reading; any readable file, pipe or device will do."""
    if path == STDIO:
        check_stdin_open()
        return sys.stdin.buffer
    return open(check_input_file(path), "rb")


def iter_lines(
    path: str, strict_utf8: bool = True, stats: DecodeStats | None = None, stream: IO[bytes] | None = None
) -> Iterator[str]:
    """Yield the lines of `path` (`-` = stdin) without their line ending (LF or CRLF), and without
    the UTF-8 byte-order mark a file may start with (a signature Windows tools write, not text).

    With `strict_utf8`, invalid UTF-8 raises TfmError naming the file and line number; otherwise
    bad bytes become U+FFFD and each repaired line is counted in `stats`. Lines are yielded as soon
    as they arrive, so this works in interactive pipes. `stream`, if given, is read instead of
    opening `path` (which still names it in messages). Read in a thread (read_chunks), stdin is
    read through a reader of its own (thread_stdin).
    """
    name = "<stdin>" if path == STDIO else path
    if stream is None and path == STDIO and threading.current_thread() is not threading.main_thread():
        stream = thread_stdin()
    stream = open_binary_input(path) if stream is None else stream
    try:
        for number, raw in enumerate(iter(stream.readline, b""), start=1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as error:
                if strict_utf8:
                    raise TfmError(
                        f"{name}:{number}: invalid UTF-8 at byte {error.start}; convert the file to UTF-8"
                    ) from None
                if stats is not None:
                    stats.invalid_utf8_lines += 1
                    if len(stats.first_invalid_utf8_lines) < NAMED_LINES:
                        stats.first_invalid_utf8_lines.append(number)
                yield raw.decode("utf-8", errors="replace")
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def thread_stdin() -> IO[bytes] | None:
    """A binary reader of fd 0 of its own, for reading stdin in a daemon thread; None if stdin has no fd.

    sys.stdin.buffer must not be used there: if the program exits while that thread waits for input,
    the interpreter's shutdown blocks on the buffer's lock and aborts ("could not acquire lock").
    """
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return io.BufferedReader(io.FileIO(fd, "rb", closefd=False))


# An input pause this long answers what was read so far: a person typing, or a pipeline's producer
# that is slower than tfm, gets each answer before tfm waits for the next line.
INPUT_PAUSE_S = 0.05


_END_OF_INPUT = object()


Item = TypeVar("Item")


def read_chunks(items: Iterable[Item], size: int, pause_s: float = INPUT_PAUSE_S) -> Iterator[list[Item]]:
    """Yield lists of at most `size` items (lines, line pairs): each ends when full or at an input pause.

    The one reader of line input for every command that answers line by line (translate, score -m,
    tokenize encode/decode, inspect-attention): a thread pulls `items` (iter_lines) into a bounded
    queue, so a huge file is never held whole, and whatever arrived before a pause of `pause_s` is
    handed out before the next read blocks. Callers write a chunk's answers and flush before asking
    for the next, so an interactive pipe gets every answer while its input stays open. An error
    raised while reading (in the thread) is raised here, after the items read before it.
    """
    # SimpleQueue's put and get are C code; queue.Queue takes Python-level locks per item, a cost of
    # the order of sentencepiece encoding a line. The bound is kept with one credit per `size` items
    # instead: the reader runs at most 2 * size items ahead of the chunks handed out.
    pending: queue.SimpleQueue = queue.SimpleQueue()
    credits = threading.Semaphore(1)

    def reader() -> None:
        try:
            for count, item in enumerate(items, start=1):
                pending.put(item)
                if count % size == 0:
                    credits.acquire()
            pending.put(_END_OF_INPUT)
        except BaseException as error:  # handed to the consumer, which raises it in the main thread
            pending.put(error)

    threading.Thread(target=reader, name="tfm-line-reader", daemon=True).start()
    chunk: list[Item] = []
    taken = 0
    while True:
        try:
            item = pending.get(timeout=pause_s) if chunk else pending.get()
        except queue.Empty:
            yield chunk
            chunk = []
            continue
        if item is _END_OF_INPUT:
            break
        if isinstance(item, BaseException):
            if chunk:
                yield chunk  # the lines before a bad one are answered first
            raise item
        taken += 1
        if taken % size == 0:
            credits.release()
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def read_lines(path: str, strict_utf8: bool = True) -> list[str]:
    """All lines of `path` as a list (see iter_lines)."""
    return list(iter_lines(path, strict_utf8=strict_utf8))


def count_lines(path: str) -> int | None:
    """The number of lines of a regular file (a last line without a newline counts, as iter_lines reads
    it), None for stdin, a pipe or a device (reading those to count would consume the input)."""
    if path == STDIO or not Path(path).is_file():
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def check_parallel_line_counts(src: str, tgt: str) -> None:
    """Raise TfmError if two regular files have different line counts: checked before any work, so
    nothing is written for inputs that do not pair up (pipes are checked at their end, zip_parallel)."""
    src_count, tgt_count = count_lines(src), count_lines(tgt)
    if src_count is not None and tgt_count is not None and src_count != tgt_count:
        raise TfmError(
            f"line counts differ: {src} has {src_count} lines but {tgt} has {tgt_count}; "
            "source and target must be line-parallel"
        )


def zip_parallel(src_lines: Iterable[str], tgt_lines: Iterable[str], src_name: str, tgt_name: str) -> Iterator[tuple[str, str]]:
    """Pair two line streams, raising TfmError with both counts if one ends before the other."""
    src_iter, tgt_iter = iter(src_lines), iter(tgt_lines)
    count = 0
    while True:
        src_line = next(src_iter, None)
        tgt_line = next(tgt_iter, None)
        if src_line is None and tgt_line is None:
            return
        if src_line is None or tgt_line is None:
            longer, rest = (tgt_name, tgt_iter) if src_line is None else (src_name, src_iter)
            shorter = src_name if src_line is None else tgt_name
            total = count + 1 + sum(1 for _ in rest)
            raise TfmError(
                f"line counts differ: {shorter} has {count} lines but {longer} has {total}; "
                "source and target must be line-parallel"
            )
        count += 1
        yield src_line, tgt_line
