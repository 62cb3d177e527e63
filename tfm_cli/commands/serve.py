"""`tfm serve`: models kept loaded behind the DeepL v2, LibreTranslate and tfm HTTP APIs (the `serve` extra)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from tfm_cli.commands import model_runs
from tfm_cli.commands.options import device_option, dtype_option, threads_option
from tfm_cli.console import print_info
from tfm_cli.errors import TfmError

MISSING_EXTRA = "tfm serve needs Starlette and uvicorn: pip install 'tfm-cli[serve]'"
EPILOG = (
    "Examples:\n\n"
    "  tfm serve -m de-en=runs/de-en/checkpoint_best.safetensors\n\n"
    "  tfm serve -m de-en=de-en.safetensors -m en-de=en-de.safetensors --api-keys keys.txt --port 8080\n\n"
    "  curl -s localhost:8000/v2/translate -d text='Ein Hund rennt.' -d target_lang=EN-US\n\n"
    "Endpoints: DeepL API v2 (/v2/translate, /v2/languages, /v2/usage, /v2/glossaries), LibreTranslate "
    "(/translate, /languages), /tfm/translate (the records of `tfm translate --json`) and /health. "
    "SIGTERM stops accepting, answers the requests in flight, and exits 0."
)


def default_data_dir() -> Path:
    """Where glossaries are kept without --data-dir: $XDG_DATA_HOME/tfm/serve, else ~/.local/share/tfm/serve."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tfm" / "serve"


