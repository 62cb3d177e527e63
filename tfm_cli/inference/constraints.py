"""Lexical constraints: target phrases every output must contain (Post & Vilar 2018; Hu et al. 2019).

`ConstraintTracker` is their search state (search_state.SearchState): per hypothesis row it tracks
how much of each phrase the output holds, bans EOS until every phrase is in, and near the length
limit lets through only tokens that advance an unmet phrase. Its `candidates` is Hu et al.'s
vectorized dynamic beam allocation: each row's best tokens plus the next token of each unmet
phrase, grouped into banks by the number of constraint tokens met, the beam dealt out over the
banks round-robin (most-met bank first, as fairseq's LexicallyConstrainedBeamSearch). Everything is
tensor operations over all rows at once; only the phrase length loops in Python.

Phrases are unordered and independent; one that is listed twice must appear twice. A phrase counts
as met where its token ids appear contiguously in the output and the word ends with it: with the
target vocabulary's word-continuation pieces given (`word_continuation_ids`: pieces that go on a
word with a letter or digit), none may follow a completed phrase, so "Red Cross" is never produced
as "Red Crosse" (Sockeye and fairseq let a longer word that starts with the phrase's pieces hold it).
"""

from __future__ import annotations

import torch

from tfm_cli.inference.search_state import SearchState

NO_TOKEN = -1  # padding of the phrase table and of the output window: equal to no token id


