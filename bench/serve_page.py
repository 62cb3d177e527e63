"""The web page of `tfm serve` in a real headless browser (Debian's chromium + chromedriver, driven by selenium).

Starts `tfm serve` with the given model on a free 127.0.0.1 port, with an API key, and checks:
the page loads without a key and lists the served pair; it asks for the key; a sentence typed and
translated (Translate button) shows the server's own translation; hovering a target word highlights
exactly the source words the alignment links it to; source text holding tags is shown as text; a
translation holding `<script>` and an `<img onerror>` (an answer substituted in the page's fetch, since
a model's vocabulary rarely has `<`) is shown as text, through Ctrl-Enter, and runs nothing. Takes a
screenshot with a word hovered. Exits 0 on success; 1 with one line saying what failed.

    apt-get install -y chromium chromium-driver && pip install selenium
    python bench/serve_page.py --model en-xx=runs/quickstart/average.safetensors \
        --sentence "my happy teacher sees two small dogs" --screenshot /tmp/serve_page.png

No driver is downloaded: selenium is given chromedriver's path (so Selenium Manager never runs).
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--window-size=1100,720",
)
# Tags in the source line: shown as text in the source row, never parsed.
TAGGED_SOURCE = '<script>window.__tfmInjected = 1</script> my dog <img src=x onerror="window.__tfmInjected = 2">'
# The substituted answer's translation: the words a hostile or broken model could emit.
HOSTILE_TRANSLATION = '<script>window.__tfmInjected = 3</script> <b>bold</b> <img src=x onerror="window.__tfmInjected = 4">'


class Failure(Exception):
    """A check that failed: its message is the script's one line of output."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failure(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tfm_command() -> list[str]:
    """`tfm` of this Python's environment."""
    found = Path(sys.executable).with_name("tfm")
    return [str(found)] if found.exists() else [sys.executable, "-m", "tfm_cli.cli"]


