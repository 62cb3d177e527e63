"""Writing files whole or not at all: a temp file beside the target renamed over it, with the
target's permissions kept; `-` and /dev/stdout written in place."""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tfm_cli.errors import TfmError
from tfm_cli.textio.paths import check_output_folder, resolved
from tfm_cli.textio.streams import STDIO

# Paths that name the process's standard output and error descriptors (atomic_file writes through them).
STANDARD_STREAM_PATHS = {"/dev/stdout": 1, "/dev/stderr": 2}


def check_stdout_open() -> None:
    """TfmError if the process was started with stdout closed."""
    if sys.stdout is None:
        raise TfmError("stdout is closed; give an output file with -o FILE")


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
        check_stdout_open()
        yield sys.stdout
        sys.stdout.flush()
        return
    with atomic_file(Path(path), text=True) as stream:
        yield stream
