"""`tfm serve` beside LibreTranslate serving the same model, through the same LibreTranslate API, on the
same sentences and machine: requests/s and latency at each load level, one server at a time.

LibreTranslate runs Argos Translate packages: a CTranslate2 model, a sentencepiece model and
metadata.json. The package is built here from the tfm checkpoint (`tfm export --to ctranslate2`, the
checkpoint's own sentencepiece model), so both servers hold the same weights. LibreTranslate comes from
its own virtual environment (--libretranslate-python; its pinned dependencies do not sit beside tfm's)
and is started by a small wrapper that changes two things, both needed because this machine reaches no
site but the package registries: MiniSBD's sentence model (downloaded from GitHub on first use) is
replaced by a splitter that returns its text whole (each request here is one Multi30k sentence, which
it would not split either; this only spares LibreTranslate the model's cost), and the start-up check
for new language packages is skipped. LibreTranslate's beam is set to the model's own (ARGOS_BEAM_SIZE);
its length penalty stays Argos's (0.2, CTranslate2's length normalisation), tfm keeps the model's
(GNMT); so the table also gives each server's BLEU on the sentences it translated.

    /work/ltvenv/bin/pip install libretranslate        # once, in a venv of its own
    python bench/serve_vs_libretranslate.py --model de-en=runs/multi30k-de-en/average.safetensors \\
        --source ../shared/data/multi30k/test_2016_flickr.de --reference ../shared/data/multi30k/test_2016_flickr.en \\
        --libretranslate-python /work/ltvenv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_corpus import cpu_flags  # noqa: E402
from serve_load import (  # noqa: E402
    Connection, Sentences, Server, Target, closed_loop, cpu_seconds, free_port, lscpu_model, ms,
    percentile, table, tfm_command,
)

STARTUP_TIMEOUT_S = 180
WRAPPER = """
import sys
from argostranslate import sbd
sbd.MiniSBDSentencizer.__init__ = lambda self, pkg: None
sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]
import libretranslate.init
libretranslate.init.check_and_install_models = lambda *args, **kwargs: None
from libretranslate.main import main
sys.argv = ["libretranslate", *sys.argv[1:]]
main()
"""


def build_argos_package(checkpoint: str, source: str, target: str, folder: Path) -> Path:
    """An installed Argos Translate package of `checkpoint` under `folder` (the packages folder)."""
    import torch

    from tfm_cli.checkpoints.format import load_model

    package = folder / f"{source}_{target}"
    package.mkdir(parents=True)
    done = subprocess.run([*tfm_command(), "export", "-m", checkpoint, "--to", "ctranslate2", str(package / "model")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tfm export --to ctranslate2 failed: {done.stderr.strip()}")
    loaded = load_model(checkpoint, device=torch.device("cpu"))
    (package / "sentencepiece.model").write_bytes(loaded.src_tokenizer.model_bytes)
    names = {"de": "German", "en": "English", "fr": "French", "es": "Spanish"}
    metadata = {"package_version": "1.0", "argos_version": "1.0", "from_code": source, "from_name": names.get(source, source),
                "to_code": target, "to_name": names.get(target, target), "type": "translate",
                "package_name": f"tfm {source}-{target}", "description": f"exported from {checkpoint}"}
    (package / "metadata.json").write_text(json.dumps(metadata, indent=1), encoding="utf-8")
    return package


class LibreTranslate:
    """LibreTranslate on 127.0.0.1 with the packages in `packages`, its stderr in a file."""

    def __init__(self, python: str, packages: Path, folder: Path, source: str, target: str, beam: int, threads: int,
                 extra_env: dict[str, str]) -> None:
        self.port = free_port()
        self.log_path = folder / "libretranslate.log"
        env = {**os.environ, "ARGOS_PACKAGES_DIR": str(packages), "ARGOS_BEAM_SIZE": str(beam),
               "HOME": str(folder), "XDG_DATA_HOME": str(folder / "data"), "XDG_CACHE_HOME": str(folder / "cache"), **extra_env}
        command = [python, "-c", WRAPPER, "--host", "127.0.0.1", "--port", str(self.port), "--load-only",
                   f"{source},{target}", "--threads", str(threads), "--disable-web-ui", "--disable-files-translation"]
        with open(self.log_path, "wb") as stderr:
            self.process = subprocess.Popen(command, stdout=stderr, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"LibreTranslate exited with {self.process.returncode}: {self.log()[-1500:]}")
            try:
                status, answer = asyncio.run(get(self.port, "/languages"))
                if status == 200 and source in [language["code"] for language in json.loads(answer)]:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"LibreTranslate did not list {source} within {STARTUP_TIMEOUT_S} s: {self.log()[-1500:]}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def translate_all(target: Target, lines: list[str], size: int = 20) -> list[str]:
    """Every line translated, `size` per request, one connection: the server's outputs in order."""
    connection, outputs = Connection(target.port), []
    try:
        for start in range(0, len(lines), size):
            status, answer = await connection.post(target.path, target.body(lines[start : start + size]))
            if status != 200:
                raise SystemExit(f"translating the test lines: HTTP {status}: {answer[:300]!r}")
            outputs += json.loads(answer)["translatedText"]
    finally:
        connection.close()
    return outputs


