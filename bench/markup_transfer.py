"""Inline markup through translation: do tags land around the right words, and is every output well-formed?

Three measurements, each through `tfm translate --markup html --json` as a user runs it:
  gold      the synthetic pair (tfm_cli/synthetic.py) with its gold word alignments: 1-2 elements per
            line (<b>, <i>, <a href>, some nested) around runs of source words. On the lines whose
            translation equals the reference, an element is right when it encloses exactly the
            target words from the first to the last one gold-aligned to its source words.
  generated --generated lines with random tag trees (depth up to 3, attributes, void tags,
            comments, entities) over the same sources: outputs that xml.etree cannot parse, and
            outputs missing or repeating a tag of their input.
  real      --real-src lines (e.g. Multi30k test2016) with tags inserted the same way, translated by
            --real-model: malformed outputs, elements left empty, and a few examples.

Usage: python bench/markup_transfer.py -m SYNTHETIC_MODEL --data DIR (test.src, test.tgt, test.align)
           [--real-model MODEL --real-src FILE] [--generated 1000]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from prepare_corpus import cpu_flags
from tfm_cli.inference.alignment import parse_pharaoh
from tfm_cli.inference.markup import Element, parse_markup
from tfm_cli.tokenization.words import word_char_offsets

OPENERS = ['<b id="e{n}">', '<i id="e{n}">', '<a id="e{n}" href="https://example.org/?q=1&amp;r={n}">']


def translate_json(model: str, lines: list[str], options: Sequence[str] = ("--markup", "html")) -> list[dict]:
    """`tfm translate --json` with `options` (by default `--markup html`) on `lines`; one record per line."""
    result = subprocess.run(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", model, "--json", "-q", "--threads", "2", *options],
        input="".join(line + "\n" for line in lines), capture_output=True, text=True,
    )
    if result.returncode != 0:
        sys.exit(result.stderr)
    records = [json.loads(row) for row in result.stdout.splitlines()]
    assert len(records) == len(lines), "one output line per input line"
    return records


def insert_elements(words: list[str], rng: random.Random) -> tuple[str, dict[str, tuple[int, int]]]:
    """The words with 1-2 tagged runs of 1-2 words (sometimes one nested in a longer one).

    Returns the line and, per element id, its source word range [first, last].
    """
    n = len(words)
    spans: dict[str, tuple[int, int]] = {}
    opened: dict[int, list[str]] = {}
    closed: dict[int, list[str]] = {}

    def add(first: int, last: int, kind: int) -> None:
        key = f"e{len(spans)}"
        spans[key] = (first, last)
        tag = OPENERS[kind].format(n=len(spans) - 1)
        opened.setdefault(first, []).append(tag)
        closed.setdefault(last, []).insert(0, "</" + tag[1] + ">")

    first = rng.randrange(n)
    last = min(n - 1, first + rng.randint(0, 2))
    add(first, last, rng.randrange(3))
    if last > first and rng.random() < 0.4:  # nested: one word inside the first element
        inner = rng.randint(first, last)
        add(inner, inner, rng.randrange(2))
    elif rng.random() < 0.6:  # a second element elsewhere
        free = [i for i in range(n) if i < first or i > last]
        if free:
            start = rng.choice(free)
            add(start, start, rng.randrange(3))
    tokens = ["".join(opened.get(i, [])) + word + "".join(closed.get(i, [])) for i, word in enumerate(words)]
    return " ".join(tokens), spans


def element_words(translation: str) -> dict[str, set[int]]:
    """Per element id in a tagged translation, the indices of the target words it encloses."""
    marked = parse_markup(translation, "html")
    offsets = word_char_offsets(marked.text)
    found: dict[str, set[int]] = {}

    def walk(nodes) -> None:
        for node in nodes:
            if isinstance(node, Element):
                key = node.start_tag.split('id="')[1].split('"')[0]
                found[key] = {k for k, (s, e) in enumerate(offsets) if s < node.end and e > node.start}
                walk(node.children)

    walk(marked.nodes)
    return found


def gold_accuracy(model: str, data: Path, rng: random.Random) -> tuple[int, int, int, int, list[str]]:
    """Returns (right elements, elements judged, exact lines, lines, wrong examples)."""
    sources = (data / "test.src").read_text(encoding="utf-8").splitlines()
    references = (data / "test.tgt").read_text(encoding="utf-8").splitlines()
    gold = [parse_pharaoh(line) for line in (data / "test.align").read_text(encoding="utf-8").splitlines()]
    cases = [insert_elements(source.split(), rng) for source in sources]
    records = translate_json(model, [line for line, _ in cases])
    right = judged = exact = 0
    wrong = []
    for (line, spans), record, reference, links in zip(cases, records, references, gold):
        if record["plain_translation"] != reference:
            continue
        exact += 1
        enclosed = element_words(record["translation"])
        for key, (first, last) in spans.items():
            targets = sorted(t for s, t in links if first <= s <= last)
            if not targets:
                continue
            judged += 1
            if enclosed.get(key) == set(range(targets[0], targets[-1] + 1)):
                right += 1
            elif len(wrong) < 3:
                wrong.append(f"{line}  ->  {record['translation']}")
    return right, judged, exact, len(sources), wrong


def random_tree(words: list[str], rng: random.Random, depth: int = 0) -> str:
    """Words wrapped in a random tree of tags, void tags, comments and entities (well-formed XML)."""
    if not words:
        return ""
    parts = []
    i = 0
    while i < len(words):
        roll = rng.random()
        if roll < 0.25 and depth < 3:
            size = rng.randint(1, max(1, len(words) - i))
            name = rng.choice(["b", "i", "span", "em", "a"])
            attributes = rng.choice(["", ' class="x"', " title='a &gt; b'", ' data-n="1&amp;2"'])
            inner = random_tree(words[i : i + size], rng, depth + 1)
            parts.append(f"<{name}{attributes}>{inner}</{name}>")
            i += size
        elif roll < 0.32:
            parts.append(rng.choice(["<br/>", '<img src="p.png"/>', "<!-- note -->", "&amp;", "&lt;x&gt;"]))
        else:
            parts.append(words[i])
            i += 1
    return " ".join(parts)


def generated_checks(model: str, sources: list[str], count: int, rng: random.Random) -> tuple[int, int, int]:
    """Returns (lines, malformed outputs, outputs whose tags differ from the input's)."""
    lines = [random_tree(sources[k % len(sources)].split(), rng) for k in range(count)]
    records = translate_json(model, lines)
    malformed = changed = 0
    for line, record in zip(lines, records):
        output = record["translation"]
        try:
            ET.fromstring(f"<r>{output}</r>")
        except ET.ParseError:
            malformed += 1
            continue
        if tag_counts(line) != tag_counts(output):
            changed += 1
    return len(lines), malformed, changed


def tag_counts(line: str) -> Counter:
    """How often each raw tag occurs in a line."""
    counts: Counter = Counter()
    position = 0
    while (start := line.find("<", position)) >= 0:
        end = line.find(">", start)
        counts[line[start : end + 1]] += 1
        position = end + 1
    return counts


def real_text(model: str, sources: list[str], rng: random.Random) -> tuple[int, int, int, int, list[str]]:
    """Returns (lines, malformed, elements, empty elements, examples)."""
    cases = [insert_elements(source.split(), rng) for source in sources]
    records = translate_json(model, [line for line, _ in cases])
    malformed = elements = empty = 0
    examples = []
    for (line, spans), record in zip(cases, records):
        try:
            ET.fromstring(f"<r>{record['translation']}</r>")
        except ET.ParseError:
            malformed += 1
            continue
        enclosed = element_words(record["translation"])
        elements += len(spans)
        empty += sum(1 for key in spans if not enclosed.get(key))
        if len(examples) < 6:
            examples.append(f"{line}\n  -> {record['translation']}")
    return len(sources), malformed, elements, empty, examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True, help="a model of the synthetic pair")
    parser.add_argument("--data", required=True, type=Path, help="its test.src, test.tgt, test.align")
    parser.add_argument("--generated", type=int, default=1000)
    parser.add_argument("--real-model")
    parser.add_argument("--real-src")
    parser.add_argument("--real-lines", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(0)
    print(f"# bench/markup_transfer.py, {date.today()}, {cpu_flags()}")
    right, judged, exact, lines, wrong = gold_accuracy(args.model, args.data, rng)
    print(f"\ngold: {right}/{judged} elements around the right words ({100 * right / max(judged, 1):.1f}%), "
          f"on the {exact}/{lines} lines translated exactly as the reference")
    for example in wrong:
        print(f"  wrong: {example}")
    sources = (args.data / "test.src").read_text(encoding="utf-8").splitlines()
    total, malformed, changed = generated_checks(args.model, sources, args.generated, rng)
    print(f"\ngenerated: {total} lines, {malformed} malformed outputs, {changed} with a tag lost or repeated")
    if args.real_model and args.real_src:
        real_sources = Path(args.real_src).read_text(encoding="utf-8").splitlines()[: args.real_lines]
        total, malformed, elements, empty, examples = real_text(args.real_model, real_sources, rng)
        print(f"\nreal ({args.real_src}): {total} lines, {malformed} malformed outputs, {elements} elements, "
              f"{empty} left around no word ({100 * empty / max(elements, 1):.1f}%)")
        for example in examples:
            print(example)


if __name__ == "__main__":
    main()