def http(url: str, data: dict | None = None, key: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request (a JSON body when `data`): status, headers, body."""
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if key is not None:
        headers["Authorization"] = f"DeepL-Auth-Key {key}"
    body = json.dumps(data).encode("utf-8") if data is not None else None
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


class Server:
    """`tfm serve` on 127.0.0.1 with one API key; stopped with SIGTERM."""

    def __init__(self, model: str, folder: Path, threads: int) -> None:
        self.key = secrets.token_hex(8)
        keys = folder / "keys.txt"
        keys.write_text(self.key + "\n", encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "serve.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*tfm_command(), "serve", "-m", model, "--port", str(self.port), "--api-keys", str(keys),
                 "--data-dir", str(folder / "data"), "--threads", str(threads)],
                stdout=subprocess.DEVNULL, stderr=log,
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Failure(f"tfm serve exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if http(f"{self.url}/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise Failure("tfm serve did not answer /health within 180 s")

    def log_tail(self) -> str:
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def browser(chromium: str, chromedriver: str, profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # A Service path: selenium uses this driver and never runs Selenium Manager (no download).
    return webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)


def wait_for(driver, what: str, condition, timeout: float = 60.0):
    """condition(driver) once it is truthy; Failure naming `what` after `timeout` s."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)
    except TimeoutException:
        status = driver.find_element("id", "status").text
        raise Failure(f"timed out waiting for {what} (page status: {status!r})") from None


def output_rows(driver) -> list[dict]:
    """Each output line's source and target text, and its words' texts and `aligned` classes."""
    return driver.execute_script("""
        return Array.from(document.querySelectorAll('#output .line')).map((line) => {
            const side = (cls) => {
                const p = line.querySelector('.' + cls);
                return {text: p.textContent, words: Array.from(p.querySelectorAll('.word')).map((w) => ({
                    text: w.textContent, aligned: w.classList.contains('aligned')}))};
            };
            return {src: side('src'), tgt: side('tgt')};
        });""")


def injected(driver) -> list[str]:
    """What an injection would have left: elements other than the page's own in #output, and the flag."""
    return driver.execute_script("""
        const found = Array.from(document.querySelectorAll('#output *'))
            .filter((n) => !(n.matches('div.line, p.src, p.tgt, p.warn, span.word'))).map((n) => n.tagName);
        if (window.__tfmInjected !== undefined) found.push('window.__tfmInjected=' + window.__tfmInjected);
        return found;""")


def translate_and_wait(driver, how: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.execute_script("document.getElementById('output').replaceChildren();")
    if how == "button":
        driver.find_element(By.ID, "translate").click()
    else:
        driver.find_element(By.ID, "source").send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for(driver, f"the translation ({how})", lambda d: d.find_elements(By.CSS_SELECTOR, "#output .line"))


def run_checks(args: argparse.Namespace, server: Server, driver) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    pair = args.model.split("=", 1)[0].lower()
    source_lang, target_lang = pair.split("-")

    status, headers, body = http(f"{server.url}/")
    check(status == 200 and headers.get("content-type", "").startswith("text/html"), f"GET / without a key: {status}")
    driver.get(f"{server.url}/")
    wait_for(driver, "the language pairs", lambda d: d.find_elements(By.CSS_SELECTOR, "#pair option"))
    pairs = [o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#pair option")]
    check(pair in pairs, f"the pair select lists {pairs}, not {pair}")
    key_box = driver.find_element(By.ID, "key-box")
    check(key_box.is_displayed(), "the API key field is not shown although the server has keys")

    # Without the key: the server's 403 message is shown, nothing is translated.
    source_box = driver.find_element(By.ID, "source")
    source_box.send_keys(args.sentence)
    driver.find_element(By.ID, "translate").click()
    wait_for(driver, "the 403 message", lambda d: "key" in d.find_element(By.ID, "status").text)
    check(not driver.find_elements(By.CSS_SELECTOR, "#output .line"), "a translation was shown without a key")

    # With the key: a sentence and a line of tags, by the Translate button.
    driver.find_element(By.ID, "key").send_keys(server.key)
    source_box.clear()
    source_box.send_keys(args.sentence + "\n" + TAGGED_SOURCE)
    translate_and_wait(driver, "button")
    status, _, body = http(f"{server.url}/tfm/translate", {"text": [args.sentence, TAGGED_SOURCE], "source_lang": source_lang,
                                                         "target_lang": target_lang}, server.key)
    check(status == 200, f"POST /tfm/translate answered {status}: {body[:200]!r}")
    records = json.loads(body)["translations"]
    rows = output_rows(driver)
    check(len(rows) == 2, f"{len(rows)} output lines for 2 input lines")
    for row, record in zip(rows, records):
        check(row["tgt"]["text"] == record["translation"], f"the page shows {row['tgt']['text']!r}, the server {record['translation']!r}")
        check(row["src"]["text"] == record["source"], f"the source row shows {row['src']['text']!r}, not {record['source']!r}")
    check(TAGGED_SOURCE in rows[1]["src"]["text"], "the tagged source line is not shown as text")
    check(not injected(driver), f"the tagged source line made elements or ran code: {injected(driver)}")

    # Hover each target word of the sentence: the source words marked are the alignment's links.
    record = records[0]
    links: dict[int, set[int]] = {}
    for link in (record.get("alignment") or "").split():
        s, t = map(int, link.split("-"))
        links.setdefault(t, set()).add(s)
    check(bool(links), f"the server gave no alignment for {args.sentence!r}")
    target_words = driver.find_elements(By.CSS_SELECTOR, "#output .line:first-child .tgt .word")
    check(len(target_words) == len(record["target_words"]), f"{len(target_words)} target word spans, {len(record['target_words'])} in the record")
    shown = None
    for t, word in enumerate(target_words):
        ActionChains(driver).move_to_element(word).perform()
        marked = {s for s, w in enumerate(output_rows(driver)[0]["src"]["words"]) if w["aligned"]}
        check(marked == links.get(t, set()), f"hovering target word {t} ({word.text!r}) marks source words {sorted(marked)}, "
                                             f"the alignment says {sorted(links.get(t, set()))}")
        if shown is None and links.get(t) and links[t] != {t}:
            shown = t  # the screenshot's word: one aligned out of place, so the picture shows the alignment
    ActionChains(driver).move_to_element(target_words[shown if shown is not None else 0]).perform()
    Path(args.screenshot).parent.mkdir(parents=True, exist_ok=True)
    check(driver.save_screenshot(str(args.screenshot)), f"could not write the screenshot {args.screenshot}")

    # A translation holding <script> and <img onerror>, by Ctrl-Enter: the answer is substituted once in
    # the page's fetch, with the record fields the server sends.
    words = HOSTILE_TRANSLATION.split(" ")
    offsets, at = [], 0
    for w in words:
        offsets.append([at, at + len(w)])
        at += len(w) + 1
    hostile = {"translations": [{"source": "my dog", "translation": HOSTILE_TRANSLATION, "alignment": "0-0 1-1 1-2",
                                 "source_words": [[0, 2], [3, 6]], "target_words": offsets}], "warnings": [[]]}
    driver.execute_script("""
        const answer = arguments[0], real = window.fetch;
        window.fetch = (url, init) => {
            window.fetch = real;
            return real(url, init).then(() => new Response(JSON.stringify(answer), {headers: {'Content-Type': 'application/json'}}));
        };""", hostile)
    source_box.clear()
    source_box.send_keys("my dog")
    translate_and_wait(driver, "ctrl-enter")
    rows = output_rows(driver)
    check(rows and rows[0]["tgt"]["text"] == HOSTILE_TRANSLATION, f"the <script> translation shows as {rows[0]['tgt']['text']!r}" if rows else "no output")
    time.sleep(0.3)  # an onerror would have fired by now
    check(not injected(driver), f"a translation holding tags made elements or ran code: {injected(driver)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="PAIR=CHECKPOINT as `tfm serve -m` takes it, e.g. en-xx=average.safetensors")
    parser.add_argument("--sentence", default="my happy teacher sees two small dogs", help="A source sentence to translate.")
    parser.add_argument("--screenshot", type=Path, required=True, help="Where to write the PNG.")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="The browser binary.")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver", help="The driver binary (never downloaded).")
    parser.add_argument("--threads", type=int, default=1, help="tfm serve --threads.")
    args = parser.parse_args()
    if "=" not in args.model:
        print(f"FAILED: --model {args.model}: give PAIR=CHECKPOINT, e.g. en-xx={args.model}", file=sys.stderr)
        return 1
    for binary in (args.chromium, args.chromedriver):
        if shutil.which(binary) is None:
            print(f"FAILED: {binary} not found (apt-get install -y chromium chromium-driver)", file=sys.stderr)
            return 1
    server = driver = None
    with tempfile.TemporaryDirectory(prefix="tfm-serve-page-") as folder:
        try:
            server = Server(args.model, Path(folder), args.threads)
            driver = browser(args.chromium, args.chromedriver, Path(folder) / "profile")
            run_checks(args, server, driver)
            driver.quit()
            driver = None
            code = server.stop()
            check(code == 0, f"tfm serve exited with {code} after SIGTERM: {server.log_tail()}")
            log = server.log_path.read_text(encoding="utf-8", errors="replace")
            check("Traceback" not in log, "tfm serve's log holds a traceback")
        except Failure as failure:
            print(f"FAILED: {failure}", file=sys.stderr)
            return 1
        except Exception as error:  # noqa: BLE001 (the browser or the driver itself: still one line)
            first = (str(error).strip().splitlines() or [""])[0]
            print(f"FAILED: {type(error).__name__}: {first}", file=sys.stderr)
            return 1
        finally:
            if driver is not None:
                driver.quit()
            if server is not None:
                server.stop()
    print(f"ok: the page translated, highlighted the aligned source words, showed tags as text; screenshot {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
