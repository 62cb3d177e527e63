"""What a word is, for every command that counts words: `translate --alignment` and `--markup`,
`--split-sentences`, guided alignment training, `tfm align` and `tfm train-aligner`.

A word is a maximal run of characters that are not whitespace, whitespace being what Python's
`str.isspace` says: the ASCII space, tab and line breaks, the no-break spaces (U+00A0, U+202F), the
Unicode spaces U+2000-U+200A, U+3000 and the rest of Unicode's White_Space. That is exactly what
`str.split()` splits on. Zero-width characters (U+200B, U+2060, U+FEFF) are not whitespace and stay
inside a word.

The same rule read on sentencepiece pieces (word_spans): '▁' is the space sentencepiece marks, and
any other whitespace character a tokenizer keeps (a tab, a no-break space: kept by the `identity`
normalization) is a boundary too, at the edge of a piece or as a piece of its own. So the words of a
sentence's pieces are the words of its text, except where a tokenizer made ONE piece across a
whitespace character in its middle (a vocabulary learnt with such pieces); the piece then stays in
one word, and the text has more words than the pieces.
"""

from __future__ import annotations

import re

from tfm_cli.tokenization.vocabulary import SPACE_MARK

Span = tuple[int, int]
WORD = re.compile(r"\S+")  # re's \s on str patterns is str.isspace: tests/test_words.py checks every code point


def split_words(text: str) -> list[str]:
    """The words of `text`, in order: a list of non-empty strings without whitespace."""
    return text.split()


def count_words(text: str) -> int:
    """The number of words of `text`."""
    return len(text.split())


def word_char_offsets(text: str) -> list[Span]:
    """Character offsets [start, end) of each word of `text`, in order: a list of (start, end) tuples."""
    return [(match.start(), match.end()) for match in WORD.finditer(text)]


def words_before(text: str, position: int) -> int:
    """The number of words of `text` that start before character `position`."""
    return count_words(text[:position])


def piece_text(piece: str) -> str:
    """A sentencepiece piece as text: its '▁' marks turned back into spaces."""
    return piece.replace(SPACE_MARK, " ")


def has_content(piece: str) -> bool:
    """Whether a piece holds a character of a word (not only '▁' or other whitespace; not empty)."""
    return not piece_text(piece).isspace() and piece != ""


def starts_with_space(piece: str) -> bool:
    """Whether a piece begins with '▁' or another whitespace character (a word starts in it)."""
    return piece_text(piece)[:1].isspace()


def ends_with_space(piece: str) -> bool:
    """Whether a piece ends with '▁' or another whitespace character (the next piece starts a word)."""
    return piece_text(piece)[-1:].isspace()


def word_spans(pieces: list[str]) -> list[Span]:
    """Group sentencepiece pieces into words: half-open piece-index ranges [start, end), one per word.

    Rules (they follow where the text has whitespace):
    - a piece starting with whitespace ('▁' or another) starts a new word, and so does the very first
      piece with content, with or without it (a sentence may start without '▁', e.g. when encoded
      without the dummy prefix), and a piece right after one that ends with whitespace;
    - a piece without whitespace before it (a word continuation or attached punctuation such as '.')
      joins the word before it;
    - pieces with no content (a bare '▁', a tab piece, an empty string) join the NEXT word, so a bare
      '▁' followed by 'Ä' is one word; trailing content-less pieces join the last word;
    - whitespace in the middle of a piece does not split it (see the module docstring).
    The spans are contiguous and cover every piece, unless no piece has content (empty input, or
    only whitespace pieces), which gives []. Returns a list of (start, end) tuples.
    """
    starts: list[int] = []
    pending = None  # index of the first content-less piece not yet given to a word
    space_before = False
    for index, piece in enumerate(pieces):
        if not has_content(piece):
            if pending is None:
                pending = index
            space_before = space_before or piece != ""
            continue
        if not starts or space_before or starts_with_space(piece):
            starts.append(index if pending is None else pending)
        pending = None
        space_before = ends_with_space(piece)
    ends = starts[1:] + [len(pieces)]
    return list(zip(starts, ends))
