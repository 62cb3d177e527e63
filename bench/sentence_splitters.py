"""Sentence splitters for `tfm translate --split-sentences`: pysbd against sentencex, side by side.

For each splitter and language it measures
  exact %     Multi30k paragraphs: 3 consecutive test_2016_flickr lines joined with a space, the share
              whose split gives back exactly the 3 original lines (all triples, and only the triples
              whose 3 lines end in sentence punctuation, the ones a splitter can recover at all);
  hard        hand-written hard cases passed (abbreviations, ordinals, decimals, ellipses, quotes after
              the period, "?!", lowercase after a period); French has hard cases only (no Multi30k text);
  sent/s      sentences per second: 3,000 train lines as 1,000 three-sentence paragraphs, best of 3.
The raw splitters are compared (stripped pieces), and tfm's wrapper around the chosen one.
Prints a markdown table, the CPU and the date; it is quick (seconds) but shares the CPU with whatever runs.

Usage: pip install pysbd sentencex && python bench/sentence_splitters.py [--data /work/shared/data/multi30k]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from prepare_corpus import cpu_flags

Splitter = Callable[[str], list[str]]
SENTENCE_END = (".", "!", "?", '"', "“", "”", "»", "«", ")")

# (paragraph, the sentences a careful reader splits it into)
HARD_CASES: dict[str, list[tuple[str, list[str]]]] = {
    "en": [
        ("Dr. Smith arrived. He was late.", ["Dr. Smith arrived.", "He was late."]),
        ("The U.S. economy grew. Prices rose.", ["The U.S. economy grew.", "Prices rose."]),
        ("She lives in the U.S. She likes it.", ["She lives in the U.S.", "She likes it."]),
        ("It costs 3.5 dollars. That is cheap.", ["It costs 3.5 dollars.", "That is cheap."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("What?! No way. Fine!", ["What?!", "No way.", "Fine!"]),
        ("He paused... and then he spoke. Everyone listened.", ["He paused... and then he spoke.", "Everyone listened."]),
        ("I saw e.g. apples there. Then pears.", ["I saw e.g. apples there.", "Then pears."]),
        ("They live at No. 5 Main St. in London. They like it.", ["They live at No. 5 Main St. in London.", "They like it."]),
        ("We left at 5 p.m. and walked home. We were tired.", ["We left at 5 p.m. and walked home.", "We were tired."]),
        ("Visit example.com today. It is free.", ["Visit example.com today.", "It is free."]),
        ("Mr. and Mrs. Jones came. They sat down.", ["Mr. and Mrs. Jones came.", "They sat down."]),
        ("J. R. R. Tolkien wrote it. It sold well.", ["J. R. R. Tolkien wrote it.", "It sold well."]),
        ("See Fig. 3 for details. It helps.", ["See Fig. 3 for details.", "It helps."]),
        ("The cat sat. (It was tired.) Then it slept.", ["The cat sat.", "(It was tired.)", "Then it slept."]),
    ],
    "de": [
        ("Das ist z. B. ein Test. Er geht.", ["Das ist z. B. ein Test.", "Er geht."]),
        ("Er wohnt in Haus Nr. 5 in Berlin. Es ist groß.", ["Er wohnt in Haus Nr. 5 in Berlin.", "Es ist groß."]),
        ("Am 3. Oktober ist Feiertag. Wir feiern.", ["Am 3. Oktober ist Feiertag.", "Wir feiern."]),
        ("Version 2.5 ist neu. Sie ist gut.", ["Version 2.5 ist neu.", "Sie ist gut."]),
        ("Er sagte: „Komm.“ Dann ging er.", ["Er sagte: „Komm.“", "Dann ging er."]),
        ("Was?! Nein. Doch!", ["Was?!", "Nein.", "Doch!"]),
        ("Äpfel, Birnen usw. sind Obst. Wir essen sie.", ["Äpfel, Birnen usw. sind Obst.", "Wir essen sie."]),
        ("Prof. Dr. Schmidt lehrt in den USA. Er ist bekannt.", ["Prof. Dr. Schmidt lehrt in den USA.", "Er ist bekannt."]),
        ("Er wartete... und dann ging er. Alle sahen zu.", ["Er wartete... und dann ging er.", "Alle sahen zu."]),
        ("Das ist ca. 5 km weit. Wir laufen.", ["Das ist ca. 5 km weit.", "Wir laufen."]),
        ("Sie kam vom 1. bis 3. Mai. Dann fuhr sie.", ["Sie kam vom 1. bis 3. Mai.", "Dann fuhr sie."]),
        ("Ein Mann, d. h. ein Vater, lacht. Das Kind auch.", ["Ein Mann, d. h. ein Vater, lacht.", "Das Kind auch."]),
        ("Siehe S. 5 und Abb. 3. Das hilft.", ["Siehe S. 5 und Abb. 3.", "Das hilft."]),
        ("Hr. Meier kommt. Fr. Müller auch.", ["Hr. Meier kommt.", "Fr. Müller auch."]),
        ("Er wohnt in der Hauptstr. 5 in Köln. Es ist schön.", ["Er wohnt in der Hauptstr. 5 in Köln.", "Es ist schön."]),
        ("Es war der 2. Weltkrieg. Viele starben.", ["Es war der 2. Weltkrieg.", "Viele starben."]),
        ("Das kostet 5 Euro. 3 Leute zahlen.", ["Das kostet 5 Euro.", "3 Leute zahlen."]),
        ("Das geschah im 19. Jh. in Paris. Es war kalt.", ["Das geschah im 19. Jh. in Paris.", "Es war kalt."]),
    ],
    "fr": [
        ("M. Dupont est arrivé. Il était en retard.", ["M. Dupont est arrivé.", "Il était en retard."]),
        ("Il aime les fruits, p. ex. les pommes. Moi aussi.", ["Il aime les fruits, p. ex. les pommes.", "Moi aussi."]),
        ("Il a dit « Bonjour. » Puis il est parti.", ["Il a dit « Bonjour. »", "Puis il est parti."]),
        ("Quoi ?! Non. Si !", ["Quoi ?!", "Non.", "Si !"]),
        ("Il attendait... puis il est parti. Tout le monde regardait.", ["Il attendait... puis il est parti.", "Tout le monde regardait."]),
        ("Cela coûte 3.5 euros. C'est cher.", ["Cela coûte 3.5 euros.", "C'est cher."]),
        ("Voir p. 5 pour les détails. Merci.", ["Voir p. 5 pour les détails.", "Merci."]),
        ("Elle a demandé : « Pourquoi ? » Il n’a pas répondu.", ["Elle a demandé : « Pourquoi ? »", "Il n’a pas répondu."]),
        ("C’est le XIXe s. en France. Il fait froid.", ["C’est le XIXe s. en France.", "Il fait froid."]),
    ],
}


def pysbd_splitter(language: str) -> Splitter:
    """pysbd's rule-based Segmenter for `language` (clean=False: the text is not rewritten): text -> pieces."""
    import pysbd

    segmenter = pysbd.Segmenter(language=language, clean=False)
    return segmenter.segment


