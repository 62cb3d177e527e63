"""A synthetic language pair with gold word alignments: the quickstart's data and a test fixture.

Source ("English-like"): subject-verb-object, determiner, number and adjectives before the noun.
Target ("Verbish"): its own lexicon, verb-final, adjectives after the noun, number after the noun,
plural marked by a suffix. Every source word has exactly one target word, so the gold alignment
is a permutation and attention alignments can be checked word by word.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

NOUNS = {
    "dog": "hundo", "cat": "kato", "bird": "birdo", "horse": "ĉevalo", "child": "infano", "woman": "virino",
    "man": "viro", "teacher": "instruisto", "farmer": "farmisto", "doctor": "kuracisto", "fish": "fiŝo",
    "apple": "pomo", "book": "libro", "house": "domo", "car": "aŭto", "boat": "boato", "tree": "arbo",
    "flower": "floro", "ball": "pilko", "letter": "letero", "song": "kanto", "river": "rivero",
    "cake": "kuko", "chair": "seĝo", "window": "fenestro", "lamp": "lampo", "key": "ŝlosilo", "bag": "sako",
}
PLURAL_SOURCE = {"child": "children", "woman": "women", "man": "men", "fish": "fish"}
ADJECTIVES = {
    "big": "granda", "small": "malgranda", "red": "ruĝa", "blue": "blua", "green": "verda", "old": "maljuna",
    "young": "juna", "happy": "feliĉa", "sad": "malĝoja", "fast": "rapida", "slow": "malrapida",
    "quiet": "kvieta", "loud": "laŭta", "bright": "hela", "dark": "malhela", "tall": "alta", "short": "mallonga",
    "clever": "saĝa", "hungry": "malsata", "beautiful": "bela",
}
VERBS = {
    "sees": "vidas", "likes": "ŝatas", "finds": "trovas", "carries": "portas", "paints": "pentras",
    "follows": "sekvas", "buys": "aĉetas", "sells": "vendas", "draws": "desegnas", "holds": "tenas",
    "watches": "rigardas", "cleans": "purigas", "opens": "malfermas", "brings": "alportas", "hears": "aŭdas",
    "knows": "konas", "wants": "volas", "loves": "amas",
}
DETERMINERS = {"the": "la", "this": "ĉi", "that": "tiu", "my": "mia", "your": "via"}
NUMBERS = {"two": "du", "three": "tri", "four": "kvar", "five": "kvin", "six": "ses", "seven": "sep"}


@dataclass(frozen=True)
class SentencePair:
    """One source sentence, its translation, and the gold word alignment (src_index, tgt_index)."""

    source: str
    target: str
    alignment: tuple[tuple[int, int], ...]

    def pharaoh(self) -> str:
        """The gold alignment as "src-tgt" pairs, sorted by target position."""
        return " ".join(f"{s}-{t}" for s, t in sorted(self.alignment, key=lambda pair: pair[1]))


def noun_phrase(rng: random.Random) -> tuple[list[str], list[str], list[int]]:
    """A random noun phrase: (source words, target words, target position of each source word)."""
    determiner = rng.choice(list(DETERMINERS))
    number = rng.choice(list(NUMBERS)) if rng.random() < 0.3 else None
    adjectives = rng.sample(list(ADJECTIVES), rng.choice([0, 0, 1, 1, 2]))
    noun = rng.choice(list(NOUNS))
    source = [determiner] + ([number] if number else []) + adjectives
    source.append(PLURAL_SOURCE.get(noun, noun + "s") if number else noun)
    # Target order: determiner noun adjectives(in source order) number.
    target = [DETERMINERS[determiner], NOUNS[noun] + ("j" if number else "")]
    target += [ADJECTIVES[a] + ("j" if number else "") for a in adjectives]
    target += [NUMBERS[number]] if number else []
    # Target index of each source word (same order as `source`).
    positions = [0]
    if number:
        positions.append(len(target) - 1)
    positions += [2 + i for i in range(len(adjectives))]
    positions.append(1)
    return source, target, positions


def sentence_pair(rng: random.Random) -> SentencePair:
    """One random subject-verb-object sentence and its verb-final translation."""
    subject_src, subject_tgt, subject_pos = noun_phrase(rng)
    object_src, object_tgt, object_pos = noun_phrase(rng)
    verb = rng.choice(list(VERBS))
    source = subject_src + [verb] + object_src
    target = subject_tgt + object_tgt + [VERBS[verb]]
    alignment = [(i, p) for i, p in enumerate(subject_pos)]
    alignment.append((len(subject_src), len(target) - 1))
    offset_src, offset_tgt = len(subject_src) + 1, len(subject_tgt)
    alignment += [(offset_src + i, offset_tgt + p) for i, p in enumerate(object_pos)]
    return SentencePair(" ".join(source), " ".join(target), tuple(alignment))


def generate_pairs(count: int, seed: int) -> list[SentencePair]:
    """`count` distinct random sentence pairs from a seeded generator."""
    rng = random.Random(seed)
    pairs: dict[str, SentencePair] = {}
    while len(pairs) < count:
        pair = sentence_pair(rng)
        pairs.setdefault(pair.source, pair)
    return list(pairs.values())


def write_corpus(folder: Path, train_size: int, valid_size: int, test_size: int, seed: int) -> dict[str, Path]:
    """Write train/valid/test .src/.tgt files, and each split's gold word alignment .align (Pharaoh), with
    no sentence shared. train.align is what guided-alignment training reads (data.train_alignment).

    Returns the written paths by name, e.g. {"train.src": Path(...), "test.align": Path(...)}.
    """
    folder.mkdir(parents=True, exist_ok=True)
    pairs = generate_pairs(train_size + valid_size + test_size, seed)
    splits = {
        "train": pairs[:train_size],
        "valid": pairs[train_size : train_size + valid_size],
        "test": pairs[train_size + valid_size :],
    }
    written = {}
    for split, split_pairs in splits.items():
        for side in ("src", "tgt"):
            path = folder / f"{split}.{side}"
            path.write_text("".join(getattr(p, "source" if side == "src" else "target") + "\n" for p in split_pairs), encoding="utf-8")
            written[f"{split}.{side}"] = path
        align = folder / f"{split}.align"
        align.write_text("".join(p.pharaoh() + "\n" for p in split_pairs), encoding="utf-8")
        written[f"{split}.align"] = align
    return written
