"""What oversized requests cost `tfm serve`: a 10 MiB body, a 100,000-sentence request and a glossary of
1,000,000 entries, each refused, with the server's resident memory before and after and its peak.

Starts `tfm serve -m PAIR=CHECKPOINT` on a free loopback port (bench/serve_load.py's Server), warms it
up, then sends each case on its own connection and reads /proc/PID/status after it: VmRSS (resident
now) and VmHWM (the peak since the start). A case passes when its status is the expected one and the
server still answers a normal request after it. Last, a glossary at the default entry limit (100,000)
is created and used, as the largest request the server accepts. Prints markdown tables with the date,
the command and the `lscpu` flags.

    python bench/serve_limits.py --model de-en=runs/multi30k-de-en/average.safetensors
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import Server, lscpu_model, table  # noqa: E402

MIB = 1024 * 1024
CHUNK = 64 * 1024
SENTENCE = "Ein Mann mit einem orangefarbenen Hut starrt auf etwas."


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process `pid` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def post(port: int, path: str, body: bytes, content_type: str = "application/json", chunked: bool = False,
         announce: int | None = None) -> tuple[int, bytes, float]:
    """One POST on a fresh connection: (status, answer body, seconds). `chunked` streams the body without a
    length; `announce` sends only headers claiming that many bytes. Sending stops if the server answers and
    closes first (status 0: no answer at all)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    try:
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", content_type)
        if chunked:
            connection.putheader("Transfer-Encoding", "chunked")
        else:
            connection.putheader("Content-Length", str(announce if announce is not None else len(body)))
        connection.endheaders()
        try:
            if chunked:
                for start in range(0, len(body), CHUNK):
                    piece = body[start : start + CHUNK]
                    connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                connection.send(b"0\r\n\r\n")
            elif announce is None:
                for start in range(0, len(body), CHUNK):
                    connection.send(body[start : start + CHUNK])
        except OSError:
            pass  # answered and closed before the whole body went out
        try:
            response = connection.getresponse()
            return response.status, response.read(), time.perf_counter() - started
        except (OSError, http.client.HTTPException):
            return 0, b"", time.perf_counter() - started
    finally:
        connection.close()


def translate_body(texts: list[str], **fields: object) -> bytes:
    return json.dumps({"text": texts, "target_lang": "EN", "source_lang": "DE", "split_sentences": "0", **fields}).encode()


def short_terms(count: int) -> list[str]:
    """`count` distinct 4-letter lower-case words (base 26), so that a million entries fit in 10 MiB."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(letters[(n // 26 ** k) % 26] for k in range(4)) for n in range(count)]


def glossary_body(count: int) -> bytes:
    entries = "".join(f"{term}\tX\n" for term in short_terms(count))  # 9 JSON bytes per entry
    return json.dumps({"name": f"{count} entries", "source_lang": "DE", "target_lang": "EN",
                       "entries": entries, "entries_format": "tsv"}).encode()


def cases() -> list[tuple[str, dict, int]]:
    """(what, post() arguments, expected status) per oversized request."""
    ten_mib = b"x" * (10 * MIB)
    hundred_k = [SENTENCE] * 100_000
    return [
        ("10 MiB body, Content-Length announced (headers only)", {"path": "/v2/translate", "body": b"", "announce": 10 * MIB}, 413),
        ("10 MiB body, Content-Length, sent whole", {"path": "/v2/translate", "body": ten_mib}, 413),
        ("10 MiB body, chunked without a length", {"path": "/v2/translate", "body": ten_mib, "chunked": True}, 413),
        ("10 MiB body to LibreTranslate /translate, chunked", {"path": "/translate", "body": ten_mib, "chunked": True}, 413),
        ("100,000 sentences as a list of texts (JSON)", {"path": "/v2/translate", "body": translate_body(hundred_k)}, 413),
        ("100,000 sentences as lines of one text (JSON, chunked)",
         {"path": "/v2/translate", "body": translate_body(["\n".join(hundred_k)], split_sentences="1"), "chunked": True}, 413),
        ("15,000 one-letter lines in one text (what 30,000 characters allow)", {"path": "/v2/translate",
         "body": translate_body(["a\n" * 15_000], split_sentences="1")}, 400),
        ("glossary of 1,000,000 entries within 10 MiB (JSON)", {"path": "/v2/glossaries", "body": glossary_body(1_000_000)}, 400),
        ("glossary of 1,000,000 entries over 10 MiB (form, chunked)", {"path": "/v2/glossaries",
         "body": glossary_form(1_000_000), "content_type": "application/x-www-form-urlencoded", "chunked": True}, 413),
    ]


def glossary_form(count: int) -> bytes:
    import urllib.parse

    entries = "".join(f"{term}\t{term.upper()}\n" for term in short_terms(count))
    return urllib.parse.urlencode({"name": "form", "source_lang": "DE", "target_lang": "EN", "entries": entries}).encode()


def healthy(port: int) -> bool:
    status, answer, _ = post(port, "/v2/translate", translate_body([SENTENCE]))
    return status == 200 and bool(json.loads(answer)["translations"][0]["text"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="PAIR=CHECKPOINT for tfm serve -m (German source)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-options", default="", help="more tfm serve options, one string")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    out = [f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/serve_limits.py {shlex.join(sys.argv[1:])}`",
           f"Machine: {lscpu_model()}; flags: {cpu_flags()}", ""]
    rows, checks = [], []
    with tempfile.TemporaryDirectory() as folder:
        server = Server(args, Path(folder), "limits", quiet=True)
        try:
            for _ in range(5):
                assert healthy(server.port), server.log()[-500:]
            rss, peak = memory_mib(server.pid)
            rows.append(["after start and 5 requests", "", "", "", f"{rss:.0f}", f"{peak:.0f}"])
            for what, request, expected in cases():
                status, answer, seconds = post(server.port, **request)
                rss, peak = memory_mib(server.pid)
                message = json.loads(answer).get("message", "") if answer.startswith(b"{") else ""
                rows.append([what, f"{status} (expected {expected})", f"{seconds * 1000:.0f}", message[:70], f"{rss:.0f}", f"{peak:.0f}"])
                checks.append((what, status == expected and healthy(server.port)))
            glossary_status, answer, seconds = post(server.port, "/v2/glossaries", glossary_body(100_000))
            glossary_id = json.loads(answer).get("glossary_id", "")
            rss, peak = memory_mib(server.pid)
            rows.append(["glossary of 100,000 entries (the limit), created", glossary_status, f"{seconds * 1000:.0f}", "",
                         f"{rss:.0f}", f"{peak:.0f}"])
            status, answer, seconds = post(server.port, "/v2/translate", translate_body([SENTENCE], glossary_id=glossary_id))
            rss, peak = memory_mib(server.pid)
            rows.append(["  and used in a translation (first use builds its matcher)", status, f"{seconds * 1000:.0f}", "",
                         f"{rss:.0f}", f"{peak:.0f}"])
            checks.append(("a glossary at the entry limit is created and used", glossary_status == 201 and status == 200))
        finally:
            code = server.stop()
        checks.append(("the server exits 0 on SIGTERM afterwards", code == 0))
    out.append(table(["request", "status", "ms", "message", "RSS after MiB", "peak RSS so far MiB"], rows))
    out.append("")
    out.append(table(["check", "result"], [[what, "pass" if ok else "FAIL"] for what, ok in checks]))
    print("\n".join(out))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
