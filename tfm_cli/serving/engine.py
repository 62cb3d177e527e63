"""One engine per served model: a thread that gathers the model's queued requests into shared batches,
which the process's torch thread (serving/torch_thread.py) translates.

Dynamic batching: the thread takes the oldest request, then every request that follows it within
`max_wait_s` of the one before (a burst of requests, such as many clients sending their next one
when a round of answers goes out, is gathered whole), for at most MAX_GATHER_WAITS x `max_wait_s` in
all and up to `max_tokens` approximate source tokens; requests that arrive while a round is searched
wait in the queue for the next. When the last round held a single request and nothing else is
queued, nobody else is sending: the request is answered without waiting (one client's latency). It groups the lines of
requests with the same settings, translates each group with one Translator.translate_chunk call, and
hands each request its own lines in order. A sentence's translation does not depend on its batch (inference/translation.py), so a
request gets what `tfm translate` gives for its lines. A Translator is built once per distinct
settings and kept. The queue is bounded: a request that finds it full is refused at once (QueueFull).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tfm_cli.checkpoints.format import LoadedModel
from tfm_cli.errors import TfmError
from tfm_cli.inference.glossary import Glossary
from tfm_cli.inference.outputs import TranslatedLine
from tfm_cli.inference.sentence_splitting import SentenceSplitter
from tfm_cli.inference.settings import resolve_decode
from tfm_cli.inference.text_preparation import TextOptions
from tfm_cli.inference.shortlist import Shortlist
from tfm_cli.inference.translation import BatchingConfig, OutputFormat, Translator, TranslationStats
from tfm_cli.serving.torch_thread import TorchThread

# A subword piece of the languages tfm is used for averages ~4 characters: the batch budget is counted
# in characters / CHARS_PER_TOKEN, so that filling a batch needs no tokenizing in the request's path.
CHARS_PER_TOKEN = 4
TRANSLATORS_KEPT = 32  # distinct request settings whose Translator is kept (most recently used)
MAX_GATHER_WAITS = 10  # a round is gathered for at most this many max_wait_s, however requests keep coming
STOP = object()


@dataclass(frozen=True)
class RequestSettings:
    """What a request asks of the translation beyond its lines: one Translator per distinct value."""

    markup: str | None = None  # "html" or "xml" (DeepL tag_handling, LibreTranslate format=html)
    split_sentences: bool = False
    glossary_id: str | None = None
    constraint_fields: bool = False  # lines carry TAB-separated target phrases (the native API's constraints)
    nbest: int = 1
    alignment: bool = False  # word alignments, as `tfm translate --json` gives them


@dataclass
class Answer:
    """A request's translated lines, in its order, and the format `format_line`/`json_record` need."""

    lines: list[TranslatedLine]
    output_format: OutputFormat


@dataclass
class Job:
    settings: RequestSettings
    lines: list[str]
    future: concurrent.futures.Future
    tokens: int


class QueueFull(Exception):
    """The engine's queue holds as many requests as it may: the request is refused, not queued."""


