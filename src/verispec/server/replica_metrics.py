"""Per-replica ``/metrics``: each engine replica's Prometheus text, labelled by replica.

Every engine replica of a Ray Serve deployment renders its own
:class:`~verispec.server.metrics.Metrics` (the single-process server's series) and
publishes it as a :class:`Snapshot` about once a second; the ingress's ``/metrics``
merges the fresh snapshots into one exposition in which every sample carries a
``replica`` label (the Ray Serve replica id), plus ``verispec_replica_info{replica, pid}``
so a replica id can be matched with its process. Summing over ``replica`` gives the
cluster's figures (``sum without (replica) (...)`` in PromQL).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["PUBLISH_PERIOD_S", "STALE_AFTER_S", "Collector", "Snapshot", "merge_snapshots"]

#: How often an engine replica publishes its snapshot (seconds).
PUBLISH_PERIOD_S = 1.0
#: A snapshot older than this is dropped (its replica stopped or no longer answers).
STALE_AFTER_S = 10.0


class Collector(Protocol):
    """What ``prometheus_client.generate_latest`` renders (a registry, say)."""

    def collect(self) -> Iterable[Metric]: ...


@dataclass(frozen=True)
class Snapshot:
    """One replica's Prometheus text at ``time`` (seconds since the epoch); ``busy``: its
    requests decoding or queued then, ``draining``: it was shutting down."""

    replica: str
    pid: int
    time: float
    text: str
    busy: int = 0
    draining: bool = False

    def dumps(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def loads(cls, raw: bytes) -> Snapshot:
        """Parse :meth:`dumps`' output; raises ValueError for anything else."""
        try:
            data = json.loads(raw)
            return cls(replica=str(data["replica"]), pid=int(data["pid"]),
                       time=float(data["time"]), text=str(data["text"]),
                       busy=int(data.get("busy", 0)), draining=bool(data.get("draining")))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a metrics snapshot: {exc}") from None

    def fresh(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) - self.time <= STALE_AFTER_S


class _Merged:
    """The collector of :func:`merge_snapshots`."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def _labelled(snapshots: Sequence[Snapshot]) -> list[Metric]:
    families: dict[tuple[str, str], Metric] = {}
    info = Metric("verispec_replica_info", "an engine replica and its process id", "gauge")
    for snap in sorted(snapshots, key=lambda s: s.replica):
        info.samples.append(Sample("verispec_replica_info",
                                   {"replica": snap.replica, "pid": str(snap.pid)}, 1.0))
        for family in text_string_to_metric_families(snap.text):
            merged = families.get((family.name, family.type))
            if merged is None:
                merged = families[(family.name, family.type)] = Metric(
                    family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                merged.samples.append(s._replace(labels={"replica": snap.replica,
                                                         **s.labels}))
    return [info, *families.values()] if snapshots else []


def merge_snapshots(snapshots: Sequence[Snapshot], extra: Collector | None = None) -> bytes:
    """One Prometheus exposition: every snapshot's samples with a ``replica`` label, the
    replica info series, then ``extra``'s metrics (the ingress's own) as they are."""
    metrics = _labelled(snapshots)
    if extra is not None:
        metrics.extend(extra.collect())
    return generate_latest(_Merged(metrics))  # type: ignore[arg-type]
