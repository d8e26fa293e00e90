"""What the replicas of a Ray Serve application share, in Ray's key-value store (the GCS).

* ``metrics/<app>/<replica>``: each engine replica's latest
  :class:`~verispec.server.replica_metrics.Snapshot` (its Prometheus text, how busy it
  is, whether it is draining), written about once a second and deleted when it stops;
  the ingress's ``/metrics`` reads the fresh ones.
* ``drain/<app>``: a shutdown order (:class:`DrainOrder`). ``verispec serve --replicas``
  writes it on SIGINT/SIGTERM; every engine replica then stops taking requests (503, as
  the single-process server while it shuts down) and cancels what still runs at the
  deadline, so in-flight requests end as they do in one process before Ray Serve stops
  the replicas.

The store is Ray's internal one (``ray.experimental.internal_kv``, as Ray Serve uses it);
it lives as long as the cluster.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from ray.experimental import internal_kv

from verispec.server.replica_metrics import Snapshot

__all__ = ["NAMESPACE", "DrainOrder", "clear_drain", "order_drain", "publish", "read_drain",
           "read_snapshots", "wait_idle", "withdraw"]

NAMESPACE = "verispec-serve"


def _metrics_key(app: str, replica: str = "") -> str:
    return f"metrics/{app}/{replica}"


def publish(app: str, snapshot: Snapshot) -> None:
    internal_kv._internal_kv_put(_metrics_key(app, snapshot.replica), snapshot.dumps(),
                                 namespace=NAMESPACE)


def withdraw(app: str, replica: str) -> None:
    internal_kv._internal_kv_del(_metrics_key(app, replica), namespace=NAMESPACE)


def read_snapshots(app: str) -> list[Snapshot]:
    """The fresh snapshots of ``app``'s engine replicas, by replica id (stale ones, of
    replicas that stopped without withdrawing theirs, are deleted)."""
    now, fresh = time.time(), []
    for key in internal_kv._internal_kv_list(_metrics_key(app), namespace=NAMESPACE):
        raw = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        try:
            snap = Snapshot.loads(raw) if raw else None
        except ValueError:
            snap = None
        if snap is not None and snap.fresh(now):
            fresh.append(snap)
        else:
            internal_kv._internal_kv_del(key, namespace=NAMESPACE)
    return sorted(fresh, key=lambda s: s.replica)


@dataclass(frozen=True)
class DrainOrder:
    """Stop taking requests; cancel what still runs at ``deadline`` (both epoch seconds)."""

    issued: float
    deadline: float


def order_drain(app: str, timeout_s: float) -> DrainOrder:
    """Tell ``app``'s engine replicas to drain; in-flight requests get ``timeout_s``."""
    now = time.time()
    order = DrainOrder(now, now + max(0.0, timeout_s))
    internal_kv._internal_kv_put(f"drain/{app}", json.dumps(asdict(order)).encode(),
                                 namespace=NAMESPACE)
    return order


def read_drain(app: str) -> DrainOrder | None:
    raw = internal_kv._internal_kv_get(f"drain/{app}", namespace=NAMESPACE)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return DrainOrder(float(data["issued"]), float(data["deadline"]))
    except (KeyError, TypeError, ValueError):
        return None


def clear_drain(app: str) -> None:
    internal_kv._internal_kv_del(f"drain/{app}", namespace=NAMESPACE)


def wait_idle(app: str, order: DrainOrder, until: float, poll_s: float = 0.2) -> bool:
    """Wait (up to the epoch time ``until``) until every engine replica has drained and
    has nothing left to decode; True if they all did."""
    while True:
        snaps = read_snapshots(app)
        if snaps and all(s.time >= order.issued and s.draining and s.busy == 0
                         for s in snaps):
            return True
        if time.time() >= until:
            return False
        time.sleep(poll_s)
