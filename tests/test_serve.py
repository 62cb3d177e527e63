"""`tfm serve` as a real process: the official `deepl` and `libretranslatepy` clients against it, their
results equal to `tfm translate`'s on the same model and settings, tfm's own endpoint, keys, limits and
bad input, a full queue, a glossary across a restart, SIGTERM with a request in flight, a checkpoint written over
under the server, and the web page at `/`
(served without a key; bench/serve_page.py drives it in a headless browser).

One server serves the whole module (the same checkpoint as en-de and as de-en, so DeepL's EN-US has a
model); the last test stops it with SIGTERM and starts a second on the same data folder.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import deepl
import pytest
from libretranslatepy import LibreTranslateAPI

from conftest import assert_one_line_error, run_cli
from translate_support import held_out_sources, trained_checkpoint

KEY = "test-key-1"
SLOW_WORD = "SLOWLY"  # a line holding it is held 2 s by the test's wrapper around the server (below)
SLOW_SECONDS = 2.0
# The server process: `python -c WRAPPER MARKER serve ...` runs `tfm serve` with Translator.translate_chunk
# wrapped so that a chunk holding SLOW_WORD touches MARKER, then waits: a request the test knows is in flight.
WRAPPER = f"""
import pathlib, sys, time
from tfm_cli.inference import translation
marker = pathlib.Path(sys.argv.pop(1))
original = translation.Translator.translate_chunk
def translate_chunk(self, lines, first_index, stats):
    if any({SLOW_WORD!r} in line for line in lines):
        marker.touch()
        time.sleep({SLOW_SECONDS})
    return original(self, lines, first_index, stats)
