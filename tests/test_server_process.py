"""``verispec serve`` as a process: SIGTERM and SIGINT end it cleanly, and timing the pair
for γ auto happens before the start's deadline. Servers run in subprocesses on 127.0.0.1
(a free port) with toy models; every wait is bounded."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from conftest import wait_for  # noqa: E402
from test_server import client, metrics, stream_text  # noqa: E402

from verispec.server import ServerHandle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# -- the process: SIGTERM and SIGINT ------------------------------------------------------------

SLOW_SERVER = """
import sys, time
from verispec.models.toy import RandomContextLM
from verispec.server import ServerConfig, serve

class Slow(RandomContextLM):
    def _extend(self, tokens, n):
        time.sleep(0.05)
        return super()._extend(tokens, n)

target = Slow(12, 1)
target.name = "slow"
sys.exit(serve(target, None, ServerConfig(method="ar", shutdown_timeout_s=4.0),
               host="127.0.0.1", port=0, log_level="warning"))
"""


@contextmanager
def server_process(argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], ServerHandle]]:
    """A server subprocess; yields it and a stand-in handle with its port (bounded waits)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    timer = threading.Timer(180, proc.kill)  # never hang the test run
    timer.start()
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert " on http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.stderr else "")
        stand_in = argparse.Namespace(port=int(line.rsplit(":", 1)[1].split()[0]))
        stand_in.url = f"http://127.0.0.1:{stand_in.port}"
        yield proc, stand_in  # type: ignore[misc]
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_sigterm_finishes_or_cancels_in_flight_requests_and_exits_0(tmp_path: Path) -> None:
    script = tmp_path / "slow_server.py"
    script.write_text(textwrap.dedent(SLOW_SERVER))
    with server_process([str(script)]) as (proc, h):
        out: dict[int, tuple[str, Any]] = {}

        def request(budget: int) -> None:
            stream = client(h).completions.create(model="slow", prompt="AB", max_tokens=budget,
                                                  seed=1, stream=True)
            out[budget] = stream_text(stream)

        threads = [threading.Thread(target=request, args=(n,)) for n in (20, 2000)]
        for t in threads:
            t.start()
        accepted = 'verispec_requests_total{endpoint="completions",status="200"}'
        wait_for(lambda: metrics(h).get(accepted) == 2, what="two requests")
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
        err = proc.stderr.read() if proc.stderr else ""
    short, long = out[20], out[2000]
    assert len(short[0]) == 20 and short[1].choices[0].finish_reason == "length"  # finished
    assert long[1].choices[0].finish_reason == "abort"  # cancelled at the deadline, cleanly
    assert long[1].model_extra["speculative"]["stop_reason"] == "cancelled"
    assert 0 < len(long[0]) < 2000 and "stopped" in err


SLOW_TIMING_SERVER = """
import sys, time
import verispec.server.app as app
import verispec.server.runner as runner
from verispec.models.toy import RandomContextLM
from verispec.server import ServerConfig, serve

runner.ServerHandle.start.__defaults__ = (1.0,)  # a start deadline shorter than the timing
timed = []

def slow_pair_costs(target, draft, rows):  # a first timing of 2 s, then held in memory
    if not timed:
        time.sleep(2.0)
    timed.append(rows)

app.pair_costs = slow_pair_costs
target, draft = RandomContextLM(12, 1), RandomContextLM(12, 2)
sys.exit(serve(target, draft, ServerConfig(method="block", gamma="auto", max_batch=3),
               host="127.0.0.1", port=0, log_level="warning"))
"""


def test_timing_the_pair_for_gamma_auto_does_not_count_against_the_start(tmp_path: Path):
    script = tmp_path / "slow_timing_server.py"
    script.write_text(textwrap.dedent(SLOW_TIMING_SERVER))
    with server_process([str(script)]) as (proc, h):
        resp = client(h).completions.create(model="random-context", prompt="AB", max_tokens=4,
                                            seed=1)
        assert len(resp.choices[0].text) <= 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        err = proc.stderr.read() if proc.stderr else ""
    assert "timing the pair's passes up to 3 rows" in err


def test_the_command_line_server_stops_on_sigint(tmp_path: Path) -> None:
    argv = ["-m", "verispec.server", "--target", "toy:random:6:1", "--draft", "toy:random:6:2",
            "--port", "0", "--log-level", "warning", "--method", "token", "--gamma", "2"]
    with server_process(argv) as (proc, h):
        resp = client(h).completions.create(model="random-context", prompt="ABC", max_tokens=6,
                                            seed=4)
        assert len(resp.choices[0].text) <= 6
        assert resp.model_extra["speculative"]["gamma"] == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
