"""The HTTP routes of `tfm serve` (Starlette): DeepL API v2, LibreTranslate, tfm's own `/tfm/translate`, `/health`,
and the web page at `/` (page.py).

Each route reads its fields (requests.py), maps them onto the library's options (DeepL's tag_handling
and LibreTranslate's format=html -> markup, split_sentences -> the sentence splitter, glossary_id -> a
Glossary's constraints) and queues the lines on the model's engine (engine.py). Errors are one JSON
object in each API's own shape: DeepL's {"message": ...}, LibreTranslate's and tfm's {"error": ...}.
"""

from __future__ import annotations

import asyncio
import re
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tfm_cli.errors import ModelFileError, TfmError
from tfm_cli.inference.markup import parse_markup
from tfm_cli.inference.outputs import TranslatedLine
from tfm_cli.inference.translation import json_record
from tfm_cli.serving.engine import Answer, Engine, QueueFull, RequestSettings
from tfm_cli.serving.glossaries import GlossaryStore, as_glossary, entries_tsv, parse_entries
from tfm_cli.serving.models import DEEPL_TARGET_VARIANTS, LanguageError, ModelSpec, choose_model, language_name
from tfm_cli.serving.page import page_route
from tfm_cli.serving.requests import (
    ClientError,
    Fields,
    Limits,
    count_field,
    field_key,
    flag_field,
    header_key,
    key_is_valid,
    optional_string,
    parse_fields,
    read_body,
    required_string,
    texts_field,
)

