"""The served models as language pairs: `-m de-en=model.safetensors` parsed, and which model a request's
languages name (DeepL's EN-US / EN-GB and LibreTranslate's `auto` included).

A tfm checkpoint records no languages (its metadata holds the model config, the tokenizers and
provenance: step, recipe, or the Marian folder it was imported from), so every model is named with
its pair on the command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tfm_cli.errors import TfmError

# ISO 639-1 (two letters) or 639-3 (three): a pair is `src-tgt`, so codes carry no region of their own.
PAIR = re.compile(r"^([A-Za-z]{2,3})-([A-Za-z]{2,3})=(.+)$", re.DOTALL)

# English names for the codes people serve most; any other code is named by itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French", "hu": "Hungarian",
    "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian",
    "nb": "Norwegian", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sk": "Slovak", "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}
# DeepL lists these target languages only with their regional variants (its client refuses a bare EN or PT).
DEEPL_TARGET_VARIANTS = {"en": ("EN-GB", "EN-US"), "pt": ("PT-BR", "PT-PT")}


@dataclass(frozen=True)
class ModelSpec:
    """One `-m` value: the checkpoint's path and the language pair it translates (lower-case codes)."""

    source: str
    target: str
    path: str

    @property
    def pair(self) -> str:
        """`de-en`."""
        return f"{self.source}-{self.target}"


def parse_model_spec(value: str) -> ModelSpec:
    """A `-m` value, `de-en=path.safetensors`, as a ModelSpec; raises TfmError for a bare path or a bad pair."""
    match = PAIR.match(value)
    if match is None:
        if "=" in value:
            raise TfmError(f"-m {value}: the language pair before '=' must be two language codes, e.g. -m de-en=model.safetensors")
        raise TfmError(
            f"-m {value}: a tfm checkpoint does not record its languages; name the pair: -m de-en={value}"
        )
    return ModelSpec(match.group(1).lower(), match.group(2).lower(), match.group(3))


def check_distinct_pairs(specs: list[ModelSpec]) -> None:
    """Raise TfmError when two `-m` values name the same language pair (a request could not choose)."""
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.pair in seen:
            raise TfmError(f"-m: two models serve {spec.pair} ({seen[spec.pair]} and {spec.path}); serve one per pair")
        seen[spec.pair] = spec.path


def base_code(code: str) -> str:
    """A request's language code as a model's: lower case, region dropped (`EN-US` -> `en`, `zh-Hans` -> `zh`)."""
    return code.strip().lower().replace("_", "-").split("-")[0]


def language_name(code: str) -> str:
    """The English name of a language code, else the code itself."""
    return LANGUAGE_NAMES.get(code, code)


class LanguageError(Exception):
    """A request names languages no served model translates; the message names the field."""


def choose_model(models: list[Any], source: str | None, target: str | None, source_field: str, target_field: str) -> Any:
    """The served model (anything with `.source` and `.target`) for the request's codes.

    `source` None (or `auto`) picks the one model into `target`; `target` None the one model served.
    Raises LanguageError naming `source_field` or `target_field`.
    """
    if target is None:
        if len(models) == 1:
            return models[0]
        raise LanguageError(f"{target_field} is required: several models are served")
    wanted = base_code(target)
    into = [model for model in models if model.target == wanted]
    if not into:
        served = ", ".join(sorted({model.target for model in models}))
        raise LanguageError(f"{target_field}: no model translates into {target!r} (served: {served})")
    if source is None or source.strip().lower() == "auto":
        if len(into) == 1:
            return into[0]
        sources = ", ".join(sorted(model.source for model in into))
        raise LanguageError(f"{source_field} is required: several models translate into {wanted} (from {sources})")
    chosen = [model for model in into if model.source == base_code(source)]
    if not chosen:
        pairs = ", ".join(sorted(f"{model.source}-{model.target}" for model in models))
        raise LanguageError(f"{source_field}: no model translates from {source!r} into {target!r} (served pairs: {pairs})")
    return chosen[0]
