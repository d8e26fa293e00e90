"""``verispec serve`` on Ray Serve: the same app in N engine replicas behind a light ingress.

Two deployments make the application (:func:`build_app`):

* :class:`VerispecEngine`, N replicas (or an autoscaling range). Each replica process
  builds its own model pair from a :class:`~verispec.server.replica_options.ModelSpec`,
  holds the FastAPI app of :func:`~verispec.server.app.create_app` (scheduler thread,
  continuous batching, every route and error of the single-process server) and answers
  forwarded requests by calling that app in-process
  (:func:`~verispec.server.inprocess.call_app`), streaming its ASGI messages back.
  Its ``max_ongoing_requests`` is at least ``max_batch + max_queue``: the engine batches
  and queues as one server, and answers 429 past that, as one server does. Every second
  it publishes its metrics and reads the application's drain order
  (:mod:`verispec.server.ray_state`).
* :class:`VerispecIngress`, an ASGI ingress (one replica by default, no CPU reserved)
  that forwards each HTTP request through a streaming deployment handle (by value, over
  Serve's gRPC transport). On a local Ray it takes HTTP itself (Serve's direct ingress,
  :func:`verispec.server.ray_runner.local_serve_env`). Ray Serve's
  router picks the engine replica (power of two choices: the shorter queue of two
  replicas drawn at random). If the replica dies before a response started, the request
  goes to another replica (:data:`MAX_ATTEMPTS` in all), and so does a request the replica
  refused as full (the router's queue lengths lag a burst; the last attempt's 429 is the
  client's answer); if it dies mid-response, a stream
  ends with an OpenAI error event (``code: replica_failed``) and never hangs.
  ``/metrics`` is answered here: every engine replica's series with a ``replica`` label
  (:mod:`verispec.server.replica_metrics`), plus the ingress's own counters.

Deploy with ``verispec serve --replicas N`` (:mod:`verispec.server.ray_runner`), with
``serve run verispec.server.ray_serve:app_builder target=... replicas=2`` or with a Serve
config file whose ``import_path`` is ``verispec.server.ray_serve:app_builder``.
Needs the ``ray`` extra (``pip install 'verispec[ray]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from typing import Any

import ray
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from ray import serve
from ray.exceptions import RayActorError, WorkerCrashedError
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError, RequestCancelledError
from ray.serve.handle import DeploymentHandle
from sse_starlette import ServerSentEvent

from verispec.server import ray_state
from verispec.server.config import ServerConfig
from verispec.server.errors import FULL_STATUS, APIError
from verispec.server.inprocess import ForwardedRequest, Lifespan, Message, call_app, error_messages
from verispec.server.replica_metrics import PUBLISH_PERIOD_S, Snapshot, merge_snapshots
from verispec.server.replica_options import ModelSpec, ReplicaOptions

__all__ = ["APP_NAME", "MAX_ATTEMPTS", "VerispecEngine", "VerispecIngress",
           "app_builder", "build_app", "deployment_options"]

log = logging.getLogger("verispec.server")

#: The application's name when ``verispec serve --replicas`` runs it.
APP_NAME = "verispec"
#: Tries of a request whose replica failed before answering or answered that it was full
#: (the first one included).
MAX_ATTEMPTS = 3
#: An ingress replica takes this many requests at once per engine replica it may face.
INGRESS_PER_ENGINE = 2
#: Ray Serve waits this much longer than the engines' drain for the ingress to drain.
INGRESS_SHUTDOWN_MARGIN_S = 10.0

_REPLICA_GONE = (RayActorError, ReplicaUnavailableError, WorkerCrashedError)


def _bind_replica_grpc_to_node_address() -> None:
    """Ray Serve 2.60 starts each replica's inter-deployment gRPC server on ``[::]:0``,
    every interface; bind it to the node's address (loopback on a local cluster) like
    Ray's other servers. Runs in every process that loads this module (the replicas)."""
    from ray.serve._private import replica as replica_module

    original = replica_module.add_port_to_grpc_server
    if getattr(original, "verispec_bound", False):
        return

    def bind(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            host = ray.util.get_node_ip_address()
            host = f"[{host}]" if ":" in host else host
            address = f"{host}:{address.rsplit(':', 1)[1]}"
        port: int = original(server, address)
        return port

    bind.verispec_bound = True  # type: ignore[attr-defined]
    replica_module.add_port_to_grpc_server = bind


_bind_replica_grpc_to_node_address()


def _replica_key() -> tuple[str, str]:
    """(the application's name, this replica's id) inside a Ray Serve replica."""
    context = serve.get_replica_context()
    return context.app_name, context.replica_id.unique_id


class VerispecEngine:
    """One engine replica: the single-process server's app, called in-process."""

    async def __init__(self, spec: ModelSpec, config: ServerConfig) -> None:
        from verispec.server.app import ServerState, create_app

        self.started = time.time()
        target, draft = await asyncio.to_thread(spec.load)
        self.app = create_app(target, draft, config)
        self.state: ServerState = self.app.state.verispec
        self._lifespan = Lifespan(self.app)  # type: ignore[arg-type]
        await self._lifespan.startup()
        self.app_name, self.replica = _replica_key()
        self.draining = False
        self._publisher = asyncio.create_task(self._publish_forever())

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[list[Message]]:
        """The app's answer to ``request``, ASGI messages in batches (a streaming call)."""
        messages = call_app(self.app, request)  # type: ignore[arg-type]
        async with contextlib.aclosing(messages):  # a caller that left: the app sees it
            async for batch in messages:
                yield batch

    def check_health(self) -> None:
        """Ray Serve's health check: a dead scheduler thread gets the replica replaced."""
        if not self.state.scheduler.alive and self.state.scheduler.accepting:
            raise RuntimeError("the engine's scheduler thread stopped")

    def _exchange(self) -> None:
        """Obey a drain order of this application, then publish this replica's snapshot."""
        order = ray_state.read_drain(self.app_name)
        if order is not None and order.issued >= self.started and not self.draining:
            self.draining = True
            self.state.scheduler.drain(max(0.0, order.deadline - time.time()))
        scheduler = self.state.scheduler
        ray_state.publish(self.app_name, Snapshot(
            self.replica, os.getpid(), time.time(), scheduler.metrics.render().decode(),
            busy=scheduler.active_rows + scheduler.queue_depth, draining=self.draining))

    async def _publish_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._exchange)
            except Exception:  # never let the metrics stop the replica
                log.warning("could not publish this replica's metrics", exc_info=True)
            await asyncio.sleep(PUBLISH_PERIOD_S)

    async def __del__(self) -> None:
        """Ray Serve stops the replica (after in-flight requests drained): cancel what is
        left, stop the scheduler thread and withdraw the metrics."""
        self._publisher.cancel()
        self.state.scheduler.drain(0.0)
        await self._lifespan.shutdown()
        await asyncio.to_thread(ray_state.withdraw, self.app_name, self.replica)