def phrase_table(phrases_per_sentence: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack each sentence's phrases (token id lists) into tensors; identical phrases become one with a count.

    Returns phrases (N, C, L) int64 padded with NO_TOKEN, lengths (N, C) int64 and needed (N, C)
    int64 (how many times each phrase must appear; 0 for padding slots), C and L at least 1.
    """
    counted = []
    for phrases in phrases_per_sentence:
        needed: dict[tuple[int, ...], int] = {}
        for phrase in phrases:
            if phrase:
                needed[tuple(phrase)] = needed.get(tuple(phrase), 0) + 1
        counted.append(needed)
    n_phrases = max([len(needed) for needed in counted] + [1])
    max_length = max([len(phrase) for needed in counted for phrase in needed] + [1])
    table = torch.full((len(counted), n_phrases, max_length), NO_TOKEN, dtype=torch.long)
    lengths = torch.zeros((len(counted), n_phrases), dtype=torch.long)
    needed_counts = torch.zeros((len(counted), n_phrases), dtype=torch.long)
    for sentence, needed in enumerate(counted):
        for slot, (phrase, count) in enumerate(needed.items()):
            table[sentence, slot, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
            lengths[sentence, slot] = len(phrase)
            needed_counts[sentence, slot] = count
    return table, lengths, needed_counts


def word_continuation_ids(pieces: list[str]) -> tuple[int, ...]:
    """The ids of `pieces` (a vocabulary, by id) that continue a word with a letter or digit: no leading
    "▁" (sentencepiece's word start) and a first character that is alphanumeric ("e", "ing", "s")."""
    return tuple(i for i, piece in enumerate(pieces) if piece[:1].isalnum())


def phrases_met(tokens: list[int], phrases: list[list[int]], continuations: frozenset[int] = frozenset()) -> list[bool]:
    """For each phrase (token ids), whether `tokens` holds it; a phrase listed k times needs k
    non-overlapping occurrences, and an occurrence followed by one of `continuations` (word-continuation
    ids) does not count. Returns one bool per phrase, in order."""
    seen: dict[tuple[int, ...], int] = {}
    met = []
    for phrase in phrases:
        key = tuple(phrase)
        seen[key] = seen.get(key, 0) + 1
        met.append(bool(phrase) and count_occurrences(tokens, phrase, continuations) >= seen[key])
    return met


def count_occurrences(tokens: list[int], phrase: list[int], continuations: frozenset[int] = frozenset()) -> int:
    """How many non-overlapping times `phrase` appears contiguously in `tokens`, left to right, not
    followed by a token of `continuations`."""
    count, start, width = 0, 0, len(phrase)
    while start + width <= len(tokens):
        ends_word = start + width == len(tokens) or tokens[start + width] not in continuations
        if tokens[start : start + width] == phrase and ends_word:
            count, start = count + 1, start + width
        else:
            start += 1
    return count


class ConstraintTracker(SearchState):
    """Constraint progress of every hypothesis row of a beam search (rows sentence-major, as the decoder's).

    State per row: the last L output tokens (`window`), per phrase the completed occurrences
    (`count`, capped at `needed`), `progress`, the longest prefix of the phrase that ends the
    output (so a phrase broken off half-way and restarted is matched, and so is an overlap), and
    `counted`, whether the last token completed an occurrence that `count` took in (a word
    continuation next takes it back, as phrases_met does not count it).
    """

    def __init__(
        self, phrases_per_sentence: list[list[list[int]]], eos_id: int, continuation_ids: tuple[int, ...] = ()
    ) -> None:
        self.eos_id = eos_id
        # Tokens that may not follow a completed phrase (word_continuation_ids): a phrase ends a word.
        self.continuation_ids = torch.tensor(continuation_ids, dtype=torch.long)
        self._continuation_mask: torch.Tensor | None = None  # (V,) bool, built at the first apply
        self.sentence_phrases, self.sentence_lengths, self.sentence_needed = phrase_table(phrases_per_sentence)
        # Per sentence, the constraint tokens to produce (a bank index runs 0 .. this).
        self.sentence_totals = (self.sentence_lengths * self.sentence_needed).sum(1)  # (N,)
        self.max_total = int(self.sentence_totals.max())

    def start(self, rows_per_sentence: int) -> None:
        """Rows i*k .. i*k+k-1 for sentence i, with nothing produced yet."""
        sentences = torch.arange(self.sentence_phrases.size(0)).repeat_interleave(rows_per_sentence)
        self.phrases = self.sentence_phrases[sentences]  # (R, C, L)
        self.lengths = self.sentence_lengths[sentences]  # (R, C)
        self.needed = self.sentence_needed[sentences]  # (R, C)
        self.totals = self.sentence_totals[sentences]  # (R,)
        rows, n_phrases, max_length = self.phrases.shape
        self.window = torch.full((rows, max_length), NO_TOKEN, dtype=torch.long)
        self.count = torch.zeros((rows, n_phrases), dtype=torch.long)
        self.progress = torch.zeros((rows, n_phrases), dtype=torch.long)
        self.counted = torch.zeros((rows, n_phrases), dtype=torch.bool)

    def advanced(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What each row's state would become after each of its candidate tokens, tokens: (R, M) int64.

        Returns window (R, M, L), count (R, M, C), progress (R, M, C) and counted (R, M, C) bool.
        """
        rows, candidates = tokens.shape
        max_length = self.window.size(1)
        window = torch.cat([self.window[:, None, 1:].expand(rows, candidates, max_length - 1), tokens[..., None]], 2)
        progress = torch.zeros((rows, candidates, self.phrases.size(1)), dtype=torch.long)
        lengths = self.lengths[:, None, :]  # (R, 1, C)
        for prefix in range(1, max_length + 1):  # longer matches overwrite shorter ones
            ends = window[:, :, None, max_length - prefix :]  # (R, M, 1, p): the output's last p tokens
            starts = self.phrases[:, None, :, :prefix]  # (R, 1, C, p): each phrase's first p tokens
            matched = (ends == starts).all(-1) & (lengths >= prefix)  # (R, M, C)
            progress = torch.where(matched, prefix, progress)
        completed = (progress == lengths) & (lengths > 0)
        # A word continuation after a just completed phrase ("birdo" + "j", allowed where it advances
        # the unmet "birdoj") makes that occurrence part of a longer word: it no longer counts.
        continues = torch.isin(tokens, self.continuation_ids)[..., None]  # (R, M, 1)
        before = self.count[:, None, :] - (self.counted[:, None, :] & continues).long()  # (R, M, C)
        needed = self.needed[:, None, :]
        count = torch.minimum(before + completed.long(), needed)
        return window, count, progress, completed & (before < needed)

    def met_tokens(self, count: torch.Tensor, progress: torch.Tensor) -> torch.Tensor:
        """Constraint tokens produced (the bank): whole occurrences plus the partial one in progress.

        The output's last tokens may begin several phrases at once ("▁se" of "ses" and "sep"), but
        they go on with one of them: the longest partial match counts, once. (Summing them made a
        shared first piece worth more than finishing a phrase, and the search repeated it.)
        count, progress: (R, ..., C) -> (R, ...) int64.
        """
        lengths = self.lengths.view(self.lengths.size(0), *[1] * (count.dim() - 2), -1)
        needed = self.needed.view_as(lengths)
        partial = torch.where((count < needed) & (progress < lengths), progress, 0)
        return (count * lengths).sum(-1) + partial.max(-1).values

    def unmet_tokens(self) -> torch.Tensor:
        """(R,) int64: the constraint tokens each row has still to produce (0 = every phrase is in)."""
        return self.totals - self.met_tokens(self.count, self.progress)

    def next_tokens(self) -> torch.Tensor:
        """(R, C) int64: per unmet phrase the token that advances it (NO_TOKEN for met or padding slots)."""
        unmet = self.count < self.needed
        position = torch.where(self.progress < self.lengths, self.progress, 0)  # a completed one restarts
        tokens = self.phrases.gather(2, position[..., None])[..., 0]
        return torch.where(unmet, tokens, NO_TOKEN)

    def continuation_mask(self, vocab_size: int) -> torch.Tensor:
        """(V,) bool: True at the continuation ids; built once per tracker (a search's vocabulary is fixed)."""
        if self._continuation_mask is None or self._continuation_mask.numel() != vocab_size:
            self._continuation_mask = torch.zeros(vocab_size, dtype=torch.bool)
            self._continuation_mask[self.continuation_ids] = True
        return self._continuation_mask

    def apply(self, log_probs: torch.Tensor, step: int, row_limits: torch.Tensor, closing: torch.Tensor) -> None:
        """Mask log_probs: (R, V) in place: no EOS while a phrase is unmet; no word-continuation token
        right after a completed phrase, except one that advances an unmet phrase (where one phrase's
        pieces begin another's); a row whose unmet tokens fill every step left before its limit
        (row_limits: (R,) int64) may only advance a phrase. Rows closing at their limit now (closing:
        (R,) bool) are left to the length limit."""
        unmet = self.unmet_tokens()
        open_rows = ~closing
        ends_phrase = ((self.progress == self.lengths) & (self.lengths > 0)).any(1)  # (R,) the output ends with one
        if self.continuation_ids.numel() and bool(ends_phrase.any()):
            # ...unless the token goes on with an unmet phrase ("to" after "in" when "into" is wanted too).
            banned = self.continuation_mask(log_probs.size(1)).expand(log_probs.shape).clone()
            next_tokens = self.next_tokens()
            banned.scatter_(1, next_tokens.clamp(min=0), banned.gather(1, next_tokens.clamp(min=0)) & (next_tokens < 0))
            log_probs.masked_fill_((ends_phrase[:, None] & banned).to(log_probs.device), float("-inf"))
        ban_eos = (unmet > 0) & open_rows
        if bool(ban_eos.any()):
            log_probs[:, self.eos_id].masked_fill_(ban_eos.to(log_probs.device), float("-inf"))
        forced = (unmet > 0) & (unmet >= row_limits - step) & open_rows
        if bool(forced.any()):
            allowed = torch.zeros(log_probs.shape, dtype=torch.bool)
            next_tokens = self.next_tokens()
            allowed.scatter_(1, next_tokens.clamp(min=0), next_tokens >= 0)
            log_probs.masked_fill_((forced[:, None] & ~allowed).to(log_probs.device), float("-inf"))

    def candidates(
        self, log_probs: torch.Tensor, scores: torch.Tensor, beam: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Dynamic beam allocation: the 2 * beam candidates of each sentence, in the order the beam takes them.

        log_probs: (R, V) masked; scores: (n, width) raw scores of the rows (R = n * width). Each row
        offers its best 2 * beam tokens plus the next token of each unmet phrase. Candidates are
        ranked by score within their bank (constraint tokens met after the token), then dealt out
        round-robin over the banks, most-met bank first: the best of each bank, then the second of
        each, and so on. Returns (scores, row within the sentence, tokens), each (n, 2 * beam).
        """
        n_sentences, width = scores.shape
        best = min(2 * beam, log_probs.size(1))
        tokens = torch.cat([log_probs.topk(best, dim=1).indices.cpu(), self.next_tokens()], 1)  # (R, M)
        token_scores = log_probs.gather(1, tokens.clamp(min=0).to(log_probs.device)).cpu()
        offered = tokens.size(1)
        # A phrase token that is also among the row's best is offered once.
        earlier = torch.ones(offered, offered, dtype=torch.bool).tril(-1)  # [i, j]: j comes before i
        repeated = ((tokens[:, :, None] == tokens[:, None, :]) & earlier).any(2)
        token_scores.masked_fill_(repeated | (tokens < 0), float("-inf"))
        _, count, progress, _ = self.advanced(tokens)
        banks = self.met_tokens(count, progress).view(n_sentences, width * offered)
        candidate_scores = (scores.view(-1, 1) + token_scores).view(n_sentences, width * offered)
        by_score = candidate_scores.argsort(dim=1, descending=True, stable=True)
        sorted_banks = banks.gather(1, by_score)
        one_hot = torch.nn.functional.one_hot(sorted_banks, self.max_total + 1)  # (n, W, banks)
        rank_in_bank = (one_hot.cumsum(1) * one_hot).sum(2) - 1  # 0 for the best of its bank
        stripe = rank_in_bank * (self.max_total + 1) + (self.max_total - sorted_banks)
        stripe.masked_fill_(candidate_scores.gather(1, by_score).isinf(), torch.iinfo(torch.long).max)
        taken = by_score.gather(1, stripe.argsort(dim=1, stable=True)[:, : 2 * beam])  # (n, 2k)
        return (
            candidate_scores.gather(1, taken),
            taken // offered,
            tokens.view(n_sentences, width * offered).gather(1, taken),
        )

    def select(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Keep `rows` (R',) int64 of the state, in order, each extended by its token (R',) int64."""
        for name in ("phrases", "lengths", "needed", "totals", "window", "count", "progress", "counted"):
            setattr(self, name, getattr(self, name).index_select(0, rows))
        window, count, progress, counted = self.advanced(tokens[:, None])
        self.window, self.count, self.progress, self.counted = window[:, 0], count[:, 0], progress[:, 0], counted[:, 0]
