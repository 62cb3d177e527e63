"""What a request brings: its body read within the size limit, its fields (JSON, URL-encoded or multipart
form, and the query string), its API key, and typed fields checked one by one.

Every problem is a ClientError: an HTTP status and one message that names the field. Nothing here
raises anything else for what a client sends.
"""

from __future__ import annotations

import hmac
import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfm_cli.errors import TfmError


class ClientError(Exception):
    """A request the server refuses: `status` (4xx) and a message naming the field."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """What one request may hold."""

    max_body_bytes: int = 128 * 1024  # DeepL's limit for a request body
    max_texts: int = 50  # DeepL's limit of texts per request
    max_chars: int = 30_000  # characters of all texts together
    max_lines: int = 2_000  # lines of all texts together, once cut at their line breaks
    max_glossary_bytes: int = 10 * 1024 * 1024  # DeepL's limit for a glossary (the body that creates one)
    max_glossary_entries: int = 100_000


@dataclass
class Fields:
    """A request's named values: the body's (JSON values, or form strings) over the query string's."""

    values: dict[str, Any] = field(default_factory=dict)
    form: bool = False  # from a form or the query string: every value a string, a repeated name a list

    def get(self, name: str) -> Any:
        return self.values.get(name)


def read_keys(path: str) -> frozenset[str]:
    """The API keys of `--api-keys FILE`: one per line; blank lines and `#` comments skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TfmError(f"--api-keys {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TfmError(f"--api-keys {path}: cannot read it ({error})") from None
    keys = frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise TfmError(f"--api-keys {path}: the file holds no key (one key per line)")
    return keys


def header_key(headers: Any) -> str | None:
    """The key of an `Authorization: DeepL-Auth-Key KEY` (or `Bearer KEY`) header, else None."""
    scheme, _, value = (headers.get("authorization") or "").strip().partition(" ")
    if scheme.lower() in ("deepl-auth-key", "bearer") and value.strip():
        return value.strip()
    return None


def field_key(fields: Fields) -> str | None:
    """The key of a DeepL `auth_key` or a LibreTranslate `api_key` field, else None."""
    for name in ("auth_key", "api_key"):
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def key_is_valid(key: str | None, keys: frozenset[str]) -> bool:
    """Whether `key` is one of `keys` (compared in constant time)."""
    if key is None:
        return False
    given = key.encode("utf-8", "surrogatepass")
    return any(hmac.compare_digest(given, known.encode("utf-8")) for known in keys)


def checked_length(headers: Any, limit: int) -> None:
    """Refuse a body whose announced Content-Length is over `limit` before reading it (413)."""
    length = headers.get("content-length")
    if length is None:
        return
    if not length.strip().isdigit():
        raise ClientError(400, f"the Content-Length header is not a number: {length!r}")
    if int(length) > limit:
        raise ClientError(413, f"the request body is {int(length)} bytes, over the limit of {limit} bytes")


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, read only while it stays within `limit` bytes (413 beyond; 400 when the client
    goes away before sending all of it: nobody reads that answer, but the log shows the request's end)."""
    from starlette.requests import ClientDisconnect

    checked_length(request.headers, limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ClientError(413, f"the request body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientError(400, f"the client closed the connection after {size} bytes of its body") from None
    return b"".join(chunks)


def utf8_text(data: bytes, what: str) -> str:
    """`data` decoded as UTF-8; 400 naming `what` and the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ClientError(400, f"{what} is not valid UTF-8 (byte {error.start})") from None


def form_values(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Form pairs as values: a name given once is a string, a name given more than once a list."""
    values: dict[str, Any] = {}
    for name, value in pairs:
        if name in values:
            values[name] = (values[name] if isinstance(values[name], list) else [values[name]]) + [value]
        else:
            values[name] = value
    return values


def url_encoded(text: str, what: str) -> list[tuple[str, str]]:
    """The name/value pairs of URL-encoded `text` (strict UTF-8 after percent-decoding)."""
    try:
        return urllib.parse.parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=10_000)
    except UnicodeDecodeError as error:
        raise ClientError(400, f"{what} is not valid UTF-8 once percent-decoded (byte {error.start})") from None
    except ValueError as error:
        raise ClientError(400, f"{what}: {error}") from None


async def parse_fields(request: Any, body: bytes) -> Fields:
    """The request's fields: a JSON object body, or a URL-encoded or multipart form, over the query string."""
    query = form_values(url_encoded(request.url.query, "the query string")) if request.url.query else {}
    content_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if not body.strip():
        return Fields(query, form=True)
    if content_type == "application/json" or content_type.endswith("+json"):
        text = utf8_text(body, "the JSON body")
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ClientError(400, f"the body is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
        except RecursionError:
            raise ClientError(400, "the body is not valid JSON: nested too deeply") from None
        if not isinstance(values, dict):
            raise ClientError(400, f"the JSON body must be an object, got {type(values).__name__}")
        return Fields({**query, **values})
    if content_type in ("", "application/x-www-form-urlencoded"):
        return Fields({**query, **form_values(url_encoded(utf8_text(body, "the form body"), "the form body"))}, form=True)
    if content_type == "multipart/form-data":
        return Fields({**query, **await multipart_values(request, body)}, form=True)
    raise ClientError(415, f"unsupported Content-Type {content_type!r}: send application/json or a form")


async def multipart_values(request: Any, body: bytes) -> dict[str, Any]:
    """The fields of a multipart form body (already read): strings only, no files."""
    from starlette.requests import Request

    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, receive).form(max_files=0, max_fields=10_000)
    except Exception as error:  # python-multipart's and Starlette's parse errors have no common base
        raise ClientError(400, f"the multipart body cannot be read: {error}") from None
    pairs = []
    for name, value in form.multi_items():
        if not isinstance(value, str):
            raise ClientError(400, f"{name}: file uploads are not accepted here")
        pairs.append((name, value))
    return form_values(pairs)


def checked_string(value: Any, name: str) -> str:
    """`value` as a string field `name`: 400 for another type or an unpaired surrogate (JSON's \\ud800)."""
    if not isinstance(value, str):
        raise ClientError(400, f"{name} must be a string, got {json_type(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ClientError(400, f"{name} is not valid Unicode (an unpaired surrogate at character {error.start})") from None
    return value


def optional_string(fields: Fields, name: str) -> str | None:
    """Field `name` as a string, None when absent or empty."""
    value = fields.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, list) and fields.form:
        raise ClientError(400, f"{name} is given {len(value)} times; give it once")
    return checked_string(value, name)


def required_string(fields: Fields, name: str) -> str:
    """Field `name` as a string; ClientError 400 when it is absent or empty."""
    value = optional_string(fields, name)
    if value is None:
        raise ClientError(400, f"{name} is required")
    return value


def texts_field(fields: Fields, name: str, limits: Limits) -> tuple[list[str], bool]:
    """Field `name`: a string or a list of strings, within the limits; returns (texts, whether a list was sent)."""
    value = fields.get(name)
    if value is None:
        raise ClientError(400, f"{name} is required")
    listed = isinstance(value, list)
    values = value if listed else [value]
    if not values:
        raise ClientError(400, f"{name} is an empty list")
    if len(values) > limits.max_texts:
        raise ClientError(400, f"{name} holds {len(values)} texts, over the limit of {limits.max_texts} per request")
    texts = [checked_string(text, f"{name}[{i}]" if listed else name) for i, text in enumerate(values)]
    chars = sum(len(text) for text in texts)
    if chars > limits.max_chars:
        raise ClientError(400, f"{name} holds {chars} characters, over the limit of {limits.max_chars} per request")
    return texts, listed


def flag_field(fields: Fields, name: str, default: bool = False) -> bool:
    """An on/off field: JSON true/false/0/1, or the form's "0"/"1"/"true"/"false"."""
    value = fields.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
        return value.strip().lower() in ("1", "true")
    raise ClientError(400, f"{name} must be 0, 1, true or false, got {value!r}")


def count_field(fields: Fields, name: str, default: int, lowest: int, highest: int) -> int:
    """A whole-number field within [lowest, highest] (a form's digits too)."""
    value = fields.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClientError(400, f"{name} must be a whole number, got {json_type(value)}")
    if not lowest <= value <= highest:
        raise ClientError(400, f"{name} must be between {lowest} and {highest}, got {value}")
    return value


def json_type(value: Any) -> str:
    """What JSON calls the type of `value`, for messages."""
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