def measure_levels(name: str, target: Target, pid: int, lines: list[str], levels: list[int], duration: float,
                   max_requests: int) -> list[list[object]]:
    """Rows of the table: one per load level, one-sentence requests for `duration` s each."""
    rows = []
    for clients in levels:
        print(f"{name}: {clients} client(s), {duration:g} s", file=sys.stderr, flush=True)
        sentences = Sentences(lines)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        results = asyncio.run(closed_loop(target, sentences, clients, 1, duration, max_requests))
        wall = time.perf_counter() - t0
        ok = [r for r in results if r.status == 200 and not r.error]
        latencies = [r.latency_s for r in ok]
        rows.append([name, clients, len(results), len(results) - len(ok), f"{len(ok) / wall:.1f}",
                     ms(percentile(latencies, 50)), ms(percentile(latencies, 90)), ms(percentile(latencies, 99)),
                     f"{(cpu_seconds(pid) - cpu0) / wall:.2f}"])
    return rows


def bleu(hypotheses: list[str], references: list[str]) -> str:
    import sacrebleu

    return f"{sacrebleu.corpus_bleu(hypotheses, [references]).score:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="PAIR=CHECKPOINT, e.g. de-en=average.safetensors")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", help="reference translations of --source, for each server's BLEU")
    parser.add_argument("--libretranslate-python", required=True, help="the python of LibreTranslate's own venv")
    parser.add_argument("--levels", default="1,64")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=2, help="tfm serve --threads")
    parser.add_argument("--serve-options", default="", help="more tfm serve options, one string")
    parser.add_argument("--libretranslate-threads", type=int, default=4, help="LibreTranslate --threads (its default: 4)")
    parser.add_argument("--argos-env", default="", help="more environment for LibreTranslate, e.g. 'ARGOS_INTER_THREADS=2'")
    args = parser.parse_args()
    pair, checkpoint = args.model.split("=", 1)
    source, target_code = pair.split("-")
    lines = [line.rstrip("\n") for line in open(args.source, encoding="utf-8")]
    levels = [int(level) for level in args.levels.split(",")]
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, outputs = [], {}
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        from tfm_cli.checkpoints.format import load_model

        import torch

        beam = load_model(checkpoint, device=torch.device("cpu")).decode_defaults.get("beam_size", 5)
        build_argos_package(checkpoint, source, target_code, folder / "packages")
        extra_env = dict(item.split("=", 1) for item in shlex.split(args.argos_env))
        libre = LibreTranslate(args.libretranslate_python, folder / "packages", folder, source, target_code, beam,
                               args.libretranslate_threads, extra_env)
        try:
            target = Target(libre.port, source, target_code, api="libretranslate")
            outputs["LibreTranslate"] = asyncio.run(translate_all(target, lines))
            rows += measure_levels("LibreTranslate", target, libre.pid, lines, levels, args.duration, args.max_requests)
        finally:
            libre.stop()
        args.serve_options = args.serve_options
        server = Server(args, folder, "tfm-serve", quiet=True)
        try:
            target = Target(server.port, source, target_code, api="libretranslate")
            outputs["tfm serve"] = asyncio.run(translate_all(target, lines))
            rows += measure_levels("tfm serve", target, server.pid, lines, levels, args.duration, args.max_requests)
        finally:
            server.stop()
    print(f"Date: {started:%Y-%m-%d %H:%M} UTC. Command: `python bench/serve_vs_libretranslate.py {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {lscpu_model()}; flags: {cpu_flags()}")
    print(f"Model: {checkpoint} (beam {beam}); {len(lines)} sentences of {args.source}, one per request; "
          f"LibreTranslate --threads {args.libretranslate_threads} {args.argos_env}; tfm serve --threads {args.threads} "
          f"{args.serve_options}".rstrip() + "\n")
    print(table(["server", "clients", "requests", "failed", "requests/s", "p50 ms", "p90 ms", "p99 ms", "server CPU s/s"], rows))
    if args.reference:
        references = [line.rstrip("\n") for line in open(args.reference, encoding="utf-8")]
        same = sum(a == b for a, b in zip(outputs["LibreTranslate"], outputs["tfm serve"]))
        print()
        print(table(["server", f"BLEU on the {len(lines)} sentences", "outputs identical to the other's"],
                    [[name, bleu(hyps, references), f"{same} of {len(lines)}"] for name, hyps in outputs.items()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
