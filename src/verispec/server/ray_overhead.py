"""Router overhead: the latency Ray Serve adds to a request, against the single-process server.

Starts ``verispec serve`` twice on 127.0.0.1 with the toy pair of
:mod:`verispec.server.testing`: once as one process, once with ``--replicas N`` on a local
Ray (or takes a running Ray endpoint from ``--url``), then sends the same small
non-streamed completion to each, one request at a time, alternating between the two so
that drift in the machine's load hits both alike. Reports the median latency of each, the
median of the per-pair difference (the added latency per request: HTTP into the ingress
replica, its handle call to the engine replica and back) and the CPU.

Run: ``python -m verispec.server.ray_overhead --requests 200`` (needs the ray extra).
The toy pair decodes in microseconds, so the figure is the serving path, not the model.
``--table FILE`` prints a file of such JSON lines (one per round) as a table: one row per
layout and replica count, the rounds' figures side by side.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from contextlib import contextmanager
from urllib.parse import urlsplit

from verispec.bench.serve import launched as launched_server
from verispec.server.testing import MODEL

__all__ = ["build_parser", "main", "measure", "table"]

FACTORY = "verispec.server.testing:toy_pair"
START_TIMEOUT_S = 300.0


@contextmanager
def launched(extra: Sequence[str]) -> Iterator[str]:
    """``python -m verispec.server`` with the toy pair on a free port; yields its URL and
    stops it with SIGTERM afterwards."""
    argv = [sys.executable, "-m", "verispec.server", "--model-factory", FACTORY,
            "--method", "ar", "--port", "0", "--log-level", "warning", *extra]
    with launched_server(argv, START_TIMEOUT_S) as url:
        yield url


class _Client:
    """One keep-alive connection; :meth:`post` returns the request's seconds."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"not a URL: {url!r}")
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=60)

    def post(self, body: bytes) -> float:
        start = time.perf_counter()
        self.conn.request("POST", "/v1/completions", body,
                          {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        payload = resp.read()
        elapsed = time.perf_counter() - start
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {payload[:200]!r}")
        return elapsed


def measure(single_url: str, ray_url: str, requests: int, warmup: int = 20,
            max_tokens: int = 4) -> dict[str, float | int]:
    """Alternate the same request between the two endpoints; latencies in milliseconds."""
    if requests < 1 or warmup < 0:
        raise ValueError(f"requests must be >= 1 and warmup >= 0, got {requests}, {warmup}")
    body = json.dumps({"model": MODEL, "prompt": "ABC", "max_tokens": max_tokens,
                       "seed": 1}).encode()
    single, ray = _Client(single_url), _Client(ray_url)
    for _ in range(warmup):
        single.post(body), ray.post(body)
    a, b = [], []
    for _ in range(requests):
        a.append(single.post(body) * 1e3)
        b.append(ray.post(body) * 1e3)
    added = [y - x for x, y in zip(a, b, strict=True)]
    return {"requests": requests, "single_p50_ms": statistics.median(a),
            "ray_p50_ms": statistics.median(b), "added_p50_ms": statistics.median(added),
            "added_p90_ms": statistics.quantiles(added, n=10)[-1] if requests > 1 else added[0]}


def _cpu() -> str:
    try:
        from verispec.telemetry.machine import cpu_info

        return str(cpu_info().model_name)
    except Exception:  # noqa: BLE001 - the figure does not depend on naming the CPU
        return "unknown"


def table(rounds: Sequence[dict[str, Any]]) -> str:
    """Lines written by :func:`main` (a ``layout`` and ``round`` added by hand, where the
    file compares layouts), one row per layout and replica count in the order they appear."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rounds:
        groups.setdefault((str(r.get("layout") or "—"), int(r["replicas"])), []).append(r)
    lines = ["| layout | replicas | rounds | added p50 (ms) | added p90 (ms) | "
             "single process p50 (ms) | Ray p50 (ms) |", "|---|---|---|---|---|---|---|"]
    for (layout, replicas), rs in groups.items():
        cells = [", ".join(f"{r[k]:.2f}" for r in rs)
                 for k in ("added_p50_ms", "added_p90_ms", "single_p50_ms", "ray_p50_ms")]
        lines.append(f"| {layout} | {replicas} | {len(rs)} | " + " | ".join(cells) + " |")
    cpus = sorted({str(r.get("machine") or r.get("cpu")) for r in rounds})
    return "\n".join(lines + ["", "CPU: " + "; ".join(cpus)])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verispec.server.ray_overhead",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200, help="measured pairs (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured pairs first (default 20)")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens per request (default 4)")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas (default 1)")
    p.add_argument("--url", default=None,
                   help="a running Ray endpoint of the toy pair (default: start one)")
    p.add_argument("--table", default=None,
                   help="print a file of this command's JSON lines as a table (nothing runs)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.table:
        text = Path(args.table).read_text(encoding="utf-8")
        print(table([json.loads(line) for line in text.splitlines() if line.strip()]))
        return 0
    with launched([]) as single_url:
        if args.url:
            result = measure(single_url, args.url, args.requests, args.warmup, args.max_tokens)
        else:
            with launched(["--replicas", str(args.replicas)]) as ray_url:
                result = measure(single_url, ray_url, args.requests, args.warmup,
                                 args.max_tokens)
    print(json.dumps({**result, "replicas": args.replicas, "cpu": _cpu()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
