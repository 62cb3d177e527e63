"""Load, overload, soak and SIGTERM runs against `tfm serve`, from a bounded asyncio client on 127.0.0.1.

Starts `tfm serve -m PAIR=CHECKPOINT` on a free loopback port and sends DeepL `/v2/translate` requests
(`split_sentences=0`: each sentence translated whole, as `tfm translate` does) of sentences drawn in
order from --source. Prints markdown tables with the date, the command and the `lscpu` flags line.

- sweep (unless --no-sweep): per request size (--sizes, default 1 and 20 sentences) and concurrency
  (--levels, default 1, 8, 64 closed-loop clients), --duration s each (default 60): requests/s,
  sentences/s, failed requests, p50/p90/p99 latency, CPU seconds of server and client per second;
  then the same sentences through `tfm translate -i FILE` in one process (its own lines/s, which counts
  translating only) as the reference, and each level's ratio to it; server RSS (/proc/PID/status
  VmRSS) after start, after warm-up and at the end.
- --overload S: the sustainable rate measured (--calibration-clients, default 64, 1 sentence), then ~4x it offered open-loop for
  S seconds, each request on its own connection: share answered 429/503 and their latency (goal < 100
  ms), whether every accepted request succeeded, and whether the server answers normally afterwards.
- --soak MINUTES: a fresh server, --soak-level clients, RSS sampled every --sample-s s (default 30):
  start, end, max.
- --sigterm: a fresh server under --soak-level clients, SIGTERM after --sigterm-after s: every request the
  server accepted (its log's lines) is answered 200, clients then find the port closed, exit code 0.

Every loop is bounded by time and by count (--max-requests per measurement). Nothing here is a test;
figures belong in bench/RESULTS.md, measured on a quiet machine.

    python bench/serve_load.py --model de-en=runs/multi30k/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de --threads 2
    python bench/serve_load.py --model en-xx=runs/quickstart/average.safetensors \\
        --source runs/quickstart/data/test.src --duration 3 --levels 1,8 --overload 5 --sigterm
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from prepare_corpus import cpu_flags

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REQUEST_TIMEOUT_S = 120.0  # one request, connect to last byte
STARTUP_TIMEOUT_S = 180.0
LOG_LINE = re.compile(r'"POST /v2/translate" (\d+) ')


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# The client: HTTP/1.1 over asyncio streams, keep-alive, a JSON body out, a Content-Length body back.
# (No client library: on a 2-core machine every client cycle is taken from the server.)

class Dropped(Exception):
    """The connection closed (or reset) before a whole answer came back."""


class Connection:
    """One keep-alive HTTP/1.1 connection to the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, close: bool = False) -> tuple[int, bytes]:
        """(status, body). ConnectionRefusedError: nothing listens; Dropped: closed mid-exchange."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
        try:
            self.writer.write(head.encode("ascii") + body)
            await self.writer.drain()
            status_line = await self.reader.readline()
            if not status_line:
                raise Dropped("closed before the status line")
            status = int(status_line.split()[1])
            length, keep = 0, not close
            while True:
                line = await self.reader.readline()
                if not line:
                    raise Dropped("closed in the headers")
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection" and value == "close":
                    keep = False
            answer = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as error:
            self.close()
            raise Dropped(type(error).__name__) from None
        if not keep:
            self.close()
        return status, answer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Result:
    started: float  # time.perf_counter() at the request's start
    latency_s: float
    status: int  # 0: no HTTP answer (see error)
    error: str = ""  # "refused", "dropped: ...", "timeout", "wrong answer"


@dataclass
class Sentences:
    """The source lines, handed out in order (cycling), `size` at a time."""

    lines: list[str]
    at: int = 0

    def take(self, size: int) -> list[str]:
        batch = [self.lines[(self.at + i) % len(self.lines)] for i in range(size)]
        self.at = (self.at + size) % len(self.lines)
        return batch


@dataclass
class Target:
    """Where requests go and in which API: DeepL's /v2/translate (split_sentences=0), or LibreTranslate's
    /translate (q as a list; each line translated whole), which LibreTranslate itself serves too."""

    port: int
    source_lang: str
    target_lang: str
    api: str = "deepl"

    @property
    def path(self) -> str:
        return "/v2/translate" if self.api == "deepl" else "/translate"

    def body(self, texts: list[str]) -> bytes:
        if self.api == "libretranslate":
            return json.dumps({"q": texts, "source": self.source_lang.lower(), "target": self.target_lang.lower(),
                               "format": "text"}).encode("utf-8")
        return json.dumps({"text": texts, "source_lang": self.source_lang, "target_lang": self.target_lang,
                           "split_sentences": "0"}).encode("utf-8")

    def count(self, answer: bytes) -> int:
        """How many translations an answer holds (-1 when it is not the API's shape)."""
        try:
            decoded = json.loads(answer)
            found = decoded["translations"] if self.api == "deepl" else decoded["translatedText"]
        except (ValueError, KeyError, TypeError):
            return -1
        return len(found) if isinstance(found, list) else -1


async def one_request(connection: Connection, target: Target, texts: list[str], close: bool = False) -> Result:
    started = time.perf_counter()
    try:
        status, answer = await asyncio.wait_for(connection.post(target.path, target.body(texts), close), REQUEST_TIMEOUT_S)
    except ConnectionRefusedError:
        return Result(started, time.perf_counter() - started, 0, "refused")
    except Dropped as error:
        return Result(started, time.perf_counter() - started, 0, f"dropped: {error}")
    except TimeoutError:
        connection.close()
        return Result(started, time.perf_counter() - started, 0, "timeout")
    latency = time.perf_counter() - started
    if status == 200 and target.count(answer) != len(texts):
        return Result(started, latency, status, "wrong answer")
    return Result(started, latency, status)


async def closed_loop(target: Target, sentences: Sentences, clients: int, size: int, duration_s: float,
                      max_requests: int, stop: asyncio.Event | None = None, until_refused: bool = False) -> list[Result]:
    """`clients` clients, each sending its next request when the last is answered, for `duration_s` s or
    `max_requests` requests in all (or, with `until_refused`, until `stop` is set and each client found
    the port closed)."""
    results: list[Result] = []
    deadline = time.perf_counter() + duration_s

    async def client() -> None:
        connection = Connection(target.port)
        try:
            while time.perf_counter() < deadline and len(results) < max_requests:
                result = await one_request(connection, target, sentences.take(size))
                results.append(result)
                if until_refused and stop is not None and stop.is_set() and result.error == "refused":
                    return
                if result.status == 0 and result.error != "refused":
                    connection.close()
                if result.error == "refused":
                    await asyncio.sleep(0.01)
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return results


async def open_loop(target: Target, sentences: Sentences, rate: float, size: int, duration_s: float,
                    max_in_flight: int) -> tuple[list[Result], int]:
    """Requests started at `rate` per second for `duration_s` s, each on its own connection, whatever the
    answers (at most `max_in_flight` open; those not started are counted). Returns (results, skipped)."""
    results: list[Result] = []
    tasks: set[asyncio.Task] = set()
    skipped = sent = 0
    start = time.perf_counter()
    total = int(rate * duration_s)

    async def send(texts: list[str]) -> None:
        results.append(await one_request(Connection(target.port), target, texts, close=True))

    while sent + skipped < total:
        due = start + (sent + skipped) / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= max_in_flight:
            skipped += 1
            continue
        task = asyncio.create_task(send(sentences.take(size)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    if tasks:
        await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 10)
    return results, skipped


# The server process.

def tfm_command() -> list[str]:
    found = Path(sys.executable).with_name("tfm")
    return [str(found)] if found.exists() else [sys.executable, "-m", "tfm_cli.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_children(pid: int) -> list[int]:
    """`pid` and its child processes (the workers of `tfm serve --workers N`)."""
    try:
        return [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    except OSError:
        return [pid]


def rss_mib(pid: int) -> float:
    """VmRSS of process `pid` and its children in MiB, summed (0 when it is gone)."""
    total = 0.0
    for process in with_children(pid):
        try:
            for line in Path(f"/proc/{process}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its children so far (their threads included)."""
    total = 0.0
    for process in with_children(pid):
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            pass
    return total


class Server:
    """`tfm serve` on 127.0.0.1, its stderr in a file."""

    def __init__(self, args: argparse.Namespace, folder: Path, name: str, quiet: bool) -> None:
        self.port = free_port()
        self.log_path = folder / f"{name}.log"
        command = [*tfm_command(), "serve", "-m", args.model, "--port", str(self.port), "--threads", str(args.threads),
                   "--data-dir", str(folder / "data"), *shlex.split(args.serve_options)]
        if quiet:
            command.append("--quiet")
        self.command = command
        with open(self.log_path, "wb") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"tfm serve exited with {self.process.returncode}: {self.log()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return  # models load before the port listens
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise SystemExit(f"tfm serve did not listen within {STARTUP_TIMEOUT_S:.0f} s")

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


# Figures and tables.

def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name:")), "?")


@dataclass
class Measured:
    clients: int
    size: int
    results: list[Result]
    wall_s: float
    server_cpu_s: float
    client_cpu_s: float
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.status == 200 and not r.error]

    def row(self, reference_rate: float | None) -> list[object]:
        ok, failed = self.ok, len(self.results) - len(self.ok)
        latencies = [r.latency_s for r in ok]
        sentences_per_s = len(ok) * self.size / self.wall_s
        ratio = f"{sentences_per_s / reference_rate:.2f}" if reference_rate else "-"
        return [self.size, self.clients, len(self.results), failed, f"{len(ok) / self.wall_s:.1f}", f"{sentences_per_s:.1f}",
                ratio, ms(percentile(latencies, 50)), ms(percentile(latencies, 90)), ms(percentile(latencies, 99)),
                f"{self.server_cpu_s / self.wall_s:.2f}", f"{self.client_cpu_s / self.wall_s:.2f}"]


def failure_counts(results: list[Result]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        if r.status != 200 or r.error:
            key = r.error or f"HTTP {r.status}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def measure(target: Target, sentences: Sentences, server: Server, clients: int, size: int, duration_s: float,
            max_requests: int) -> Measured:
    cpu0, client0, t0 = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
    results = asyncio.run(closed_loop(target, sentences, clients, size, duration_s, max_requests))
    wall = time.perf_counter() - t0
    return Measured(clients, size, results, wall, cpu_seconds(server.pid) - cpu0, time.process_time() - client0,
                    failure_counts(results))


def reference_rate(args: argparse.Namespace, lines: list[str], folder: Path) -> tuple[float, float]:
    """`tfm translate -i FILE` on `lines` in one process: (its lines/s, translating only; its wall time)."""
    source = folder / "reference.src"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    command = [*tfm_command(), "translate", "-m", args.model.split("=", 1)[1], "-i", str(source), "-o", str(folder / "reference.hyp"),
               "--threads", str(args.reference_threads or args.threads)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.reference_timeout, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the reference `tfm translate` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    match = re.search(r"translated \d+ lines .* in [\d.]+ s: ([\d.]+) lines/s", done.stderr)
    return (float(match.group(1)) if match else len(lines) / wall), wall


# The runs.

def run_sweep(args, target, sentences, server, folder, out, checks) -> None:
    rss = {"after start": rss_mib(server.pid)}
    log("warm-up: 8 clients, 1 sentence, 2 s")
    measure(target, sentences, server, 8, 1, 2.0, args.max_requests)
    rss["after warm-up"] = rss_mib(server.pid)
    measured = []
    for size in args.sizes:
        for clients in args.levels:
            log(f"measuring {clients} client(s), {size} sentence(s) per request, {args.duration:g} s")
            measured.append(measure(target, sentences, server, clients, size, args.duration, args.max_requests))
    rss["end"] = rss_mib(server.pid)
    log(f"reference: tfm translate -i on {len(sentences.lines)} lines")
    rate, wall = reference_rate(args, sentences.lines, folder)
    out.append(f"\n### Load (closed loop, DeepL /v2/translate, split_sentences=0; {args.duration:g} s per row)\n")
    out.append(table(["sentences/request", "clients", "requests", "failed", "requests/s", "sentences/s", "x reference",
                      "p50 ms", "p90 ms", "p99 ms", "server CPU s/s", "client CPU s/s"],
                     [m.row(rate) for m in measured]))
    failures = {f"{m.size}x{m.clients}": m.failures for m in measured if m.failures}
    if failures:
        out.append(f"\nFailures by kind: {json.dumps(failures)}")
    out.append(f"\nReference: `tfm translate -i` on the same {len(sentences.lines)} lines, --threads {args.reference_threads or args.threads}, one process: "
               f"{rate:.1f} lines/s translating ({wall:.1f} s wall with start-up).\n")
    out.append(table(["server RSS", "MiB"], [[k, f"{v:.0f}"] for k, v in rss.items()]))
    checks.append(("no failed requests in the sweep", not failures))


def run_overload(args, target, sentences, server, out, checks) -> None:
    calibration_s = min(10.0, max(3.0, args.duration))
    clients = args.calibration_clients
    log(f"overload: the sustainable rate ({clients} clients, 1 sentence, {calibration_s:g} s)")
    calibrated = measure(target, sentences, server, clients, 1, calibration_s, args.max_requests)
    sustainable = len(calibrated.ok) / calibrated.wall_s
    baseline_p50 = percentile([r.latency_s for r in calibrated.ok], 50)
    offered = args.overload_factor * sustainable
    log(f"overload: offering {offered:.0f} requests/s for {args.overload:g} s")
    cpu0, client0, t0 = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
    results, skipped = asyncio.run(open_loop(target, sentences, offered, 1, args.overload, args.max_in_flight))
    wall = time.perf_counter() - t0
    server_cpu, client_cpu = (cpu_seconds(server.pid) - cpu0) / wall, (time.process_time() - client0) / wall
    refused = [r for r in results if r.status in (429, 503)]
    answered = [r for r in results if r.status == 200 and not r.error]
    other = [r for r in results if r.status not in (200, 429, 503) or r.error]
    time.sleep(1.0)
    log("overload: after the load, 20 requests from 1 client")
    after = measure(target, sentences, server, 1, 1, 60.0, 20)
    refused_ms = [r.latency_s for r in refused]
    within = sum(1 for v in refused_ms if v < 0.1)
    out.append(f"\n### Overload ({args.overload_factor:g}x the sustainable rate, open loop, one connection per request, {args.overload:g} s)\n")
    out.append(table(["what", "value"], [
        [f"sustainable rate ({clients} clients, 1 sentence)", f"{sustainable:.1f} requests/s (p50 {ms(baseline_p50)} ms)"],
        ["offered", f"{offered:.1f} requests/s, {len(results)} sent, {skipped} not sent (over {args.max_in_flight} open)"],
        ["answered 200", (f"{len(answered)} ({len(answered) / max(1, len(results)):.0%}), {len(answered) / wall:.1f}/s, "
                          f"p50 {ms(percentile([r.latency_s for r in answered], 50))} ms, p99 {ms(percentile([r.latency_s for r in answered], 99))} ms")],
        ["refused 429/503", f"{len(refused)} ({len(refused) / max(1, len(results)):.0%})"],
        ["refusal latency p50 / p90 / p99 / max ms", " / ".join(ms(percentile(refused_ms, q)) for q in (50, 90, 99)) + f" / {ms(max(refused_ms, default=float('nan')))}"],
        ["refusals within 100 ms", f"{within} of {len(refused)}"],
        ["other outcomes", json.dumps(failure_counts(other)) if other else "none"],
        ["CPU s per s: server / client", f"{server_cpu:.2f} / {client_cpu:.2f}"],
        ["after the load: 20 requests, 1 client", f"{len(after.ok)} x 200, p50 {ms(percentile([r.latency_s for r in after.ok], 50))} ms"],
    ]))
    checks.append(("overload: every accepted request succeeded", not other))
    checks.append(("overload: refusals within 100 ms (p99)", bool(refused) and percentile(refused_ms, 99) < 0.1))
    checks.append(("overload: the server answers normally afterwards", len(after.ok) == 20))


def run_soak(args, target, sentences, folder, out, checks) -> None:
    server = Server(args, folder, "soak", quiet=True)
    try:
        total_s = args.soak * 60
        log(f"soak: {args.soak_level} clients, {args.soak:g} min, RSS every {args.sample_s:g} s")
        samples = [(0.0, rss_mib(server.pid), 0)]
        results: list[Result] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < total_s and len(results) < args.max_requests * 100:
            window = min(args.sample_s, total_s - (time.perf_counter() - t0))
            results += asyncio.run(closed_loop(target_for(server, target), sentences, args.soak_level, args.sizes[0], window,
                                               args.max_requests))
            samples.append((time.perf_counter() - t0, rss_mib(server.pid), len(results)))
        failures = failure_counts(results)
        values = [rss for _, rss, _ in samples]
        out.append(f"\n### Soak ({args.soak_level} clients, {args.sizes[0]} sentence(s) per request, {args.soak:g} min)\n")
        out.append(table(["s", "RSS MiB", "requests so far"], [[f"{t:.0f}", f"{rss:.0f}", n] for t, rss, n in samples]))
        out.append(f"\nRSS start {values[0]:.0f} MiB, end {values[-1]:.0f} MiB, max {max(values):.0f} MiB; "
                   f"{len(results)} requests, failed: {json.dumps(failures) if failures else 0}.")
        checks.append(("soak: no failed requests", not failures))
    finally:
        server.stop()


def target_for(server: Server, target: Target) -> Target:
    return Target(server.port, target.source_lang, target.target_lang, target.api)


def run_sigterm(args, target, sentences, folder, out, checks) -> None:
    server = Server(args, folder, "sigterm", quiet=False)  # its log counts the requests it accepted
    mine = target_for(server, target)

    async def scenario() -> tuple[list[Result], float]:
        stop = asyncio.Event()
        load = asyncio.create_task(closed_loop(mine, sentences, args.soak_level, args.sizes[0], args.sigterm_after + 60,
                                               args.max_requests, stop, until_refused=True))
        await asyncio.sleep(args.sigterm_after)
        signalled = time.perf_counter()
        server.process.send_signal(signal.SIGTERM)
        stop.set()
        return await load, signalled

    results, signalled = asyncio.run(scenario())
    try:
        code = server.process.wait(60)
    except subprocess.TimeoutExpired:
        code = server.stop()
    logged = [int(status) for status in LOG_LINE.findall(server.log())]
    answered = [r for r in results if r.status == 200 and not r.error]
    after = [r for r in answered if r.started >= signalled]
    kinds = failure_counts(results)
    refused = kinds.pop("refused", 0)
    dropped = {k: v for k, v in kinds.items() if k.startswith("dropped")}
    others = {k: v for k, v in kinds.items() if not k.startswith("dropped")}
    out.append(f"\n### SIGTERM under load ({args.soak_level} clients, signal after {args.sigterm_after:g} s)\n")
    out.append(table(["what", "value"], [
        ["requests the server accepted (its log)", f"{len(logged)}, statuses {sorted(set(logged))}"],
        ["answered 200 to the clients", f"{len(answered)} ({len(after)} of them sent after the signal)"],
        ["connections refused after the signal (not accepted)", refused],
        ["closed by the server before it read the request (not in its log)", json.dumps(dropped) if dropped else 0],
        ["other outcomes", json.dumps(others) if others else "none"],
        ["exit code", code],
    ]))
    checks.append(("sigterm: every accepted request answered 200", len(logged) == len(answered) and set(logged) <= {200} and not others))
    checks.append(("sigterm: exit code 0", code == 0))
    checks.append(("sigterm: no traceback in the log", "Traceback" not in server.log()))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--model", required=True, help="PAIR=CHECKPOINT, as `tfm serve -m` takes it.")
    parser.add_argument("--source", type=Path, required=True, help="Source sentences, one per line (e.g. test_2016_flickr.de).")
    parser.add_argument("--lines", type=int, default=1000, help="Use the first N non-empty lines of --source.")
    parser.add_argument("--levels", default="1,8,64", help="Concurrent clients, comma-separated.")
    parser.add_argument("--sizes", default="1,20", help="Sentences per request, comma-separated.")
    parser.add_argument("--duration", type=float, default=60.0, help="Seconds per (size, clients) row.")
    parser.add_argument("--max-requests", type=int, default=200_000, help="Requests per measurement at most.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="--threads of tfm serve and of the reference tfm translate.")
    parser.add_argument("--serve-options", default="", help="More `tfm serve` options, e.g. '--queue-size 64 --batch-wait-ms 5'.")
    parser.add_argument("--reference-threads", type=int, default=0,
                        help="--threads of the reference tfm translate (default: --threads), e.g. 2 beside --threads 1 --serve-options '--workers 2'.")
    parser.add_argument("--no-sweep", action="store_true", help="Skip the levels x sizes sweep and its reference.")
    parser.add_argument("--overload", type=float, default=0.0, metavar="S", help="Run the overload check for S seconds.")
    parser.add_argument("--overload-factor", type=float, default=4.0, help="Offered rate / sustainable rate.")
    parser.add_argument("--calibration-clients", type=int, default=64,
                        help="Closed-loop clients whose throughput is the overload run's sustainable rate (full batches).")
    parser.add_argument("--max-in-flight", type=int, default=2000, help="Open requests at most in the overload run.")
    parser.add_argument("--soak", type=float, default=0.0, metavar="MINUTES", help="Run the soak for MINUTES.")
    parser.add_argument("--soak-level", type=int, default=8, help="Clients of the soak and the SIGTERM run.")
    parser.add_argument("--sample-s", type=float, default=30.0, help="Seconds between the soak's RSS samples.")
    parser.add_argument("--sigterm", action="store_true", help="Run the SIGTERM-under-load check.")
    parser.add_argument("--sigterm-after", type=float, default=3.0, help="Seconds of load before SIGTERM.")
    parser.add_argument("--reference-timeout", type=float, default=3600.0, help="Seconds the reference tfm translate may take.")
    args = parser.parse_args()
    args.levels = [int(v) for v in args.levels.split(",") if v.strip()]
    args.sizes = [int(v) for v in args.sizes.split(",") if v.strip()]
    if not re.match(r"^[A-Za-z]{2,3}-[A-Za-z]{2,3}=.", args.model):
        parser.error(f"--model {args.model}: give PAIR=CHECKPOINT, e.g. de-en={args.model}")
    if not args.levels or not args.sizes or min(args.levels + args.sizes) < 1:
        parser.error("--levels and --sizes need positive integers")
    return args


def main() -> int:
    args = parse_args()
    lines = [line.strip() for line in args.source.read_text(encoding="utf-8").splitlines() if line.strip()][: args.lines]
    if not lines:
        raise SystemExit(f"--source {args.source}: no lines")
    pair = args.model.split("=", 1)[0].lower()
    source_lang, target_lang = pair.split("-")
    sentences = Sentences(lines)
    out = [
        f"## tfm serve under load, {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}\n",
        f"Command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"CPU: {lscpu_model()}, {os.cpu_count()} logical CPUs; server and client on the same machine.  ",
        f"`lscpu` flags: {cpu_flags()}  ",
        f"Model {args.model}, {len(lines)} source lines from {args.source}, tfm serve --threads {args.threads} {args.serve_options}".rstrip(),
    ]
    checks: list[tuple[str, bool]] = []
    with tempfile.TemporaryDirectory(prefix="tfm-serve-load-") as name:
        folder = Path(name)
        if not args.no_sweep or args.overload:
            server = Server(args, folder, "load", quiet=True)
            target = Target(server.port, source_lang, target_lang)
            try:
                if not args.no_sweep:
                    run_sweep(args, target, sentences, server, folder, out, checks)
                if args.overload:
                    run_overload(args, target, sentences, server, out, checks)
            finally:
                server.stop()
        target = Target(0, source_lang, target_lang)
        if args.soak:
            run_soak(args, target, sentences, folder, out, checks)
        if args.sigterm:
            run_sigterm(args, target, sentences, folder, out, checks)
    out.append("\n### Checks\n")
    out.append(table(["check", "result"], [[name, "pass" if passed else "FAIL"] for name, passed in checks]))
    print("\n".join(out))
    return 0 if all(passed for _, passed in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
