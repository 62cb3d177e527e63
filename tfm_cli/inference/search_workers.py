"""Search batches in forked worker processes, each on one CPU thread (`tfm translate --workers N`).

On a few cores one process spreads every small decoding step over all its threads, and much of
the step is then spent waking and joining OpenMP's threads and running the step's Python, which
no second thread shares (bench/RESULTS.md, "Decoding workers"). N processes that each search whole
batches on one thread never wait for each other, and their Python runs side by side. Batches are
independent (decoding is batch-invariant, decoding.py) and a step gives the same bits on one
thread as on several (model/step_threads.py), so the translations are the ones one process gives.

The workers are forked once the model is loaded, so they share its weights (copy-on-write) and
start in milliseconds. A forked process may only run torch on one thread: GNU OpenMP's thread pool
does not survive a fork, and a child that starts a parallel region on several threads can hang.
Batches go out through one queue (an idle worker takes the next), answers come back numbered, and
`SearchWorkers.search` yields them in the order the batches were given.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from tfm_cli.config import DecodeConfig
from tfm_cli.errors import TfmError
from tfm_cli.inference.decoding import source_batch
from tfm_cli.inference.ensemble import Ensemble, step_decoder
from tfm_cli.inference.search import Hypothesis, search_beams, search_samples
from tfm_cli.inference.search_state import SearchState
from tfm_cli.inference.shortlist import ShortlistBatch
from tfm_cli.model import Transformer

# How often an idle worker checks that the process that forked it still exists.
PARENT_CHECK_S = 1.0
# How long closing waits for a worker to finish its batch and exit before it is killed.
STOP_WAIT_S = 5.0


@dataclass(frozen=True)
class SearchJob:
    """One batch to search: source ids (EOS not included), and per source its sampling seed when the
    search samples, or the state its beam search keeps (search_state.SearchState, e.g. the batch's
    constraints), if any."""

    sources: list[list[int]]
    seeds: list[int] | None = None
    state: SearchState | None = None
    shortlist: ShortlistBatch | None = None  # the target ids the batch's output layer computes (shortlist.py)


def search_batch(model: Transformer | Ensemble, job: SearchJob, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Search one batch on `model` (one model or an ensemble); returns per source its n-best hypotheses
    (sampled when decode.sample)."""
    device = next(model.parameters()).device
    decoder = step_decoder(model, source_batch(job.sources, model.config, device), job.shortlist)
    with torch.inference_mode():
        if decode.sample:
            return search_samples(decoder, decode, job.seeds)
        return search_beams(decoder, decode, job.state)


def worker_loop(
    model: Transformer | Ensemble, decode: DecodeConfig, jobs: multiprocessing.Queue, answers: multiprocessing.Queue, parent: int
) -> None:
    """A worker's life: take (number, SearchJob) from `jobs`, put (number, hypotheses, None) or
    (number, None, error text) on `answers`, until None arrives or process `parent` is gone."""
    # Ctrl-C reaches the whole process group: the parent answers it and stops the workers. A SIGTERM
    # ends a worker at once (not through the parent's handler, which would print a traceback here).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)
    while True:
        try:
            task = jobs.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if os.getppid() != parent:
                # Nobody reads the answers any more: end without waiting for them to be sent.
                os._exit(0)
            continue
        if task is None:
            return
        number, job = task
        try:
            answers.put((number, search_batch(model, job, decode), None))
        except Exception as error:  # noqa: BLE001 - any failure is reported to the parent, which raises it
            answers.put((number, None, f"{type(error).__name__}: {error}"))


class SearchWorkers:
    """`count` forked processes that search batches of `model` (one model or an ensemble) with `decode`,
    one CPU thread each.

    Use as a context manager (or call close()): the workers are stopped when it ends, also on an
    error or Ctrl-C. Only where the operating system can fork (Linux, macOS), on the CPU.
    """

    def __init__(self, model: Transformer | Ensemble, decode: DecodeConfig, count: int) -> None:
        if count < 2:
            raise TfmError(f"decoding workers need at least 2 processes, got {count}")
        if next(model.parameters()).device.type != "cpu":
            raise TfmError("--workers runs CPU processes: use it with --device cpu, or leave it out on a GPU")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise TfmError("--workers needs a system that can fork processes (Linux or macOS); leave it out here")
        self.decode = decode  # every worker searches with these settings
        context = multiprocessing.get_context("fork")
        self.jobs = context.Queue()
        self.answers = context.Queue()
        self.processes = [
            context.Process(target=worker_loop, args=(model, decode, self.jobs, self.answers, os.getpid()), daemon=True)
            for _ in range(count)
        ]
        for process in self.processes:
            process.start()

    def search(self, jobs: Iterable[SearchJob]) -> Iterator[list[list[Hypothesis]]]:
        """Search every job in the workers; yields each job's hypotheses in the order of `jobs`.

        Every job is handed out before the first answer is awaited, the largest first (sentences x
        the longest source's tokens), so that no worker is left with a large batch when the others have
        run out. Raises TfmError when a worker reports an error or dies.
        """
        jobs = list(jobs)
        count = len(jobs)
        for number in sorted(range(count), key=lambda n: -len(jobs[n].sources) * max(map(len, jobs[n].sources))):
            self.jobs.put((number, jobs[number]))
        waiting: dict[int, list[list[Hypothesis]]] = {}
        for number in range(count):
            while number not in waiting:
                answer_number, hypotheses, error = self.next_answer()
                if error is not None:
                    raise TfmError(f"a decoding worker failed: {error}")
                waiting[answer_number] = hypotheses
            yield waiting.pop(number)

    def next_answer(self) -> tuple[int, list[list[Hypothesis]] | None, str | None]:
        """The next answer any worker gives; raises TfmError if a worker has died instead."""
        while True:
            try:
                return self.answers.get(timeout=PARENT_CHECK_S)
            except queue.Empty:
                dead = [process for process in self.processes if not process.is_alive()]
                if dead:
                    raise TfmError(
                        f"a decoding worker ended (exit code {dead[0].exitcode}) before answering; "
                        "if memory ran out, use fewer --workers or a smaller --batch-size"
                    ) from None

    def close(self, finished: bool = True) -> None:
        """Stop the workers. finished: every answer was taken, so each is asked to end and given up
        to STOP_WAIT_S; otherwise (an error, Ctrl-C) they are killed at once, batches left undone."""
        if finished:
            for _ in self.processes:
                self.jobs.put(None)
        for process in self.processes:
            if finished:
                process.join(STOP_WAIT_S)
            if process.is_alive():
                process.kill()
            process.join()
        self.jobs.cancel_join_thread()  # jobs no worker took are dropped, not waited for
        self.jobs.close()
        self.answers.close()

    def __enter__(self) -> SearchWorkers:
        return self

    def __exit__(self, error_type: type | None, *rest: object) -> None:
        self.close(finished=error_type is None)
