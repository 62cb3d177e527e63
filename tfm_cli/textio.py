"""Files and streams: `-` for stdin/stdout, UTF-8 line reading with clear errors, atomic writes.

Every command that takes a path goes through here, so `-`, CRLF handling, invalid UTF-8 and
"no half-written output file" behave the same everywhere.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import io
import json
import os
import queue
import re
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from tfm_cli.errors import TfmError

STDIO = "-"
# Paths that name the process's standard output and error descriptors (atomic_file writes through them).
STANDARD_STREAM_PATHS = {"/dev/stdout": 1, "/dev/stderr": 2}


def resolved(path: Path) -> Path:
    """`path` with symbolic links followed (as Path.resolve); TfmError for a link loop."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError for a loop, 3.13 OSError (ELOOP)
        raise TfmError(f"{path}: a symbolic link loop") from None


def check_input_file(path: str | Path, what: str = "input") -> Path:
    """Return `path` as a Path if it is a readable file (or pipe, or device); raise TfmError saying what is wrong."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise TfmError(f"{path}: a symbolic link to nothing (dangling, or a loop) ({what})")
    if not path.exists():
        raise TfmError(f"{path}: no such file ({what})")
    if path.is_dir():
        raise TfmError(f"{path}: is a directory, expected a file ({what})")
    if not os.access(path, os.R_OK):
        raise TfmError(f"{path}: permission denied ({what})")
    return path


@contextlib.contextmanager
def as_regular_file(path: Path) -> Iterator[Path]:
    """`path` itself if it is a regular file, else (a pipe, `<(cat model)`) a temp copy of all it holds.

    For readers that need sizes and offsets (safetensors); the copy is removed afterwards.
    """
    path = Path(path)
    if path.is_file():
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="tfm-input-") as folder:
        copy = Path(folder) / (path.name or "input")
        with open(path, "rb") as stream, open(copy, "wb") as out:
            shutil.copyfileobj(stream, out, 1 << 20)
        yield copy


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
        if sys.stdin is None:
            raise TfmError("stdin is closed; give the input file with -i FILE")
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


HASH_BLOCK_BYTES = 8 << 20  # read size of file_sha256 (hashlib releases the GIL on large blocks)


def file_sha256(path: str | Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """The hex SHA-256 of the whole file `path`, read HASH_BLOCK_BYTES at a time; `on_bytes(n)` after each block.

    Raises OSError if the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK_BYTES):
            digest.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest.hexdigest()


def read_lines(path: str, strict_utf8: bool = True) -> list[str]:
    """All lines of `path` as a list (see iter_lines)."""
    return list(iter_lines(path, strict_utf8=strict_utf8))


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_in_the_way(folder: Path) -> Path | None:
    """The first of `folder` and the folders above it that exists but is not a folder, or None."""
    return next((path for path in [folder, *folder.parents] if path.exists() and not path.is_dir()), None)


def check_output_folder(directory: Path, target: Path) -> None:
    """Raise TfmError unless `directory` (where `target` is to be written) is a folder that exists.

    Names the first path component that is in the way: `-o notes.txt/out` says that notes.txt is a file.
    """
    if directory.is_dir():
        return
    blocking = file_in_the_way(directory)
    if blocking is not None:
        raise TfmError(f"{blocking}: is a file, not a folder; cannot write {target} under it")
    raise TfmError(f"{directory}: output folder does not exist (for {target}); create it first")


def check_output_path(path: Path) -> None:
    """Raise TfmError if `path` cannot be an output file: it is a folder, or its folder is missing.

    For commands that work a long time before writing: they check the output first.
    """
    path = Path(path)
    if path.is_dir():
        raise TfmError(f"{path}: is a directory, expected an output file path")
    check_output_folder(path.parent if str(path.parent) else Path("."), path)


