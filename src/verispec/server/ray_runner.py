"""``verispec serve --replicas N``: the app on Ray Serve, started and stopped with the command.

Without ``--address`` a local Ray starts on loopback only (:func:`start_local_ray`: node
address 127.0.0.1, no dashboard) and the ingress replica itself takes HTTP on
``--host:--port`` (Ray Serve's direct ingress, :func:`local_serve_env`: one process hop
fewer than through Serve's HTTP proxy, which then listens on a free port of its own); with
``--address`` the command joins that cluster and Serve's HTTP proxy binds ``--host:--port``
(the cluster's own Serve settings apply). :func:`serve_replicas` deploys
:func:`~verispec.server.ray_serve.build_app` as the application ``verispec`` and serves
until SIGINT/SIGTERM. Then, as the single-process server: a drain order
(:mod:`verispec.server.ray_state`) makes every engine replica refuse new requests (503)
and cancel what still runs after ``--shutdown-timeout`` seconds; once they are idle Ray
Serve deletes the application, and the local Ray shuts down with all its processes (a
joined cluster keeps running without the application). Exit status 0 after a clean
shutdown.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

import ray
from ray import serve

from verispec.server import ray_state

#: Ray's single-machine mode: with it off, Ray takes the loopback address as the node's
#: address instead of replacing it with the machine's network address.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

__all__ = ["LOOPBACK_ENV", "local_serve_env", "loopback_mode", "serve_replicas",
           "start_local_ray"]


def local_serve_env(port: int, ingress_replicas: int = 1) -> dict[str, str]:
    """Ray Serve's settings for a local Ray (Serve reads them from the environment of every
    Ray process, so they are set before Ray starts): the ingress replicas take HTTP
    themselves ("direct ingress") on ``port`` and the ports after it, one each, instead of
    behind Serve's HTTP proxy, so a request crosses one process less. No load balancer sits
    in front to deregister a stopping ingress from, so it stops at once, and a restarted
    ingress takes its port back at once. Serve's throughput-optimized mode is not used: its
    user code on the replica's main event loop slowed decoding in the engine replica
    (docs/deploy.md, "Scaling model")."""
    if not (ingress_replicas >= 1 and 0 < port and port + ingress_replicas <= 65536):
        raise ValueError(f"no room for {ingress_replicas} ingress port(s) from {port}")
    return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + ingress_replicas),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
            "RAY_SERVE_PORT_QUARANTINE_S": "0"}


def loopback_mode() -> None:
    """Make Ray keep 127.0.0.1 as this node's address (it replaces a loopback address with
    the machine's network address unless told it runs on one machine only): for this
    process and the processes it starts."""
    from ray._private import ray_constants

    os.environ[LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read when ray was imported: set it here too


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_local_ray(num_cpus: int | None = None, log_to_driver: bool = True,
                    temp_dir: str | None = None) -> dict[str, Any]:
    """Start a local Ray whose every server binds loopback: node address 127.0.0.1 (see
    :func:`loopback_mode`), no dashboard. Returns ``ray.init``'s address info."""
    loopback_mode()
    kwargs: dict[str, Any] = {"_node_ip_address": "127.0.0.1", "include_dashboard": False,
                              "log_to_driver": log_to_driver, "num_cpus": num_cpus}
    if temp_dir is not None:
        kwargs["_temp_dir"] = temp_dir
    context = ray.init(**kwargs)
    info: dict[str, Any] = dict(context.address_info)
    return info


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Stop:
    """The SIGINT/SIGTERM handler: while the app starts a signal aborts the start
    (KeyboardInterrupt, so that Ray is shut down); once it serves, it sets :attr:`event`."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.serving = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self.serving:
            raise KeyboardInterrupt
        self.event.set()


@contextmanager
def _signals(handler: _Stop) -> Iterator[None]:
    """``handler`` answers SIGINT/SIGTERM while the block runs (main thread only)."""
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, handler)
                for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


#: Beyond the shutdown timeout, how long cancelled requests get to end before Serve stops.
DRAIN_MARGIN_S = 5.0


def _drain(timeout_s: float) -> bool:
    """Order the engine replicas to drain and wait until they are idle; True if they all
    drained in time."""
    from verispec.server.ray_serve import APP_NAME

    order = ray_state.order_drain(APP_NAME, timeout_s)
    idle = ray_state.wait_idle(APP_NAME, order, order.deadline + DRAIN_MARGIN_S)
    time.sleep(0.2)  # the last bytes of the last responses pass the ingress
    return idle


def _describe(config: Any, options: Any) -> str:
    if options.replicas is not None:
        count = f"{options.replicas} engine replica{'s' if options.replicas != 1 else ''}"
    else:
        count = f"{options.min_replicas} to {options.max_replicas} engine replicas"
    return (f"{count} on Ray Serve, max batch {config.max_batch}, queue {config.max_queue} "
            "each")


def serve_replicas(spec: Any, config: Any, options: Any, *, host: str = "127.0.0.1",
                   port: int = 8000, address: str | None = None, log_level: str = "info",
                   out: TextIO, err: TextIO) -> int:
    """Deploy the app on Ray Serve and serve until SIGINT/SIGTERM; returns the exit status.

    ``spec``, ``config``, ``options``: a :class:`~verispec.server.replica_options.ModelSpec`,
    a :class:`~verispec.server.config.ServerConfig` and a
    :class:`~verispec.server.replica_options.ReplicaOptions`. ``port=0`` picks a free port.
    """
    from verispec.server.ray_serve import APP_NAME, build_app

    app = build_app(spec, config, options)  # bad options fail here, before Ray starts
    port = port or _free_port(host)
    proxy_port = port  # Serve's HTTP proxy: the endpoint on a joined cluster
    chatty = log_level in ("debug", "info")
    if address is None:
        proxy_port = _free_port(host)
        os.environ.update(local_serve_env(port, options.ingress_replicas))
        cpus = max(os.cpu_count() or 1, math.ceil(options.most_replicas * options.replica_cpus))
        start_local_ray(num_cpus=cpus, log_to_driver=chatty)
    else:
        if _is_loopback(address):  # a local cluster, started on 127.0.0.1
            loopback_mode()
        ray.init(address=address, log_to_driver=chatty)
    stop = _Stop()
    try:
        with _signals(stop):  # after ray.init, which installs a SIGTERM handler of its own
            ray_state.clear_drain(APP_NAME)  # an order left by an earlier run on this cluster
            serve.start(http_options={"host": host, "port": proxy_port},
                        proxy_location="HeadOnly",
                        logging_config={"log_level": log_level.upper()})
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
            stop.serving = True
            url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            print(f"verispec serve: {config.method} on {url} ({_describe(config, options)})",
                  file=out, flush=True)
            stop.event.wait()
        print(f"verispec serve: shutting down (in-flight requests get "
              f"{config.shutdown_timeout_s:g}s)", file=err, flush=True)
        clean = _drain(config.shutdown_timeout_s)
        serve.delete(APP_NAME)
        if address is None:
            serve.shutdown()
        print("verispec serve: stopped" if clean else
              "verispec serve: stopped (some replicas did not drain in time)", file=err,
              flush=True)
        return 0
    except KeyboardInterrupt:
        print("verispec serve: interrupted while starting", file=err, flush=True)
        if address is not None:
            with contextlib.suppress(Exception):
                serve.delete(APP_NAME)
        return 1
    finally:
        ray_state.clear_drain(APP_NAME)
        ray.shutdown()
