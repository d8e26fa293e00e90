"""The HTTP side: a FastAPI app whose routes speak OpenAI's API (as the official ``openai``
client uses it) and hand generation to the scheduler thread.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream: true``
as server-sent events ending in ``data: [DONE]``, framed by ``sse-starlette``),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``GET /metrics``.

Every response that ends a generation carries ``usage`` and the extension object
``speculative`` (method, γ, seed, block efficiency, accepted tokens, ...). A client that
goes away cancels its request: its row is freed at the next engine iteration.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from verispec.api import pair_costs
from verispec.models.base import CausalLM
from verispec.models.threads import release_worker_threads
from verispec.server.config import ServerConfig
from verispec.server.errors import APIError, error_response, install_handlers
from verispec.server.metrics import CONTENT_TYPE_LATEST
from verispec.server.planning import Planner
from verispec.server.scheduler import Delta, Event, Failure, Final, Job, Scheduler
from verispec.server.schemas import Generation, parse_body, parse_chat, parse_completion
from verispec.server.text import TextStream

__all__ = ["ServerState", "costs_wanted", "create_app", "time_pair_costs"]

#: How often a waiting handler checks that the scheduler thread is still alive (seconds).
LIVENESS_S = 5.0


@dataclass
class ServerState:
    """What the routes share (``app.state.verispec``)."""

    target: CausalLM
    draft: CausalLM | None
    config: ServerConfig
    planner: Planner
    scheduler: Scheduler
    model_id: str
    started: int


def costs_wanted(state: ServerState) -> bool:
    """Whether the server times the pair's passes before it starts (γ auto, ``warm_costs``)."""
    return state.draft is not None and (state.config.warm_costs
                                        or state.planner.default.gamma == "auto")


def time_pair_costs(state: ServerState) -> None:
    """Time the pair's passes up to ``max_batch`` rows when :func:`costs_wanted`: once per
    machine, pair and grid (kept on disk), which can take minutes on a small CPU. The
    calling thread then hands back its torch worker threads: from now on only the scheduler
    thread runs the models (:func:`~verispec.models.threads.release_worker_threads`)."""
    try:
        if costs_wanted(state):
            pair_costs(state.target, state.draft, state.config.max_batch)  # type: ignore[arg-type]
    finally:
        release_worker_threads()


def create_app(target: CausalLM, draft: CausalLM | None = None,
               config: ServerConfig | None = None) -> FastAPI:
    """An OpenAI-compatible app serving ``target`` with speculation drafted by ``draft``.

    The models are used as given (already loaded; the app owns their caches from now on).
    The scheduler thread starts with the app's lifespan and stops with it.
    Raises ValueError for a configuration that cannot serve (unknown or unbatchable
    default method).
    """
    config = config or ServerConfig()
    try:
        planner = Planner(target, draft, config)
    except APIError as exc:
        raise ValueError(exc.message.removeprefix("--method: ")) from None
    scheduler = Scheduler(target, planner, config)
    state = ServerState(target, draft, config, planner, scheduler,
                        config.model_name or target.name, int(time.time()))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(time_pair_costs, state)
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="verispec", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.verispec = state
    install_handlers(app)
    _add_routes(app, state)
    return app


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        ok = state.scheduler.accepting and state.scheduler.alive
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "active_rows": state.scheduler.active_rows,
                             "queue_depth": state.scheduler.queue_depth},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.scheduler.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [_model_card(state)]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        if model_id != state.model_id:
            raise _unknown_model(model_id, state)
        return JSONResponse(_model_card(state))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, state, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, state, chat=True)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_id, "object": "model", "created": state.started,
            "owned_by": "verispec"}


def _unknown_model(name: str, state: ServerState) -> APIError:
    return APIError(404, f"the model {name!r} does not exist; this server serves "
                         f"{state.model_id!r}", param="model", code="model_not_found")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is larger than {limit} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body is larger than {limit} bytes",
                           code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _generate(request: Request, state: ServerState, *, chat: bool) -> Response:
    endpoint = "chat" if chat else "completions"
    arrival = time.perf_counter()
    try:
        raw = parse_body(await _read_body(request, state.config.max_body_bytes))
        gen = parse_chat(raw) if chat else parse_completion(raw)
        if gen.model != state.model_id:
            raise _unknown_model(gen.model, state)
        plan = state.planner.plan(gen)
        text = TextStream(state.planner.decode, gen.stop, state.target.eos_token_ids)
        job = Job(plan, text, asyncio.get_running_loop(), arrival)
        state.scheduler.submit(job)
    except APIError as exc:
        state.scheduler.metrics.request(endpoint, exc.status)
        return error_response(exc)
    state.scheduler.metrics.request(endpoint, 200)
    if gen.stream:
        return EventSourceResponse(_stream(job, gen, state, chat), ping=15,
                                   background=BackgroundTask(_forget, job, state))
    return await _collect(request, job, gen, state, chat)


