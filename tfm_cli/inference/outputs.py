"""What `tfm translate` answers for one input line: its outputs (n-best), each with text, scores,
alignment and constraint report; `translation.format_line` prints them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Output:
    """One translation of one line, ready to print."""

    text: str
    ids: list[int]  # output token ids, EOS excluded
    pieces: list[str]
    raw_score: float  # sum of token log-probs, EOS included
    score: float  # raw_score normalised by the decoding's length penalty rule at n_scored_tokens
    finished: bool  # False if EOS was forced at the length limit
    alignment: list[tuple[int, int]] | None = None  # word-level (src, tgt) pairs
    words: list[tuple[int, int]] | None = None  # character offsets [start, end) of each output word
    constraints_met: list[bool] | None = None  # per constraint of the line, whether this output holds it
    plain_text: str | None = None  # with --markup: the translation before its tags were put back
    # With --markup: `alignment` plus each source word's best target word (the links tags follow).
    markup_links: list[tuple[int, int]] | None = None
    # The tokens raw_score sums over, EOS included: len(pieces) + 1 when None; one EOS per sentence
    # for a line translated sentence by sentence (--split-sentences).
    scored_tokens: int | None = None

    @property
    def n_scored_tokens(self) -> int:
        """The number of token log-probs raw_score sums (EOS included) and score is normalised at."""
        return len(self.pieces) + 1 if self.scored_tokens is None else self.scored_tokens


@dataclass
class TranslatedLine:
    """The answer for one input line: no outputs for an empty line, else n-best, best first."""

    index: int  # 0-based position in the input
    source: str
    outputs: list[Output] = field(default_factory=list)
    truncated: bool = False
    src_words: list[tuple[int, int]] | None = None  # character offsets of the source words (with alignment)
    constraints: list[str] | None = None  # the target phrases required (--constraints, --glossary)
    plain_source: str | None = None  # with --markup: the source text without its tags (what was translated)
    # What the user should know about this line (a truncated source, a dropped constraint), without
    # the line number: the command prefixes it.
    warnings: list[str] = field(default_factory=list)
