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
        alternatives = []
        for entry in sorted(entries, key=lambda e: -len(e.source)):  # the longest term first
            words = r"\s+".join(re.escape(word) for word in entry.source.split())
            alternatives.append(words if entry.case_sensitive else f"(?i:{words})")
        # (?<!\w) / (?!\w): a term starts and ends at a word boundary (also when it starts or ends
        # with punctuation, as in `C++`).
        self.pattern = re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)") if entries else None

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
        except UnicodeDecodeError as error:
            raise TfmError(f"glossary {path} is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
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
        """The terms found in `text`, left to right, not overlapping: (start, end, entry) character spans."""
        if self.pattern is None:
            return []
        found = []
        for match in self.pattern.finditer(text):
            words = " ".join(match.group().split())
            entry = self.by_key.get(words) or self.by_key[words.lower()]
            found.append((match.start(), match.end(), entry))
        return found

    def constraints(self, text: str) -> list[str]:
        """The target terms `text` requires: one per source occurrence, in source order."""
        return [entry.target for _, _, entry in self.matches(text)]


def term_key(entry: GlossaryEntry) -> str:
    """How a matched text finds its entry: as written for case-sensitive terms, else lower-cased."""
    return entry.source if entry.case_sensitive else entry.source.lower()
