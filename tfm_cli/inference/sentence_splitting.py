"""Sentences of a line for `tfm translate --split-sentences`: character spans, rejoining, word offsets.

The splitter is sentencex (the optional `sentences` extra), picked over pysbd with bench/sentence_splitters.py:
hundreds of times faster (compiled), maintained, ~300 languages with fallbacks (pysbd raises on the rest),
fewer misses on the German and French hard cases. sentencex never cuts before a sentence that starts with a
digit ("... eine Landschaft. 2 Mädchen sitzen."), which Multi30k's German has often; number_starts_masked lets
it see those boundaries while keeping its abbreviation rules (bench/RESULTS.md, "Sentence splitters").
Sentences are cut only where whitespace separates words (tokenization/words.py's rule: any character
str.isspace calls whitespace), and spans are stripped of whitespace; so no word is ever cut and the words
of the sentences, in order, are exactly the words of the line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tfm_cli.errors import TfmError
from tfm_cli.tokenization.words import words_before

Span = tuple[int, int]
DEFAULT_LANGUAGE = "en"
MISSING_SPLITTER = "--split-sentences needs a sentence splitter: pip install 'tfm-cli[sentences]'"
# A word ending in . ! or ?, the whitespace after it, and a number starting the next word.
NUMBER_AFTER_STOP = re.compile(r"(?<!\S)(\S+[.!?])(\s+)(\d+)")
SHORTEST_WORD_BEFORE_NUMBER = 4  # "Nr. 5", "ca. 3", "S. 12", "Abb. 2", "Art. 5": abbreviations are shorter


def splitter_language(language: str) -> str:
    """The code handed to sentencex for a language code: its primary subtag in lower case ("de-AT" -> "de").

    An empty code gives DEFAULT_LANGUAGE ("en"). Any other code is passed on: sentencex falls back along
    its own chain of related languages, and to English for a code it does not know, so nothing crashes.
    """
    primary = language.strip().lower().replace("_", "-").split("-")[0]
    return primary or DEFAULT_LANGUAGE


@dataclass(frozen=True)
class SentenceSplitter:
    """Splits lines of one language into sentence spans; build it once per language and reuse it.

    Raises TfmError on construction when the `sentences` extra (sentencex) is not installed.
    """

    language: str
    segment: Callable[[str], list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            import sentencex
        except ImportError:
            raise TfmError(MISSING_SPLITTER) from None
        code = splitter_language(self.language)
        object.__setattr__(self, "segment", lambda text: list(sentencex.segment(code, text)))

    def spans(self, line: str) -> list[Span]:
        """Character spans [start, end) of the sentences of `line`, in order; see sentence_spans."""
        if not line.strip():
            return []
        masked = number_starts_masked(line)  # same length as line, so the splitter's offsets are the line's
        cuts = [cut for cut in piece_ends(masked, self.segment(masked)) if 0 < cut < len(line)]
        # A cut with no whitespace beside it falls inside a word ("end.Next"): merge by not cutting there.
        cuts = [cut for cut in cuts if line[cut - 1].isspace() or line[cut].isspace()]
        return merge_empty(line, [strip_spaces(line, start, end) for start, end in zip([0, *cuts], [*cuts, len(line)])])


def sentence_spans(line: str, language: str) -> list[Span]:
    """Character spans [start, end) of the sentences of `line`, in order, split with sentencex for `language`.

    Each span is stripped of whitespace and holds a non-whitespace character; only whitespace lies
    between consecutive spans, so no word is ever cut. A blank line (only whitespace, the rule
    `tfm translate` uses) gives []; a line without a sentence break gives one span. A convenience over
    SentenceSplitter(language).spans(line); build the SentenceSplitter yourself to split many lines.
    Raises TfmError when the `sentences` extra is not installed.
    """
    return SentenceSplitter(language).spans(line)


def number_starts_masked(line: str) -> str:
    """`line` with each number that follows a sentence stop replaced by as many "Z"s: a str of the same length.

    Splitters treat a period followed by a digit as no boundary; followed by a capital letter, they cut
    unless the word before is an abbreviation they know. The mask hands that decision to them. A stop
    after a word with an inner period ("z.B.", "U.S.") or shorter than SHORTEST_WORD_BEFORE_NUMBER
    letters before "." is left alone, since such words are mostly abbreviations that take a number.
    """

    def mask(match: re.Match[str]) -> str:
        word, spaces, number = match.groups()
        stem = word.rstrip(".!?")
        if word.endswith(".") and (len(stem) < SHORTEST_WORD_BEFORE_NUMBER or "." in stem):
            return match.group(0)
        return word + spaces + "Z" * len(number)

    return NUMBER_AFTER_STOP.sub(mask, line)


def piece_ends(line: str, pieces: list[str]) -> list[int]:
    """The offset in `line` where each of the splitter's consecutive `pieces` ends.

    The pieces are found one after another; should the splitter ever have changed the text, the pieces
    from the first one not found on are dropped, so that rest of the line stays one sentence.
    """
    ends, cursor = [], 0
    for piece in pieces:
        start = line.find(piece, cursor)
        if start < 0:
            break
        cursor = start + len(piece)
        ends.append(cursor)
    return ends


def strip_spaces(line: str, start: int, end: int) -> Span:
    """The span [start, end) of `line` without its leading and trailing whitespace (maybe empty)."""
    while start < end and line[start].isspace():
        start += 1
    while end > start and line[end - 1].isspace():
        end -= 1
    return start, end


def merge_empty(line: str, spans: list[Span]) -> list[Span]:
    """`spans` with each one that holds only whitespace (a lone tab, say) joined to its neighbour.

    It joins the sentence before it, or the one after it when it comes first; so no sentence is blank.
    """
    merged: list[Span] = []
    pending = None  # start of leading whitespace-only pieces, given to the first real sentence
    for start, end in spans:
        if line[start:end].strip():
            merged.append((start if pending is None else pending, end))
            pending = None
        elif merged:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start and pending is None:
            pending = start
    return merged


def join_sentences(line: str, spans: list[Span], translations: list[str]) -> str:
    """One output line: `translations` (one per span) joined by the text between consecutive spans of `line`.

    That text is whitespace only (the original spacing, double spaces kept); the line's leading and
    trailing whitespace is not kept. No spans (a blank line) give "". Raises ValueError when the
    numbers of spans and translations differ.
    """
    if len(spans) != len(translations):
        raise ValueError(f"{len(spans)} sentence spans but {len(translations)} translations")
    parts = []
    for index, translation in enumerate(translations):
        if index:
            parts.append(line[spans[index - 1][1] : spans[index][0]])
        parts.append(translation)
    return "".join(parts)


def word_offsets(line: str, spans: list[Span]) -> list[int]:
    """For each span, the number of words (tokenization/words.py) of `line` before it: a list, one int per span.

    Adding a sentence's offset to its word indices gives the word's index in the whole line.
    """
    return [words_before(line, start) for start, _ in spans]
