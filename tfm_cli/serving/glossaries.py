"""The DeepL glossaries `tfm serve` keeps: entries checked as DeepL checks them, stored in one SQLite file
so they survive a restart (and can be shared by replicas that reach the same file).

A stored glossary becomes an inference.glossary.Glossary, whose term matching turns it into constraints
exactly as `tfm translate --glossary` does; nothing here matches terms.
"""

from __future__ import annotations

import csv
import datetime
import io
import re
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from tfm_cli.errors import TfmError
from tfm_cli.inference.glossary import Glossary, GlossaryEntry, term_key

DATABASE_NAME = "glossaries.sqlite3"
ENTRY_FORMATS = ("tsv", "csv")
SCHEMA = """
CREATE TABLE IF NOT EXISTS glossaries (
    glossary_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    creation_time TEXT NOT NULL,
    entry_count INTEGER NOT NULL,
    entries TEXT NOT NULL
)
"""
INFO_COLUMNS = "glossary_id, name, source_lang, target_lang, creation_time, entry_count"
# A line (as str.splitlines cuts them) with something besides white space on it.
NON_BLANK_LINE = re.compile(r"[^\S\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]*[^\s][^\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]*")


@dataclass(frozen=True)
class GlossaryInfo:
    """A glossary's description, as DeepL's API returns it (without the entries)."""

    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    creation_time: str
    entry_count: int

    def to_json(self) -> dict:
        """The DeepL v2 glossary object (the official client reads every one of these fields)."""
        return {
            "glossary_id": self.glossary_id, "name": self.name, "ready": True, "source_lang": self.source_lang,
            "target_lang": self.target_lang, "creation_time": self.creation_time, "entry_count": self.entry_count,
        }


def parse_entries(text: str, entries_format: str, max_entries: int) -> list[tuple[str, str]]:
    """The (source term, target term) pairs of DeepL glossary entries in `entries_format` (tsv or csv).

    TSV: `source<TAB>target` per line; CSV: `source,target[,source_lang,target_lang]` per row. Blank
    lines are skipped, terms stripped; a term may hold no TAB or line break. Raises TfmError naming the
    line for a malformed one, an empty term, or a source term listed twice (DeepL refuses those too),
    and for text of more than `max_entries` non-blank lines (counted before anything is split).
    """
    if entries_format not in ENTRY_FORMATS:
        raise TfmError(f"entries_format must be tsv or csv, got {entries_format!r}")
    lines = sum(1 for _ in NON_BLANK_LINE.finditer(text))
    if lines > max_entries:
        raise TfmError(f"entries: {lines} lines, over the limit of {max_entries} entries per glossary")
    if entries_format == "tsv":
        rows = [line.split("\t") for line in text.splitlines()]
    else:
        try:
            rows = [row[:2] if len(row) in (2, 4) else row for row in csv.reader(io.StringIO(text))]
        except csv.Error as error:
            raise TfmError(f"entries: not valid CSV ({error})") from None
    pairs: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for number, fields in enumerate(rows, 1):
        if not any(field.strip() for field in fields):
            continue
        if len(fields) != 2:
            expected = "source<TAB>target" if entries_format == "tsv" else "source,target[,source_lang,target_lang]"
            raise TfmError(f"entries line {number}: expected `{expected}`, got {len(fields)} field(s)")
        source, target = (field.strip() for field in fields)
        if not source or not target:
            raise TfmError(f"entries line {number}: a term is empty")
        if any(char in term for term in (source, target) for char in "\r\n\t"):
            raise TfmError(f"entries line {number}: a term holds a TAB or a line break")
        key = term_key(GlossaryEntry(" ".join(source.split()), target))
        if key in seen:
            raise TfmError(f"entries line {number}: the source term {source!r} is already on line {seen[key]}")
        seen[key] = number
        pairs.append((source, target))
    if not pairs:
        raise TfmError("entries: the glossary has no entries")
    return pairs


def as_glossary(pairs: list[tuple[str, str]]) -> Glossary:
    """The Glossary (term matcher) of (source, target) pairs; whitespace runs in a source term are one
    space, as `tfm translate --glossary` reads a TSV file."""
    return Glossary([GlossaryEntry(" ".join(source.split()), target) for source, target in pairs])


def entries_tsv(pairs: list[tuple[str, str]]) -> str:
    """The pairs as DeepL returns a glossary's entries: `source<TAB>target` lines."""
    return "\n".join(f"{source}\t{target}" for source, target in pairs)


class GlossaryStore:
    """The glossaries in `folder`/glossaries.sqlite3: create, list, read and delete, safe across threads.

    Each call is one SQLite transaction, so processes that share the file (replicas on one host, or a
    shared file system whose locks work) see each other's glossaries.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / DATABASE_NAME
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.connection = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            with self.connection:
                self.connection.execute(SCHEMA)
        except (OSError, sqlite3.Error) as error:
            raise TfmError(f"--data-dir: cannot keep the glossary database at {self.path}: {error}") from None
        self.lock = threading.Lock()

    def create(self, name: str, source_lang: str, target_lang: str, pairs: list[tuple[str, str]]) -> GlossaryInfo:
        """Store a new glossary of `pairs` and return its description (a fresh id)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        info = GlossaryInfo(
            str(uuid.uuid4()), name, source_lang, target_lang,
            now.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z", len(pairs),
        )
        with self.lock, self.connection:
            self.connection.execute(
                f"INSERT INTO glossaries ({INFO_COLUMNS}, entries) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (info.glossary_id, info.name, info.source_lang, info.target_lang, info.creation_time,
                 info.entry_count, entries_tsv(pairs)),
            )
        return info

    def list(self) -> list[GlossaryInfo]:
        """Every glossary, oldest first."""
        with self.lock:
            rows = self.connection.execute(f"SELECT {INFO_COLUMNS} FROM glossaries ORDER BY creation_time").fetchall()
        return [GlossaryInfo(*row) for row in rows]

    def info(self, glossary_id: str) -> GlossaryInfo | None:
        """The glossary's description, or None when there is none with that id."""
        with self.lock:
            row = self.connection.execute(
                f"SELECT {INFO_COLUMNS} FROM glossaries WHERE glossary_id = ?", (glossary_id,)
            ).fetchone()
        return GlossaryInfo(*row) if row else None

    def entries(self, glossary_id: str) -> list[tuple[str, str]] | None:
        """The glossary's (source, target) pairs in their order, or None when there is none with that id."""
        with self.lock:
            row = self.connection.execute("SELECT entries FROM glossaries WHERE glossary_id = ?", (glossary_id,)).fetchone()
        if row is None:
            return None
        return [tuple(line.split("\t", 1)) for line in row[0].split("\n")]

    def delete(self, glossary_id: str) -> bool:
        """Remove the glossary; False when there was none with that id."""
        with self.lock, self.connection:
            cursor = self.connection.execute("DELETE FROM glossaries WHERE glossary_id = ?", (glossary_id,))
        return cursor.rowcount > 0

    def close(self) -> None:
        """Close the database."""
        with self.lock:
            self.connection.close()
