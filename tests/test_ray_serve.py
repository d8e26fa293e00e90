"""``verispec serve --replicas``: the server as Ray Serve replicas on a local Ray (loopback).

One cluster for the module: ``python -m verispec.server --replicas 2`` in a subprocess,
serving the toy pair of :mod:`verispec.server.testing` (no end-of-text token, so every
request runs to its budget) with a shared control directory that slows down or holds the
replicas' forward passes. Responses are compared with the single-process server's for the
same requests and seeds (fixed γ), through the official ``openai`` client without retries.
The last cluster test stops it with SIGINT and checks that no process is left.
Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import conftest

from verispec.server import ServerConfig, ServerHandle, create_app
from verispec.server.testing import MODEL, set_delay, set_gate, toy_pair

HAS_RAY = find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="the ray extra is not installed "
                                                   "(pip install 'verispec[ray]')")
pytestmark = [pytest.mark.ray,  # Ray Serve's own pydantic deprecations:
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")]

ROOT = Path(__file__).resolve().parents[1]
FACTORY = "verispec.server.testing:toy_pair"
SETTINGS = {"method": "block", "gamma": 3, "max_batch": 4, "max_queue": 12}
START_TIMEOUT_S = 240.0
SHUTDOWN_S = 8  # the cluster's --shutdown-timeout


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (None: no such process)."""
    try:
        return Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> set[int]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields:
            tree.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if (fields := _stat(p)) and fields[0] != "Z"}


def listener(port: int) -> str:
    """The command line of the process that listens on 127.0.0.1:``port`` (Ray's processes
    name themselves there, e.g. ``ray::ProxyActor``)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):  # no IPv6 table: nothing to read there
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()  # sl, local address:port (hex), remote, state, ..., inode
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fds = Path("/proc", pid, "fd")
            if any(os.readlink(fds / fd) in inodes for fd in os.listdir(fds)):
                return Path("/proc", pid, "cmdline").read_text().replace("\0", " ").strip()
    raise AssertionError(f"nothing listens on port {port}")


def first_line(proc: subprocess.Popen[str], timeout: float = START_TIMEOUT_S) -> str:
    """The first line ``proc`` prints on stdout within ``timeout`` seconds ("" if none)."""
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(
        proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    return first[0] if first else ""


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """:func:`conftest.wait_for` at the pace of a Ray cluster (longer default, 0.1 s polls)."""
    conftest.wait_for(condition, timeout, what, poll=0.1)


@dataclass
class Cluster:
    proc: subprocess.Popen[str]
    port: int
    control: Path
    stderr: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {'name{label="v",...}': value}."""
        from prometheus_client.parser import text_string_to_metric_families

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert resp.status == 200
            text = resp.read().decode()
        finally:
            conn.close()
        return _samples(text_string_to_metric_families(text))


def _samples(families: Iterator[Any]) -> dict[str, float]:
    out = {}
    for family in families:
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def per_replica(m: dict[str, float], name: str, **labels: str) -> dict[str, float]:
    """{replica: value} of one series (the other labels as given)."""
    out: dict[str, float] = {}
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for key, value in m.items():
        if key.startswith(name + "{") and all(w in key for w in want):
            replica = key.split('replica="', 1)[1].split('"', 1)[0]
            out[replica] = out.get(replica, 0.0) + value
    return out


