"""Inline markup through translation: take the tags out of a source line, put them back around the
target words aligned to the words they enclosed (Bergamot's approach, the Firefox translator).

Owns tag parsing (the stdlib HTMLParser, never regular expressions) and tag placement; it neither
translates nor aligns. Words are tokenization/words.py's (runs of non-whitespace).
"""

from __future__ import annotations

import bisect
import html
import re
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser

from tfm_cli.inference.alignment import AlignmentPair
from tfm_cli.tokenization.words import word_char_offsets

MARKUP_MODES = ("html", "xml")
# HTML's void elements: a start tag with no end tag, kept as a position marker.
HTML_VOID_ELEMENTS = frozenset(
    ["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"]
)
# Elements that may sit inside a word (`un<b>der</b>line`) without splitting it: Bergamot's
# HTMLOptions::inlineTags plus a few more phrasing elements. In html mode the tags of every other
# element (p, div, li, td, ...) separate the words on either side, as a browser lays them out.
HTML_INLINE_ELEMENTS = frozenset(
    ["a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins", "kbd"]
    + ["label", "mark", "math", "output", "q", "ruby", "s", "samp", "small", "span", "strike", "strong"]
    + ["sub", "sup", "time", "tt", "u", "var"]
)
# Bergamot's inWordTags: the one void element that only ever sits inside a word.
HTML_IN_WORD_VOID = frozenset({"wbr"})
# HTMLParser stops a tag name at these characters (html.parser.tagfind_tolerant).
TAG_NAME_END = "\t\n\r\f />\x00"
# What may close a comment: "--" then ">" (Python 3.11's _markupbase), or "--!>" (newer releases).
COMMENT_CLOSE = re.compile(r"--!?\s*>")
# In xml mode these are ordinary elements, but in the vocabularies that have them (XHTML, SVG) they
# hold code, as in html: their text is kept verbatim, untranslated.
XML_CODE_ELEMENTS = ("script", "style")


@dataclass
class Marker:
    """A tag kept verbatim at one point of the text: a void element, `<x/>`, a comment, a doctype,
    a processing instruction, CDATA, script/style content, or a tag that did not nest."""

    raw: str
    offset: int  # character offset in MarkedLine.text where the marker sits
    order: int  # document order, to break ties between things at the same place


@dataclass
class Element:
    """A start tag and its matching end tag, verbatim, enclosing MarkedLine.text[start:end]."""

    start_tag: str
    end_tag: str
    start: int
    end: int
    order: int
    name: str = ""  # as matched: lower-cased in html mode, as written in xml mode
    children: list[Element | Marker] = field(default_factory=list)


@dataclass
class MarkedLine:
    """A source line split into the plain text to translate and the markup around it."""

    text: str  # tags removed, entities and character references decoded
    nodes: list[Element | Marker]  # the top-level elements and markers, in document order
    well_formed: bool  # False when some tag did not nest (it is then kept as a Marker)


@dataclass
class _Token:
    kind: str  # "data", "start", "end", "empty" (void or <x/>) or "marker"
    raw: str
    text: str = ""  # decoded text, for "data"
    name: str = ""


