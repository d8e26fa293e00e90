"""A peer's HTTP server as a subprocess on 127.0.0.1: started in its own process group, ready
once one of its ``GET`` paths answers, stopped with SIGTERM to the group and then SIGKILL.
vLLM (:class:`verispec.bench.vllm.VllmServer`) and llama.cpp's ``llama-server``
(:class:`verispec.bench.llamacpp.server.SpecServer`) run through it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["HOST", "ServerProcess", "free_port", "get_json", "sigterm_interrupts"]

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 60.0


def free_port(host: str = HOST) -> int:
    """A port free on ``host`` now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does, so
    the ``finally`` blocks that stop child servers run when the benchmark is terminated (by
    default SIGTERM ends the process at once and leaves its servers running). Outside the
    main thread (where handlers cannot be set) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def get_json(url: str, timeout_s: float = 5.0) -> object:
    """``GET url`` (loopback) as JSON."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # loopback
        return json.loads(resp.read().decode("utf-8"))


class ServerProcess:
    """The server ``argv`` (with ``--port P``) run with the extra environment ``env``, ready
    once ``GET ready_path`` answers. Its output goes to ``log_path`` (default:
    ``verispec-SLUG-PORT.log`` in the temporary directory, SLUG from ``name``)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], *, name: str,
                 ready_path: str, start_timeout_s: float,
                 log_path: Path | None = None) -> None:
        self.argv, self.env, self.name = list(argv), dict(env), name
        port = self.argv[self.argv.index("--port") + 1]
        self.url = f"http://{HOST}:{port}"
        slug = name.lower().replace(" ", "-")
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"verispec-{slug}-{port}.log"
        self.ready_path = ready_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's output."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self) -> str:
        """Start it and wait until it answers; returns its URL. Raises RuntimeError (with
        the end of its output) if it exits or is not ready within ``start_timeout_s``."""
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **self.env})
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with status {self.proc.returncode} "
                                   f"before serving; the end of {self.log_path}:\n"
                                   f"{self.log_tail()}")
            try:
                get_json(self.url + self.ready_path, timeout_s=2.0)
                return self.url
            except (OSError, ValueError):
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {self.start_timeout_s:.0f} s; "
                           f"the end of {self.log_path}:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after :data:`STOP_TIMEOUT_S`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
            try:  # the leader is gone: reap what is left of its group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