def serve(
    ctx: typer.Context,
    model: list[str] = typer.Option(..., "-m", "--model", help="A model as its language pair and checkpoint, e.g. de-en=model.safetensors; repeat for more pairs."),
    shortlist: list[str] = typer.Option([], "--shortlist", help="A lexical shortlist for one served pair, e.g. de-en=de-en.shortlist.safetensors (`tfm shortlist`; as `translate --shortlist`); repeat for more pairs."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default; 0.0.0.0 listens on every interface)."),
    port: int = typer.Option(8000, "--port", help="TCP port to listen on."),
    api_keys: Optional[str] = typer.Option(None, "--api-keys", help="A file of API keys, one per line: every request but /health must carry one (else 403)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Folder of the glossary database (default: $XDG_DATA_HOME/tfm/serve, else ~/.local/share/tfm/serve)."),
    max_texts: int = typer.Option(50, "--max-texts", help="Texts per request at most (DeepL's limit)."),
    max_chars: int = typer.Option(30_000, "--max-chars", help="Characters per request at most, all texts together."),
    max_lines: int = typer.Option(2_000, "--max-lines", help="Lines per request at most, all texts together once cut at their line breaks."),
    max_body_kib: int = typer.Option(128, "--max-body-kib", help="Request body size limit in KiB (DeepL's: 128); larger bodies get 413. A body that creates a glossary may hold 10 MiB (DeepL's glossary limit)."),
    max_glossary_entries: int = typer.Option(100_000, "--max-glossary-entries", help="Entries per glossary at most; a larger one is refused (400)."),
    queue_size: int = typer.Option(64, "--queue-size", help="Requests waiting per model at most; beyond, 503 (429 on DeepL's routes) at once."),
    batch_wait_ms: float = typer.Option(5.0, "--batch-wait-ms", help="How long a model's engine waits for the next request to batch with those it has (up to ten waits per round; none for a lone client)."),
    max_tokens: int = typer.Option(8000, "--max-tokens", help="Approximate source tokens the engine gathers into one round of batches."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    threads: int = threads_option(),
    workers: int = typer.Option(1, "--workers", help="Server processes sharing the port, each with its own copy of the models (Linux/macOS); e.g. one per core with --threads 1, for machines where one process's engine cannot use every core."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No request log lines or other messages on stderr (errors still show)."),
) -> None:
    """Serve models over HTTP: the DeepL v2 and LibreTranslate APIs, and tfm's own with alignments and scores.

    Requests from many clients are translated together (dynamic batching); each answer equals what
    `tfm translate` gives for the same lines and settings.
    """
    import importlib.util

    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise TfmError(MISSING_EXTRA) from None
    # python-multipart (form bodies) is imported by Starlette when a form arrives: found, not imported, here.
    if importlib.util.find_spec("python_multipart") is None and importlib.util.find_spec("multipart") is None:
        raise TfmError(MISSING_EXTRA)
    from tfm_cli.serving.glossaries import GlossaryStore
    from tfm_cli.serving.models import check_distinct_pairs, parse_model_spec
    from tfm_cli.serving.requests import Limits, read_keys
    from tfm_cli.serving.workers import check_can_fork, serve_in_workers

    specs = [parse_model_spec(value) for value in model]
    check_distinct_pairs(specs)
    shortlists = shortlist_paths(shortlist, specs)
    for name, value in (("--max-texts", max_texts), ("--max-chars", max_chars), ("--max-lines", max_lines),
                        ("--max-body-kib", max_body_kib), ("--max-glossary-entries", max_glossary_entries),
                        ("--queue-size", queue_size), ("--max-tokens", max_tokens)):
        if value < 1:
            raise TfmError(f"{name} must be at least 1, got {value}")
    if batch_wait_ms < 0:
        raise TfmError(f"--batch-wait-ms must be 0 or more, got {batch_wait_ms}")
    check_can_fork(workers)
    limits = Limits(max_body_bytes=max_body_kib * 1024, max_texts=max_texts, max_chars=max_chars, max_lines=max_lines,
                    max_glossary_entries=max_glossary_entries)
    setup = ServeSetup(
        specs, read_keys(api_keys) if api_keys is not None else None, limits,
        Path(data_dir) if data_dir is not None else default_data_dir(),
        dict(threads=threads, queue_size=queue_size, batch_wait_ms=batch_wait_ms, max_tokens=max_tokens),
        device, dtype, threads, host, quiet, shortlists,
    )
    GlossaryStore(setup.data_folder).close()  # a folder where the database cannot be kept is said before anything loads
    sock = listening_socket(host, port)  # before the slow part: a busy port is said at once
    try:
        if workers == 1:
            serve_in_this_process(ctx, uvicorn, setup, sock)
        else:
            def announce() -> None:
                print_info(listening_line(sock, setup, workers), quiet=quiet)
                sock.close()  # the workers listen; the parent's copy would only queue connections nobody takes at the end

            code = serve_in_workers(workers, lambda number, ready: serve_in_this_process(ctx, uvicorn, setup, sock, number, ready),
                                    announce)
            if code:
                raise typer.Exit(code)
    finally:
        sock.close()


def shortlist_paths(values: list[str], specs: list) -> dict[str, str]:
    """The --shortlist values (`de-en=FILE`) as {pair: file}; TfmError for a bad value or a pair no -m serves."""
    from tfm_cli.serving.models import parse_model_spec

    served = {spec.pair for spec in specs}
    paths: dict[str, str] = {}
    for value in values:
        if "=" not in value:
            raise TfmError(f"--shortlist {value}: name the language pair it is for, e.g. --shortlist de-en={value}")
        spec = parse_model_spec(value)
        if spec.pair not in served:
            raise TfmError(f"--shortlist {value}: no -m serves {spec.pair} (served: {', '.join(sorted(served))})")
        if spec.pair in paths:
            raise TfmError(f"--shortlist: two shortlists for {spec.pair}; give one per pair")
        paths[spec.pair] = spec.path
    return paths


@dataclass
class ServeSetup:
    """What `tfm serve` was asked for, checked: the models, keys, limits, glossary folder and engine settings."""

    specs: list
    keys: frozenset[str] | None
    limits: object
    data_folder: Path
    engine_settings: dict  # threads, queue_size, batch_wait_ms, max_tokens
    device: str
    dtype: str
    threads: int
    host: str
    quiet: bool
    shortlists: dict[str, str]  # language pair -> shortlist file


def serve_in_this_process(ctx: typer.Context, uvicorn, setup: ServeSetup, sock, worker: int | None = None, ready=None) -> None:
    """Load the models and serve on `sock` until SIGTERM or Ctrl-C. worker: this process's number among
    `--workers` (None: the only server process, which says where it listens); ready() once it can answer."""
    from tfm_cli.serving.glossaries import GlossaryStore
    from tfm_cli.serving.torch_thread import TorchThread

    quiet = setup.quiet
    model_runs.set_up_process(ctx, setup.threads)
    torch_thread = TorchThread(keep_main_thread_single(ctx))
    placement = model_runs.resolve_placement(setup.device, setup.dtype, quiet or bool(worker))
    store = GlossaryStore(setup.data_folder)  # each worker its own connection: one must not cross a fork
    try:
        service = load_service(setup.specs, store, setup.keys, setup.limits, placement, setup.engine_settings, quiet,
                               log_prefix="" if worker is None else f"worker {worker + 1}: ", show_loading=not worker,
                               shortlists=setup.shortlists, torch_thread=torch_thread)
        run_server(uvicorn, service, sock, setup, ready=ready, announce=worker is None)
    finally:
        torch_thread.stop()
        store.close()


def keep_main_thread_single(ctx: typer.Context) -> int:
    """Run torch on one thread in the calling (main) thread until `ctx` closes; returns the thread count
    the translations get instead, in the process's TorchThread (the --threads value, else torch's default).

    Loading the models on one thread starts no OpenMP team in the main thread, so the TorchThread's
    is the process's only one (why that matters: serving/torch_thread.py).
    """
    import torch

    engine_threads = torch.get_num_threads()
    if engine_threads > 1:
        torch.set_num_threads(1)
        ctx.call_on_close(lambda: torch.set_num_threads(engine_threads))
    return engine_threads


def listening_socket(host: str, port: int):
    """A TCP socket bound to (host, port), for uvicorn to listen on; TfmError when the address cannot be had."""
    import socket

    if not 0 <= port <= 65535:
        raise TfmError(f"--port must be between 0 and 65535, got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that say
        # they are TCP, and without it every answer written in two parts waited ~40 ms for a delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except OSError as error:
        raise TfmError(f"--host {host}: {error.strerror or error}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise TfmError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def load_service(specs, store, keys, limits, placement, engine_settings: dict, quiet: bool, log_prefix: str = "",
                 show_loading: bool = True, shortlists: dict[str, str] | None = None, torch_thread=None):
    """Load every model on `placement` and build its engine (not started); the Service the routes share.

    engine_settings: threads, queue_size, batch_wait_ms, max_tokens. log_prefix starts each request log line.
    shortlists: language pair -> the shortlist file its engine translates with. torch_thread: the
    serving.torch_thread.TorchThread every engine translates in (None: each engine in its own thread).
    """
    from tfm_cli.serving.app import ServedModel, Service, glossary_lookup
    from tfm_cli.serving.engine import Engine

    shortlists = shortlists or {}

    models = []
    for spec in specs:
        loaded = model_runs.load_placed_model(spec.path, placement)
        shortlist_path = shortlists.get(spec.pair)
        shortlist = model_runs.load_shortlist(shortlist_path, loaded, spec.path) if shortlist_path else None
        engine = Engine(loaded, spec.source, glossary_lookup(store), queue_size=engine_settings["queue_size"],
                        max_tokens=engine_settings["max_tokens"], max_wait_s=engine_settings["batch_wait_ms"] / 1000,
                        threads=engine_settings["threads"], shortlist=shortlist, torch_thread=torch_thread)
        models.append(ServedModel(spec, engine))
        with_shortlist = f" with the shortlist {shortlist_path}" if shortlist_path else ""
        print_info(f"loaded {spec.pair}: {spec.path}{with_shortlist}", quiet=quiet or not show_loading)
    log = (lambda line: None) if quiet else (lambda line: print_info(log_prefix + line))
    return Service(models, store, keys, limits, log)


def listening_line(sock, setup: ServeSetup, workers: int = 1) -> str:
    """The line that says where the server listens, with its keys, glossary database and workers."""
    from tfm_cli.serving.glossaries import DATABASE_NAME

    shown_host = f"[{setup.host}]" if ":" in setup.host else setup.host
    key_count = f"{len(setup.keys)} API key(s)" if setup.keys is not None else "no API keys"
    processes = f"; {workers} workers" if workers > 1 else ""
    return (f"listening on http://{shown_host}:{sock.getsockname()[1]} ({key_count}; "
            f"glossaries in {setup.data_folder / DATABASE_NAME}{processes})")


def wait_until(condition, poll_s: float = 0.01) -> None:
    """Return once condition() is true."""
    while not condition():
        time.sleep(poll_s)


def run_server(uvicorn, service, sock, setup: ServeSetup, ready=None, announce: bool = True) -> None:
    """Serve until SIGTERM or Ctrl-C: uvicorn stops accepting, finishes the requests in flight, then the
    engines answer what is queued and stop. SIGTERM then returns normally (exit 0, what supervisors
    expect); Ctrl-C exits 130 as every command does. ready(), if given, is called once the engines run;
    announce: say where the server listens (a worker leaves that to its parent)."""
    import signal

    from tfm_cli.serving.app import build_app

    for served in service.models:
        served.engine.start()
    config = uvicorn.Config(
        build_app(service), log_config=None, log_level="warning", access_log=False, lifespan="off",
        server_header=False, timeout_graceful_shutdown=None,
    )
    server = uvicorn.Server(config)
    service.stopping = lambda: server.should_exit  # answers in flight at shutdown then say Connection: close
    if announce:
        print_info(listening_line(sock, setup), quiet=setup.quiet)
    if ready is not None:  # said once uvicorn runs (and has its signal handlers): a SIGTERM then stops it
        threading.Thread(target=lambda: (wait_until(lambda: server.started), ready()), daemon=True).start()
    # uvicorn raises the signal it stopped for again once it has shut down: SIGTERM is then ignored here
    # (the command ends normally), where tfm's own handler would make it exit 143.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        server.run(sockets=[sock])
    finally:
        for served in service.models:
            served.engine.stop()
        signal.signal(signal.SIGTERM, previous)
    print_info("stopped: every accepted request was answered", quiet=setup.quiet or not announce)
