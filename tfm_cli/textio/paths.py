"""Paths given on the command line: inputs checked before any work, output folders, hashes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tfm_cli.errors import TfmError


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
