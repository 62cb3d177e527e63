"""One client's latency on `tfm serve` with two models loaded, before and after the second one has translated.

Starts `tfm serve -m PAIR=CHECKPOINT -m SECOND=CHECKPOINT` (the same checkpoint under a second language
pair) on a free loopback port, sends --requests one-sentence LibreTranslate `/translate` requests to the
first pair one after another (after a few to warm up) and takes their median, then a few requests to the
second pair, then the first pair's median again. Where each model translated in a thread of its own,
with its own OpenMP team, the second median was about twice the first (serving/torch_thread.py).
Prints a markdown table with the date, the command and the `lscpu` flags. Nothing here is a test.

    python bench/serve_two_models.py --model de-en=runs/multi30k-de-en/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import free_port, lscpu_model, table  # noqa: E402


def translate(port: int, source: str, text: str) -> float:
    """Seconds one LibreTranslate request took; raises RuntimeError unless it was answered 200."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/translate", body=json.dumps({"q": text, "source": source, "target": "en"}),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"/translate answered {response.status}")
    return time.perf_counter() - started


def wait_until_healthy(port: int, process: subprocess.Popen, seconds: float = 120) -> None:
    """Return once /health answers 200; RuntimeError when the server exits or the time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tfm serve exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("tfm serve did not answer /health in time")


def median_ms(port: int, source: str, lines: list[str]) -> float:
    """The median milliseconds of one request per line, one after another."""
    return statistics.median(translate(port, source, line) for line in lines) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="PAIR=CHECKPOINT, as `tfm serve -m` takes it")
    parser.add_argument("--second-pair", default="fr-en", help="the language pair the same checkpoint is served as too")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2, help="tfm serve --threads")
    args = parser.parse_args()
    pair, checkpoint = args.model.split("=", 1)
    first_source, second_source = pair.split("-")[0], args.second_pair.split("-")[0]
    lines = [line.rstrip("\n") for line in open(args.source, encoding="utf-8") if line.strip()]
    measured = lines[100 : 100 + args.requests]
    port = free_port()
    started = datetime.datetime.now(datetime.timezone.utc)
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "serve", "-m", args.model, "-m", f"{args.second_pair}={checkpoint}",
         "--port", str(port), "--threads", str(args.threads), "--quiet"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until_healthy(port, process)
        for line in lines[:10]:
            translate(port, first_source, line)
        alone = median_ms(port, first_source, measured)
        for line in lines[:10]:
            translate(port, second_source, line)
        after_second = median_ms(port, first_source, measured)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/serve_two_models.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {cpu_flags()}\n")
    print(table(["first pair's one-sentence requests", "p50 ms"],
                [[f"only the first model has translated ({args.requests} requests)", f"{alone:.1f}"],
                 [f"after the second model ({args.second_pair}) translated 10 lines", f"{after_second:.1f}"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