def sentencex_splitter(language: str) -> Splitter:
    """sentencex's segment for `language`: text -> pieces."""
    import sentencex

    return lambda text: list(sentencex.segment(language, text))


def tfm_splitter(language: str) -> Splitter:
    """tfm's SentenceSplitter (sentencex, plus the mask that lets it cut before a sentence starting with a
    number): text -> pieces."""
    from tfm_cli.inference.sentence_splitting import SentenceSplitter

    splitter = SentenceSplitter(language)
    return lambda text: [text[start:end] for start, end in splitter.spans(text)]


SPLITTERS = {"pysbd": pysbd_splitter, "sentencex": sentencex_splitter, "tfm (sentencex + number mask)": tfm_splitter}


def split(splitter: Splitter, text: str) -> list[str]:
    """The non-empty pieces of `text` as `splitter` cuts it, stripped of surrounding whitespace."""
    return [piece.strip() for piece in splitter(text) if piece.strip()]


def read_lines(path: Path, count: int | None = None) -> list[str]:
    """The first `count` (all if None) lines of `path`, stripped."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return lines[:count] if count is not None else lines


def triples(lines: list[str]) -> list[list[str]]:
    """Non-overlapping groups of 3 consecutive lines (a trailing group of fewer is dropped)."""
    return [lines[i : i + 3] for i in range(0, len(lines) - 2, 3)]


def recovery(splitter: Splitter, groups: list[list[str]]) -> float:
    """Percent of `groups` that `splitter` splits back into exactly their lines when joined with a space."""
    if not groups:
        return float("nan")
    return 100 * sum(split(splitter, " ".join(group)) == group for group in groups) / len(groups)


def sentences_per_second(splitter: Splitter, groups: list[list[str]], repeats: int = 3) -> float:
    """Input sentences per second splitting `groups` joined as paragraphs, best of `repeats`."""
    paragraphs = [" ".join(group) for group in groups]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for paragraph in paragraphs:
            splitter(paragraph)
        best = min(best, time.perf_counter() - start)
    return sum(map(len, groups)) / best


def cpu_model() -> str:
    """The CPU's "Model name" line of lscpu, or a note that lscpu is missing."""
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "lscpu unavailable"
    return next((line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("Model name:")), "?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/multi30k"))
    args = parser.parse_args()
    print(f"{datetime.date.today()}; {cpu_model()}; {cpu_flags()}")
    print(f"pysbd {version('pysbd')}, sentencex {version('sentencex')}")
    for language in ("de", "en"):
        lines = read_lines(args.data / f"test_2016_flickr.{language}")
        ended = sum(line.endswith(SENTENCE_END) for line in lines)
        print(f"test_2016_flickr.{language}: {ended} of {len(lines)} lines end in sentence punctuation")
    print()
    print("| splitter | language | exact % (all triples) | exact % (punctuated triples) | hard cases passed | sent/s |")
    print("|---|---|---|---|---|---|")
    failures = []
    for name, make in SPLITTERS.items():
        for language in ("en", "de", "fr"):
            splitter = make(language)
            test_path = args.data / f"test_2016_flickr.{language}"
            groups = triples(read_lines(test_path)) if test_path.exists() else []
            punctuated = [group for group in groups if all(line.endswith(SENTENCE_END) for line in group)]
            cases = HARD_CASES[language]
            passed = 0
            for text, expected in cases:
                got = split(splitter, text)
                passed += got == expected
                if got != expected:
                    failures.append(f"{name} {language}: {text!r} -> {got}")
            train_path = args.data / f"train.{language}"
            speed = sentences_per_second(splitter, triples(read_lines(train_path, 3000))) if train_path.exists() else None
            exact = f"{recovery(splitter, groups):.1f} ({len(groups)})" if groups else "-"
            exact_punct = f"{recovery(splitter, punctuated):.1f} ({len(punctuated)})" if groups else "-"
            shown_speed = f"{speed:,.0f}" if speed else "-"
            print(f"| {name} | {language} | {exact} | {exact_punct} | {passed}/{len(cases)} | {shown_speed} |")
    print("\nHard cases failed:")
    print("\n".join(f"  {failure}" for failure in failures) or "  none")


if __name__ == "__main__":
    main()
