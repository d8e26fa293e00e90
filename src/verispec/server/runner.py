"""Running the app: :class:`ServerHandle` (uvicorn in a background thread, on a socket bound
here, so port 0 picks a free one) and :func:`serve` (the blocking ``verispec serve``).

Shutdown is ours, not uvicorn's: on SIGINT/SIGTERM :func:`serve` stops taking requests
(uvicorn closes its socket; a request that still reaches the app gets 503), lets in-flight
requests finish until the deadline, cancels what is left (streams end with
``finish_reason: "abort"`` and ``[DONE]``), waits for uvicorn and the scheduler thread to
end and returns 0. (uvicorn's own signal handling would re-raise the signal after its
graceful shutdown, so the process would not exit 0; it is not used.) A second SIGINT
stops at once.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import TextIO

import uvicorn
from fastapi import FastAPI

from verispec.models.base import CausalLM
from verispec.models.threads import release_worker_threads
from verispec.server.app import ServerState, costs_wanted, create_app, time_pair_costs
from verispec.server.config import ServerConfig

__all__ = ["ServerHandle", "serve"]

log = logging.getLogger("verispec.server")

#: uvicorn's own backstop beyond our deadline (connections still open are then cut).
GRACE_MARGIN_S = 10.0


class ServerHandle:
    """uvicorn serving ``app`` from a background thread.

    ``port=0`` binds a free port (read :attr:`port` after construction). Use as a context
    manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, *,
                 log_level: str = "warning") -> None:
        self.app = app
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when
        # their proto says TCP, and without it Nagle + delayed ACKs hold SSE chunks ~40 ms
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = host, int(self._sock.getsockname()[1])
        timeout = self.state.config.shutdown_timeout_s + GRACE_MARGIN_S
        config = uvicorn.Config(app, log_level=log_level, lifespan="on",
                                timeout_graceful_shutdown=int(timeout) + 1)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="verispec-http", daemon=True)

    @property
    def state(self) -> ServerState:
        state: ServerState = self.app.state.verispec
        return state

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except SystemExit:  # uvicorn's exit on a failed start-up
            log.error("the HTTP server failed to start")

    def start(self, timeout_s: float = 120.0) -> ServerHandle:
        """Start serving; returns once the app has started (its lifespan ran)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server failed to start (see the log)")
            if time.monotonic() > deadline:
                self.stop(0.0)
                raise RuntimeError(f"the server did not start within {timeout_s:g}s")
            time.sleep(0.02)
        return self

    def stop(self, deadline_s: float | None = None, timeout_s: float | None = None) -> bool:
        """Drain (in-flight requests get ``deadline_s``, default the config's shutdown
        timeout), stop uvicorn and join its thread; True if everything ended in time."""
        deadline = self.state.config.shutdown_timeout_s if deadline_s is None else deadline_s
        self.state.scheduler.drain(deadline)
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s if timeout_s is not None
                              else deadline + 2 * GRACE_MARGIN_S)
        else:
            self._sock.close()
        self.state.scheduler.close()  # normally already closed by the lifespan
        return not self._thread.is_alive() and not self.state.scheduler.alive

    def __enter__(self) -> ServerHandle:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve(target: CausalLM, draft: CausalLM | None, config: ServerConfig, *,
          host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; returns the exit status (0
    after a clean shutdown, 1 if the server failed or did not stop in time)."""
    out, err = out or sys.stdout, err or sys.stderr
    handle = ServerHandle(create_app(target, draft, config), host, port, log_level=log_level)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            handle.server.force_exit = True  # a second Ctrl-C: stop waiting
        stop.set()

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_signal)
                for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        if costs_wanted(handle.state):  # before the start's deadline: a new grid takes minutes
            print(f"verispec serve: timing the pair's passes up to {config.max_batch} rows for "
                  "gamma auto (kept on disk after the first time)", file=err, flush=True)
            time_pair_costs(handle.state)
        release_worker_threads()  # the models were loaded here; the scheduler thread runs them
        handle.start()
        print(f"verispec serve: {handle.state.model_id} ({config.method}) on {handle.url} "
              f"(max batch {config.max_batch}, queue {config.max_queue})", file=out, flush=True)
        while not stop.wait(1.0):
            if not handle.running:
                print("verispec serve: the HTTP server stopped", file=err, flush=True)
                return 1
        print(f"verispec serve: shutting down (in-flight requests get "
              f"{config.shutdown_timeout_s:g}s)", file=err, flush=True)
        clean = handle.stop()
        print("verispec serve: stopped" if clean else "verispec serve: did not stop cleanly",
              file=err, flush=True)
        return 0 if clean else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
