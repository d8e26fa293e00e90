"""Calling an ASGI app in-process, one HTTP request at a time, its response as messages.

A Ray Serve engine replica holds the app :func:`~verispec.server.app.create_app` builds and
answers the ingress's :class:`ForwardedRequest` through :func:`call_app`: the request goes
in as an ASGI ``http`` scope with its whole body, and the ASGI messages the app sends
(``http.response.start``, then ``http.response.body`` chunks) come out as they are sent,
in batches of whatever is ready, so a stream reaches the client event by event. A caller
that stops reading (its client went away) makes the app see ``http.disconnect``, which
cancels the request's row, exactly as when a client leaves the single-process server.

The ASGI app's lifespan runs through :class:`Lifespan` (startup and shutdown messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ASGIApp", "ForwardedRequest", "Lifespan", "Message", "call_app", "error_messages"]

log = logging.getLogger("verispec.server")

Message = MutableMapping[str, Any]
ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]

#: After its caller left, the app gets this long to notice the disconnect and end.
DISCONNECT_GRACE_S = 5.0


@dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request as the ingress received it (picklable: it crosses processes)."""

    method: str
    path: str
    query_string: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    raw_path: bytes | None = None
    root_path: str = ""
    scheme: str = "http"
    http_version: str = "1.1"
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None
    extensions: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_scope(cls, scope: MutableMapping[str, Any], body: bytes) -> ForwardedRequest:
        """The request of an ASGI ``http`` scope with its (already read) body."""
        client, server = scope.get("client"), scope.get("server")
        return cls(method=scope["method"], path=scope["path"],
                   query_string=scope.get("query_string", b""),
                   headers=tuple((bytes(k), bytes(v)) for k, v in scope.get("headers", ())),
                   body=body, raw_path=scope.get("raw_path"),
                   root_path=scope.get("root_path", ""), scheme=scope.get("scheme", "http"),
                   http_version=scope.get("http_version", "1.1"),
                   client=tuple(client) if client else None,  # type: ignore[arg-type]
                   server=tuple(server) if server else None)  # type: ignore[arg-type]

    def scope(self) -> dict[str, Any]:
        """The ASGI ``http`` scope the app receives."""
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": self.http_version, "method": self.method,
                "scheme": self.scheme, "path": self.path,
                "raw_path": self.raw_path if self.raw_path is not None else self.path.encode(),
                "query_string": self.query_string, "root_path": self.root_path,
                "headers": [list(h) for h in self.headers], "client": self.client,
                "server": self.server, "state": {}}


def error_messages(status: int, body: bytes,
                   headers: tuple[tuple[bytes, bytes], ...] = ()) -> list[Message]:
    """A whole JSON response as ASGI messages."""
    head = [(b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()), *headers]
    return [{"type": "http.response.start", "status": status, "headers": head},
            {"type": "http.response.body", "body": body, "more_body": False}]


_INTERNAL = (b'{"error":{"message":"internal server error","type":"server_error",'
             b'"param":null,"code":"internal_error"}}')


async def call_app(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[list[Message]]:
    """Run ``app`` on ``request``; yields the response's ASGI messages in batches.

    The last batch ends with a body message whose ``more_body`` is false. If the app
    fails before it started a response, the response is a 500 with the OpenAI error body.
    Closing the iterator early tells the app its client disconnected.
    """
    outbox: asyncio.Queue[Message | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    state = {"body_sent": False, "started": False}

    async def receive() -> Message:
        if not state["body_sent"]:
            state["body_sent"] = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            state["started"] = True
        if message["type"] in ("http.response.start", "http.response.body"):
            await outbox.put(dict(message))

    async def run() -> None:
        try:
            await app(request.scope(), receive, send)
        except Exception:  # the app's handlers answered what they could; log the rest
            log.exception("the app failed on %s %s", request.method, request.path)
            if not state["started"]:
                for message in error_messages(500, _INTERNAL):
                    await outbox.put(message)
        finally:
            await outbox.put(None)

    task = asyncio.create_task(run())
    try:
        while True:
            batch = [await outbox.get()]
            while not outbox.empty():
                batch.append(outbox.get_nowait())
            done = batch[-1] is None
            messages = [m for m in batch if m is not None]
            if messages:
                yield messages
            if done:
                return
    finally:
        disconnected.set()
        if not task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), DISCONNECT_GRACE_S)
            task.cancel()


class Lifespan:
    """An ASGI app's lifespan (``startup`` then ``shutdown``) driven by hand."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": {}}

        async def send(message: Message) -> None:
            await self._outbox.put(message)

        try:
            await self.app(scope, self._inbox.get, send)
        except Exception as exc:  # noqa: BLE001 - a lifespan that raises, not reports
            await self._outbox.put({"type": "lifespan.failed", "message": repr(exc)})

    async def _step(self, phase: str) -> None:
        await self._inbox.put({"type": f"lifespan.{phase}"})
        reply = await self._outbox.get()
        if reply["type"] != f"lifespan.{phase}.complete":
            raise RuntimeError(f"the app's lifespan {phase} failed: "
                               f"{reply.get('message') or reply['type']}")

    async def startup(self) -> None:
        """Start the app (its lifespan's startup); raises RuntimeError if it fails."""
        self._task = asyncio.create_task(self._run())
        await self._step("startup")

    async def shutdown(self) -> None:
        """Stop the app (its lifespan's shutdown); a no-op if it never started."""
        if self._task is None or self._task.done():
            return
        await self._step("shutdown")
        await self._task
