"""``GET /metrics``: the server's counters in Prometheus' text format (``prometheus_client``,
one registry per app so several apps can live in one process).

Series (all prefixed ``verispec_``):

* ``requests_total{endpoint, status}``: answered requests by HTTP status (streams count
  when they start);
* ``requests_finished_total{method, reason}``: decoded requests by why they ended (``eos``,
  ``max_new_tokens``, ``stop``, ``cancelled``, ``context_window``, ``error``);
* ``queue_depth``, ``active_rows``: requests waiting for a row, rows decoding (read at
  scrape time);
* ``tokens_generated_total{method}``, ``target_calls_total{method}`` (per row: each row's
  passes), ``target_passes_total`` (batched target forward passes);
* ``block_efficiency{method}``: tokens per target call, ``acceptance_by_position{method,
  position}``: P(draft token i accepted | drafted), both over finished requests;
* ``time_to_first_token_seconds{method}``, ``time_per_output_token_seconds{method}``:
  histograms.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from verispec.engine.stats import Stats

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The app's metrics; the scheduler thread and the event loop both write to them
    (``prometheus_client`` is thread-safe)."""

    def __init__(self, queue_depth: Callable[[], float], active_rows: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter("verispec_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=reg)
        self.finished = Counter("verispec_requests_finished", "decoded requests by end",
                                ["method", "reason"], registry=reg)
        Gauge("verispec_queue_depth", "requests waiting for a free row",
              registry=reg).set_function(queue_depth)
        Gauge("verispec_active_rows", "rows of the batch decoding now",
              registry=reg).set_function(active_rows)
        self.tokens = Counter("verispec_tokens_generated", "tokens generated", ["method"],
                              registry=reg)
        self.target_calls = Counter("verispec_target_calls", "target passes each row took "
                                    "part in, summed over rows", ["method"], registry=reg)
        self.target_passes = Counter("verispec_target_passes", "batched target forward passes",
                                     registry=reg)
        self.block_efficiency = Gauge("verispec_block_efficiency", "tokens per target call "
                                      "over finished requests", ["method"], registry=reg)
        self.acceptance = Gauge("verispec_acceptance_by_position", "P(draft token at position "
                                "accepted | drafted) over finished requests",
                                ["method", "position"], registry=reg)
        self.ttft = Histogram("verispec_time_to_first_token_seconds", "arrival to first token",
                              ["method"], buckets=TTFT_BUCKETS, registry=reg)
        self.tpot = Histogram("verispec_time_per_output_token_seconds", "seconds per output "
                              "token after the first", ["method"], buckets=TPOT_BUCKETS,
                              registry=reg)
        self._totals: dict[str, Stats] = {}

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def first_token(self, method: str, seconds: float) -> None:
        self.ttft.labels(method).observe(seconds)

    def passes(self, count: int) -> None:
        if count > 0:
            self.target_passes.inc(count)

    def finish(self, method: str, reason: str, stats: Stats | None,
               decode_seconds: float | None) -> None:
        """A request ended; ``decode_seconds``: first to last token (None if < 2 tokens)."""
        self.finished.labels(method, reason).inc()
        if stats is None:
            return
        self.tokens.labels(method).inc(stats.tokens_emitted)
        self.target_calls.labels(method).inc(stats.target_calls)
        if decode_seconds is not None and stats.tokens_emitted > 1:
            self.tpot.labels(method).observe(decode_seconds / (stats.tokens_emitted - 1))
        total = self._totals.setdefault(method, Stats(method=method))
        self._totals[method] = total = Stats.merge([total, stats], batch_size=1,
                                                   target_passes=0, wall_time_s=0.0)
        self.block_efficiency.labels(method).set(total.block_efficiency)
        for position, rate in enumerate(total.acceptance_by_position):
            self.acceptance.labels(method, str(position + 1)).set(rate)

    def render(self) -> bytes:
        return generate_latest(self.registry)
