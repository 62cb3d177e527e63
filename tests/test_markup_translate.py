"""`tfm translate --markup` on the trained synthetic model: tags come back around the aligned words,
every output line is well-formed when its input was, and hostile markup costs no line."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET

import pytest

from conftest import run_cli
from tfm_cli.inference.alignment import parse_pharaoh
from translate_support import held_out_sources, one_thread, trained_checkpoint  # noqa: F401 (one_thread: autouse fixture)


@pytest.fixture(scope="module")
def model_path():
    return trained_checkpoint()


def tagged(line: str, rng: random.Random) -> tuple[str, int, int]:
    """`line` with <b>…</b> around a random run of 1-2 of its words; returns (text, first word, last word)."""
    words = line.split()
    first = rng.randrange(len(words))
    last = min(first + rng.randint(0, 1), len(words) - 1)
    out = words[:first] + ["<b>" + words[first]] + words[first + 1 : last + 1]
    out[last] = out[last] + "</b>"
    return " ".join(out + words[last + 1 :]), first, last


def test_tags_land_around_the_words_aligned_to_the_words_they_enclosed(model_path):
    rng = random.Random(0)
    sources = held_out_sources()[:30]
    cases = [tagged(line, rng) for line in sources]
    result = run_cli(["translate", "-m", model_path, "--markup", "html", "--json", "-q"],
                     input="".join(text + "\n" for text, _, _ in cases))
    assert result.exit_code == 0, result.stderr
    for (text, first, last), row in zip(cases, result.stdout.splitlines()):
        record = json.loads(row)
        assert record["plain_source"] == " ".join(text.replace("<b>", "").replace("</b>", "").split())
        plain = record["plain_translation"]
        links = parse_pharaoh(record["alignment"])
        aligned = sorted({t for s, t in links if first <= s <= last})
        ET.fromstring(f"<r>{record['translation']}</r>")  # well-formed
        before, rest = record["translation"].split("<b>")
        start = len(before.split())
        end = start + len(rest.split("</b>")[0].split())
        if aligned:
            # The element encloses a run of the target words aligned to its words (markup.py keeps one
            # run when words aligned outside it interleave; tags also follow each source word's best
            # target word, so the run may hold words beyond these links): at least one of them.
            assert any(start <= t < end for t in aligned), (record["translation"], aligned)
        assert record["translation"].replace("<b>", "").replace("</b>", "") == plain


def test_hostile_markup_keeps_one_line_per_line_and_every_tag(model_path):
    source = held_out_sources()[0]
    words = source.split()
    lines = [
        f"<b>{source}",  # never closed
        f"{words[0]}</i> {' '.join(words[1:])}",  # closed, never opened
        "<b></b>",  # tags only
        "",
        f'<a href="x?a=1&amp;b=2">{words[0]}</a> &lt;{" ".join(words[1:])}&gt;',
        f"{words[0]}<br/>{' '.join(words[1:])}<img src='a.png'>",
        "<!-- comment only -->",
    ]
    result = run_cli(["translate", "-m", model_path, "--markup", "html"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == len(lines)
    assert "line 1: its html tags do not nest properly" in result.stderr
    assert "line 2: its html tags do not nest properly" in result.stderr
    assert "<b>" in outputs[0] and "</i>" in outputs[1] and outputs[2] == "<b></b>" and outputs[3] == ""
    assert '<a href="x?a=1&amp;b=2">' in outputs[4] and "</a>" in outputs[4]
    assert "<br/>" in outputs[5] and "<img src='a.png'>" in outputs[5]
    assert outputs[6] == "<!-- comment only -->"
    for line in (outputs[4], outputs[5].replace("<img src='a.png'>", "<img src='a.png'/>")):
        ET.fromstring(f"<r>{line}</r>")
