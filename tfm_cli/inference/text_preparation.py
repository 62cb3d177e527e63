"""Text as users bring it -> what the model translates, and the translations -> one answer per line.

`prepare_line` takes one input line apart: its TAB-separated constraint fields (--constraints), its
inline tags (--markup), its sentences (--split-sentences) and the glossary terms each sentence
holds (--glossary). Each sentence becomes a `Segment` that is translated in the same batches as
every other line's. `assemble_line` puts a line's segment answers back together: sentences rejoined
with the line's own spacing, word alignments and constraint reports shifted to whole-line
positions, tags put back around the aligned words. With none of the options a line is one segment
and its answer passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfm_cli.inference.glossary import Glossary
from tfm_cli.inference.markup import MarkedLine, parse_markup, restore_markup
from tfm_cli.inference.outputs import Output, TranslatedLine
from tfm_cli.inference.sentence_splitting import SentenceSplitter, join_sentences, word_offsets
from tfm_cli.length_penalty import LengthPenalty
from tfm_cli.tokenization.words import word_char_offsets

@dataclass(frozen=True)
class TextOptions:
    """How input lines are read: constraint fields, glossary, markup, sentence splitting."""

    constraint_fields: bool = False  # --constraints: TAB-separated target phrases follow the source
    glossary: Glossary | None = None
    markup: str | None = None  # "html" or "xml"
    splitter: SentenceSplitter | None = None


@dataclass
class Segment:
    """One piece of a line that is translated on its own: a sentence, or the whole line."""

    text: str
    phrases: list[str] = field(default_factory=list)  # target phrases its translation must hold


@dataclass
class PreparedLine:
    """An input line taken apart: its segments and what is needed to put their translations together."""

    source: str  # the line without its constraint fields (the source as given, tags included)
    text: str  # the text translated: `source` without its tags
    spans: list[tuple[int, int]]  # character spans of the segments in `text` ([] for a blank line)
    segments: list[Segment]
    marked: MarkedLine | None = None
    warnings: list[str] = field(default_factory=list)


def prepare_line(line: str, options: TextOptions) -> PreparedLine:
    """Take `line` apart as `options` say; returns a PreparedLine (no segments for a blank line)."""
    source, phrases = line, []
    if options.constraint_fields:
        source, *fields = line.split("\t")
        phrases = [phrase.strip() for phrase in fields if phrase.strip()]
    text, marked, warnings = source, None, []
    if options.markup is not None:
        marked = parse_markup(source, options.markup)
        text = marked.text
        if not marked.well_formed:
            warnings.append(f"its {options.markup} tags do not nest properly; each unmatched tag is kept where it stood")
    if not text.strip():
        if phrases:
            warnings.append(f"the source is empty: its {len(phrases)} constraint(s) were not used")
        return PreparedLine(source, text, [], [], marked, warnings)
    # Without splitting the whole text is one segment, leading spaces and all (as tokenized so far).
    spans = options.splitter.spans(text) if options.splitter is not None else [(0, len(text))]
    segments = []
    for start, end in spans:
        sentence = text[start:end]
        terms = options.glossary.constraints(sentence) if options.glossary is not None else []
        segments.append(Segment(sentence, terms))
    segments[0].phrases.extend(phrases)  # --constraints and --split-sentences do not go together
    return PreparedLine(source, text, spans, segments, marked, warnings)


def assemble_line(
    index: int, prepared: PreparedLine, answers: list[TranslatedLine], length_penalty: LengthPenalty
) -> TranslatedLine:
    """One line's answer from its segments' answers (one per segment, in order).

    Segment warnings get "sentence k: " when the line was split. A single plain segment's answer is
    returned as it is (index and source set); otherwise each output is the join of the segments' k-th
    outputs (the caller allows n-best only for single segments): text joined with the line's own
    spacing, raw scores summed and normalised over all tokens (each segment's EOS counted), alignment
    pairs shifted to whole-line word positions, and with markup the tags put back.
    """
    line = TranslatedLine(index=index, source=prepared.source, warnings=list(prepared.warnings))
    split = len(answers) > 1
    for number, answer in enumerate(answers, 1):
        line.warnings += [f"sentence {number}: {warning}" if split else warning for warning in answer.warnings]
    line.truncated = any(answer.truncated for answer in answers)
    constrained = [answer for answer in answers if answer.constraints is not None]
    if constrained:
        line.constraints = [phrase for answer in constrained for phrase in answer.constraints]
    if not answers:
        if prepared.marked is not None and prepared.source.strip():
            # Tags around no text (`<b></b>`, a lone comment): nothing to translate, the tags stay.
            text = restore_markup(prepared.marked, "", [])
            line.outputs = [Output(text=text, ids=[], pieces=[], raw_score=0.0, score=0.0, finished=True, plain_text="")]
        return line
    if not split and prepared.marked is None:
        only = answers[0]
        line.outputs, line.src_words = only.outputs, only.src_words
        return line
    with_outputs = [answer for answer in answers if answer.outputs]
    if not with_outputs:
        return line
    n_outputs = min(len(answer.outputs) for answer in with_outputs)
    line.outputs = [joined_output(prepared, answers, k, length_penalty) for k in range(n_outputs)]
    if any(answer.src_words is not None for answer in answers):
        line.src_words = word_char_offsets(prepared.text)
    if prepared.marked is not None:
        line.plain_source = prepared.text
    return line


def joined_output(prepared: PreparedLine, answers: list[TranslatedLine], k: int, length_penalty: LengthPenalty) -> Output:
    """The k-th output of a line from the k-th output of each segment (an empty one where a segment has none)."""
    chosen = [answer.outputs[k] if answer.outputs else None for answer in answers]
    texts = [output.text if output else "" for output in chosen]
    text = join_sentences(prepared.text, prepared.spans, texts) if len(answers) > 1 else texts[0]
    ids = [token for output in chosen if output for token in output.ids]
    raw_score = sum(output.raw_score for output in chosen if output)
    n_scored = sum(len(output.ids) + 1 for output in chosen if output)  # each segment ends with its EOS
    output = Output(
        text=text,
        ids=ids,
        pieces=[piece for output in chosen if output for piece in output.pieces],
        raw_score=raw_score,
        score=length_penalty.normalise(raw_score, n_scored),
        finished=all(output.finished for output in chosen if output),
        scored_tokens=n_scored,
    )
    if any(answer.constraints is not None for answer in answers):
        output.constraints_met = []
        for answer, o in zip(answers, chosen):
            phrases = answer.constraints or []
            output.constraints_met += o.constraints_met if o is not None and o.constraints_met else [False] * len(phrases)
    if all(o is None or o.alignment is not None for o in chosen):
        output.alignment = shifted_links(prepared, chosen, "alignment")
        output.words = word_char_offsets(text)
    if prepared.marked is not None:
        # Alignment words come from the output pieces; a text that a byte-fallback newline split
        # further could have more: links past either side's words are left out.
        n_src, n_tgt = len(word_char_offsets(prepared.text)), len(word_char_offsets(text))
        all_links = shifted_links(prepared, chosen, "markup_links")
        links = [(src, tgt) for src, tgt in all_links if src < n_src and tgt < n_tgt]
        output.plain_text = text
        output.text = restore_markup(prepared.marked, text, links)
    return output


def shifted_links(prepared: PreparedLine, chosen: list[Output | None], kind: str) -> list[tuple[int, int]]:
    """The segments' word links (`kind`: "alignment" or "markup_links") at whole-line word positions:
    each segment's shifted by the words of the line and of the joined translation before it."""
    tgt_offset, pairs = 0, []
    for src_offset, output in zip(word_offsets(prepared.text, prepared.spans), chosen):
        if output is not None:
            pairs += [(src + src_offset, tgt + tgt_offset) for src, tgt in getattr(output, kind) or []]
            tgt_offset += len(word_char_offsets(output.text))
    return pairs