async def _next_event(job: Job, state: ServerState) -> Event:
    """The job's next event; a 503 failure if the scheduler thread has died."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), LIVENESS_S)
        except TimeoutError:
            if not state.scheduler.alive:
                return Failure(APIError(503, "the server stopped before this request ended",
                                        code="shutting_down"))


async def _forget(job: Job, state: ServerState) -> None:
    """After a response: cancel the job if it is still running (a no-op once it ended)."""
    state.scheduler.cancel(job)


async def _watch_disconnect(request: Request, job: Job, state: ServerState) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            state.scheduler.cancel(job)
            return


async def _collect(request: Request, job: Job, gen: Generation, state: ServerState,
                   chat: bool) -> Response:
    """A whole (non-streamed) response."""
    watcher = asyncio.create_task(_watch_disconnect(request, job, state))
    parts: list[str] = []
    try:
        while True:
            event = await _next_event(job, state)
            if isinstance(event, Delta):
                parts.append(event.text)
            elif isinstance(event, Failure):
                return error_response(event.error)
            else:
                parts.append(event.text)
                return JSONResponse(_full_body(job, gen, state, chat, "".join(parts), event))
    finally:
        watcher.cancel()


def _usage(job: Job, final: Final) -> dict[str, int]:
    prompt, completion = len(job.plan.prompt_ids), final.stats.tokens_emitted
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _extension(job: Job, gen: Generation, final: Final) -> dict[str, Any]:
    st = final.stats
    return {"method": job.plan.request.label, "gamma": st.gamma,
            "drafter": job.plan.request.drafter, "seed": job.plan.seed,
            "stop_reason": final.stop_reason, "lossless": st.lossless,
            "block_efficiency": st.block_efficiency, "accepted_tokens": st.accepted_total,
            "drafted_tokens": st.drafted_total, "target_calls": st.target_calls,
            "mean_accepted": st.mean_accepted,
            "acceptance_by_position": st.acceptance_by_position}


def _head(job: Job, state: ServerState, chat: bool, chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat \
        else "text_completion"
    return {"id": ("chatcmpl-" if chat else "cmpl-") + job.id, "object": kind,
            "created": job.created, "model": state.model_id}


def _full_body(job: Job, gen: Generation, state: ServerState, chat: bool, text: str,
               final: Final) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None,
                              "finish_reason": final.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {**_head(job, state, chat, False), "choices": [choice],
            "usage": _usage(job, final), "speculative": _extension(job, gen, final)}


def _chunk(job: Job, state: ServerState, chat: bool, text: str | None,
           finish: str | None = None, role: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {**_head(job, state, chat, True), "choices": [choice]}


def _sse(obj: dict[str, Any] | str) -> ServerSentEvent:
    return ServerSentEvent(data=obj if isinstance(obj, str) else json.dumps(
        obj, separators=(",", ":")))


async def _stream(job: Job, gen: Generation, state: ServerState,
                  chat: bool) -> AsyncIterator[ServerSentEvent]:
    """The events of a streamed response; leaving early (client gone) cancels the job."""
    ended = False
    try:
        if chat:
            yield _sse(_chunk(job, state, chat, "", role=True))
        while True:
            event = await _next_event(job, state)
            if isinstance(event, Delta):
                yield _sse(_chunk(job, state, chat, event.text))
                continue
            ended = True
            if isinstance(event, Failure):
                yield _sse(event.error.body())
                return
            last = _chunk(job, state, chat, event.text or (None if chat else ""),
                          event.finish_reason)
            last["usage"] = _usage(job, event)
            last["speculative"] = _extension(job, gen, event)
            yield _sse(last)
            if gen.include_usage:
                yield _sse({**_head(job, state, chat, True), "choices": [],
                            "usage": _usage(job, event)})
            yield _sse("[DONE]")
            return
    finally:
        if not ended:
            state.scheduler.cancel(job)
