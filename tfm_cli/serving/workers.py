"""`tfm serve --workers N`: N server processes accepting on one listening socket, each with its own models,
engines and event loop.

One process serves with one event loop and one engine thread per model, and their Python shares one
interpreter lock; on more cores than one engine uses well (a small decoding step spread over many
threads spends much of its time waking and joining them: bench/RESULTS.md, "Decoding workers"),
several processes that each serve whole requests use the machine better. The parent binds the socket,
then forks the workers one at a time; each loads the models itself (the parent never runs torch, so no
OpenMP thread pool crosses a fork), opens its own connection to the glossary database, starts its
engines and says it is ready, and only then is the next one forked: a model that cannot be loaded is
reported once, by the first worker. The kernel gives each new connection to one of the workers.

Stopping: SIGTERM to the parent is passed to every worker; Ctrl-C reaches the whole process group.
Each worker answers what it accepted and exits; the parent exits 0 after SIGTERM (130 after Ctrl-C)
once all have. A worker that ends on its own is an error: the others are stopped and the parent exits 1.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable

from tfm_cli.console import print_error
from tfm_cli.errors import TfmError

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C


def check_can_fork(count: int) -> None:
    """Raise TfmError when `count` is below 1, or above 1 on a system that cannot fork."""
    if count < 1:
        raise TfmError(f"--workers must be at least 1, got {count}")
    if count > 1 and "fork" not in multiprocessing.get_all_start_methods():
        raise TfmError("--workers needs a system that can fork processes (Linux or macOS); leave it out here")


def run_worker(number: int, serve_one: Callable[[int, Callable[[], None]], None], ready_fd: int) -> int:
    """In a forked worker: serve_one(number, ready) until it returns; the exit code for the worker."""
    def ready() -> None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)

    try:
        serve_one(number, ready)
        return 0
    except TfmError as error:
        print_error(str(error))
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED
    except BaseException:  # a worker must end with os._exit, whatever happens: the parent reports it
        traceback.print_exc()
        return 1


def fork_worker(number: int, serve_one: Callable[[int, Callable[[], None]], None]) -> int | None:
    """Fork worker `number` and wait until it is ready; its pid, or None when it ended first (it said why)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler, which signals the workers
        os.close(read_fd)
        code = run_worker(number, serve_one, write_fd)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write_fd)
    try:
        ready = os.read(read_fd, 1)  # b"": the worker ended (closing its end) before it was ready
    finally:
        os.close(read_fd)
    if ready:
        return pid
    os.waitpid(pid, 0)
    return None


def stop(pids: set[int], sig: int = signal.SIGTERM) -> None:
    """Send `sig` to each worker still running."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def serve_in_workers(count: int, serve_one: Callable[[int, Callable[[], None]], None], announce: Callable[[], None]) -> int:
    """Run `count` forked workers, each `serve_one(number, ready)` (it calls ready() once it can answer, then
    serves until SIGTERM or Ctrl-C); `announce()` once all are ready. Returns the command's exit code."""
    running: set[int] = set()
    stopping: list[int] = []  # the signals that asked the workers to stop

    def forward(signum, frame) -> None:
        stopping.append(signum)
        stop(running, signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        try:
            for number in range(count):
                if stopping:
                    break
                pid = fork_worker(number, serve_one)
                if pid is None:
                    stop(running)
                    wait_all(running)
                    return 1
                running.add(pid)
        except KeyboardInterrupt:
            stopping.append(signal.SIGINT)
        if stopping:  # a signal came while the workers started: those that did stop now
            stop(running)
        else:
            announce()
        return wait_for_workers(running, stopping)
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for_workers(running: set[int], stopping: list[int]) -> int:
    """Wait until every worker in `running` has ended; the exit code for the command (see serve_in_workers)."""
    failed = False
    while running:
        try:
            pid, status = os.waitpid(-1, 0)
        except KeyboardInterrupt:  # Ctrl-C reaches the workers too (one process group); passed on in case not
            stopping.append(signal.SIGINT)
            stop(running)
            continue
        except ChildProcessError:
            break
        running.discard(pid)
        if not stopping and not failed:
            failed = True
            print_error(f"a server worker ended on its own (exit code {os.waitstatus_to_exitcode(status)}); stopping the others")
            stop(running)
    if failed:
        return 1
    return INTERRUPTED if signal.SIGINT in stopping else 0


def wait_all(pids: set[int]) -> None:
    """Wait for each of `pids` to end."""
    for pid in list(pids):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        pids.discard(pid)