DEEPL, LIBRETRANSLATE, TFM = "deepl", "libretranslate", "tfm"
# What /v2/usage reports as the limit: DeepL's figure for an account without one.
UNLIMITED_CHARACTERS = 1_000_000_000_000
LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
ANY_LINE_BREAK = re.compile(r"[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
SPLIT_SENTENCES = ("0", "1", "nonewlines")
MAX_LOGGED_PATH = 200


@dataclass
class ServedModel:
    """A loaded model, its language pair and its engine."""

    spec: ModelSpec
    engine: Engine

    @property
    def source(self) -> str:
        return self.spec.source

    @property
    def target(self) -> str:
        return self.spec.target


@dataclass
class Service:
    """Everything the routes share: the models, the glossaries, the keys (None: no key needed), the limits."""

    models: list[ServedModel]
    glossaries: GlossaryStore
    keys: frozenset[str] | None = None
    limits: Limits = field(default_factory=Limits)
    log: Callable[[str], None] = lambda line: None
    characters: int = 0  # characters translated since the start (/v2/usage)
    # Whether the server is shutting down (the command sets it to ask uvicorn): answers then say
    # `Connection: close`, so a keep-alive client opens a new connection (refused) instead of sending
    # its next request on one the server is about to close (RFC 9112 section 9.6).
    stopping: Callable[[], bool] = lambda: False
    # Set when a model's checkpoint changed on disk or became unreadable under the server: from then on
    # /health answers 503, so a supervisor restarts the server on the new file.
    model_file_failed: bool = False

    def model(self, source: str | None, target: str | None, source_field: str, target_field: str) -> ServedModel:
        try:
            return choose_model(self.models, source, target, source_field, target_field)
        except LanguageError as error:
            raise ClientError(400, str(error)) from None

    async def translate(self, model: ServedModel, settings: RequestSettings, lines: list[str]) -> Answer:
        """The lines translated by the model's engine, with `settings` (a full queue raises QueueFull)."""
        return await asyncio.wrap_future(model.engine.submit(settings, lines))

    def checked_glossary(self, glossary_id: str | None, model: ServedModel) -> str | None:
        """`glossary_id` when it names a stored glossary of the model's pair; ClientError otherwise."""
        if glossary_id is None:
            return None
        info = self.glossaries.info(glossary_id)
        if info is None:
            raise ClientError(404, f"glossary_id: no glossary {glossary_id!r}")
        if (info.source_lang, info.target_lang) != (model.source, model.target):
            raise ClientError(
                400, f"glossary_id: glossary {glossary_id!r} is for {info.source_lang}-{info.target_lang}, "
                f"the request for {model.source}-{model.target}"
            )
        return glossary_id


def error_response(api: str, status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """One JSON error in the API's shape."""
    return JSONResponse({"message" if api == DEEPL else "error": message}, status_code=status, headers=headers)


def endpoint(
    service: Service, api: str, handler: Callable[[Request, Fields], Awaitable[Response]], body_limit: int | None = None,
) -> Callable:
    """A route: the body within its limit (`body_limit` bytes, else the service's), the key checked, the
    fields parsed, every error one JSON answer.

    With keys configured, a wrong key in the Authorization header is refused before the body is read; a
    request without that header must carry a valid `auth_key` / `api_key` field (a body that cannot be
    read then counts as one without a key). A client's error never shows a traceback; a server's is logged.
    """

    async def run(request: Request) -> Response:
        try:
            in_header = header_key(request.headers)
            if service.keys is not None and in_header is not None and not key_is_valid(in_header, service.keys):
                raise ClientError(403, "wrong API key")
            body = await read_body(request, body_limit or service.limits.max_body_bytes)
            try:
                fields = await parse_fields(request, body)
            except ClientError:
                if service.keys is not None and in_header is None:
                    raise ClientError(403, "an API key is required") from None
                raise
            if service.keys is not None and in_header is None:
                given = field_key(fields)
                if not key_is_valid(given, service.keys):
                    raise ClientError(403, "an API key is required" if given is None else "wrong API key")
            return await handler(request, fields)
        except ClientError as error:
            return error_response(api, error.status, error.message)
        except QueueFull:
            # DeepL's clients know 429 (and retry it with backoff); the others get 503.
            status = 429 if api == DEEPL else 503
            message = "Too many requests: the translation queue is full; retry later"
            return error_response(api, status, message, {"Retry-After": "1"})
        except ModelFileError as error:  # the server's checkpoint, not the request
            service.model_file_failed = True
            service.log(f"error: {error}")
            message = "the server's model file changed on disk or became unreadable since it was loaded; the server must be restarted"
            return error_response(api, 503, message)
        except TfmError as error:  # settings the library refuses for this request
            return error_response(api, 400, str(error))
        except Exception:
            service.log(f"error: {request.method} {loggable(request.url.path)} failed:\n{traceback.format_exc().rstrip()}")
            return error_response(api, 500, "internal server error (the server's log has the details)")

    return run


def text_lines(text: str, split_lines: bool) -> list[tuple[str, str]]:
    """A request's text as the lines the Translator reads, each with the line break that followed it.

    split_lines: cut at every line break (kept, to put back); otherwise line breaks become spaces
    (same length, so character offsets hold) and the text is one line.
    """
    if not split_lines:
        return [(ANY_LINE_BREAK.sub(" ", text), "")]
    parts = LINE_BREAK.split(text)
    return list(zip(parts[0::2], [*parts[1::2], ""]))


def check_markup(lines: list[str], markup: str | None, name: str, owners: list[int]) -> None:
    """400 naming the text whose tags do not nest (the CLI warns and goes on; a client gets told)."""
    if markup is None:
        return
    for line, owner in zip(lines, owners):
        if not parse_markup(line, markup).well_formed:
            raise ClientError(400, f"{name}[{owner}]: its {markup} tags do not nest properly")


def hypothesis_text(line: TranslatedLine, k: int = 0) -> str:
    """The text of a line's k-th hypothesis, tags put back ("" for a blank line or a missing hypothesis):
    the column `tfm translate` prints for it."""
    return line.outputs[k].text if k < len(line.outputs) else ""


async def translated_texts(
    service: Service, model: ServedModel, settings: RequestSettings, texts: list[str], split_lines: bool, name: str,
) -> list[list[str]]:
    """Each text translated line by line and put back together with its line breaks: per text, its best
    translation then each further hypothesis (settings.nbest in all)."""
    pieces = [text_lines(text, split_lines) for text in texts]
    lines = [line for piece in pieces for line, _ in piece]
    if len(lines) > service.limits.max_lines:
        raise ClientError(400, f"{name} holds {len(lines)} lines, over the limit of {service.limits.max_lines} per request")
    check_markup(lines, settings.markup, name, [i for i, piece in enumerate(pieces) for _ in piece])
    answer = await service.translate(model, settings, lines)
    outputs = iter(answer.lines)
    results = []
    for piece in pieces:
        translated = [next(outputs) for _ in piece]
        results.append([
            "".join(hypothesis_text(line, k) + brk for line, (_, brk) in zip(translated, piece))
            for k in range(settings.nbest)
        ])
    service.characters += sum(len(text) for text in texts)
    return results


# DeepL API v2.

async def deepl_translate(service: Service, request: Request, fields: Fields) -> Response:
    """POST /v2/translate."""
    texts, _ = texts_field(fields, "text", service.limits)
    target = required_string(fields, "target_lang")
    source = optional_string(fields, "source_lang")
    model = service.model(source, target, "source_lang", "target_lang")
    tag_handling = optional_string(fields, "tag_handling")
    if tag_handling not in (None, "html", "xml"):
        raise ClientError(400, f"tag_handling must be html or xml, got {tag_handling!r}")
    split = fields.get("split_sentences")
    if split is None or split == "":
        split = "nonewlines" if tag_handling == "html" else "1"  # DeepL's defaults
    split = str(int(split)) if isinstance(split, int) and not isinstance(split, bool) else split
    if split not in SPLIT_SENTENCES:
        raise ClientError(400, f"split_sentences must be 0, 1 or nonewlines, got {split!r}")
    flag_field(fields, "preserve_formatting")  # tfm never corrects formatting: accepted, checked, nothing to do
    glossary_id = optional_string(fields, "glossary_id")
    if glossary_id is not None and source is None:
        raise ClientError(400, "source_lang is required with glossary_id")
    settings = RequestSettings(markup=tag_handling, split_sentences=split != "0",
                               glossary_id=service.checked_glossary(glossary_id, model))
    results = await translated_texts(service, model, settings, texts, split == "1", "text")
    return JSONResponse({"translations": [
        {"detected_source_language": model.source.upper(), "text": result[0], "billed_characters": len(text)}
        for text, result in zip(texts, results)
    ]})


async def deepl_languages(service: Service, request: Request, fields: Fields) -> Response:
    """GET/POST /v2/languages (type=source, the default, or target)."""
    kind = optional_string(fields, "type") or "source"
    if kind not in ("source", "target"):
        raise ClientError(400, f"type must be source or target, got {kind!r}")
    if kind == "source":
        codes = sorted({model.source for model in service.models})
        return JSONResponse([{"language": code.upper(), "name": language_name(code)} for code in codes])
    languages = []
    for code in sorted({model.target for model in service.models}):
        for variant in DEEPL_TARGET_VARIANTS.get(code, (code.upper(),)):
            languages.append({"language": variant, "name": language_name(code), "supports_formality": False})
    return JSONResponse(languages)


async def deepl_usage(service: Service, request: Request, fields: Fields) -> Response:
    """GET/POST /v2/usage: the characters translated since the server started."""
    return JSONResponse({"character_count": service.characters, "character_limit": UNLIMITED_CHARACTERS})


async def deepl_glossary_pairs(service: Service, request: Request, fields: Fields) -> Response:
    """GET /v2/glossary-language-pairs: a glossary can be made for each served pair."""
    pairs = sorted({(model.source, model.target) for model in service.models})
    return JSONResponse({"supported_languages": [{"source_lang": s, "target_lang": t} for s, t in pairs]})


async def deepl_glossaries(service: Service, request: Request, fields: Fields) -> Response:
    """POST /v2/glossaries creates one (201); GET lists them."""
    if request.method == "GET":
        return JSONResponse({"glossaries": [info.to_json() for info in service.glossaries.list()]})
    values = {name: required_string(fields, name) for name in ("name", "source_lang", "target_lang", "entries")}
    entries_format = optional_string(fields, "entries_format") or "tsv"
    model = service.model(values["source_lang"], values["target_lang"], "source_lang", "target_lang")
    pairs = parse_entries(values["entries"], entries_format, service.limits.max_glossary_entries)
    info = service.glossaries.create(values["name"], model.source, model.target, pairs)
    return JSONResponse(info.to_json(), status_code=201)


async def deepl_glossary(service: Service, request: Request, fields: Fields) -> Response:
    """GET /v2/glossaries/{id} describes one; DELETE removes it (204)."""
    glossary_id = request.path_params["glossary_id"]
    if request.method == "DELETE":
        if not service.glossaries.delete(glossary_id):
            raise ClientError(404, f"no glossary {glossary_id!r}")
        return Response(status_code=204)
    info = service.glossaries.info(glossary_id)
    if info is None:
        raise ClientError(404, f"no glossary {glossary_id!r}")
    return JSONResponse(info.to_json())


async def deepl_glossary_entries(service: Service, request: Request, fields: Fields) -> Response:
    """GET /v2/glossaries/{id}/entries: the entries as TSV."""
    glossary_id = request.path_params["glossary_id"]
    pairs = service.glossaries.entries(glossary_id)
    if pairs is None:
        raise ClientError(404, f"no glossary {glossary_id!r}")
    return Response(entries_tsv(pairs), media_type="text/tab-separated-values; charset=utf-8")


# LibreTranslate.

async def libre_translate(service: Service, request: Request, fields: Fields) -> Response:
    """POST /translate: q (a string or a list), source (a code or auto), target, format, alternatives."""
    texts, listed = texts_field(fields, "q", service.limits)
    target = required_string(fields, "target")
    source = optional_string(fields, "source")
    model = service.model(source, target, "source", "target")
    text_format = optional_string(fields, "format") or "text"
    if text_format not in ("text", "html"):
        raise ClientError(400, f"format must be text or html, got {text_format!r}")
    alternatives = count_field(fields, "alternatives", 0, 0, model.engine.beam_size - 1)
    # Each line of q is translated whole, as `tfm translate` translates a line (n-best needs whole lines).
    settings = RequestSettings(markup="html" if text_format == "html" else None, nbest=alternatives + 1)
    results = await translated_texts(service, model, settings, texts, True, "q")
    answer: dict[str, Any] = {"translatedText": [r[0] for r in results] if listed else results[0][0]}
    if alternatives:
        answer["alternatives"] = [r[1:] for r in results] if listed else results[0][1:]
    if source is None or source.strip().lower() == "auto":
        detected = {"confidence": 100.0, "language": model.source}
        answer["detectedLanguage"] = [detected] * len(texts) if listed else detected
    return JSONResponse(answer)


async def libre_languages(service: Service, request: Request, fields: Fields) -> Response:
    """GET/POST /languages: each source language and the targets it is served into."""
    targets: dict[str, list[str]] = {}
    for model in service.models:
        targets.setdefault(model.source, []).append(model.target)
    return JSONResponse([
        {"code": code, "name": language_name(code), "targets": sorted(into)} for code, into in sorted(targets.items())
    ])


# tfm's own API: what `tfm translate --json` writes, per line.

async def tfm_translate(service: Service, request: Request, fields: Fields) -> Response:
    """POST /tfm/translate: text (one line each), optional source_lang/target_lang, nbest, markup,
    split_sentences, glossary_id, constraints (per text, a list of target phrases)."""
    texts, listed = texts_field(fields, "text", service.limits)
    name = (lambda i: f"text[{i}]") if listed else (lambda i: "text")
    for i, text in enumerate(texts):
        if ANY_LINE_BREAK.search(text):
            raise ClientError(400, f"{name(i)} holds a line break: send one line per text, as tfm translate reads lines")
    model = service.model(optional_string(fields, "source_lang"), optional_string(fields, "target_lang"),
                          "source_lang", "target_lang")
    nbest = count_field(fields, "nbest", 1, 1, model.engine.beam_size)
    markup = optional_string(fields, "markup")
    if markup not in (None, "html", "xml"):
        raise ClientError(400, f"markup must be html or xml, got {markup!r}")
    split = flag_field(fields, "split_sentences")
    if split and nbest > 1:
        raise ClientError(400, "nbest must be 1 with split_sentences (a split line gets one translation)")
    lines = constrained_lines(fields, texts, listed, split)
    settings = RequestSettings(
        markup=markup, split_sentences=split, glossary_id=service.checked_glossary(optional_string(fields, "glossary_id"), model),
        constraint_fields=lines is not texts, nbest=nbest, alignment=True,
    )
    check_markup(texts, markup, "text", list(range(len(texts))))
    answer = await service.translate(model, settings, lines)
    service.characters += sum(len(text) for text in texts)
    return JSONResponse({
        "translations": [json_record(line, answer.output_format) for line in answer.lines],
        "warnings": [line.warnings for line in answer.lines],
    })


def constrained_lines(fields: Fields, texts: list[str], listed: bool, split: bool) -> list[str]:
    """`texts` as `tfm translate --constraints` reads them (source TAB phrase TAB ...) when the request has
    `constraints`, a list of phrase lists, one per text; else `texts` itself."""
    constraints = fields.get("constraints")
    if constraints is None:
        return texts
    if split:
        raise ClientError(400, "constraints belong to a whole line: use glossary_id with split_sentences")
    if not listed and isinstance(constraints, list) and all(isinstance(p, str) for p in constraints):
        constraints = [constraints]  # one text, one list of phrases
    if not isinstance(constraints, list) or len(constraints) != len(texts):
        raise ClientError(400, f"constraints must be a list of {len(texts)} phrase list(s), one per text")
    lines = []
    for i, (text, phrases) in enumerate(zip(texts, constraints)):
        if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
            raise ClientError(400, f"constraints[{i}] must be a list of strings")
        if any("\t" in item or ANY_LINE_BREAK.search(item) for item in [text, *phrases]):
            raise ClientError(400, f"text[{i}] or constraints[{i}] holds a TAB or a line break")
        lines.append("\t".join([text, *phrases]))
    return lines


async def health(request: Request) -> Response:
    """GET /health: 200 once the models are loaded (they are before the server listens), 503 once a model's
    checkpoint changed on disk or became unreadable under the server; never needs a key."""
    service: Service = request.app.state.service
    if service.model_file_failed:
        message = "a model's checkpoint changed on disk or became unreadable; restart the server (its log says which)"
        return JSONResponse({"status": "restart needed", "error": message}, status_code=503)
    return JSONResponse({
        "status": "ok",
        "models": [{"source": m.source, "target": m.target} for m in service.models],
        "api_key_required": service.keys is not None,  # the web page asks for a key when it is
    })


def loggable(path: str) -> str:
    """A request path safe for one log line: control characters escaped, cut at MAX_LOGGED_PATH."""
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in path[:MAX_LOGGED_PATH])
    return shown + ("..." if len(path) > MAX_LOGGED_PATH else "")


class RequestLog:
    """ASGI middleware: one log line per request (client, method, path, status, milliseconds); never the
    query string, which may hold a key. Once `stopping()`, each answer carries `Connection: close`
    (uvicorn's h11 protocol closes the connection after an answer in flight at shutdown without saying so)."""

    def __init__(self, app: Any, log: Callable[[str], None], stopping: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.log = log
        self.stopping = stopping

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if self.stopping():
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client")
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.log(f'{client[0] if client else "-"} "{scope["method"]} {loggable(scope["path"])}" {status[0]} {elapsed_ms:.1f} ms')


def build_app(service: Service) -> Any:
    """The ASGI application serving `service`, wrapped in the request log."""

    def route(path: str, handler: Callable, api: str, methods: list[str], body_limit: int | None = None) -> Route:
        async def bound(request: Request, fields: Fields) -> Response:
            return await handler(service, request, fields)

        return Route(path, endpoint(service, api, bound, body_limit), methods=methods)

    async def http_error(request: Request, error: Exception) -> Response:
        status = getattr(error, "status_code", 500)
        message = {404: f"no such endpoint: {loggable(request.url.path)}", 405: f"{request.method} is not allowed here"}
        return JSONResponse({"message": message.get(status, "bad request"), "error": message.get(status, "bad request")}, status_code=status)

    both = ["GET", "POST"]
    routes = [
        Route("/", page_route(), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        route("/v2/translate", deepl_translate, DEEPL, ["POST"]),
        route("/v2/languages", deepl_languages, DEEPL, both),
        route("/v2/usage", deepl_usage, DEEPL, both),
        route("/v2/glossary-language-pairs", deepl_glossary_pairs, DEEPL, ["GET"]),
        route("/v2/glossaries", deepl_glossaries, DEEPL, both, service.limits.max_glossary_bytes),
        route("/v2/glossaries/{glossary_id}", deepl_glossary, DEEPL, ["GET", "DELETE"]),
        route("/v2/glossaries/{glossary_id}/entries", deepl_glossary_entries, DEEPL, ["GET"]),
        route("/translate", libre_translate, LIBRETRANSLATE, ["POST"]),
        route("/languages", libre_languages, LIBRETRANSLATE, both),
        route("/tfm/translate", tfm_translate, TFM, ["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.service = service
    return RequestLog(app, service.log, lambda: service.stopping())


def glossary_lookup(store: GlossaryStore) -> Callable[[str], Any]:
    """id -> the stored glossary as a Glossary (None when there is none): what an Engine asks for."""

    def lookup(glossary_id: str) -> Any:
        pairs = store.entries(glossary_id)
        return as_glossary(pairs) if pairs is not None else None

    return lookup