def make_folder(folder: Path, what: str) -> None:
    """Create `folder` and its parents (fine if it exists); TfmError naming the path if that cannot be done."""
    blocking = file_in_the_way(folder)
    if blocking is not None:
        raise TfmError(f"{blocking}: is a file, not a folder; cannot create the {what} {folder}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TfmError(f"{folder}: cannot create the {what}: {error.strerror}") from None


def temp_file_beside(target: Path) -> tuple[int, str]:
    """Create a hidden temp file in `target`'s folder: returns (fd, name), raising TfmError if no folder.

    mkstemp creates files as 0600; the final file should get the usual permissions (0666 minus
    the umask), as if it had been opened directly.
    """
    directory = target.parent if str(target.parent) else Path(".")
    check_output_folder(directory, target)
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as error:  # name the file the user asked for, not the temp name
        raise OSError(error.errno, f"{error.strerror} (cannot create a file in {directory})", str(target)) from None
    os.fchmod(fd, creation_mode())
    return fd, name


def creation_mode(folder: bool = False) -> int:
    """The permission bits a new file (0666) or folder (0777) gets from open() or mkdir(): minus the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


def keep_permissions(fd: int, target: Path) -> None:
    """Give the open file `fd` the permission bits of the existing file `target`, and its owner and group
    where this process may: replacing a file then changes its contents only, as `> target` would.

    Raises TfmError if this process could not write `target` itself (a read-only file stays protected).
    """
    info = os.stat(target)
    if not os.access(target, os.W_OK):
        raise TfmError(f"{target}: no permission to write this file; make it writable (chmod u+w) or write elsewhere")
    os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o777)
    with contextlib.suppress(PermissionError):  # only root may give a file away; a group must be one's own
        os.fchown(fd, info.st_uid, info.st_gid)


def remove_stale_temp_files(folder: Path, target_names: str) -> list[Path]:
    """Delete the temp files of `temp_file_beside` in `folder` for targets named like `target_names`.

    target_names: a regular expression over the targets' file names. Returns the deleted paths.
    A process killed mid-write (SIGKILL, power loss) cannot remove its temp file. Call this only when
    no other process can be writing those targets (tfm train --resume, before anything is written).
    """
    # temp_file_beside's names: "." + the target's name + "." + mkstemp's 8 random characters + ".tmp".
    temp_name = re.compile(rf"\.(?:{target_names})\.[a-z0-9_]{{8}}\.tmp")
    stale = sorted(p for p in folder.glob(".*.tmp") if temp_name.fullmatch(p.name) and p.is_file())
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


# What line readers split on (Python's str.splitlines, and so most tools that read lines): an
# output line holding one of these would read back as several lines.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAKS_TO_SPACES = str.maketrans({char: " " for char in LINE_BREAKS})
_BREAKS_AND_TABS_TO_SPACES = str.maketrans({char: " " for char in LINE_BREAKS + "\t"})


def one_line(text: str, tabs: bool = False) -> str:
    """`text` with every line-break character (LINE_BREAKS) replaced by a space, and with `tabs`,
    every TAB too (for TAB-separated columns). Same length: character offsets stay valid."""
    return text.translate(_BREAKS_AND_TABS_TO_SPACES if tabs else _BREAKS_TO_SPACES)


# Characters json.dumps(ensure_ascii=False) writes as they are that str.splitlines() splits on.
_JSON_LINE_BREAKS = str.maketrans({char: f"\\u{ord(char):04x}" for char in "\x85\u2028\u2029"})


def json_line(record: object) -> str:
    """`record` as one line of JSON (UTF-8 text kept as is, no newline): json.dumps escapes every
    other LINE_BREAKS character itself; U+0085, U+2028 and U+2029 are escaped here, so the line
    reads back as one line with any line reader."""
    return json.dumps(record, ensure_ascii=False).translate(_JSON_LINE_BREAKS)


@contextlib.contextmanager
def atomic_file(path: Path, text: bool = False) -> Iterator[IO]:
    """A file (text: UTF-8 with \\n newlines; else binary) whose new contents replace `path`'s.

    A regular file (or a path not there yet) is written to a temp file in the same folder, fsynced,
    then renamed onto `path`: a crash at any moment leaves either the old file or the new one,
    never a partial file, and if the block raises (bad input, Ctrl-C) the temp file is removed and
    `path` is left as it was. A file replaced keeps its permission bits, and its owner and group
    where the process may set them (a file it may not write is refused); a hard link to the old file
    keeps the old contents. A symbolic link (or a chain of them) is followed: the file it points
    to is replaced, the links stay. Anything that is not a regular file, directly or through links
    (/dev/null, a named pipe, a terminal, /dev/stdout or /proc/self/fd/N on a pipe), is written in
    place: renaming a file onto it would replace the device itself, or fail. What `path` is, is asked
    of the kernel (stat follows every link), not worked out from the links' text: /dev/stdout on a
    pipe reads `pipe:[1234]`, a name no path resolves to. A path that names an open file descriptor
    (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N) is written through that descriptor,
    whatever it is: `{ echo a; tfm ... -o /dev/stdout; } > file` appends to the file the shell
    opened, as the stream would, instead of replacing it.
    """
    path = Path(path)
    descriptor = descriptor_named(path)
    try:
        mode: int | None = os.stat(path).st_mode
    except OSError:  # a new path, a dangling link, a loop (named below), a folder missing or in the way
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise TfmError(f"{path}: is a directory, expected an output file path")
    if descriptor is not None or (mode is not None and not stat.S_ISREG(mode)):
        try:
            with open_in_place(path, descriptor, text) as stream:
                yield stream
        except OSError as error:
            raise naming_the_file(error, path) from None
        return
    if path.is_symlink():
        path = resolved(path)  # to a regular file, or dangling: the file it names is (re)placed
    fd, tmp_name = temp_file_beside(path)
    try:
        with io.open(fd, "w", encoding="utf-8", newline="\n") if text else os.fdopen(fd, "wb") as stream:
            if mode is not None:  # an existing file: the new one keeps its permissions and owner
                keep_permissions(stream.fileno(), path)
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp_name, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(error, OSError):
            raise naming_the_file(error, path) from None
        raise
    fsync_directory(path.parent if str(path.parent) else Path("."))


def naming_the_file(error: OSError, path: Path) -> OSError:
    """`error` with `path` as its file name when it names none (a failed write says which file failed)."""
    if error.filename is None and error.errno is not None:
        return OSError(error.errno, error.strerror, str(path))
    return error


def descriptor_named(path: Path) -> int | None:
    """The file descriptor `path` names: 1 for /dev/stdout, 2 for /dev/stderr, N for /dev/fd/N or
    /proc/self/fd/N; None for any other path (links to them are not followed)."""
    name = os.path.normpath(os.path.abspath(path))
    if name in STANDARD_STREAM_PATHS:
        return STANDARD_STREAM_PATHS[name]
    match = re.fullmatch(r"/(?:dev/fd|proc/self/fd)/(\d+)", name)
    return int(match.group(1)) if match else None


def open_in_place(path: Path, descriptor: int | None, text: bool) -> IO:
    """`path` opened for writing where it is (no temp file): through a copy of `descriptor` when given,
    so the writes go on from that descriptor's position, else by opening the path."""
    if descriptor is None:
        return open(path, "w", encoding="utf-8", newline="\n") if text else open(path, "wb")
    try:
        copy = os.dup(descriptor)
    except OSError:
        raise TfmError(f"{path}: file descriptor {descriptor} is not open; give an output file") from None
    return io.open(copy, "w", encoding="utf-8", newline="\n") if text else os.fdopen(copy, "wb")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see atomic_file)."""
    with atomic_file(Path(path)) as stream:
        stream.write(data)


def atomic_write_pair(first: tuple[Path, bytes], second: tuple[Path, bytes]) -> None:
    """Write two files that belong together (a .model and its .vocab) so that neither appears alone.

    Both contents are written and fsynced to temp files first (a full disk fails here, before
    anything is replaced); then the second is renamed into place and the first after it.
    """
    first_path, first_data = Path(first[0]), first[1]
    with atomic_file(first_path) as first_stream:
        first_stream.write(first_data)
        first_stream.flush()
        os.fsync(first_stream.fileno())  # a full disk shows here, before the second file is in place
        atomic_write_bytes(Path(second[0]), second[1])


@contextlib.contextmanager
def open_output(path: str) -> Iterator[IO[str]]:
    """A text stream for results: stdout for `-`, else a temp file renamed onto `path` on success.

    If the body raises (bad input, Ctrl-C), a file output is removed rather than left half-written.
    """
    if path == STDIO:
        if sys.stdout is None:
            raise TfmError("stdout is closed; give an output file with -o FILE")
        yield sys.stdout
        sys.stdout.flush()
        return
    with atomic_file(Path(path), text=True) as stream:
        yield stream


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
