"""Parallel text read in chunks with bounded memory: both sides in step, UTF-8 checked line by line,
line counts compared, a running SHA-256 of each file, a cheap fingerprint to know a file again, and the
full SHA-256 that proves it is the same.

Library code: it never prints; problems are TfmErrors naming the file and line.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from tfm_cli.errors import TfmError
from tfm_cli.textio.paths import check_input_file, resolved

CHUNK_LINES = 50_000  # pairs per chunk: a few MB of text, enough for sentencepiece's threads to share
SAMPLE_BLOCKS = 64  # blocks hashed by a fingerprint, evenly spread from the first byte to the last
SAMPLE_BLOCK_BYTES = 4096
INVALID_EXAMPLES = 5  # line numbers of skipped invalid UTF-8 kept for the report


@dataclass(frozen=True)
class FileFingerprint:
    """What recognises a text file without reading it all: its path, size, modification time, status change
    time and inode, and a SHA-256 of SAMPLE_BLOCKS blocks spread over it (a small file is hashed whole).

    The change time is the kernel's: tools that keep a file's modification time (`cp -p`, `rsync -a`,
    tar) cannot keep it, so an edit they copy in changes the fingerprint even where the sampled blocks
    and the size stay the same.
    """

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    sample_sha256: str

    def to_dict(self) -> dict[str, Any]:
        """The fingerprint as a JSON-ready dict."""
        return asdict(self)


def fingerprint(path: str | Path, what: str) -> FileFingerprint:
    """The FileFingerprint of the text file `path` (its resolved path); TfmError if it cannot be read.

    Reads at most SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES bytes whatever the file's size.
    """
    path = resolved(check_input_file(path, what))
    if not path.is_file():
        raise TfmError(f"{path}: not a regular file ({what}); training text must be a file that can be read twice")
    stat = path.stat()
    digest = hashlib.sha256(str(stat.st_size).encode())
    with open(path, "rb") as f:
        if stat.st_size <= SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES:
            digest.update(f.read())
        else:
            last_start = stat.st_size - SAMPLE_BLOCK_BYTES
            for block in range(SAMPLE_BLOCKS):
                f.seek(last_start * block // (SAMPLE_BLOCKS - 1))
                digest.update(f.read(SAMPLE_BLOCK_BYTES))
    return FileFingerprint(str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, digest.hexdigest())


@dataclass
class PairChunk:
    """Up to CHUNK_LINES consecutive pairs of a parallel corpus."""

    first_line: int  # 0-based line number of the first pair
    src: list[str]  # lines without their ending; "" where the pair is in `invalid`
    tgt: list[str]
    invalid: set[int]  # indices into the chunk of pairs with a side that is not UTF-8 (invalid_utf8 = "skip")
    bytes_read: int  # bytes of both files read so far, this chunk included


@dataclass
class ReadReport:
    """What reading a whole parallel corpus found, once its last chunk has been yielded."""

    lines: int = 0
    src_sha256: str = ""
    tgt_sha256: str = ""
    invalid_utf8: int = 0
    invalid_examples: tuple[str, ...] = ()  # "file:line" of the first INVALID_EXAMPLES skipped lines


def decode_lines(
    data: bytes, raw_lines: list[bytes], path: Path, first_line: int, skip_invalid: bool
) -> tuple[list[str], set[int]]:
    """The UTF-8 lines of `data` (= b"".join(raw_lines)) without their LF or CRLF ending, and the
    indices of lines that are not UTF-8.

    With skip_invalid False an invalid line raises TfmError naming `path` and its 1-based line number;
    with it True such lines become "" and are listed. The whole chunk is decoded at once when it is valid.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return decode_lines_one_by_one(raw_lines, path, first_line, skip_invalid)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    return lines, set()


def decode_lines_one_by_one(
    raw_lines: list[bytes], path: Path, first_line: int, skip_invalid: bool
) -> tuple[list[str], set[int]]:
    """decode_lines for a chunk that holds invalid UTF-8: line by line, to name the line."""
    lines, invalid = [], set()
    for index, raw in enumerate(raw_lines):
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            if not skip_invalid:
                raise TfmError(
                    f"{path}:{first_line + index + 1}: invalid UTF-8 at byte {error.start} of the line; convert the "
                    "file to UTF-8, or set data.invalid_utf8 = \"skip\" to drop such pairs"
                ) from None
            lines.append("")
            invalid.add(index)
    return lines, invalid


def count_remaining_lines(f: IO[bytes]) -> int:
    """How many more lines `f` holds (a last line without a newline counts)."""
    return sum(1 for _ in f)


def read_pairs(
    src_path: str | Path, tgt_path: str | Path, what: str, skip_invalid: bool, report: ReadReport,
    chunk_lines: int = CHUNK_LINES,
) -> Iterator[PairChunk]:
    """Yield the pairs of two parallel files in chunks, holding one chunk in memory at a time.

    Fills `report` as it goes (line count, SHA-256 of each file, skipped invalid lines). Raises
    TfmError naming both files and their line counts when they differ (found when the shorter one
    ends), and for invalid UTF-8 unless `skip_invalid`.
    """
    src_path = check_input_file(src_path, f"{what} source")
    tgt_path = check_input_file(tgt_path, f"{what} target")
    src_hash, tgt_hash = hashlib.sha256(), hashlib.sha256()
    bytes_read = 0
    examples: list[str] = []
    with open(src_path, "rb") as src_file, open(tgt_path, "rb") as tgt_file:
        while True:
            src_raw = list(itertools.islice(src_file, chunk_lines))
            tgt_raw = list(itertools.islice(tgt_file, len(src_raw))) if src_raw else []
            if len(tgt_raw) < len(src_raw) or (not src_raw and tgt_file.peek(1)):
                src_count = report.lines + len(src_raw) + count_remaining_lines(src_file)
                tgt_count = report.lines + len(tgt_raw) + count_remaining_lines(tgt_file)
                raise TfmError(
                    f"{what} data: {src_path} has {src_count} lines but {tgt_path} has {tgt_count}; "
                    "parallel files need one sentence per line on both sides"
                )
            if not src_raw:
                break
            src_bytes, tgt_bytes = b"".join(src_raw), b"".join(tgt_raw)
            src_hash.update(src_bytes)
            tgt_hash.update(tgt_bytes)
            bytes_read += len(src_bytes) + len(tgt_bytes)
            src, src_invalid = decode_lines(src_bytes, src_raw, src_path, report.lines, skip_invalid)
            tgt, tgt_invalid = decode_lines(tgt_bytes, tgt_raw, tgt_path, report.lines, skip_invalid)
            invalid = src_invalid | tgt_invalid
            for index in sorted(invalid)[: INVALID_EXAMPLES - len(examples)]:
                path = src_path if index in src_invalid else tgt_path
                examples.append(f"{path}:{report.lines + index + 1}")
            chunk = PairChunk(report.lines, src, tgt, invalid, bytes_read)
            report.lines += len(src_raw)
            report.invalid_utf8 += len(invalid)
            yield chunk
    report.src_sha256, report.tgt_sha256 = src_hash.hexdigest(), tgt_hash.hexdigest()
    report.invalid_examples = tuple(examples)
