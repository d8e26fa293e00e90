"""``verispec serve --address``: the app joins a running Ray cluster of two nodes.

Both nodes run on one machine on loopback (Ray's ``cluster_utils.Cluster``, one CPU each),
so two engine replicas that reserve one CPU each can only both run on different nodes: the
requests cross nodes as they would across machines. The server stops at SIGINT and leaves
the cluster running; the test then stops exactly this cluster's processes (never
``ray stop``, which would stop every Ray on the machine) and checks none is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from test_ray_serve import (FACTORY, HAS_RAY, ROOT, _ask, _samples, alive, descendants,
                            first_line, needs_ray, per_replica, requests_mix, wait_for)

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmdline(pid: str) -> str:
    try:
        return Path("/proc", pid, "cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def cluster_processes(gcs_port: int) -> set[int]:
    """Every process of the cluster whose GCS listens on ``gcs_port``: its GCS server, the
    processes that name its address (raylets, agents, monitors) and their children (Ray's
    workers, which rename themselves ``ray::...``)."""
    roots = {int(pid) for pid in filter(str.isdigit, os.listdir("/proc"))
             if f"--gcs_server_port={gcs_port}" in (line := _cmdline(pid))
             or f"127.0.0.1:{gcs_port}" in line}
    return alive(roots | {child for pid in roots for child in descendants(pid)})


#: Two nodes on one machine, both on 127.0.0.1: Ray's own test clusters
#: (``ray.cluster_utils.Cluster``) in its single-machine mode. ``ray start --address`` cannot
#: add a second node there ("multi-node clusters are not supported"), and Ray's cluster mode
#: replaces the loopback node address with the machine's network address, which the
#: loopback rule of these tests forbids.
CLUSTER_SCRIPT = """
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
from ray._private import ray_constants
ray_constants.ENABLE_RAY_CLUSTER = False
from ray.cluster_utils import Cluster
common = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
cluster = Cluster(initialize_head=True, head_node_args={**common, "include_dashboard": False})
cluster.add_node(**common)
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@contextmanager
def two_node_cluster() -> Iterator[tuple[int, dict[str, str]]]:
    """A head and a second node on 127.0.0.1, one CPU each; yields (GCS port, environment)."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1",
           "RAY_USAGE_STATS_ENABLED": "0"}
    holder = subprocess.Popen([sys.executable, "-c", CLUSTER_SCRIPT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)
    port = 0
    try:
        line = first_line(holder)
        assert line.startswith("127.0.0.1:"), line
        port = int(line.strip().rsplit(":", 1)[1])
        yield port, env
    finally:
        if holder.stdin:
            holder.stdin.close()  # the holder shuts its cluster down
        try:
            holder.wait(60)
        except subprocess.TimeoutExpired:
            holder.kill()
        if port:
            for pid in cluster_processes(port):
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not cluster_processes(port), 30, "the cluster's processes to end")


def _metrics(url: str) -> dict[str, float]:
    import http.client

    from prometheus_client.parser import text_string_to_metric_families

    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/metrics")
        return _samples(text_string_to_metric_families(conn.getresponse().read().decode()))
    finally:
        conn.close()


def _ray_status(gcs_port: int, env: dict[str, str]) -> str:
    status = subprocess.run([str(Path(sys.executable).with_name("ray")), "status", "--address",
                             f"127.0.0.1:{gcs_port}"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert status.returncode == 0, status.stderr
    return status.stdout


@needs_ray
def test_serve_joins_a_two_node_cluster_spreads_replicas_and_leaves_it_running() -> None:
    if not HAS_RAY or not Path("/proc").is_dir():
        pytest.skip("needs the ray extra and Linux's /proc")
    with two_node_cluster() as (gcs_port, env):
        http_port = _free_port()
        argv = [sys.executable, "-m", "verispec.server", "--address", f"127.0.0.1:{gcs_port}",
                "--replicas", "2", "--replica-cpus", "1", "--port", str(http_port),
                "--model-factory", FACTORY, "--factory-kwargs", json.dumps({"eos": False}),
                "--method", "block", "--gamma", "3", "--log-level", "warning"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, env=env)
        try:
            line = first_line(proc)
            url = f"http://127.0.0.1:{http_port}"
            assert f" on {url} " in line, line
            wait_for(lambda: len(per_replica(_metrics(url), "verispec_replica_info")) == 2,
                     60, "both replicas' metrics")
            pids = per_replica(_metrics(url), "verispec_replica_info")
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                   timeout=120)
            cases = requests_mix(8, max_tokens=12)
            with ThreadPoolExecutor(8) as pool:
                texts = [t for t, _ in pool.map(lambda r: _ask(client, r), cases)]
            assert all(texts), texts
            # one CPU a node, one a replica: both nodes' CPUs are taken, by one replica each
            # (Ray's status reports usage with a lag, as after the server below)
            wait_for(lambda: "2.0/2.0 CPU" in _ray_status(gcs_port, env), 60,
                     "both nodes' CPUs to be taken")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(120) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        assert len(pids) == 2
        after = _ray_status(gcs_port, env)  # the cluster outlives the server
        assert after.count("node_") >= 2, after
        # the replicas are gone from both nodes (Ray's status reports usage with a lag)
        wait_for(lambda: "0.0/2.0 CPU" in _ray_status(gcs_port, env), 60,
                 "both nodes' CPUs to be free")