class _Tokenizer(HTMLParser):
    """HTMLParser events as _Tokens whose raw text is sliced from the line between event offsets."""

    def __init__(self, line: str, mode: str):
        super().__init__(convert_charrefs=True)
        self.line = line
        self.mode = mode
        if mode == "xml":
            self.CDATA_CONTENT_ELEMENTS = ()  # XML parses script/style as ordinary elements (see XML_CODE_ELEMENTS)
        self.line_starts = [0] + [i + 1 for i, char in enumerate(line) if char == "\n"]
        self.events: list[tuple[int, str, str]] = []  # (offset, kind, decoded text)
        # Where the last thing that can end a tag or a comment starts (-1: none), see check_for_whole_start_tag.
        self.last_tag_end = line.rfind(">")
        self.last_comment_close = max((m.start() for m in COMMENT_CLOSE.finditer(line)), default=-1)

    def tokens(self) -> list[_Token]:
        """Feed the whole line; every character of it ends up in exactly one token."""
        self.feed(self.line)
        self.close()
        if self.rawdata:  # an unclosed <script> or <style>: HTMLParser keeps its content unread
            self.events.append((len(self.line) - len(self.rawdata), "marker", ""))
        offsets = [offset for offset, _, _ in self.events] + [len(self.line)]
        tokens = []
        for (offset, kind, text), end in zip(self.events, offsets[1:]):
            raw = self.line[offset:end]
            if kind == "data" and tokens and tokens[-1].kind == "data":
                tokens[-1].raw += raw
                tokens[-1].text += text
            else:
                tokens.append(_Token(kind, raw, text, self.tag_name(raw) if kind in ("start", "end", "empty") else ""))
        return tokens

    def tag_name(self, raw: str) -> str:
        """The tag's name as HTMLParser delimits it; original case kept in xml mode."""
        start = 2 if raw.startswith("</") else 1
        end = start
        while end < len(raw) and raw[end] not in TAG_NAME_END:
            end += 1
        return raw[start:end] if self.mode == "xml" else raw[start:end].lower()

    def record(self, kind: str, text: str = "") -> None:
        line, column = self.getpos()
        self.events.append((self.line_starts[line - 1] + column, kind, text))

    def handle_starttag(self, tag, attrs):
        void = self.mode == "html" and tag in HTML_VOID_ELEMENTS
        self.record("empty" if void else "start")

    def handle_startendtag(self, tag, attrs):
        self.record("empty")

    def handle_endtag(self, tag):
        self.record("end")

    def handle_data(self, data):
        # Script and style content is code, not text to translate: kept verbatim.
        self.record("marker" if self.cdata_elem else "data", data)

    def handle_comment(self, data):
        self.record("marker")

    def handle_decl(self, decl):
        self.record("marker")

    def handle_pi(self, data):
        self.record("marker")

    def unknown_decl(self, data):
        self.record("marker")

    def parse_html_declaration(self, i):
        # _markupbase raises AssertionError on a marked section it does not know (`<![foo[`);
        # a browser reads it as a bogus comment, and so do we.
        try:
            return super().parse_html_declaration(i)
        except AssertionError:
            return self.parse_bogus_comment(i)

    def parse_endtag(self, i):
        # HTMLParser skips "</>" without any event; keep it, so that no input is ever lost.
        if self.rawdata.startswith("</>", i):
            self.record("marker")
            return i + 3
        return super().parse_endtag(i)

    def line_offset(self, i: int) -> int:
        """The offset in the line of HTMLParser's rawdata[i] (rawdata is always a suffix of the line)."""
        return len(self.line) - len(self.rawdata) + i

    def check_for_whole_start_tag(self, i):
        # With no ">" left in the line the tag cannot end: say so (-1, unfinished, which close() reads
        # as text) without HTMLParser's scan of the rest of the line for attributes, which it repeats
        # from every later "<" (quadratic: 30,000 characters of "<a " took 18 s).
        if self.line_offset(i) > self.last_tag_end:
            return -1
        return super().check_for_whole_start_tag(i)

    def parse_comment(self, i, report=1):
        # Likewise a comment that nothing after it can close (100,000 characters of "<!--" took 18 s).
        if self.line_offset(i) + 2 > self.last_comment_close:
            return -1
        return super().parse_comment(i, report)


def _separates_words(token: _Token, mode: str) -> bool:
    """Whether a tag between two non-space characters splits them into two words.

    Void elements and `<x/>` (a <br> between "line1" and "line2" is a line break, and a translator
    expects two words), and in html mode the tags of block elements, do: .text gets a space there.
    Inline elements do not: `un<b>der</b>line` stays one word, which the tag then encloses whole.
    Bergamot's substituteInlineTagsWithSpaces splits there too; we don't, because "un der line"
    would be mistranslated. Comments and other markers are invisible and split nothing.
    """
    if token.kind == "empty":
        return token.name not in HTML_IN_WORD_VOID or mode == "xml"
    if token.kind in ("start", "end") and mode == "html":
        return token.name not in HTML_INLINE_ELEMENTS
    return False


