"""markup.py: tags out of a source line and back into its translation, on hand-worked cases and on
generated lines checked against xml.etree (a parser independent of ours).

In the hand cases, alignments are (source word, target word) pairs; each expected output was
worked out from the rules in markup.py's docstrings, and the reasoning is in the comment above it.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from tfm_cli.inference.markup import Element, Marker, parse_markup, restore_markup


def identity(marked):
    return [(i, i) for i in range(len(marked.text.split()))]


@pytest.mark.parametrize(
    "line, mode",
    [
        ('Press <b>Save</b> &amp; <i class="x">quit</i> now', "html"),
        ('<p>Go <a href="/a?x=1&amp;y=2" title=\'say "hi"\'>home</a> <br> or <em>stay</em></p>', "html"),
        ("<seg>A <g id='1'>bold <x id='2'/> move</g>  <!-- c --> end</seg>", "xml"),
        # Spaces inside an element's edges stay inside it.
        ("a<b> red </b>c <i></i> d", "html"),
    ],
)
def test_identity_translation_gives_the_input_back(line, mode):
    marked = parse_markup(line, mode)
    assert marked.well_formed
    assert restore_markup(marked, marked.text, identity(marked)) == line


def test_entities_are_decoded_in_the_text_and_escaped_again_in_the_output():
    marked = parse_markup("Tom &amp; Jerry &lt;3 it&#39;s caf&eacute; &#x41;", "html")
    assert marked.text == "Tom & Jerry <3 it's café A"
    # &amp; and &lt; round-trip; the other references come back as the characters they stand for.
    out = restore_markup(marked, marked.text, identity(marked))
    assert out == "Tom &amp; Jerry &lt;3 it's café A"
    assert restore_markup(marked, "a > b & c", []) == "a &gt; b &amp; c"


@pytest.mark.parametrize(
    "line, mode, translation, alignment, expected",
    [
        # The classic reordering: "red" is aligned to target word 1.
        ("<b>red</b> car", "html", "voiture rouge", [(0, 1), (1, 0)], "voiture <b>rouge</b>"),
        # Nested: the->la, very->très, big->grande, house->maison. <b> covers très grande, <i>
        # grande; <p> covers all four.
        (
            "<p>the <b>very <i>big</i></b> house</p>",
            "html",
            "la maison très grande",
            [(0, 0), (1, 2), (2, 3), (3, 1)],
            "<p>la maison <b>très <i>grande</i></b></p>",
        ),
        # Quotes and '>' inside attribute values: the tag is copied byte for byte.
        (
            "<a title='say \"hi\" > bye' href=\"x\">link</a> text",
            "html",
            "texte lien",
            [(0, 1), (1, 0)],
            "texte <a title='say \"hi\" > bye' href=\"x\">lien</a>",
        ),
        # Many-to-one: both source words go to "pomme"; the element spans what its words reach.
        ("<b>an apple</b> today", "html", "aujourd'hui pomme", [(0, 1), (1, 1), (2, 0)], "aujourd'hui <b>pomme</b>"),
        # Unaligned element ("big" has no link): before the word aligned to the next aligned source
        # word ("house" -> maison), with the one space that separated them in the source.
        ("the <b>big</b> house", "html", "la maison", [(0, 0), (2, 1)], "la<b></b> maison"),
        # Empty translation: every tag at the end, in document order, elements empty.
        ("<b>x</b> <br/>", "html", "", [], "<b></b><br/>"),
        # Comment: before the word aligned to "hello"; <b> follows "world" to the front.
        (
            "<!-- note --> hello <b>world</b>",
            "xml",
            "monde bonjour",
            [(0, 1), (1, 0)],
            "<b>monde</b><!-- note --> bonjour",
        ),
        # Siblings whose words interleave in the target: <b>'s words are 0 and 2, <i>'s is 1. <b>
        # keeps its first run (a tie of one word each), word 2 stays outside; no overlap.
        (
            "<b>a b</b> <i>c</i>",
            "html",
            "A C B",
            [(0, 0), (1, 2), (2, 1)],
            "<b>A</b> <i>C</i> B",
        ),
        # A marker goes before the word aligned to the next aligned source word, "y" -> Y, with
        # the one space that followed it in the source. X, aligned to "x" outside <b>, splits <b>'s
        # words: <b> keeps its longer run, Q R, and P stays outside it.
        ("<b>p q r</b> x <br/> y", "html", "P X Q R Y", [(0, 0), (1, 2), (2, 3), (3, 1), (4, 4)],
         "P X <b>Q R</b><br/> Y"),
        # With no next word, it goes after Q, the word "x" is aligned to (as is "q"), which sits
        # inside <b>'s range [P, R]: it moves to the nearer edge of that sibling, its end.
        ("<b>p q r</b> x <br/>", "html", "P Q R", [(0, 0), (1, 1), (2, 2), (3, 1)], "<b>P Q R</b><br/>"),
        # ... and to its start when that is nearer: after P is boundary 1 of <b>'s [0, 4).
        ("<b>p q r s</b> x <br/>", "html", "P Q R S", [(0, 0), (1, 1), (2, 2), (3, 3), (4, 0)],
         "<br/><b>P Q R S</b>"),
        # A target word with no link inside an element's words does not split them: X has none.
        ("<b>a b</b> c", "html", "A X B C", [(0, 0), (1, 2), (2, 3)], "<b>A X B</b> C"),
        # A stray link far from the rest: "s" links S and, wrongly, A. The words between are
        # aligned to words outside <b>, so its words form two runs of one; of equally long runs the
        # tag keeps the one nearest to where its neighbour "c" went (C, word 2): S, not A.
        ("a b c <b>s</b>", "html", "A B C S", [(0, 0), (1, 1), (2, 2), (3, 3), (3, 0)], "A B C <b>S</b>"),
        # A longer run wins over a nearer one: "s" renders as the compound "S1 S2", with a stray A.
        ("a <b>s</b> c", "html", "S1 S2 C A", [(0, 3), (1, 0), (1, 1), (1, 3), (2, 2)], "<b>S1 S2</b> C A"),
        # After the previous word, keeping the source's two spaces only where the target has room.
        ("x  <br/>", "html", "X Y", [(0, 0)], "X <br/>Y"),
    ],
)
def test_tags_follow_the_alignment(line, mode, translation, alignment, expected):
    assert restore_markup(parse_markup(line, mode), translation, alignment) == expected


def test_a_void_tag_between_two_words_separates_them():
    marked = parse_markup("line1<br/>line2", "html")
    assert marked.text == "line1 line2"
    assert restore_markup(marked, "ligne1 ligne2", [(0, 0), (1, 1)]) == "ligne1<br/> ligne2"
    # An html <img> needs no slash; before the word aligned to "here".
    marked = parse_markup('see <img src="x"> here', "html")
    assert marked.text == "see  here"
    assert restore_markup(marked, "ici voir", [(0, 1), (1, 0)]) == '<img src="x">ici voir'


def test_inline_elements_keep_a_word_whole_but_block_elements_split_it():
    assert parse_markup("un<b>der</b>line", "html").text == "underline"
    assert restore_markup(parse_markup("un<b>der</b>line", "html"), "souligner", [(0, 0)]) == "<b>souligner</b>"
    assert parse_markup("<li>one</li><li>two</li>", "html").text == "one two"
    assert parse_markup("a<wbr>b", "html").text == "ab"
    # XML knows nothing of blocks: only an empty element splits.
    assert parse_markup("<li>one</li><li>two</li>", "xml").text == "onetwo"
    assert parse_markup("a<x/>b", "xml").text == "a b"


def test_the_tree_records_spans_and_raw_tags():
    marked = parse_markup('<p class="A">x <B>y</B></p><br>', "html")
    [p, br] = marked.nodes
    assert isinstance(p, Element) and (p.start_tag, p.end_tag, p.start, p.end) == ('<p class="A">', "</p>", 0, 3)
    assert isinstance(p.children[0], Element) and p.children[0].start_tag == "<B>"
    assert isinstance(br, Marker) and br.raw == "<br>" and br.offset == 3


def test_xml_mode_is_case_sensitive_and_has_no_void_elements():
    assert not parse_markup("<B>x</b>", "xml").well_formed
    assert parse_markup("<B>x</b>", "html").well_formed
    assert not parse_markup("a <br> b", "xml").well_formed  # an unclosed element in XML
    assert parse_markup("a <br> b", "html").well_formed


@pytest.mark.parametrize(
    "line, mode, translation, alignment, expected, well_formed",
    [
        # <b> never closed and </i> never opened: both kept, each at its own place. "<b>" sat
        # before "bold" (-> gras), "</i>" one space before "text" (-> texte).
        ("a <b>bold</i> text", "html", "un texte gras", [(0, 0), (1, 2), (2, 1)], "un</i> texte <b>gras", False),
        # Crossed tags: </b> closes <b>, so <i> (still open inside it) becomes a marker; </i> then
        # has no open element.
        ("<b><i>x</b></i> y", "html", "X Y", [(0, 0), (1, 1)], "<b><i>X</b></i> Y", False),
        # "</>" is skipped by HTMLParser without an event; we still keep it.
        ("a</>b", "html", "ab", [(0, 0)], "</>ab", True),
        # An unclosed <script>: its content is code, kept verbatim and untranslated.
        ("<script>if (a<b) x", "html", "", [], "<script>if (a<b) x", False),
        # An unknown marked section makes _markupbase raise; it is read as a bogus comment.
        ("<![foo[ x ]]> a", "html", "A", [(0, 0)], "<![foo[ x ]]>A", True),
    ],
)
def test_bad_markup_is_kept_verbatim_and_reported(line, mode, translation, alignment, expected, well_formed):
    marked = parse_markup(line, mode)
    assert restore_markup(marked, translation, alignment) == expected
    assert marked.well_formed == well_formed


def test_comments_doctype_pi_and_cdata_are_markers_in_xml():
    line = "<?pi x?><!DOCTYPE d><![CDATA[ <b> ]]>one <!-- two --> three"
    marked = parse_markup(line, "xml")
    assert marked.text == "one  three" and marked.well_formed
    assert [node.raw for node in marked.nodes] == ["<?pi x?>", "<!DOCTYPE d>", "<![CDATA[ <b> ]]>", "<!-- two -->"]
    assert restore_markup(marked, marked.text, identity(marked)) == line


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="markup mode"):
        parse_markup("x", "sgml")
    with pytest.raises(ValueError, match="outside"):
        restore_markup(parse_markup("x", "html"), "y", [(0, 1)])


# ---- generated lines ----------------------------------------------------------------------------

# (raw as written in the source, the same text in the normalised output); all known to XML.
WORDS = [("cat", "cat"), ("a&amp;b", "a&amp;b"), ("&lt;x&gt;", "&lt;x&gt;"), ("it&#39;s", "it's"),
         ("caf&#233;", "café"), ("na\u00efve", "na\u00efve"), ("&quot;q&quot;", '"q"'), ("7", "7")]
TARGET_WORDS = ["le", "chat", "a&b", "<y>", "été", "x>y", "'", "99"]
ATTRIBUTES = ["", ' class="c"', " title='a > b'", ' data-q=\'say "hi"\'', ' href="/x?a=1&amp;b=2"']
ELEMENT_NAMES = ["b", "i", "span", "a", "Em"]


class LineMaker:
    """Random well-formed lines as pieces (source raw, normalised raw, is_tag); ids make tags unique."""

    def __init__(self, rng: random.Random, mode: str):
        self.rng, self.mode, self.next_id = rng, mode, 0

    def new_id(self) -> str:
        self.next_id += 1
        return f"n{self.next_id}"

    def content(self, depth: int) -> list[tuple[str, str, bool]]:
        pieces = []
        for _ in range(self.rng.randint(1, 6) if depth == 0 else self.rng.randint(0, 4)):
            roll = self.rng.random()
            if roll < 0.35:
                word = self.rng.choice(WORDS)
                pieces.append((word[0], word[1], False))
            elif roll < 0.5:
                spaces = " " * self.rng.choice([1, 1, 1, 2])
                pieces.append((spaces, spaces, False))
            elif roll < 0.8 and depth < 3:
                name = self.rng.choice(ELEMENT_NAMES)
                start = f'<{name} id="{self.new_id()}"{self.rng.choice(ATTRIBUTES)}>'
                pieces.append((start, start, True))
                pieces += self.content(depth + 1)
                pieces.append((f"</{name}>", f"</{name}>", True))
            elif roll < 0.9:
                void = self.rng.choice(["<br id='{}'/>", '<img id="{}" src="a>b"/>']
                                       + (["<br id='{}'>", '<img id="{}" src="x">'] if self.mode == "html" else []))
                void = void.format(self.new_id())
                pieces.append((void, void, True))
            else:
                marker = self.rng.choice(["<!-- c -->", "<?pi d?>"])
                pieces.append((marker, marker, True))
        return pieces


def as_xml(text: str, raw_tags: list[str]) -> str:
    """Close html void tags written without a slash, so that ElementTree can read the text."""
    for raw in set(raw_tags):
        if raw.startswith(("<br", "<img")) and not raw.endswith("/>"):
            text = text.replace(raw, raw[:-1] + "/>")
    return text


def parents(text: str) -> dict[str, str]:
    """id -> the id of its parent element ("root" at the top), as ElementTree reads it."""
    root = ET.fromstring(f'<r id="root">{text}</r>')
    return {child.get("id"): node.get("id") for node in root.iter() for child in node}


def tag_between_letters(pieces: list[tuple[str, str, bool]]) -> bool:
    """Whether some run of tags has a non-space character right before and right after it."""
    text = [(norm, is_tag) for _, norm, is_tag in pieces if norm]
    for i, (_, is_tag) in enumerate(text):
        if is_tag and i > 0 and not text[i - 1][1] and text[i - 1][0][-1] != " ":
            j = i
            while j < len(text) and text[j][1]:
                j += 1
            if j < len(text) and text[j][0][0] != " ":
                return True
    return False


def has_blank_element(nodes, text: str) -> bool:
    """Whether some element encloses spaces but no word: it is placed as an empty element, and its
    spaces stay outside it, so an identity translation cannot give the line back."""
    return any(
        isinstance(node, Element)
        and ((node.start < node.end and not text[node.start : node.end].strip(" ")) or has_blank_element(node.children, text))
        for node in nodes
    )


def test_generated_lines_give_well_formed_output_with_every_tag_once_and_the_text_untouched():
    rng = random.Random(1234)
    identities = 0
    for case in range(1200):
        mode = "html" if case % 2 else "xml"
        pieces = LineMaker(rng, mode).content(0)
        line = "".join(raw for raw, _, _ in pieces)
        raw_tags = [raw for raw, _, is_tag in pieces if is_tag]
        marked = parse_markup(line, mode)
        assert marked.well_formed, line

        n_src = len(marked.text.split())
        translation = " " * rng.choice([0, 0, 0, 1]) + (" " * rng.choice([1, 1, 2])).join(
            rng.choice(TARGET_WORDS) for _ in range(rng.choice([0, 1, 2, 3, 5, 8]))
        )
        n_tgt = len(translation.split())
        alignment = []
        if n_src and n_tgt:
            alignment = [(rng.randrange(n_src), t) for t in range(n_tgt) if rng.random() < 0.8]
            alignment += [(s, rng.randrange(n_tgt)) for s in range(n_src) if rng.random() < 0.3]
        out = restore_markup(marked, translation, alignment)

        root = ET.fromstring("<r>" + as_xml(out, raw_tags) + "</r>")  # raises unless well-formed
        assert "".join(root.itertext()) == translation, (line, translation, alignment, out)
        for raw, count in Counter(raw_tags).items():
            assert out.count(raw) == count, (line, out, raw)
        # Parents contain their children: every element keeps its parent.
        assert parents(as_xml(out, raw_tags)) == parents(as_xml(line, raw_tags)), (line, alignment, out)

        if n_src and not tag_between_letters(pieces) and not has_blank_element(marked.nodes, marked.text):
            normalised = "".join(norm for _, norm, _ in pieces)
            assert restore_markup(marked, marked.text, identity(marked)) == normalised, line
            identities += 1
    assert identities > 300  # the identity check above really ran
