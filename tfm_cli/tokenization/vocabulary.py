"""Tokenizers whose ids come from a vocabulary table, not from the sentencepiece model; `>>xx<<` language tags.

Marian models (OPUS-MT) split text with a sentencepiece model per side but number the pieces with
a separate table (vocab.json) shared by both sides, so the ids are not the sentencepiece model's own.
`MappedTokenizer` has the interface of tokenizer.Tokenizer, so every command runs either kind.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from tfm_cli.errors import TfmError
from tfm_cli.tokenization.tokenizer import load_sentencepiece

if TYPE_CHECKING:
    from tfm_cli.tokenization.tokenizer import Tokenizer

# Marian's language tags: a source starting with `>>fr<<` asks a multilingual model for French.
LANGUAGE_TAG = re.compile(r">>(.+)<<")
SPACE_MARK = "\u2581"  # sentencepiece's visible space, '▁'


class MappedTokenizer:
    """A sentencepiece model whose pieces map to ids through `pieces` (id -> piece string).

    Encoding follows Hugging Face's MarianTokenizer: a text starting with a `>>xx<<` tag keeps the tag
    as one token, the rest goes through sentencepiece, and a piece missing from the table is `unk_id`.
    Decoding drops `control_ids` (padding, EOS) and detokenizes the rest with the sentencepiece model.
    """

    def __init__(
        self, model_bytes: bytes, pieces: tuple[str, ...], unk_id: int, control_ids: frozenset[int], origin: str = "<bytes>"
    ) -> None:
        self.model_bytes = model_bytes
        self.processor = load_sentencepiece(model_bytes, origin)
        if not 0 <= unk_id < len(pieces):
            raise TfmError(f"{origin}: the unknown-word id {unk_id} is outside the vocabulary ({len(pieces)} pieces)")
        self.pieces = pieces
        self.unk_id = unk_id
        self.control_ids = control_ids
        self.ids = {piece: index for index, piece in enumerate(pieces)}

    @property
    def vocabulary(self) -> tuple[str, ...]:
        """The piece of every id, in id order (what a checkpoint stores beside the sentencepiece bytes)."""
        return self.pieces

    @property
    def vocab_size(self) -> int:
        """The number of ids, special ones included."""
        return len(self.pieces)

    def encode_pieces(self, text: str) -> list[str]:
        """Raw text -> pieces; a leading `>>xx<<` tag stays one piece (as MarianTokenizer splits it)."""
        tag = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            tag, text = [text[: end + 2]], text[end + 2 :]
        return tag + self.processor.encode(text, out_type=str)

    def encode_ids(self, text: str) -> list[int]:
        """Raw text -> ids (no EOS added); pieces missing from the table become unk_id."""
        return [self.piece_to_id(piece) for piece in self.encode_pieces(text)]

    def encode_ids_batch(self, texts: list[str]) -> list[list[int]]:
        """Many raw texts -> ids each."""
        return [self.encode_ids(text) for text in texts]

    def decode_ids(self, ids: list[int]) -> str:
        """Ids -> detokenized text (control ids dropped)."""
        return self.decode_pieces([self.pieces[i] for i in ids if i not in self.control_ids])

    def decode_pieces(self, pieces: list[str]) -> str:
        """Pieces -> detokenized text, as MarianTokenizer makes it: sentencepiece's decoding, then every
        '▁' left (sentencepiece keeps pieces it does not know verbatim) a space, ends stripped."""
        return self.processor.decode_pieces(pieces).replace(SPACE_MARK, " ").strip()

    def id_to_piece(self, piece_id: int) -> str:
        """The piece string of one id."""
        return self.pieces[piece_id]

    def piece_to_id(self, piece: str) -> int:
        """The id of one piece (unk_id if the table lacks it)."""
        return self.ids.get(piece, self.unk_id)


def encode_vocabulary(pieces: tuple[str, ...]) -> bytes:
    """The piece table as UTF-8 JSON (a list of strings in id order), as a checkpoint stores it."""
    return json.dumps(list(pieces), ensure_ascii=False).encode("utf-8")


def decode_vocabulary(data: bytes, origin: str) -> tuple[str, ...]:
    """The piece table stored by encode_vocabulary. Raises TfmError naming `origin` if it is damaged."""
    try:
        pieces = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        pieces = None
    if not isinstance(pieces, list) or not all(isinstance(piece, str) for piece in pieces):
        raise TfmError(f"{origin}: damaged vocabulary (not a JSON list of pieces)")
    if len(set(pieces)) != len(pieces):
        raise TfmError(f"{origin}: damaged vocabulary (a piece appears twice)")
    return tuple(pieces)


def language_tags(tokenizer: Tokenizer | MappedTokenizer) -> dict[str, int]:
    """The `>>xx<<` tags of a (source) tokenizer's vocabulary: language code xx -> the tag's id."""
    pieces = (tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size))
    return {match.group(1): index for index, piece in enumerate(pieces) if (match := LANGUAGE_TAG.fullmatch(piece))}


def language_tag_id(tokenizer: Tokenizer | MappedTokenizer, language: str) -> int:
    """The id of the tag `>>language<<` in the source vocabulary. Raises TfmError listing the model's tags."""
    tags = language_tags(tokenizer)
    if language in tags:
        return tags[language]
    if not tags:
        raise TfmError(f"--target-lang {language}: this model has no >>xx<< language tags (it has one target language)")
    raise TfmError(f"--target-lang {language}: the model has no tag >>{language}<<; its tags: {', '.join(sorted(tags))}")