class _Relay:
    """Sends one response's ASGI messages to the client; holds the start back until the
    first body chunk, so a replica lost before that leaves nothing sent. With
    ``hold_refusal``, a replica's 429 (its queue full) is not sent either: :attr:`refused`
    is set and the rest of that answer dropped, so the request can go to another replica."""

    def __init__(self, send: Callable[[Message], Any], hold_refusal: bool = False) -> None:
        self.send = send
        self.pending_start: Message | None = None
        self.started = False
        self.ended = False
        self.event_stream = False
        self.hold_refusal = hold_refusal
        self.refused = False

    async def feed(self, batch: list[Message]) -> None:
        for message in batch:
            if self.refused:
                return
            if message["type"] == "http.response.start":
                self.pending_start = message
                content_type = dict(message.get("headers", ())).get(b"content-type", b"")
                self.event_stream = bytes(content_type).startswith(b"text/event-stream")
                continue
            if self.pending_start is not None:
                if self.hold_refusal and self.pending_start.get("status") == FULL_STATUS:
                    self.refused = True
                    return
                await self.send(self.pending_start)
                self.pending_start, self.started = None, True
            self.ended = not message.get("more_body", False)
            await self.send(message)

    async def finish(self) -> None:
        """The replica's answer ended; close the response if it did not."""
        if not self.started and self.pending_start is None:
            await self.error(500, "the engine replica ended without an answer", "internal_error")
        elif not self.ended:
            await self.feed([{"type": "http.response.body", "body": b"", "more_body": False}])

    async def error(self, status: int, message: str, code: str,
                    headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Answer an error: a whole response if nothing was sent yet, else an OpenAI error
        event that ends a stream (other responses just end, cut short)."""
        body = APIError(status, message, code=code).body()
        if not self.started:
            for m in error_messages(status, json.dumps(body).encode(), headers):
                await self.send(m)
            self.started = self.ended = True
            return
        if self.ended:
            return
        event = ServerSentEvent(data=json.dumps(body, separators=(",", ":"))).encode()
        await self.send({"type": "http.response.body",
                         "body": event if self.event_stream else b"", "more_body": False})
        self.ended = True


async def _read_body(receive: Callable[[], Any], limit: int) -> bytes | None:
    """The request body cut after ``limit`` bytes (the engine answers 413 for more); None
    if the client left before sending it all."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size <= limit:
            chunks.append(chunk[: limit + 1 - size])
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class _ASGI:
    """An ASGI 3 app object around a coroutine (uvicorn takes a bound method for ASGI 2)."""

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.handler = handler

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Any],
                       send: Callable[[Message], Any]) -> None:
        await self.handler(scope, receive, send)