def parse_markup(line: str, mode: str) -> MarkedLine:
    """Split one line of `mode` ("html" or "xml") markup into plain text and its tag tree.

    Returns a MarkedLine: .text to translate, .nodes the top-level Elements and Markers (Elements
    hold the character span they enclose in .text and their children), .well_formed. Never raises
    on bad markup: an end tag with no open element, or an element never closed, becomes a Marker.
    The text inside script and style elements is a Marker too (code, not text), in both modes.
    """
    if mode not in MARKUP_MODES:
        raise ValueError(f"markup mode must be one of {MARKUP_MODES}, not {mode!r}")
    tokens = _Tokenizer(line, mode).tokens()
    # next_starts_word[i]: the next text after token i (tags skipped) starts with a non-space.
    next_starts_word = [False] * (len(tokens) + 1)
    for index in range(len(tokens) - 1, -1, -1):
        token = tokens[index]
        if token.kind == "data" and token.text:
            next_starts_word[index] = token.text[0] != " "
        else:
            next_starts_word[index] = next_starts_word[index + 1]

    text: list[str] = []
    length = 0
    root = Element("", "", 0, 0, -1)
    stack = [root]
    # Open elements by name: an end tag that matches none is found without walking the whole stack
    # (quadratic on thousands of unmatched end tags under thousands of open ones).
    open_names: Counter[str] = Counter()
    well_formed = True

    def add_space_if_inside_word(index: int) -> None:
        nonlocal length
        if _separates_words(tokens[index], mode) and length and text[-1][-1] != " " and next_starts_word[index]:
            text.append(" ")
            length += 1

    for index, token in enumerate(tokens):
        if token.kind == "data" and mode == "xml" and any(open_names[name] for name in XML_CODE_ELEMENTS):
            stack[-1].children.append(Marker(token.raw, length, index))
        elif token.kind == "data":
            if token.text:
                text.append(token.text)
                length += len(token.text)
        elif token.kind == "start":
            add_space_if_inside_word(index)  # before the element: the space stays outside it
            element = Element(token.raw, "", length, length, index, token.name)
            stack[-1].children.append(element)
            stack.append(element)
            open_names[token.name] += 1
        elif token.kind == "end":
            if not open_names[token.name]:
                stack[-1].children.append(Marker(token.raw, length, index))
                well_formed = False
            else:
                depth = next(d for d in range(len(stack) - 1, 0, -1) if stack[d].name == token.name)
                if len(stack) - 1 > depth:  # elements opened inside it and never closed
                    open_names.subtract(unclosed.name for unclosed in stack[depth + 1 :])
                    _unwrap(stack, depth)
                    well_formed = False
                element = stack.pop()
                open_names[element.name] -= 1
                element.end_tag, element.end = token.raw, length
            add_space_if_inside_word(index)
        else:
            stack[-1].children.append(Marker(token.raw, length, index))
            add_space_if_inside_word(index)
    if len(stack) > 1:
        _unwrap(stack, 0)
        well_formed = False
    return MarkedLine("".join(text), root.children, well_formed)


def _unwrap(stack: list[Element], depth: int) -> None:
    """Pop the open elements above stack[depth], which were never closed: each start tag becomes a
    Marker and its children move up to stack[depth]. Each was the last child of the one below it, so
    they become one run there: marker, children, the next marker, ... (one pass: thousands of
    unclosed elements moved level by level would be quadratic)."""
    parent, unclosed = stack[depth], stack[depth + 1 :]
    parent.children.pop()
    for element in unclosed:
        parent.children.append(Marker(element.start_tag, element.start, element.order))
        parent.children.extend(element.children if element is unclosed[-1] else element.children[:-1])
    del stack[depth + 1 :]


@dataclass
class _Target:
    """What placement needs to know about the source, the translation and the alignment."""

    marked: MarkedLine
    translation: str
    src_words: list[tuple[int, int]]  # character offsets in marked.text
    tgt_words: list[tuple[int, int]]  # character offsets in translation
    links: list[list[int]]  # links[s]: the sorted target words aligned to source word s
    # Looked up by bisection, so that a line of thousands of tags and words is not quadratic.
    src_starts: list[int] = field(init=False)  # src_starts[s]: where source word s starts
    src_ends: list[int] = field(init=False)  # src_ends[s]: where source word s ends
    linked: list[int] = field(init=False)  # the source words with a link, in order
    aligned: set[int] = field(init=False)  # the target words with a link

    def __post_init__(self):
        self.src_starts = [start for start, _ in self.src_words]
        self.src_ends = [end for _, end in self.src_words]
        self.linked = [s for s, targets in enumerate(self.links) if targets]
        self.aligned = {t for targets in self.links for t in targets}

    def words_of(self, element: Element) -> range:
        """The source words whose characters overlap the element's span (those ending after its
        start and starting before its end; for an empty span, a word it sits inside)."""
        first = bisect.bisect_right(self.src_ends, element.start)
        return range(first, bisect.bisect_left(self.src_starts, element.end))

    def linked_in(self, words: range) -> list[int]:
        """The source words in `words` that have a link."""
        return self.linked[bisect.bisect_left(self.linked, words.start) : bisect.bisect_left(self.linked, words.stop)]

    def prev_end(self, t: int) -> int:
        """Where the text before target word t ends: the end of word t - 1, or 0."""
        return self.tgt_words[t - 1][1] if t > 0 else 0

    def next_start(self, t: int) -> int:
        """Where target word t starts, or the translation's end when there is no word t."""
        return self.tgt_words[t][0] if t < len(self.tgt_words) else len(self.translation)


