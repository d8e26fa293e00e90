"""The scheduler thread: the one owner of the engine.

The event loop never touches the engine. It hands a :class:`Job` over with
:meth:`Scheduler.submit` (a thread-safe queue) and reads the job's events from an
``asyncio.Queue`` that the scheduler fills through ``loop.call_soon_threadsafe``:
:class:`Delta` (text released), then one :class:`Final` (finish reason, statistics) or one
:class:`Failure`. Between two engine iterations the thread takes every command waiting
(submit, cancel, drain, stop); with nothing to decode it blocks on the queue (no spinning).
While serving it is the one thread that runs the models: the threads that loaded and timed
them hand their torch worker threads back first
(:func:`~verispec.models.threads.release_worker_threads`), or every parallel kernel of this
thread would wait for sleeping workers.

Admission: at most ``max_batch + max_queue`` requests are in the server at once (the ones
beyond ``max_batch`` wait for a row); one more is refused at once with 429 and
``Retry-After``. A cancelled request (client gone, stop string, shutdown deadline) leaves
at the next iteration, freeing its row; one still waiting for a row leaves at once.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from verispec.engine.loop import Engine
from verispec.engine.request import Row
from verispec.engine.stats import Stats
from verispec.models.base import CausalLM
from verispec.server.config import ServerConfig
from verispec.server.errors import FULL_STATUS, APIError
from verispec.server.metrics import Metrics
from verispec.server.planning import Plan, Planner
from verispec.server.text import TextStream

__all__ = ["Delta", "Failure", "Final", "Job", "Scheduler"]

log = logging.getLogger("verispec.server")

#: engine stop reason -> OpenAI finish_reason ("abort": cancelled before its end).
FINISH_REASONS = {"eos": "stop", "max_new_tokens": "length", "context_window": "length",
                  "cancelled": "abort"}


@dataclass
class Delta:
    """Text released by an accepted block."""

    text: str


@dataclass
class Final:
    """The request ended: the last text, why, and its statistics."""

    text: str
    finish_reason: str
    stop_reason: str
    stats: Stats


@dataclass
class Failure:
    """The request failed before or while decoding."""

    error: APIError


Event = Delta | Final | Failure


class Job:
    """One HTTP request's generation, shared by the event loop and the scheduler thread.

    The event loop creates it (with its loop and queue) and only reads ``events``; the
    scheduler thread owns every other mutable attribute.
    """

    def __init__(self, plan: Plan, text: TextStream, loop: asyncio.AbstractEventLoop,
                 arrival: float) -> None:
        self.id = uuid.uuid4().hex[:24]
        self.plan = plan
        self.text = text
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.arrival = arrival  # time.perf_counter() when the HTTP request came in
        self.created = int(time.time())
        self.row: Row | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.done = False

    def post(self, event: Event) -> None:
        """Hand an event to the event loop (from the scheduler thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Scheduler:
    """Owns the :class:`~verispec.engine.loop.Engine`; see the module docstring."""

    def __init__(self, target: CausalLM, planner: Planner, config: ServerConfig) -> None:
        self.target, self.planner, self.config = target, planner, config
        self.metrics = Metrics(queue_depth=lambda: self.queue_depth,
                               active_rows=lambda: self.active_rows)
        self.active_rows = 0  # written by the scheduler thread after every iteration
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding = 0  # submitted and not yet ended (guarded by _lock)
        self._accepting = True
        self._jobs: dict[int, Job] = {}  # row id -> job (scheduler thread)
        self._deadline: float | None = None
        self._deadline_passed = False
        self._engine: Engine | None = None
        self._thread = threading.Thread(target=self._run, name="verispec-scheduler",
                                        daemon=True)

    # -- the event loop's side ------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Requests admitted to the server and not yet decoding."""
        return max(0, self._outstanding - self.active_rows)

    @property
    def capacity(self) -> int:
        return self.config.max_batch + self.config.max_queue

    @property
    def accepting(self) -> bool:
        return self._accepting

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or raise 429 (full) / 503 (shutting down) at once."""
        with self._lock:
            if not self._accepting:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if self._outstanding >= self.capacity:
                raise APIError(FULL_STATUS, f"the server is full ({self.config.max_batch} rows "
                                            f"decoding, {self.config.max_queue} waiting); "
                                            "retry later",
                               code="queue_full",
                               headers={"Retry-After": str(self.config.retry_after_s)})
            self._outstanding += 1
        self._inbox.put(("submit", job))

    def cancel(self, job: Job) -> None:
        """Stop a job (its client is gone); a no-op once it has ended."""
        self._inbox.put(("cancel", job))

    def drain(self, timeout_s: float) -> None:
        """Refuse new requests; cancel what is still running after ``timeout_s``."""
        with self._lock:
            self._accepting = False
        self._inbox.put(("drain", time.monotonic() + max(0.0, timeout_s)))

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel everything left and end the thread (joined up to ``timeout_s``)."""
        with self._lock:
            self._accepting = False
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the scheduler thread -------------------------------------------------------------

    def _run(self) -> None:
        self.planner.reset_drafters()  # the draft model's cache starts empty, like the target's
        engine = self._engine = Engine(self.target, batch_size=self.config.max_batch)
        try:
            while self._take_commands(block=engine.idle):
                self._check_deadline()
                if engine.idle:
                    continue
                passes = engine.passes
                try:
                    finished = engine.step()
                except Exception as exc:  # a model fault: fail the batch, start afresh
                    engine = self._fault(exc)
                    continue
                self.metrics.passes(engine.passes - passes)
                for row in finished:
                    self._finish(row)
                self.active_rows = len(engine.active)
        except Exception:  # pragma: no cover - a bug in the scheduler itself
            log.exception("the scheduler stopped on an unexpected error")
        finally:
            self._abort_all(APIError(503, "the server stopped before this request ended",
                                     code="shutting_down"))
            self.active_rows = 0

    def _take_commands(self, block: bool) -> bool:
        """Run the waiting commands (waiting for one if ``block``); False on stop."""
        while True:
            try:
                if block:
                    timeout = None if self._deadline is None or self._deadline_passed \
                        else max(0.0, self._deadline - time.monotonic())
                    kind, arg = self._inbox.get(timeout=timeout)
                    block = False
                else:
                    kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if kind == "stop":
                return False
            if kind == "submit":
                self._admit(arg)
            elif kind == "cancel":
                self._cancel(arg)
            elif kind == "drain" and self._deadline is None:
                self._deadline = arg

    def _admit(self, job: Job) -> None:
        assert self._engine is not None
        if self._deadline_passed:
            self._end(job, Failure(APIError(503, "the server is shutting down",
                                            code="shutting_down")), "error")
            return
        try:
            request = self.planner.build(job.plan, lambda new: self._on_tokens(job, new))
            job.row = self._engine.submit(request)
        except ValueError as exc:
            self._end(job, Failure(APIError(400, str(exc), code="invalid_request")), "error")
            return
        except Exception as exc:
            log.exception("could not start a request")
            self._end(job, Failure(APIError(500, f"could not start the request "
                                                 f"({type(exc).__name__})",
                                            code="internal_error")), "error")
            return
        self._jobs[job.row.id] = job

    def _on_tokens(self, job: Job, new: list[int]) -> None:
        """Called by the engine with each accepted block of a row."""
        now = time.perf_counter()
        if job.first_token_at is None:
            job.first_token_at = now
            self.metrics.first_token(job.plan.request.label, now - job.arrival)
        job.last_token_at = now
        text = job.text.feed(new)
        if job.text.stopped and job.row is not None and self._engine is not None:
            self._engine.cancel(job.row)  # a stop string: the row leaves at the next step
        if text:
            job.post(Delta(text))

    def _cancel(self, job: Job) -> None:
        engine = self._engine
        if job.done or job.row is None or engine is None:
            return
        for i, row in enumerate(engine.waiting):
            if row is job.row:  # not decoding yet: leave at once
                del engine.waiting[i]
                row.stats.stop_reason = "cancelled"
                self._finish(row)
                return
        engine.cancel(job.row)

    def _finish(self, row: Row) -> None:
        job = self._jobs.pop(row.id, None)
        if job is None:
            return
        tail = job.text.finish()
        reason = "stop" if job.text.stopped else row.stats.stop_reason
        finish = "stop" if job.text.stopped else FINISH_REASONS.get(reason, "abort")
        decode = (job.last_token_at - job.first_token_at
                  if job.first_token_at is not None and job.last_token_at is not None else None)
        self.metrics.finish(job.plan.request.label, reason, row.stats, decode)
        self._end(job, Final(tail, finish, reason, row.stats), None)

    def _end(self, job: Job, event: Event, reason: str | None) -> None:
        """Post the job's last event and free its place in the server."""
        if job.done:
            return
        job.done = True
        if reason is not None:
            self.metrics.finish(job.plan.request.label, reason, None, None)
        job.post(event)
        with self._lock:
            self._outstanding -= 1

    def _check_deadline(self) -> None:
        if self._deadline is None or time.monotonic() < self._deadline:
            return
        self._deadline_passed = True
        for job in list(self._jobs.values()):
            self._cancel(job)

    def _fault(self, exc: Exception) -> Engine:
        """The engine raised mid-iteration: fail its requests, rebuild engine and drafters."""
        log.exception("engine iteration failed; failing %d request(s)", len(self._jobs))
        self._abort_all(APIError(500, f"decoding failed ({type(exc).__name__}: {exc})",
                                 code="engine_error"))
        self.planner.reset_drafters()
        self._engine = Engine(self.target, batch_size=self.config.max_batch)
        self.active_rows = 0
        return self._engine

    def _abort_all(self, error: APIError) -> None:
        for job in list(self._jobs.values()):
            self._end(job, Failure(error), "error")
        self._jobs.clear()
        while True:  # submissions still queued
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                self._end(arg, Failure(error), "error")
