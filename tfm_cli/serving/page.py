"""The web page of `tfm serve` at `/`: one static HTML file (static/index.html, package data) with its
script and style inline, served with a Content-Security-Policy that allows exactly those two blocks.

The page needs no key to load (it holds no data); the API calls it makes carry the key the user types.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

INLINE_BLOCK = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def page_html() -> str:
    """The page's HTML, as shipped in the package."""
    return resources.files("tfm_cli.serving").joinpath("static", "index.html").read_text(encoding="utf-8")


def content_security_policy(html: str) -> str:
    """A CSP allowing only the page's own inline <script> and <style> blocks (by their SHA-256) and
    requests to its own origin: an injected tag could neither run nor load anything."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in INLINE_BLOCK.findall(html):
        digest = base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii")
        hashes[kind].append(f"'sha256-{digest}'")
    return "; ".join([
        "default-src 'none'",
        f"script-src {' '.join(hashes['script']) or chr(39) + 'none' + chr(39)}",
        f"style-src {' '.join(hashes['style']) or chr(39) + 'none' + chr(39)}",
        "connect-src 'self'",
        "img-src data:",  # the empty favicon (so the browser asks for no /favicon.ico)
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])


def page_route():
    """The handler of `GET /`: the page, read and hashed once."""
    html = page_html()
    headers = {
        "Content-Security-Policy": content_security_policy(html),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }

    async def page(request: Request) -> Response:
        return Response(html, media_type="text/html; charset=utf-8", headers=headers)

    return page