def settled(cluster: Cluster, name: str, **labels: str) -> dict[str, float]:
    """{replica: value} once two reads more than a publish period apart agree (a replica's
    figures reach /metrics up to a second late)."""
    last = per_replica(cluster.metrics(), name, **labels)
    for _ in range(20):
        time.sleep(1.2)
        now = per_replica(cluster.metrics(), name, **labels)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{name} did not settle: {last}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not HAS_RAY:
        pytest.skip("the ray extra is not installed (pip install 'verispec[ray]')")
    if not Path("/proc").is_dir():
        pytest.skip("following the cluster's processes needs Linux's /proc")
    control = tmp_path_factory.mktemp("control")
    stderr = tmp_path_factory.mktemp("log") / "server.err"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    argv = [sys.executable, "-m", "verispec.server", "--model-factory", FACTORY,
            "--factory-kwargs", json.dumps({"control_dir": str(control), "eos": False}),
            "--replicas", "2", "--port", str(port), "--method", SETTINGS["method"],
            "--gamma", str(SETTINGS["gamma"]), "--max-batch", str(SETTINGS["max_batch"]),
            "--max-queue", str(SETTINGS["max_queue"]), "--shutdown-timeout", str(SHUTDOWN_S),
            "--log-level", "warning"]
    with stderr.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = first_line(proc)
        assert f" on http://127.0.0.1:{port} " in line, (line, stderr.read_text()[-3000:])
        cl = Cluster(proc, port, control, stderr)
        wait_for(lambda: len(per_replica(cl.metrics(), "verispec_replica_info")) == 2,
                 what="both replicas' metrics")
        yield cl
    finally:
        set_gate(control, False)
        _stop(proc)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop the server if it still runs, and every process it started, whatever state it
    is in (a failed start included)."""
    if proc.poll() is not None:
        return
    pids = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    for pid in alive(pids | descendants(proc.pid)):  # never leave a process behind
        os.kill(pid, signal.SIGKILL)


# -- the single-process reference -------------------------------------------------------------

_REFERENCE: dict[str, str] = {}


def reference(requests: list[dict[str, Any]]) -> list[str]:
    """What the single-process server answers (same pair, same settings), text by request."""
    todo = [r for r in requests if _key(r) not in _REFERENCE]
    if todo:
        config = ServerConfig(**SETTINGS, shutdown_timeout_s=2.0)  # type: ignore[arg-type]
        handle = ServerHandle(create_app(*toy_pair(eos=False), config), "127.0.0.1", 0)
        with handle:
            c = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)
            for r in todo:
                _REFERENCE[_key(r)] = _ask(c, {**r, "stream": False})[0]
    return [_REFERENCE[_key(r)] for r in requests]


def _key(request: dict[str, Any]) -> str:  # streamed or not, the same text
    return json.dumps({k: v for k, v in request.items() if k != "stream"}, sort_keys=True)


def _ask(client: Any, request: dict[str, Any]) -> tuple[str, Any]:
    """(text, last chunk or response) of one request, streamed or not, chat or not."""
    body = dict(request)
    chat = "messages" in body
    extra = {"speculative": body.pop("speculative")} if "speculative" in body else None
    api = client.chat.completions if chat else client.completions
    resp = api.create(model=MODEL, extra_body=extra, **body)
    if not body.get("stream"):
        choice = resp.choices[0]
        return (choice.message.content if chat else choice.text), resp
    parts, last = [], None
    for chunk in resp:
        if chunk.choices:
            choice = chunk.choices[0]
            parts.append((choice.delta.content if chat else choice.text) or "")
            if choice.finish_reason is not None:
                last = chunk
    return "".join(parts), last


def requests_mix(n: int, max_tokens: int = 20) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        r: dict[str, Any] = {"seed": 100 + i, "max_tokens": max_tokens, "stream": i % 2 == 0,
                             "temperature": [1.0, 0.7, 0.0][i % 3],
                             "speculative": {"method": ["block", "token", "ar"][i % 3],
                                             "gamma": 3}}
        chat = {"messages": [{"role": "user", "content": "ABBA"}]}
        out.append({**r, **(chat if i % 4 == 3 else {"prompt": ["ABC", "BCA", "CCB"][i % 3]})})
    return out


# -- serving -------------------------------------------------------------------------------------

@needs_ray
def test_the_ingress_replica_takes_http_itself_not_serves_proxy(cluster: Cluster) -> None:
    """Direct ingress: the endpoint's socket belongs to the ingress replica, so a request
    crosses no proxy process on its way to the engine replica."""
    assert "ServeReplica:verispec:VerispecIngress" in listener(cluster.port)
    assert "ProxyActor" not in listener(cluster.port)


@needs_ray
def test_sixteen_concurrent_streams_equal_the_single_process_server(cluster: Cluster) -> None:
    cases = [{**r, "stream": True} for r in requests_mix(16, max_tokens=24)]
    before = per_replica(cluster.metrics(), "verispec_requests_total", status="200")
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda r: _ask(cluster.client(), r), cases))
    for case, (text, last), want in zip(cases, got, reference(cases), strict=True):
        assert text == want, case
        assert last.choices[0].finish_reason == "length"
        ar = case["speculative"]["method"] == "ar"
        assert last.model_extra["speculative"]["gamma"] == (0 if ar else 3)

    def spread() -> bool:  # both replicas served some: the router spreads the load
        after = per_replica(cluster.metrics(), "verispec_requests_total", status="200")
        served = {k: v - before.get(k, 0.0) for k, v in after.items()}
        return sum(served.values()) == 16 and min(served.values()) > 0 and len(served) == 2

    wait_for(spread, 30, "the requests in both replicas' metrics")


@needs_ray
def test_sixty_four_concurrent_requests_none_lost_past_the_queue_limit(cluster: Cluster) -> None:
    """Held replicas take max_batch + max_queue = 16 requests each; the rest are answered 429
    with Retry-After by the replica (as one server does) after the ingress has offered each
    of them to the router MAX_ATTEMPTS times; every accepted one completes."""
    from verispec.server.ray_serve import MAX_ATTEMPTS

    cases = requests_mix(64, max_tokens=12)
    capacity = 2 * (SETTINGS["max_batch"] + SETTINGS["max_queue"])
    results: list[tuple[str, Any] | BaseException | None] = [None] * 64
    before = sum(settled(cluster, "verispec_requests_total", status="200").values())
    offered = "verispec_ingress_refusals_rerouted_total"
    rerouted = sum(v for k, v in cluster.metrics().items() if k.startswith(offered))

    def one(i: int) -> None:
        try:
            results[i] = _ask(cluster.client(), cases[i])
        except Exception as exc:  # noqa: BLE001 - kept for the assertions below
            results[i] = exc

    set_gate(cluster.control, True)
    try:
        with ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(one, i) for i in range(64)]

            def routed() -> bool:
                limited = sum(isinstance(r, openai.RateLimitError) for r in results)
                accepted = sum(per_replica(cluster.metrics(), "verispec_requests_total",
                                           status="200").values()) - before
                return limited + accepted == 64

            wait_for(routed, 60, "every request accepted or refused")
            set_gate(cluster.control, False)
            for f in futures:
                f.result(120)
    finally:
        set_gate(cluster.control, False)
    done = [(i, r) for i, r in enumerate(results) if isinstance(r, tuple)]
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(done) + len(limited) == 64, [r for r in results if not isinstance(r, tuple)]
    assert len(done) == capacity  # the router filled both replicas before either refused
    for err in limited:
        assert err.status_code == 429 and err.body["code"] == "queue_full"
        assert err.response.headers["retry-after"] == "1"
    now = sum(v for k, v in cluster.metrics().items() if k.startswith(offered))
    assert now - rerouted >= (MAX_ATTEMPTS - 1) * len(limited)
    wants = reference([cases[i] for i, _ in done])
    for (i, (text, _)), want in zip(done, wants, strict=True):
        assert text == want, cases[i]


@needs_ray
def test_a_client_that_disconnects_frees_its_row_in_the_replica(cluster: Cluster) -> None:
    def finished(reason: str) -> float:
        return sum(per_replica(cluster.metrics(), "verispec_requests_finished_total",
                               reason=reason).values())

    cancelled = finished("cancelled")
    set_delay(cluster.control, 0.1)  # 50 tokens: ~5 s
    try:
        stream = cluster.client().completions.create(
            model=MODEL, prompt="AB", max_tokens=50, seed=1, stream=True,
            extra_body={"speculative": {"method": "ar"}})
        chunks = iter(stream)
        next(chunks), next(chunks)
        stream.close()
        wait_for(lambda: finished("cancelled") == cancelled + 1, 20, "the request cancelled")
    finally:
        set_delay(cluster.control, 0.0)
    assert sum(per_replica(cluster.metrics(), "verispec_active_rows").values()) == 0


# -- faults ------------------------------------------------------------------------------------

@dataclass
class Outcome:
    text: str = ""
    error: BaseException | None = None
    ended: float = 0.0
    finish: str | None = None


def _run_request(client: Any, request: dict[str, Any], out: Outcome) -> None:
    """Run a request, keeping the text streamed before any error."""
    try:
        if request.get("stream"):
            body = {k: v for k, v in request.items() if k != "speculative"}
            stream = client.completions.create(model=MODEL, **body, extra_body={
                "speculative": request["speculative"]})
            for chunk in stream:
                out.text += chunk.choices[0].text if chunk.choices else ""
                out.finish = chunk.choices[0].finish_reason if chunk.choices else out.finish
        else:
            out.text = _ask(client, request)[0]
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        out.error = exc
    out.ended = time.monotonic()


def _place(cluster: Cluster, request: dict[str, Any], out: Outcome,
           threads: list[threading.Thread]) -> str:
    """Send a request (in a thread); the replica that took it (from the metrics: the one
    whose count of accepted requests grew; replicas may come and go meanwhile)."""
    served = settled(cluster, "verispec_requests_total", status="200")
    thread = threading.Thread(target=_run_request, args=(cluster.client(), request, out))
    thread.start()
    threads.append(thread)
    grown: dict[str, float] = {}

    def accepted() -> bool:
        now = per_replica(cluster.metrics(), "verispec_requests_total", status="200")
        grown.update({r: v - served.get(r, 0.0) for r, v in now.items()
                      if v > served.get(r, 0.0)})
        return bool(grown)

    wait_for(accepted, 30, f"the request to be accepted ({served}, {out})")
    assert sum(grown.values()) == 1, (served, grown)
    return next(iter(grown))


@needs_ray
def test_a_replica_killed_mid_stream_ends_its_streams_and_ray_restarts_it(
        cluster: Cluster) -> None:
    """Streams of the killed replica end with an error event (no hang), its non-streamed
    requests (not answered yet) are served by the other replica, the other replica's
    requests are unaffected, and Ray Serve starts a new replica within 60 s."""
    requests = [{"prompt": "ABC", "seed": 500 + i, "max_tokens": 60,
                 "speculative": {"method": "ar"}} for i in range(12)]
    wants = reference(requests)  # streamed or not, the same text
    kinds: list[bool] = []  # streamed or not, chosen as the requests are sent
    m = cluster.metrics()
    pids = {r: int(k.split('pid="')[1].split('"')[0]) for k in m
            if k.startswith("verispec_replica_info")
            for r in [k.split('replica="')[1].split('"')[0]]}
    rerouted = sum(v for k, v in m.items() if k.startswith("verispec_ingress_rerouted_total"))
    outcomes = [Outcome() for _ in requests]
    threads: list[threading.Thread] = []
    placed: dict[int, str] = {}

    def running(replica: str) -> list[bool]:  # the kinds of its requests still running
        return [kinds[j] for j, p in placed.items() if p == replica and not outcomes[j].ended]

    def next_kind() -> bool:
        """The kind that completes the most replicas' pairs wherever the router sends it
        (ties: the kind missing on the replica running fewer requests): the routing does
        not follow a fixed pattern of kinds, so a fixed list of kinds can miss."""
        completes = {k: sum((not k) in running(r) for r in pids) for k in (True, False)}
        if completes[True] != completes[False]:
            return max(completes, key=completes.__getitem__)
        idle = min(pids, key=lambda r: len(running(r)))
        return not running(idle)[0] if running(idle) else len(kinds) % 2 == 0

    set_delay(cluster.control, 0.3)  # 60 tokens: ~18 s per request
    try:
        for i, request in enumerate(requests):  # until a replica runs both kinds
            kinds.append(next_kind())
            placed[i] = _place(cluster, {**request, "stream": kinds[i]}, outcomes[i], threads)
            both = [r for r in pids if set(running(r)) == {True, False}]
            if both and len(set(placed.values())) == 2:
                break
        assert both, placed
        victim = both[0]
        # its streams have sent text: they have started answering (a stream that has not
        # is sent to the other replica, like a non-streamed request)
        wait_for(lambda: all(outcomes[j].text for j, p in placed.items()
                             if p == victim and kinds[j]), 30, "the streams' first text")
        live = {j for j, p in placed.items() if p == victim and not outcomes[j].ended}
        os.kill(pids[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        for t in threads:
            t.join(120)
    finally:
        set_delay(cluster.control, 0.0)
    for i, replica in placed.items():
        out = outcomes[i]
        if i in live and kinds[i]:  # a stream of the killed replica: the error event
            assert isinstance(out.error, openai.APIError), (i, out)
            assert out.error.code == "replica_failed" and "incomplete" in out.error.message
            assert 0 < len(out.text) < 60 and wants[i].startswith(out.text)
            assert out.ended - killed_at < 30
        else:  # served in full, by its replica or (not answered yet) by the other one
            assert out.error is None and out.text == wants[i], (i, replica, out)
    moved = [i for i in live if not kinds[i]]
    assert moved and any(kinds[i] for i in live)

    def restarted() -> bool:
        replicas = per_replica(cluster.metrics(), "verispec_replica_info")
        return len(replicas) == 2 and victim not in replicas

    wait_for(restarted, 60 - (time.monotonic() - killed_at), "a new replica")
    m = cluster.metrics()
    now = sum(v for k, v in m.items() if k.startswith("verispec_ingress_rerouted_total"))
    assert 1 <= now - rerouted <= len(moved)
    text, _ = _ask(cluster.client(), {"prompt": "AB", "seed": 1, "max_tokens": 6})
    assert text == reference([{"prompt": "AB", "seed": 1, "max_tokens": 6}])[0]


# -- shutdown (the module's last cluster test) ---------------------------------------------------

@needs_ray
def test_sigint_lets_in_flight_requests_finish_cancels_at_the_deadline_and_leaves_no_process(
        cluster: Cluster) -> None:
    """As the single-process server: new requests are refused, in-flight ones may finish
    for --shutdown-timeout (8 s), what still runs is cancelled (finish_reason "abort")."""
    short, long = ({"prompt": "ABC", "seed": 9, "max_tokens": n, "stream": True,
                    "speculative": {"method": "ar"}} for n in (12, 60))
    pids = descendants(cluster.proc.pid)
    assert len(pids) >= 6  # Ray's own processes, the proxy, the ingress and two engines
    outcomes, threads = [Outcome(), Outcome()], []
    set_delay(cluster.control, 0.25)  # ~3 s and ~15 s
    try:
        for request, out in zip((short, long), outcomes, strict=True):
            _place(cluster, request, out, threads)
        cluster.proc.send_signal(signal.SIGINT)
        refused: list[BaseException] = []

        def refuses() -> bool:  # the replicas took the drain order: new requests get 503
            try:
                cluster.client().completions.create(model=MODEL, prompt="A", max_tokens=1)
            except openai.InternalServerError as exc:
                refused.append(exc)
            return bool(refused)

        wait_for(refuses, SHUTDOWN_S - 2, "new requests to be refused")
        assert refused[0].status_code == 503 and refused[0].body["code"] == "shutting_down"
        assert cluster.proc.wait(120) == 0
        for t in threads:
            t.join(60)
    finally:
        set_delay(cluster.control, 0.0)
    done, cut = outcomes
    assert done.error is None and done.finish == "length"
    assert done.text == reference([short])[0]
    assert cut.error is None and cut.finish == "abort"
    assert 0 < len(cut.text) < 60 and reference([long])[0].startswith(cut.text)
    assert "stopped" in cluster.stderr.read_text()
    wait_for(lambda: not alive(pids), 30, "every Ray process to end")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", cluster.port)) != 0  # nothing listens any more
