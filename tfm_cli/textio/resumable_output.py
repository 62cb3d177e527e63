"""An output file that an interrupted run can continue (`tfm translate --resume`).

The results go to FILE.partial, chunk by chunk; after each chunk the file is flushed to disk and a
record beside it, FILE.partial.json, says how many input lines are done and how many bytes of
FILE.partial hold them (the record is replaced atomically). A rerun of the same job (the record's
`job`: the command's settings and the stamps of its input files) truncates FILE.partial to those
bytes, skips those input lines and goes on; at the end FILE.partial becomes FILE and the record goes.
A chunk cut off by Ctrl-C or a crash is simply done again. Whatever the interruption, FILE itself
appears only complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from tfm_cli.errors import TfmError
from tfm_cli.textio.atomic_files import fsync_directory, temp_file_beside
from tfm_cli.textio.paths import check_output_path, file_sha256


def file_stamp(path: str) -> list[Any]:
    """What identifies a file's contents: [absolute path, size in bytes, SHA-256 of the bytes as hex].

    The whole file is hashed (about a second per GB), not its modification time: a copy, a fresh
    checkout or a re-mounted data folder keeps the contents and changes the time, and an edit that
    keeps the size and the time must still be caught.
    """
    return [str(Path(path).resolve()), os.stat(path).st_size, file_sha256(path)]


def job_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The names of what differs between two jobs of the form {"options": {...}, "files": [stamps]}:
    option names, and the paths of files whose stamps differ (both sorted); [] when they are equal."""
    saved_options, current_options = saved.get("options", {}), current.get("options", {})
    names = sorted(key for key in saved_options.keys() | current_options.keys()
                   if saved_options.get(key) != current_options.get(key))
    saved_files = {str(stamp[0]): stamp for stamp in saved.get("files", [])}
    current_files = {str(stamp[0]): stamp for stamp in current.get("files", [])}
    files = sorted(path for path in saved_files.keys() | current_files.keys()
                   if saved_files.get(path) != current_files.get(path))
    return [f"option {name}" for name in names] + [f"file {path}" for path in files]


class ResumableOutput:
    """FILE written through FILE.partial and its record FILE.partial.json; see the module docstring.

    `job` (JSON-serialisable) is what makes a rerun the same work: a record of another job is refused.
    Use open() once, then chunk_done() after each chunk and finish() at the end.
    """

    def __init__(self, target: str | Path, job: dict[str, Any]) -> None:
        self.target = Path(target)
        check_output_path(self.target)
        self.partial = self.target.with_name(self.target.name + ".partial")
        self.record = self.target.with_name(self.target.name + ".partial.json")
        self.job = json.loads(json.dumps(job, default=str))  # as it reads back from the record (lists, not tuples)
        self.lines_done = 0
        self.stream: IO[str] | None = None

    def open(self) -> tuple[IO[str], int]:
        """(a text stream that appends to FILE.partial, the input lines a former run already did).

        Raises TfmError when a record of another job is there (naming both files to delete).
        """
        done_bytes = 0
        if self.record.exists() and self.partial.exists():
            try:
                saved = json.loads(self.record.read_text(encoding="utf-8"))
                job, self.lines_done, done_bytes = saved["job"], int(saved["lines"]), int(saved["bytes"])
            except (ValueError, KeyError, TypeError):
                raise TfmError(f"{self.record}: not a record of --resume; delete it and {self.partial} to start over") from None
            if job != self.job:
                differences = ", ".join(job_differences(job, self.job)) or "the job's record"
                raise TfmError(
                    f"{self.partial} was begun by another job (differs in: {differences}); rerun with the same "
                    f"options and files, or delete it and {self.record} to start over"
                )
            if done_bytes > self.partial.stat().st_size:
                raise TfmError(f"{self.partial} is shorter than {self.record} says; delete both to start over")
        self.stream = open(self.partial, "a+", encoding="utf-8", newline="")
        self.stream.truncate(done_bytes)
        self.stream.seek(done_bytes)
        if not done_bytes:
            self.lines_done = 0
            self.save_record(0)
        return self.stream, self.lines_done

    def chunk_done(self, lines: int) -> None:
        """Make the chunk just written durable and count its `lines` input lines as done."""
        assert self.stream is not None, "open() first"
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.lines_done += lines
        self.save_record(os.fstat(self.stream.fileno()).st_size)

    def finish(self) -> None:
        """FILE.partial becomes FILE (replacing any), and the record is removed."""
        assert self.stream is not None, "open() first"
        self.stream.close()
        os.replace(self.partial, self.target)
        self.record.unlink(missing_ok=True)
        fsync_directory(self.target.parent if str(self.target.parent) else Path("."))

    def close(self) -> None:
        """Close FILE.partial, keeping it and its record for a rerun (after an error or Ctrl-C)."""
        if self.stream is not None and not self.stream.closed:
            self.stream.close()

    def save_record(self, done_bytes: int) -> None:
        fd, name = temp_file_beside(self.record)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"job": self.job, "lines": self.lines_done, "bytes": done_bytes}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, self.record)
