"""torch's OpenMP worker threads handed back by a thread that is done with torch
(verispec.models.threads), and the server's threads that load and time the models handing
theirs back before the scheduler thread runs them."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest
import torch

from conftest import wait_for
from verispec.models import threads
from verispec.models.threads import release_worker_threads

LINUX = sys.platform.startswith("linux")


def _tasks() -> int:
    """The process's OS threads (Linux)."""
    return len(os.listdir("/proc/self/task"))


def _in_thread(work: Any) -> dict[str, Any]:
    """Run ``work(out)`` on a new thread (which has no OpenMP team yet); its ``out``."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            work(out)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    if "error" in out:
        raise out["error"]
    return out


@pytest.mark.skipif(not LINUX, reason="counts threads in /proc/self/task")
def test_a_thread_hands_back_its_workers_and_computes_the_same_after() -> None:
    x = torch.arange(1 << 22, dtype=torch.float32)  # large enough for a parallel region

    def work(out: dict[str, Any]) -> None:
        torch.set_num_threads(2)  # a team with one worker, also on a 1-core machine
        before = _tasks()
        out["first"] = (x * 3).sum()
        out["with_team"] = _tasks()
        out["released"] = release_worker_threads()
        wait_for(lambda: _tasks() < out["with_team"], timeout=10, what="the workers to end")
        out["after"] = _tasks()
        out["again"] = (x * 3).sum()  # a new team, the same result
        out["before"] = before

    old = torch.get_num_threads()
    try:
        out = _in_thread(work)
    finally:
        torch.set_num_threads(old)
    assert threads._openmp() is not None  # PyPI's torch wheels ship libgomp
    assert out["released"] is True
    assert out["with_team"] > out["before"]  # the parallel region started a worker
    assert out["after"] < out["with_team"]
    assert torch.equal(out["first"], out["again"])


def test_without_an_openmp_runtime_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_openmp", lambda: None)
    assert release_worker_threads() is False


def _record(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[int]:
    """Replace ``module.release_worker_threads`` by a recorder of the calling threads."""
    calls: list[int] = []
    monkeypatch.setattr(module, "release_worker_threads",
                        lambda: calls.append(threading.get_ident()) or True)
    return calls


def test_the_server_threads_that_load_and_time_the_models_hand_back_their_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi")
    from verispec.server import ServerConfig, app, create_app, replica_options
    from verispec.server.replica_options import ModelSpec

    loads = _record(monkeypatch, replica_options)
    target, draft = ModelSpec(factory="verispec.server.testing:toy_pair",
                              factory_kwargs={"delay": 0.0}).load()
    assert loads == [threading.get_ident()]
    with pytest.raises(ValueError, match="no function"):
        ModelSpec(factory="verispec.server.testing:nothing").load()
    assert len(loads) == 2  # also when loading fails

    timings = _record(monkeypatch, app)
    state = create_app(target, draft, ServerConfig(gamma=8)).state.verispec

    def timing(out: dict[str, Any]) -> None:
        app.time_pair_costs(state)
        out["ident"] = threading.get_ident()

    out = _in_thread(timing)
    assert timings == [out["ident"]]  # the timing thread, not the caller's