@serve.ingress()
class VerispecIngress:
    """The ingress: forwards every request to an engine replica, answers ``/metrics``."""

    def __init__(self, engine: DeploymentHandle, max_body_bytes: int) -> None:
        # by value over Serve's gRPC transport, whatever the cluster's default: less added
        # latency per request than through Ray's object store (docs/deploy.md)
        self.engine = engine.options(method_name="forward", stream=True, _by_reference=False)
        self.max_body_bytes = max_body_bytes
        self.registry = CollectorRegistry()
        self.rerouted = Counter("verispec_ingress_rerouted", "requests sent to another engine "
                                "replica because theirs failed before answering", ["ingress"],
                                registry=self.registry)
        self.refused = Counter("verispec_ingress_refusals_rerouted", "requests offered to "
                               "the router again because their engine replica answered that "
                               "its queue was full", ["ingress"], registry=self.registry)
        self.broken = Counter("verispec_ingress_broken_responses", "responses cut by a failed "
                              "engine replica (streams end with an error event)", ["ingress"],
                              registry=self.registry)
        self.app_name, self.replica = _replica_key()

    def __serve_build_asgi_app__(self) -> _ASGI:
        return _ASGI(self.asgi)

    async def asgi(self, scope: MutableMapping[str, Any], receive: Callable[[], Any],
                   send: Callable[[Message], Any]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                phase = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{phase}.complete"})
                if phase == "shutdown":
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            await self._metrics(send)
            return
        body = await _read_body(receive, self.max_body_bytes)
        if body is not None:
            await self._forward(ForwardedRequest.from_scope(scope, body), send)

    async def _forward(self, request: ForwardedRequest, send: Callable[[Message], Any]) -> None:
        """Forward ``request``; retry on another replica while nothing was answered, or
        while the replica answered that its queue is full (the router's view of the
        replicas' queues lags a burst: the last attempt's refusal is the answer)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            relay = _Relay(send, hold_refusal=attempt < MAX_ATTEMPTS)
            response = self.engine.remote(request)
            try:
                async for batch in response:
                    await relay.feed(batch)
                    if relay.refused:
                        break
                if relay.refused:
                    response.cancel()
                    self.refused.labels(self.replica).inc()
                    continue
                await relay.finish()
                return
            except (asyncio.CancelledError, RequestCancelledError):
                response.cancel()  # the client went away: so does the request
                raise
            except BackPressureError as exc:
                retry = () if exc.retry_after_s is None else (
                    (b"retry-after", str(max(1, round(exc.retry_after_s))).encode()),)
                await relay.error(exc.status_code, exc.message, "queue_full", retry)
                return
            except Exception as exc:  # noqa: BLE001 - every failure gets an answer
                response.cancel()
                gone = isinstance(exc, _REPLICA_GONE)
                if gone and not relay.started and attempt < MAX_ATTEMPTS:
                    self.rerouted.labels(self.replica).inc()
                    log.warning("engine replica lost before answering %s %s (%s); trying "
                                "another", request.method, request.path, type(exc).__name__)
                    continue
                if relay.started:
                    self.broken.labels(self.replica).inc()
                log.warning("engine replica failed on %s %s: %r", request.method,
                            request.path, exc)
                what = "stopped" if gone else f"failed ({type(exc).__name__})"
                await relay.error(503, f"the engine replica serving this request {what}; "
                                  "the response is incomplete" if relay.started else
                                  f"no engine replica could answer: the last one {what}",
                                  "replica_failed")
                return

    async def _metrics(self, send: Callable[[Message], Any]) -> None:
        snapshots = await asyncio.to_thread(ray_state.read_snapshots, self.app_name)
        body = merge_snapshots(snapshots, self.registry)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def deployment_options(config: ServerConfig, options: ReplicaOptions) -> tuple[dict[str, Any],
                                                                             dict[str, Any]]:
    """The Ray Serve options of the engine and of the ingress deployment."""
    engine_ongoing = options.engine_max_ongoing(config.max_batch, config.max_queue)
    engine: dict[str, Any] = {
        "max_ongoing_requests": engine_ongoing,
        "ray_actor_options": {"num_cpus": options.replica_cpus},
        "health_check_period_s": options.health_check_period_s,
        "graceful_shutdown_timeout_s": config.shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    if options.replicas is not None:
        engine["num_replicas"] = options.replicas
    else:
        low, high = options.min_replicas, options.max_replicas
        engine["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                        "initial_replicas": max(low or 0, 1),
                                        "target_ongoing_requests": config.max_batch}
    ingress = {
        "num_replicas": options.ingress_replicas,
        "max_ongoing_requests": INGRESS_PER_ENGINE * options.most_replicas * engine_ongoing,
        "ray_actor_options": {"num_cpus": 0},
        "graceful_shutdown_timeout_s": config.shutdown_timeout_s + INGRESS_SHUTDOWN_MARGIN_S,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    return engine, ingress


def build_app(spec: ModelSpec, config: ServerConfig | None = None,
              options: ReplicaOptions | None = None) -> serve.Application:
    """The Ray Serve application: ingress in front of the engine replicas."""
    config = config or ServerConfig()
    options = options or ReplicaOptions()
    engine_opts, ingress_opts = deployment_options(config, options)
    engine = serve.deployment(VerispecEngine, name="VerispecEngine", **engine_opts)
    ingress = serve.deployment(VerispecIngress, name="VerispecIngress", **ingress_opts)
    return ingress.bind(engine.bind(spec, config), config.max_body_bytes)


#: ``verispec serve`` options that Ray Serve's own settings replace in an app builder.
_NOT_APP_ARGS = {"host": "http_options.host", "port": "http_options.port",
                 "address": "the cluster `serve run`/`serve deploy` talks to",
                 "log_level": "logging_config.log_level"}


def _argv(args: Mapping[str, Any], flags: Mapping[str, bool]) -> list[str]:
    """``verispec serve`` arguments from builder args (``max_batch: 4`` → ``--max-batch 4``)."""
    argv: list[str] = []
    for key, value in args.items():
        name = str(key).replace("-", "_")
        if name in _NOT_APP_ARGS:
            raise ValueError(f"{key!r} is not an application argument: set "
                             f"{_NOT_APP_ARGS[name]} in the Serve config instead")
        flag = "--" + name.replace("_", "-")
        if flag not in flags:
            raise ValueError(f"unknown application argument {key!r} (the arguments are "
                             "verispec serve's options without dashes, e.g. max_batch)")
        if flags[flag]:  # a switch: true or false
            if str(value).lower() in ("1", "true", "yes", "on"):
                argv.append(flag)
            elif str(value).lower() not in ("0", "false", "no", "off"):
                raise ValueError(f"{key!r} is a switch: give true or false, not {value!r}")
        elif value is not None:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def app_builder(args: dict[str, Any]) -> serve.Application:
    """Ray Serve's application builder: ``verispec serve``'s options as ``args``
    (``serve run verispec.server.ray_serve:app_builder target=toy:random:12:1 no_draft=true
    method=ar replicas=2``, or the ``args`` of a Serve config file). Without ``replicas``
    or a replica range the application runs one engine replica."""
    from verispec.server.cli import build_parser, config_from_args

    parser = build_parser(strict=True)
    flags = {opt: action.nargs == 0 for action in parser._actions
             for opt in action.option_strings if opt.startswith("--")}
    parsed = parser.parse_args(_argv(args or {}, flags))
    return build_app(ModelSpec.from_args(parsed), config_from_args(parsed),
                     ReplicaOptions.from_args(parsed) or ReplicaOptions())