def restore_markup(marked: MarkedLine, translation: str, alignment: list[AlignmentPair]) -> str:
    """Put the tags of `marked` back into `translation`, around the target words aligned to the
    source words they enclosed; `alignment` holds (source word, target word) index pairs.

    Returns the translation with &, < and > escaped and every tag inserted verbatim exactly once;
    its text is otherwise unchanged. Well-formed input gives well-formed output. Raises ValueError
    for a link to a word that `marked.text` or `translation` does not have.
    """
    src_words = word_char_offsets(marked.text)
    tgt_words = word_char_offsets(translation)
    links: list[set[int]] = [set() for _ in src_words]
    for src, tgt in alignment:
        if not (0 <= src < len(src_words) and 0 <= tgt < len(tgt_words)):
            raise ValueError(
                f"alignment link {src}-{tgt} is outside {len(src_words)} source and {len(tgt_words)} target words"
            )
        links[src].add(tgt)
    target = _Target(marked, translation, src_words, tgt_words, [sorted(tgts) for tgts in links])
    root = Element("", "", 0, len(marked.text), -1, children=marked.nodes)
    return _render(target, root, 0, len(tgt_words), 0, len(translation))


@dataclass
class _Open:
    """An element being written by _render: its children still to place, last first, and its text."""

    items: list[tuple[int, int, int, Element | Marker, int]]  # (first word, end word, order, child, offset)
    cursor: int  # how far its text in the translation has been written
    char_end: int  # where its text ends
    end_tag: str


def _render(target: _Target, root: Element, lo: int, hi: int, char_start: int, char_end: int) -> str:
    """The content of `root` (without its own tags): it holds target words [lo, hi), which are
    translation[char_start:char_end]; returns that text escaped, with the children's tags in it.

    Depth-first with a stack of open elements, not recursion: a line may nest thousands of tags.
    """
    out = []
    stack = [_Open(_placements(target, root, lo, hi, char_end), char_start, char_end, "")]
    while stack:
        open_element = stack[-1]
        if not open_element.items:
            out.append(html.escape(target.translation[open_element.cursor : open_element.char_end], quote=False))
            out.append(open_element.end_tag)
            stack.pop()
            if stack:
                stack[-1].cursor = open_element.char_end
            continue
        first, last, _, child, offset = open_element.items.pop()
        if first == last:
            # A marker, or an element with no target words (then empty, its own children inside it).
            start = end = min(max(offset, open_element.cursor), open_element.char_end)
        else:
            leading, trailing = _edge_spaces(target, child)
            start = max(open_element.cursor, target.prev_end(first), target.tgt_words[first][0] - leading)
            end = min(open_element.char_end, target.next_start(last), target.tgt_words[last - 1][1] + trailing)
        out.append(html.escape(target.translation[open_element.cursor : start], quote=False))
        if isinstance(child, Marker):
            out.append(child.raw)
            open_element.cursor = start
        else:
            out.append(child.start_tag)
            stack.append(_Open(_placements(target, child, first, last, end), start, end, child.end_tag))
    return "".join(out)


def _placements(
    target: _Target, parent: Element, lo: int, hi: int, char_end: int
) -> list[tuple[int, int, int, Element | Marker, int]]:
    """Where each child of `parent` (holding target words [lo, hi), its text ending at char_end)
    goes, last first: (first word, end word, order, child, desired character offset for a point)."""
    intervals = _child_intervals(target, parent, lo, hi)
    items = []
    for child in parent.children:
        if isinstance(child, Element) and child.order in intervals:
            first, last = intervals[child.order]
            items.append((first, last, child.order, child, 0))
        else:
            boundary, offset = _outside_siblings(target, *_point(target, child, lo, hi, char_end), intervals)
            items.append((boundary, boundary, child.order, child, offset))
    # Sorting on (first, end) puts a point at boundary k after a sibling that ends at k and before
    # one that starts at k; siblings never overlap, so the order is a left-to-right walk.
    items.sort(key=lambda item: item[:3], reverse=True)
    return items


