"""A terminology glossary (TSV: source term, target term): every source occurrence of a term becomes a
constraint that its target term appear in the translation.

Matching is what a translator expects from a term base: whole words only (`cat` is not found in
`category`), the longest term wins where terms overlap (`New York` before `York`), any run of
spaces in the text matches the single space of a term, and case is ignored only for terms written
all in lower case (`dog` matches `Dog` at the start of a sentence; `Apple` and `EU` match only so).
The target term is used verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tfm_cli.errors import TfmError

NOT_SPACE = re.compile(r"\S+")
WORD = re.compile(r"\w")


@dataclass(frozen=True)
class GlossaryEntry:
    """One term: the source form looked for and the target form required."""

    source: str
    target: str

    @property
    def case_sensitive(self) -> bool:
        """Terms with an upper-case letter match only as written."""
        return self.source != self.source.lower()


class Glossary:
    """Finds a glossary's source terms in text and returns the target terms they require."""

    def __init__(self, entries: list[GlossaryEntry]) -> None:
        self.entries = entries
        self.by_key = {term_key(entry): entry for entry in entries}
        # The terms are looked up, not compiled into one regular expression: one alternative per term
        # took seconds to compile for 100,000 terms, and its case-insensitive matches ("μm" for "µm")
        # were not always the term lower-cased. Lengths longest first: the longest term wins.
        self.lengths = sorted({len(key) for key in self.by_key}, reverse=True)

    @classmethod
    def load(cls, path: str | Path) -> Glossary:
        """Read a TSV glossary: one `source term<TAB>target term` per line; blank lines are skipped.

        Raises TfmError naming the file and line for a line without exactly two non-empty fields,
        or a source term listed twice with different targets.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Excel, Notepad) is no part of the first term
        except FileNotFoundError:
            raise TfmError(f"glossary {path} not found") from None
        except IsADirectoryError:
            raise TfmError(f"glossary {path} is a directory; give the TSV file") from None
        except UnicodeDecodeError as error:
            raise TfmError(f"glossary {path} is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
        if "\x00" in text:
            # UTF-16 without a byte-order mark decodes as "UTF-8" with a NUL after every ASCII letter:
            # read on, no term would ever match.
            number = text.count("\n", 0, text.index("\x00")) + 1
            raise TfmError(f"glossary {path} line {number} has a NUL byte: not UTF-8 text (UTF-16? binary?); save it as UTF-8")
        entries: dict[str, tuple[GlossaryEntry, int]] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            fields = [field.strip() for field in line.split("\t")]
            if len(fields) != 2 or not all(fields):
                raise TfmError(
                    f"glossary {path} line {number}: expected `source term<TAB>target term`, "
                    f"got {len(fields)} field(s){'' if all(fields) else ' with an empty one'}"
                )
            entry = GlossaryEntry(" ".join(fields[0].split()), fields[1])
            key = term_key(entry)
            if key in entries and entries[key][0].target != entry.target:
                raise TfmError(
                    f"glossary {path} line {number}: {entry.source!r} already has the target "
                    f"{entries[key][0].target!r} (line {entries[key][1]}); keep one"
                )
            entries.setdefault(key, (entry, number))
        if not entries:
            raise TfmError(f"glossary {path} has no terms")
        return cls([entry for entry, _ in entries.values()])

    def matches(self, text: str) -> list[tuple[int, int, GlossaryEntry]]:
        """The terms found in `text`, left to right, not overlapping: (start, end, entry) character spans.

        A term starts and ends at a word boundary (also where it starts or ends with punctuation, as
        `C++` does): no word character (regex `\\w`) just before or after it.
        """
        # The text with each run of whitespace made one space (as in the terms), and where each of
        # its characters stands in `text`.
        flat, where = [], []
        for match in NOT_SPACE.finditer(text):
            if flat:
                flat.append(" ")
                where.append(match.start() - 1)
            flat.append(match.group())
            where.extend(range(match.start(), match.end()))
        flat_text = "".join(flat)
        word = [bool(WORD.match(c)) for c in flat_text]
        found, start, size = [], 0, len(flat_text)
        while start < size:
            entry = None
            if flat_text[start] != " " and not (start and word[start - 1]):
                entry, end = self.term_at(flat_text, word, start)
            if entry is None:
                start += 1
                continue
            found.append((where[start], where[end - 1] + 1, entry))
            start = end
        return found

    def term_at(self, text: str, word: list[bool], start: int) -> tuple[GlossaryEntry | None, int]:
        """The longest term that starts at `start` of `text` (whitespace runs already one space) and
        ends at a word boundary, and where it ends; (None, start) if none does."""
        for length in self.lengths:
            end = start + length
            if end > len(text) or text[end - 1] == " " or (end < len(text) and word[end]):
                continue
            words = text[start:end]
            entry = self.by_key.get(words)
            if entry is None:
                entry = self.by_key.get(words.lower())
                entry = None if entry is None or entry.case_sensitive else entry
            if entry is not None:
                return entry, end
        return None, start

    def constraints(self, text: str) -> list[str]:
        """The target terms `text` requires: one per source occurrence, in source order."""
        return [entry.target for _, _, entry in self.matches(text)]


def term_key(entry: GlossaryEntry) -> str:
    """How a matched text finds its entry: as written for case-sensitive terms, else lower-cased."""
    return entry.source if entry.case_sensitive else entry.source.lower()