translation.Translator.translate_chunk = translate_chunk
sys.argv[0] = "tfm"
from tfm_cli.cli import main
main()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A `tfm serve` process on 127.0.0.1 (stderr to a file), started and waited for until /health answers."""

    def __init__(self, folder: Path, model: Path, data_dir: Path, keys: Path, *options: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.marker = folder / "in-flight"
        self.stderr_path = folder / "stderr.txt"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", WRAPPER, str(self.marker), "serve", "-m", f"en-de={model}", "-m", f"de-en={model}",
                 "--port", str(self.port), "--data-dir", str(data_dir), "--api-keys", str(keys), "--threads", "1", *options],
                stdout=subprocess.DEVNULL, stderr=stderr,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"tfm serve exited with {self.process.returncode}:\n{self.stderr()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        pytest.fail(f"tfm serve did not answer /health within 120 s:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def model() -> Path:
    return trained_checkpoint()


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# the test's keys\n{KEY}\nanother-key\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-data")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model, data_dir, keys_file):
    started = Server(tmp_path_factory.mktemp("server"), model, data_dir, keys_file, "--queue-size", "2")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def translator(server) -> deepl.Translator:
    return deepl.Translator(KEY, server_url=server.url)


def sources(count: int, start: int = 0) -> list[str]:
    return held_out_sources()[start : start + count]


def cli_lines(model: Path, lines: list[str], *options: str) -> list[str]:
    """What `tfm translate -m MODEL OPTIONS` writes for `lines`, one string per line."""
    result = run_cli(["translate", "-m", model, "--threads", "1", *options], input="".join(line + "\n" for line in lines))
    assert result.exit_code == 0, result.stderr
    return result.stdout.splitlines()


def call(server: Server, method: str, path: str, fields=None, body: bytes | None = None, key: str | None = KEY,
         content_type: str | None = None) -> tuple[int, object]:
    """One request; `fields` go as a JSON body. Returns (status, the answer's JSON)."""
    headers = {}
    if key is not None:
        headers["Authorization"] = f"DeepL-Auth-Key {key}"
    if fields is not None:
        body, content_type = json.dumps(fields).encode("utf-8"), "application/json"
    if content_type is not None:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(server.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
            return response.status, json.loads(data) if data else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# The official clients, against `tfm translate`.

def test_the_deepl_client_translates_a_text_and_a_list_as_tfm_translate_does(server, translator, model):
    paragraph = f"{sources(1, 10)[0]}. {sources(1, 11)[0]}."  # two sentences: DeepL's default splits them
    texts = [*sources(5), paragraph, ""]
    expected = cli_lines(model, texts, "--split-sentences", "--source-lang", "en")
    one = translator.translate_text(texts[0], source_lang="EN", target_lang="DE")
    assert (one.text, one.detected_source_lang) == (expected[0], "EN")
    many = translator.translate_text(texts, target_lang="DE")
    assert [result.text for result in many] == expected
    unsplit = translator.translate_text([paragraph], target_lang="de", split_sentences="0")
    assert [result.text for result in unsplit] == cli_lines(model, [paragraph])
    # EN-US names the de-en model's EN (the same weights here, so the same output).
    assert translator.translate_text(texts[0], source_lang="DE", target_lang="EN-US").text == expected[0]


def test_a_text_of_several_lines_is_translated_line_by_line_with_split_sentences_1(server, translator, model):
    lines = sources(3, 20)
    result = translator.translate_text("\n".join(lines), target_lang="DE", split_sentences="1")
    assert result.text == "\n".join(cli_lines(model, lines, "--split-sentences", "--source-lang", "en"))


def test_the_deepl_client_translates_html_as_tfm_translate_markup_does(server, translator, model):
    words = sources(2, 30)
    first = words[0].split()
    html = [f"<p>{first[0]} <b>{' '.join(first[1:3])}</b> {' '.join(first[3:])}</p>", f"<i>{words[1]}</i> &amp; more"]
    expected = cli_lines(model, html, "--markup", "html", "--split-sentences", "--source-lang", "en")
    results = translator.translate_text(html, source_lang="EN", target_lang="DE", tag_handling="html")
    assert [result.text for result in results] == expected
    assert "<b>" in results[0].text and "</p>" in results[0].text


def test_the_deepl_client_creates_lists_reads_uses_and_deletes_glossaries(server, translator, model, tmp_path):
    entries = {"dog": "kato", "big": "granda"}
    glossary = translator.create_glossary("animals", "EN", "DE", entries)
    assert (glossary.name, glossary.source_lang, glossary.target_lang, glossary.entry_count) == ("animals", "EN", "DE", 2)
    assert translator.get_glossary(glossary.glossary_id).name == "animals"
    assert glossary.glossary_id in [g.glossary_id for g in translator.list_glossaries()]
    assert translator.get_glossary_entries(glossary) == entries
    assert ("EN", "DE") in [(p.source_lang.upper(), p.target_lang.upper()) for p in translator.get_glossary_languages()]
    texts = ["the big dog sees my cat", *sources(3, 40)]
    terms = tmp_path / "terms.tsv"
    terms.write_text("".join(f"{s}\t{t}\n" for s, t in entries.items()), encoding="utf-8")
    expected = cli_lines(model, texts, "--glossary", terms, "--split-sentences", "--source-lang", "en")
    results = translator.translate_text(texts, source_lang="EN", target_lang="DE", glossary=glossary)
    assert [result.text for result in results] == expected
    assert "kato" in results[0].text.split() and "granda" in results[0].text.split()
    translator.delete_glossary(glossary)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.get_glossary(glossary.glossary_id)


def test_the_deepl_client_lists_languages_and_usage(server, translator):
    assert sorted(language.code for language in translator.get_source_languages()) == ["DE", "EN"]
    assert sorted(language.code for language in translator.get_target_languages()) == ["DE", "EN-GB", "EN-US"]
    usage = translator.get_usage()
    assert usage.character.valid and not usage.any_limit_reached


def test_the_libretranslate_client_translates_and_lists_languages(server, model):
    client = LibreTranslateAPI(f"{server.url}/", KEY)
    text = sources(1, 50)[0]
    assert client.translate(text, "en", "de") == cli_lines(model, [text])[0]
    assert client.languages() == [
        {"code": "de", "name": "German", "targets": ["en"]}, {"code": "en", "name": "English", "targets": ["de"]},
    ]


def test_libretranslate_alternatives_are_the_n_best_of_tfm_translate(server, model):
    texts = sources(3, 60)
    status, answer = call(server, "POST", "/translate", {"q": texts, "source": "auto", "target": "de", "alternatives": 2,
                                                        "api_key": KEY}, key=None)
    assert status == 200, answer
    columns = [line.split("\t") for line in cli_lines(model, texts, "--nbest", "3")]
    assert answer["translatedText"] == [c[0] for c in columns]
    assert answer["alternatives"] == [c[1:] for c in columns]
    assert answer["detectedLanguage"][0]["language"] == "en"


def test_tfm_translate_endpoint_returns_the_records_of_translate_json(server, model):
    texts = sources(4, 70)
    status, answer = call(server, "POST", "/tfm/translate", {"text": texts, "nbest": 2, "target_lang": "de"})
    assert status == 200, answer
    assert answer["translations"] == [json.loads(line) for line in cli_lines(model, texts, "--json", "--nbest", "2")]
    status, answer = call(server, "POST", "/tfm/translate", {"text": [texts[0]], "constraints": [["granda kato"]], "target_lang": "de"})
    assert status == 200, answer
    expected = json.loads(cli_lines(model, [f"{texts[0]}\tgranda kato"], "--json", "--constraints")[0])
    assert answer["translations"] == [expected]
    assert expected["constraints"] == [{"phrase": "granda kato", "met": True}]


# Keys, limits and bad input.

@pytest.mark.parametrize("method, path, fields", [
    ("POST", "/v2/translate", {"text": ["a dog"], "target_lang": "DE"}),
    ("GET", "/v2/languages", None),
    ("GET", "/v2/glossaries", None),
    ("POST", "/translate", {"q": "a dog", "source": "en", "target": "de"}),
    ("GET", "/languages", None),
    ("POST", "/tfm/translate", {"text": ["a dog"], "target_lang": "de"}),
])
def test_a_missing_or_wrong_key_gets_403_and_no_translation(server, method, path, fields):
    for key in (None, "wrong-key"):
        status, answer = call(server, method, path, fields, key=key)
        assert status == 403, answer
        assert set(answer) <= {"message", "error"} and "key" in next(iter(answer.values()))
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
        assert response.status == 200  # never needs a key
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong-key", server_url=server.url).translate_text("a dog", target_lang="DE")


def test_the_web_page_is_served_without_a_key_and_calls_only_routes_that_exist(server):
    import re

    with urllib.request.urlopen(f"{server.url}/", timeout=10) as response:  # no key: the page holds no data
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        policy = response.headers["Content-Security-Policy"]
        page = response.read().decode("utf-8")
    shipped = Path(__file__).parent.parent / "tfm_cli" / "serving" / "static" / "index.html"
    assert page == shipped.read_text(encoding="utf-8")
    # Only the page's own inline blocks may run, by hash; never an injected one.
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy and "connect-src 'self'" in policy
    # Text goes in as text: none of the ways to put a string into the page as HTML or code.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in page, sink
    paths = set(re.findall(r"""["'](/[^"'\s]*)["']""", page))
    assert paths == {"/health", "/tfm/translate"}
    assert all(call.startswith("fetch(ROUTES.") for call in re.findall(r"fetch\([^,)]*", page))
    for path in paths:  # each exists: any answer but 404 (/tfm/translate answers GET with 405)
        assert call(server, "GET", path)[0] != 404, path
    status, health = call(server, "GET", "/health", key=None)
    assert status == 200 and health["api_key_required"] is True  # so the page asks for the key


@pytest.mark.parametrize("fields, body, content_type, status, message", [
    (None, b"{" + b" " * 140_000 + b"}", "application/json", 413, "over the limit"),
    ({"text": ["a dog"] * 51, "target_lang": "DE"}, None, None, 400, "text holds 51 texts"),
    ({"text": ["a" * 30_001], "target_lang": "DE"}, None, None, 400, "text holds 30001 characters"),
    ({"text": ["a\n" * 1_000, "b\n" * 1_000], "target_lang": "DE"}, None, None, 400, "text holds 2002 lines, over the limit of 2000"),
    (None, b'{"text": ["a dog"], "target_lang": ', "application/json", 400, "not valid JSON: Expecting value"),
    (None, b"[1, 2]", "application/json", 400, "must be an object"),
    (None, b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "application/json", 400, "nested too deeply"),
    ({"text": {"a": 1}, "target_lang": "DE"}, None, None, 400, "text must be a string, got an object"),
    ({"text": ["a dog", 7], "target_lang": "DE"}, None, None, 400, r"text\[1\] must be a string"),
    ({"text": ["a dog"], "target_lang": "XX"}, None, None, 400, "target_lang: no model translates into 'XX'"),
    ({"text": ["a dog"], "source_lang": "FR", "target_lang": "DE"}, None, None, 400, "source_lang: no model translates from 'FR'"),
    ({"text": ["a dog"]}, None, None, 400, "target_lang is required"),
    (None, b"text=a%FF&target_lang=DE", "application/x-www-form-urlencoded", 400, "not valid UTF-8"),
    (None, b'{"text": ["a \xff dog"], "target_lang": "DE"}', "application/json", 400, "not valid UTF-8"),
    (None, b'{"text": ["a \\ud800 dog"], "target_lang": "DE"}', "application/json", 400, r"text\[0\] is not valid Unicode"),
    ({"text": ["a dog"], "source_lang": "EN", "target_lang": "DE", "glossary_id": "nope"}, None, None, 404, "glossary_id: no glossary"),
    ({"text": ["<b>a <i>dog</b></i>"], "target_lang": "DE", "tag_handling": "html"}, None, None, 400, r"text\[0\]: its html tags do not nest"),
    ({"text": ["a dog"], "target_lang": "DE", "split_sentences": "2"}, None, None, 400, "split_sentences must be"),
    ({"text": ["a dog"], "target_lang": "DE", "tag_handling": "pdf"}, None, None, 400, "tag_handling must be"),
])
def test_bad_requests_get_one_json_error_naming_the_problem(server, fields, body, content_type, status, message):
    import re

    got, answer = call(server, "POST", "/v2/translate", fields, body=body, content_type=content_type)
    assert got == status, answer
    assert list(answer) == ["message"] and re.search(message, answer["message"]), answer


def announced_body_status(server: Server, path: str, length: int) -> int:
    """The status of a POST whose headers announce a body of `length` bytes, of which none is sent."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.putrequest("POST", path)
        for name, value in (("Authorization", f"DeepL-Auth-Key {KEY}"), ("Content-Type", "application/json"),
                            ("Content-Length", str(length))):
            connection.putheader(name, value)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def chunked_body_status(server: Server, path: str, size: int) -> int:
    """The status of a POST that streams `size` bytes in chunks without a Content-Length; sending stops
    when the server has answered and closed the connection."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    chunk = b"a" * 65_536
    try:
        connection.putrequest("POST", path)
        for name, value in (("Authorization", f"DeepL-Auth-Key {KEY}"), ("Content-Type", "application/json"),
                            ("Transfer-Encoding", "chunked")):
            connection.putheader(name, value)
        connection.endheaders()
        try:
            for _ in range(size // len(chunk)):
                connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            connection.send(b"0\r\n\r\n")
        except OSError:  # the server answered 413 and closed the connection before all was sent
            pass
        return connection.getresponse().status
    finally:
        connection.close()


def test_a_10_mib_body_is_refused_whether_announced_or_streamed(server):
    ten_mib = 10 * 1024 * 1024
    # Announced: refused on its headers, before any of the body arrives (the answer would otherwise wait).
    assert announced_body_status(server, "/v2/translate", ten_mib) == 413
    assert announced_body_status(server, "/v2/glossaries", ten_mib + 1) == 413
    # Streamed without a length: refused once it passes the limit.
    assert chunked_body_status(server, "/v2/translate", ten_mib) == 413
    assert chunked_body_status(server, "/translate", ten_mib) == 413


def test_a_glossary_may_be_larger_than_a_translation_request_but_not_over_its_entry_limit(server):
    def entries(count: int) -> str:
        return "".join(f"word{i}\tWort{i}\n" for i in range(count))

    fields = {"name": "big", "source_lang": "EN", "target_lang": "DE", "entries_format": "tsv"}
    status, answer = call(server, "POST", "/v2/glossaries", {**fields, "entries": entries(10_000)})  # ~190 KB
    assert status == 201 and answer["entry_count"] == 10_000, answer
    assert call(server, "DELETE", f"/v2/glossaries/{answer['glossary_id']}")[0] == 204
    # A million entries: refused whole (the server's default limit is 100,000), nothing stored.
    before = call(server, "GET", "/v2/glossaries")[1]["glossaries"]
    status, answer = call(server, "POST", "/v2/glossaries", {**fields, "entries": entries(100_001) + "\n" * 50})
    assert status == 400 and "100001 lines, over the limit of 100000 entries" in answer["message"], answer
    assert call(server, "GET", "/v2/glossaries")[1]["glossaries"] == before


def test_clients_that_disconnect_mid_body_or_mid_translation_do_not_disturb_the_others(server, model):
    def gone_after(head: bytes, body: bytes) -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + body)
        # closed here: the server reads the rest of the body, or writes its answer, to nobody

    body = json.dumps({"text": [f"{SLOW_WORD} cat"], "target_lang": "DE"}).encode()
    head = (f"POST /v2/translate HTTP/1.1\r\nHost: x\r\nAuthorization: DeepL-Auth-Key {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n")
    log_before = server.stderr()
    server.marker.unlink(missing_ok=True)
    gone_after(head.format(len(body)).encode(), body)  # whole request sent, gone while it is translated
    gone_after(head.format(10_000).encode(), body[:20])  # gone in the middle of its body
    texts = sources(3, 95)
    status, answer = call(server, "POST", "/v2/translate", {"text": texts, "target_lang": "DE", "split_sentences": "0"})
    assert status == 200 and [t["text"] for t in answer["translations"]] == cli_lines(model, texts)
    deadline = time.monotonic() + 30
    while not server.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.marker.exists()  # the first one did reach the engine
    time.sleep(SLOW_SECONDS + 0.5)  # its answer has been written to the closed connection by now
    assert call(server, "GET", "/v2/usage")[0] == 200
    new_log = server.stderr()[len(log_before):]
    assert "Traceback" not in new_log and "error:" not in new_log, new_log
    assert '"POST /v2/translate" 400' in new_log  # the cut body: one log line, no traceback


def test_old_deepl_clients_send_a_form_with_auth_key(server, model):
    text = sources(1, 80)[0]
    form = f"auth_key={KEY}&text={urllib.parse.quote(text)}&target_lang=DE&split_sentences=0".encode()
    status, answer = call(server, "POST", "/v2/translate", body=form, key=None, content_type="application/x-www-form-urlencoded")
    assert status == 200, answer
    assert answer["translations"][0]["text"] == cli_lines(model, [text])[0]


def test_a_full_queue_is_refused_at_once_and_the_queued_requests_are_answered(server, model):
    # The server runs with --queue-size 2: one slow request in the engine, two queued, the fourth refused.
    server.marker.unlink(missing_ok=True)
    results: dict[str, tuple[int, object]] = {}
    texts = {"slow": f"{SLOW_WORD} dog", "first": sources(1, 90)[0], "second": sources(1, 91)[0]}

    def send(name: str) -> None:
        results[name] = call(server, "POST", "/tfm/translate", {"text": [texts[name]], "target_lang": "de"})

    threads = [threading.Thread(target=send, args=("slow",))]
    threads[0].start()
    deadline = time.monotonic() + 30
    while not server.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.marker.exists(), server.stderr()
    for name in ("first", "second"):
        threads.append(threading.Thread(target=send, args=(name,)))
        threads[-1].start()
    time.sleep(0.3)  # both are queued by now (the slow one holds the engine for SLOW_SECONDS)
    started = time.monotonic()
    status, answer = call(server, "POST", "/tfm/translate", {"text": ["a dog"], "target_lang": "de"})
    assert (status, time.monotonic() - started < 1.0) == (503, True), answer
    assert "queue is full" in answer["error"]
    status, answer = call(server, "POST", "/v2/translate", {"text": ["a dog"], "target_lang": "DE"})
    assert status == 429 and "Too many requests" in answer["message"]  # DeepL's code for it
    for thread in threads:
        thread.join(30)
    assert {name: status for name, (status, _) in results.items()} == {"slow": 200, "first": 200, "second": 200}
    assert results["first"][1]["translations"][0]["translation"] == cli_lines(model, [texts["first"]])[0]


def test_every_request_gets_one_log_line_and_no_traceback(server):
    call(server, "GET", "/v2/usage")
    log = server.stderr()
    assert '"GET /v2/usage" 200' in log
    assert '"POST /v2/translate" 413' in log
    assert "Traceback" not in log
    assert KEY not in log


def test_serve_without_its_extra_or_a_language_pair_is_one_line(model, monkeypatch):
    assert_one_line_error(run_cli(["serve", "-m", str(model)]), "does not record its languages; name the pair: -m de-en=")
    assert_one_line_error(run_cli(["serve", "-m", f"en-de={model}", "-m", f"EN-DE={model}"]), "two models serve en-de")
    assert_one_line_error(run_cli(["serve", "-m", f"en-de={model}", "--workers", "0"]), "--workers must be at least 1")
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    assert_one_line_error(run_cli(["serve", "-m", f"en-de={model}"]), r"pip install 'tfm-cli\[serve\]'")


def test_a_busy_port_is_one_line(server, model, data_dir):
    result = run_cli(["serve", "-m", f"en-de={model}", "--port", str(server.port), "--data-dir", data_dir])
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{server.port}")


def test_workers_share_the_port_and_the_glossaries_and_all_stop_on_sigterm(model, data_dir, keys_file, tmp_path):
    import re

    workers = Server(tmp_path / "workers", model, data_dir, keys_file, "--workers", "2")
    try:
        pid = workers.process.pid
        # /health answers once the first worker is up; the second is forked after it.
        deadline = time.monotonic() + 120
        while len(children := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(children) == 2
        while "listening on" not in workers.stderr() and time.monotonic() < deadline:  # said once both are ready
            time.sleep(0.1)
        glossary = deepl.Translator(KEY, server_url=workers.url).create_glossary("shared", "EN", "DE", {"dog": "hundo"})
        texts = sources(4, 120)
        expected = cli_lines(model, texts)
        readers: set[str] = set()
        for _ in range(64):  # each call is a new connection; the kernel gives it to either worker
            status, answer = call(workers, "POST", "/v2/translate", {"text": texts, "target_lang": "DE", "split_sentences": "0"})
            assert status == 200 and [t["text"] for t in answer["translations"]] == expected
            assert call(workers, "GET", f"/v2/glossaries/{glossary.glossary_id}")[0] == 200
            readers = set(re.findall(rf'worker (\d): \S+ "GET /v2/glossaries/{glossary.glossary_id}" 200', workers.stderr()))
            if readers == {"1", "2"}:
                break
        assert readers == {"1", "2"}  # a glossary made through one worker is read by both

        workers.marker.unlink(missing_ok=True)
        answer: dict[str, object] = {}
        thread = threading.Thread(target=lambda: answer.update(result=call(
            workers, "POST", "/v2/translate", {"text": [f"{SLOW_WORD} dog", *texts], "target_lang": "DE", "split_sentences": "0"})))
        thread.start()
        deadline = time.monotonic() + 30
        while not workers.marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert workers.marker.exists(), workers.stderr()
        workers.process.send_signal(signal.SIGTERM)
        thread.join(30)
        status, body = answer["result"]
        assert status == 200 and [t["text"] for t in body["translations"]][1:] == expected
        assert workers.process.wait(30) == 0, workers.stderr()
        assert not any(Path(f"/proc/{child}").exists() for child in children)
        assert "Traceback" not in workers.stderr()
    finally:
        workers.stop()


def test_a_model_the_workers_cannot_load_is_said_once(tmp_path, data_dir):
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(b"not a checkpoint")
    done = subprocess.run([sys.executable, "-m", "tfm_cli", "serve", "-m", f"de-en={damaged}", "--workers", "3", "--port", "0",
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("error:") == 1 and "not a safetensors file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# Last: it stops the module's server.

def test_sigterm_answers_the_request_in_flight_exits_0_and_a_restart_keeps_the_glossaries(
    server, translator, model, data_dir, keys_file, tmp_path
):
    glossary = translator.create_glossary("kept", "EN", "DE", {"cat": "hundo"})
    server.marker.unlink(missing_ok=True)
    texts = [f"{SLOW_WORD} cat", *sources(2, 100)]
    answer: dict[str, object] = {}

    def send() -> None:
        # http.client keeps the connection alive (urllib asks for Connection: close itself): the answer
        # must then say Connection: close, or a keep-alive client sends its next request into a closing socket.
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = json.dumps({"text": texts, "target_lang": "DE", "split_sentences": "0"})
        connection.request("POST", "/v2/translate", body, {"Authorization": f"DeepL-Auth-Key {KEY}", "Content-Type": "application/json"})
        response = connection.getresponse()
        answer["result"] = (response.status, json.loads(response.read()))
        answer["connection"] = response.getheader("Connection")
        connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.marker.exists(), server.stderr()
    server.process.send_signal(signal.SIGTERM)
    thread.join(30)
    status, body = answer["result"]
    assert status == 200, body
    assert [t["text"] for t in body["translations"]] == cli_lines(model, texts)
    assert answer["connection"] == "close"
    assert server.process.wait(30) == 0, server.stderr()
    log = server.stderr()
    assert "Traceback" not in log and "stopped: every accepted request was answered" in log

    restarted = Server(tmp_path / "restarted", model, data_dir, keys_file)
    try:
        again = deepl.Translator(KEY, server_url=restarted.url)
        assert again.get_glossary(glossary.glossary_id).name == "kept"
        assert again.get_glossary_entries(glossary.glossary_id) == {"cat": "hundo"}
        terms = tmp_path / "terms.tsv"
        terms.write_text("cat\thundo\n", encoding="utf-8")
        lines = ["the cat sees my dog", *sources(2, 110)]
        results = again.translate_text(lines, source_lang="EN", target_lang="DE", glossary=glossary.glossary_id)
        assert [r.text for r in results] == cli_lines(model, lines, "--glossary", terms, "--split-sentences", "--source-lang", "en")
    finally:
        restarted.stop()
    assert restarted.process.returncode == 0
    assert "Traceback" not in restarted.stderr()


def test_the_listening_socket_turns_nagles_algorithm_off_for_every_connection():
    # Without TCP_NODELAY an answer written in two parts (headers, body) waits for the client's delayed
    # ACK: ~40 ms on every keep-alive request. asyncio sets it only on sockets that say they are TCP.
    import asyncio

    from tfm_cli.commands.serve import listening_socket

    sock = listening_socket("127.0.0.1", 0)

    async def accepted_nodelay() -> int:
        seen: list[int] = []

        async def handle(reader, writer) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return seen[0]

    assert asyncio.run(accepted_nodelay()) != 0


def thread_count(pid: int) -> int:
    """The OS threads of process `pid` (Linux: one entry per thread under /proc/PID/task)."""
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


# With libgomp every thread that runs torch in parallel keeps its own team of OpenMP threads, and once
# a process's teams outnumber the cores every parallel region waits for a sleeping thread to wake
# (serving/torch_thread.py). These two tests count threads: they fail when a second team appears.
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads under /proc (Linux)")
def test_every_model_translates_in_the_one_torch_thread(tmp_path, model, keys_file):
    started = Server(tmp_path / "server", model, tmp_path / "data", keys_file, "--threads", "2")
    try:
        before = thread_count(started.process.pid)
        for target_lang in ("DE", "EN-US"):
            status, _ = call(started, "POST", "/v2/translate", {"text": [sources(1)[0]], "target_lang": target_lang})
            assert status == 200
            if target_lang == "DE":
                after_first_model = thread_count(started.process.pid)
        # The torch thread starts with the first translation, with one OpenMP thread beside it (2 threads);
        # the second model translates in the same thread and its team: no thread more.
        assert after_first_model == before + 2
        assert thread_count(started.process.pid) == after_first_model
    finally:
        started.stop()
    assert started.process.returncode == 0, started.stderr()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads under /proc (Linux)")
def test_loading_in_the_main_thread_starts_no_openmp_team(model):
    # What serve_in_this_process does before the models are used: keep_main_thread_single, then a load
    # and a translation in the main thread (a fresh process: pytest's own has teams of its own).
    script = f"""
import os, click, torch
from pathlib import Path
from tfm_cli.commands.serve import keep_main_thread_single
from tfm_cli.checkpoints.format import load_model
from tfm_cli.inference.settings import resolve_decode
from tfm_cli.inference.translation import BatchingConfig, TranslationStats, Translator
torch.set_num_threads(2)
count = lambda: len(os.listdir("/proc/self/task"))
with click.Context(click.Command("serve")) as ctx:
    before = count()
    threads = keep_main_thread_single(ctx)
    loaded = load_model(Path({str(model)!r}))
    Translator(loaded, resolve_decode({{}}, loaded.decode_defaults), BatchingConfig()).translate_chunk(
        ["the dog sees a cat"] * 20, 0, TranslationStats())
    print(threads, before, count())
print(torch.get_num_threads())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    given, before, after, restored = (int(value) for value in result.stdout.split())
    assert given == 2  # what the torch thread gets
    assert after == before  # the main thread ran torch without a team
    assert restored == 2  # the command's end gives the caller its threads back


def test_a_checkpoint_written_over_under_the_server_is_a_503_and_health_asks_for_a_restart(model, keys_file, tmp_path):
    # The server reads embedding rows from its checkpoint on first use; a file written over in place (as
    # `cp new old` does) is the server's problem, not the request's: 503, /health 503, one log line.
    import shutil
    import struct

    copy = tmp_path / "model.safetensors"
    shutil.copyfile(model, copy)
    server = Server(tmp_path / "server", copy, tmp_path / "data", keys_file)
    try:
        lines = sources(20)
        status, answer = call(server, "POST", "/v2/translate", {"text": lines[:1], "target_lang": "DE"})
        assert status == 200, answer
        with open(copy, "r+b") as file:  # every tensor byte changed, the header and the length kept
            (header_size,) = struct.unpack("<Q", file.read(8))
            file.seek(8 + header_size)
            data = bytes(byte ^ 0x55 for byte in file.read())
            file.seek(8 + header_size)
            file.write(data)
        status, answer = call(server, "POST", "/v2/translate", {"text": lines[1:], "target_lang": "DE"})
        assert status == 503, answer
        assert "must be restarted" in answer["message"]
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(f"{server.url}/health", timeout=10)
        assert health.value.code == 503
        assert json.loads(health.value.read())["status"] == "restart needed"
    finally:
        server.stop()
    log = server.stderr()
    assert "the checkpoint changed on disk while its model was in use" in log
    assert "Traceback" not in log