def _child_intervals(target: _Target, parent: Element, lo: int, hi: int) -> dict[int, tuple[int, int]]:
    """Target word intervals [first, end) within [lo, hi) of the child elements that get words,
    keyed by the child's order; pairwise disjoint.

    A child claims the target words (in [lo, hi)) aligned to its source words; a word claimed by
    several siblings goes to the first in document order. The smallest range covering a child's
    words may hold words aligned to source words outside it (a sibling's, the parent's own text's,
    or a stray link's far from the rest): then the child keeps one run of its words between two
    such foreign words: the run that holds most of them; among equally long runs, the one nearest
    to the target words of the source words on either side of the child (where the child's text
    sat among its neighbours); then the first. Its other words stay outside it. Target words with
    no link at all never split a run. The interval starts and ends on the child's own words and
    holds no foreign word, so two intervals can never overlap. Bergamot instead repeats a tag
    around every run; here each tag must appear exactly once.
    """
    owner: dict[int, int] = {}
    anchors: dict[int, list[int]] = {}
    for child in parent.children:
        if isinstance(child, Element):
            words = target.words_of(child)
            for s in target.linked_in(words):
                for t in target.links[s]:
                    if lo <= t < hi:
                        owner.setdefault(t, child.order)
            anchors[child.order] = _neighbour_targets(target, words, lo, hi)
    intervals = {}
    for order in sorted(set(owner.values())):
        runs: list[list[int]] = [[]]
        for t in range(lo, hi):
            if owner.get(t) == order:
                runs[-1].append(t)
            elif t in target.aligned and runs[-1]:
                runs.append([])
        near = anchors[order]
        # max keeps the first of runs that tie on both counts
        best = max((run for run in runs if run), key=lambda run: (len(run), -_distance(run, near)))
        intervals[order] = (best[0], best[-1] + 1)
    return intervals


def _distance(run: list[int], anchors: list[int]) -> int:
    """How many words separate the run's nearer end from the nearest anchor; 0 without anchors."""
    return min((abs(t - a) for a in anchors for t in (run[0], run[-1])), default=0)


def _neighbour_targets(target: _Target, words: range, lo: int, hi: int) -> list[int]:
    """The target words in [lo, hi) aligned to the nearest linked source word before `words` and to
    the nearest one after them (either may be missing)."""
    before = bisect.bisect_left(target.linked, words.start)  # linked[:before] lie before the words
    after = bisect.bisect_left(target.linked, words.stop)  # linked[after:] lie after them
    sources = target.linked[before - 1 : before] if before else []
    sources += target.linked[after : after + 1]
    return [t for s in sources for t in target.links[s] if lo <= t < hi]


def _point(target: _Target, node: Element | Marker, lo: int, hi: int, char_end: int) -> tuple[int, int]:
    """Where a marker, or an element with no target words, goes: (word boundary, character offset).

    Before the target word aligned to the next source word that has a link into [lo, hi), else
    after the one aligned to the previous such word, else at the end of the parent. As many spaces
    as separated it from that word in the source stay between them, if the target has them (so
    an identity translation gives the input back).
    """
    start, end = (node.start, node.end) if isinstance(node, Element) else (node.offset, node.offset)
    own = target.words_of(node) if isinstance(node, Element) else range(0)
    text = target.marked.text

    def inside(s: int) -> list[int]:
        return [t for t in target.links[s] if lo <= t < hi]

    # The words after it: those ending after its end, but its own (at most one of them: the word
    # its end sits inside). A word the marker sits inside (a comment in "foo<!---->bar") counts.
    following = bisect.bisect_right(target.src_ends, end)
    if following in own:
        following += 1
    for s in target.linked_in(range(following, len(target.src_words))):
        if targets := inside(s):
            t = targets[0]
            gap = text[end : target.src_words[s][0]]
            spaces = len(gap) if s == following and gap.strip(" ") == "" else 0
            return t, max(target.tgt_words[t][0] - spaces, target.prev_end(t))
    # The words before it: those ending at or before its start (never its own).
    preceding = bisect.bisect_right(target.src_ends, start)
    for s in reversed(target.linked_in(range(preceding))):
        if targets := inside(s):
            t = targets[-1]
            gap = text[target.src_words[s][1] : start]
            spaces = len(gap) if s == preceding - 1 and gap.strip(" ") == "" else 0
            return t + 1, min(target.tgt_words[t][1] + spaces, target.next_start(t + 1))
    return hi, char_end


def _outside_siblings(
    target: _Target, boundary: int, offset: int, intervals: dict[int, tuple[int, int]]
) -> tuple[int, int]:
    """A point strictly inside a sibling's interval moves to the interval's nearer edge (its start
    on a tie), since siblings must not overlap; returns (word boundary, character offset)."""
    for first, last in intervals.values():
        if first < boundary < last:
            if boundary - first <= last - boundary:
                return first, target.tgt_words[first][0]
            return last, target.tgt_words[last - 1][1]
    return boundary, offset


def _edge_spaces(target: _Target, element: Element) -> tuple[int, int]:
    """Spaces inside the element's span before its first word and after its last, in the source:
    the target keeps as many as it has there (so an identity translation gives the input back)."""
    words = target.words_of(element)
    first_start = target.src_words[words[0]][0]
    last_end = target.src_words[words[-1]][1]
    return max(first_start - element.start, 0), max(element.end - last_end, 0)