class Engine:
    """The thread that owns one loaded model and translates the requests queued for it.

    glossary: id -> Glossary (None when there is none), asked when a Translator with that glossary is built.
    shortlist: the lexical shortlist every translation of this model uses (`serve --shortlist`), if any.
    torch_thread: the thread that translates for every engine of the process (serving/torch_thread.py);
    None: this engine's own thread translates, on `threads` torch CPU threads (0 = torch's default).
    """

    def __init__(
        self, loaded: LoadedModel, source_lang: str, glossary: Callable[[str], Glossary | None],
        queue_size: int = 64, max_tokens: int = 8000, max_wait_s: float = 0.005, threads: int = 0,
        shortlist: Shortlist | None = None, torch_thread: TorchThread | None = None,
    ) -> None:
        self.loaded = loaded
        self.shortlist = shortlist
        self.source_lang = source_lang
        self.glossary = glossary
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.max_tokens = max_tokens
        self.max_wait_s = max_wait_s
        self.threads = threads
        self.torch_thread = torch_thread
        self.decode_defaults = resolve_decode({}, loaded.decode_defaults)
        self.translators: OrderedDict[RequestSettings, Translator] = OrderedDict()
        self.splitter: SentenceSplitter | None = None
        self.thread = threading.Thread(target=self.run, name=f"tfm-engine-{source_lang}", daemon=True)

    @property
    def beam_size(self) -> int:
        """The beam the model decodes with (its own default, else tfm's): n-best requests may ask at most this many."""
        return self.decode_defaults.beam_size

    def start(self) -> None:
        """Start the engine's thread."""
        self.thread.start()

    def stop(self) -> None:
        """Answer what is queued, then end the thread (waits for it)."""
        self.queue.put(STOP)
        self.thread.join()

    def submit(self, settings: RequestSettings, lines: list[str]) -> concurrent.futures.Future:
        """Queue `lines` for translation with `settings`; the future's result is an Answer.

        Raises QueueFull at once when the queue is full. The future raises TfmError for settings the
        Translator refuses (a client's error) and any other exception for a failure of the server.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        tokens = sum(len(line) // CHARS_PER_TOKEN + 1 for line in lines)
        try:
            self.queue.put_nowait(Job(settings, lines, future, tokens))
        except queue.Full:
            raise QueueFull from None
        return future

    def run(self) -> None:
        """The engine's loop: gather a batch of jobs, answer them, until STOP."""
        if self.threads and self.torch_thread is None:
            import torch

            torch.set_num_threads(self.threads)  # OpenMP's thread count is per calling thread
        stopping, alone = False, False
        while not stopping:
            first = self.queue.get()
            if first is STOP:
                break
            jobs, tokens = [first], first.tokens
            wait = 0.0 if alone and self.queue.empty() else self.max_wait_s
            last_call = time.monotonic() + MAX_GATHER_WAITS * wait
            while tokens < self.max_tokens:
                try:
                    job = self.queue.get(timeout=max(0.0, min(wait, last_call - time.monotonic())))
                except queue.Empty:
                    break
                if job is STOP:
                    stopping = True
                    break
                jobs.append(job)
                tokens += job.tokens
            alone = len(jobs) == 1
            if self.torch_thread is None:
                self.answer(jobs)
            else:
                self.torch_thread.run(self.answer, jobs)

    def answer(self, jobs: list[Job]) -> None:
        """Translate the lines of `jobs`, one translate_chunk per distinct settings, and resolve their futures."""
        # A client that went away cancelled its future: its lines are not translated.
        groups: dict[RequestSettings, list[Job]] = {}
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                groups.setdefault(job.settings, []).append(job)
        for settings, members in groups.items():
            try:
                translator = self.translator(settings)
                lines = [line for job in members for line in job.lines]
                translated = translator.translate_chunk(lines, 0, TranslationStats())
            except Exception as error:  # TfmError: the client's settings; anything else: reported as a server error
                for job in members:
                    job.future.set_exception(error)
                continue
            output_format = OutputFormat(json=settings.alignment, length_penalty=translator.length_penalty, nbest=settings.nbest)
            start = 0
            for job in members:
                mine = translated[start : start + len(job.lines)]
                start += len(job.lines)
                # Numbered within the request, as `tfm translate` numbers the lines of a file of them.
                job.future.set_result(Answer([dataclasses.replace(line, index=i) for i, line in enumerate(mine)], output_format))

    def translator(self, settings: RequestSettings) -> Translator:
        """The Translator for `settings`, built on first use and kept (the least recently used goes first)."""
        translator = self.translators.get(settings)
        if translator is not None:
            self.translators.move_to_end(settings)
            return translator
        glossary = None
        if settings.glossary_id is not None:
            glossary = self.glossary(settings.glossary_id)
            if glossary is None:
                raise TfmError(f"glossary_id: no glossary {settings.glossary_id!r}")
        splitter = None
        if settings.split_sentences:
            if self.splitter is None:
                self.splitter = SentenceSplitter(self.source_lang)
            splitter = self.splitter
        decode = resolve_decode({"nbest": settings.nbest}, self.loaded.decode_defaults)
        # Alignments as `tfm translate` computes them: markup needs them, --json shows them.
        align = self.loaded.alignment if settings.alignment or settings.markup is not None else None
        text = TextOptions(constraint_fields=settings.constraint_fields, glossary=glossary, markup=settings.markup, splitter=splitter)
        translator = Translator(self.loaded, decode, BatchingConfig(), align, text=text, shortlist=self.shortlist)
        self.translators[settings] = translator
        if len(self.translators) > TRANSLATORS_KEPT:
            self.translators.popitem(last=False)
        return translator
