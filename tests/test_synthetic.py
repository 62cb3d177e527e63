"""The synthetic language pair: gold alignments are permutations that really link translated words."""

from __future__ import annotations

from tfm_cli.synthetic import (
    ADJECTIVES, DETERMINERS, NOUNS, NUMBERS, PLURAL_SOURCE, VERBS, generate_pairs, write_corpus,
)

LEXICON = {**ADJECTIVES, **DETERMINERS, **NOUNS, **NUMBERS, **VERBS}


def source_lemma(word: str) -> str:
    """The lexicon entry of a source word (plural nouns mapped back to their singular)."""
    irregular = {plural: singular for singular, plural in PLURAL_SOURCE.items()}
    if word in LEXICON:
        return word
    return irregular.get(word, word[:-1])


def target_lemma(word: str) -> str:
    """The source lexicon entry a target word translates (plural suffix -j removed)."""
    reverse = {target: source for source, target in LEXICON.items()}
    return reverse[word] if word in reverse else reverse[word[:-1]]


def test_alignment_is_a_permutation_linking_lexicon_entries():
    for pair in generate_pairs(300, seed=3):
        source, target = pair.source.split(), pair.target.split()
        assert len(source) == len(target) == len(pair.alignment)
        assert sorted(t for _, t in pair.alignment) == list(range(len(target)))
        assert sorted(s for s, _ in pair.alignment) == list(range(len(source)))
        for s, t in pair.alignment:
            assert source_lemma(source[s]) == target_lemma(target[t]), (pair, s, t)


def test_target_is_verb_final_with_adjectives_after_the_noun():
    pair = next(p for p in generate_pairs(200, seed=1) if any(w in ADJECTIVES for w in p.source.split()))
    target = pair.target.split()
    assert target[-1] in VERBS.values()
    source = pair.source.split()
    adjective_index = next(i for i, w in enumerate(source) if w in ADJECTIVES)
    noun_target = dict(pair.alignment)
    # The adjective's translation comes after its noun's translation.
    noun_index = next(i for i in range(adjective_index, len(source)) if source[i] not in ADJECTIVES)
    assert noun_target[adjective_index] > noun_target[noun_index]


def test_corpus_splits_are_disjoint_and_seeded(tmp_path):
    paths = write_corpus(tmp_path / "a", 200, 20, 30, seed=7)
    again = write_corpus(tmp_path / "b", 200, 20, 30, seed=7)
    assert paths["train.src"].read_text() == again["train.src"].read_text()
    splits = {name: set(paths[f"{name}.src"].read_text().splitlines()) for name in ("train", "valid", "test")}
    assert len(splits["train"]) == 200 and len(splits["test"]) == 30
    assert not splits["train"] & splits["test"] and not splits["valid"] & splits["test"]
    assert len(paths["test.align"].read_text().splitlines()) == 30
