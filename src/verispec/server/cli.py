"""``verispec serve``: argument parsing and start-up.

:func:`add_command` adds ``serve`` to the ``verispec`` subparsers and :func:`run` executes
it (``verispec.cli`` wires both, as for ``audit``); :func:`main` is ``python -m
verispec.server``. With ``--replicas``, ``--min-replicas/--max-replicas`` or ``--address``
the same app runs as Ray Serve replicas (:mod:`verispec.server.ray_runner`, the ``ray``
extra). Exit status 0 after a clean shutdown (SIGINT/SIGTERM), 1 if the server failed; bad
input raises ValueError (exit 2 through ``verispec.cli.main``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from verispec.checks import parse_gamma
from verispec.models.options import add_model_args
from verispec.server.config import ServerConfig

__all__ = ["add_command", "build_parser", "config_from_args", "main", "run"]


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


def _add_replica_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "replicas", "serve the same app from N engine replicas on Ray Serve, one engine "
        "each, behind a light ingress (needs pip install 'verispec[ray]'; see docs/deploy.md)")
    g.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="N engine replicas on a local Ray (started on 127.0.0.1 and stopped "
                        "with the server) or on the cluster of --address")
    g.add_argument("--min-replicas", type=int, default=None, metavar="N",
                   help="autoscale: at least N engine replicas (with --max-replicas)")
    g.add_argument("--max-replicas", type=int, default=None, metavar="N",
                   help="autoscale: at most N engine replicas; Ray Serve adds one when the "
                        "replicas average more than --max-batch requests in flight")
    g.add_argument("--replica-cpus", type=float, default=1.0, metavar="CPUS",
                   help="CPUs Ray reserves for each engine replica (default 1)")
    g.add_argument("--address", default=None, metavar="HOST:PORT",
                   help="join this running Ray cluster (e.g. 127.0.0.1:6379) instead of "
                        "starting a local one; the server's app is deleted at shutdown, the "
                        "cluster stays")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--no-draft", action="store_true",
                   help="load no draft model (then only --method ar or --drafter ngram)")
    p.add_argument("--method", default="block", metavar="METHOD",
                   help="the speculation of requests that do not choose one in their "
                        "\"speculative\" object: a batchable method with options in brackets "
                        "(default block; mjgd and pearl cannot share the batch)")
    p.add_argument("--gamma", type=parse_gamma, default=None,
                   help="γ for --method: an integer or auto (default: the method's, as "
                        "verispec generate)")
    p.add_argument("--drafter", choices=["model", "ngram"], default="model",
                   help="the default drafter: the draft model or prompt lookup")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; binding any other "
                        "address exposes the server to the network)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    p.add_argument("--max-batch", type=int, default=8, help="rows decoded together (default 8)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a row; more are answered 429 (default 64)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id clients give (default: the target's name)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="budget of requests without max_tokens (default 256)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGINT/SIGTERM, in-flight requests may finish for this long, then "
                        "are cancelled (default 30)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's (with replicas: Ray Serve's) log level (default info)")
    p.add_argument("--model-factory", default=None, metavar="MODULE:FUNCTION",
                   help="build the pair by calling this function, which returns (target, "
                        "draft or None), instead of loading --target/--draft (e.g. "
                        "verispec.server.testing:toy_pair, the toy pair of the tests)")
    p.add_argument("--factory-kwargs", type=_json_object, default={}, metavar="JSON",
                   help="keyword arguments of --model-factory, a JSON object")
    _add_replica_arguments(p)


def add_command(sub: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``verispec`` subparsers."""
    p = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (completions, chat, streaming, "
        "continuous batching)",
        description="Serve the target with speculative decoding behind OpenAI's API: "
                    "POST /v1/completions and /v1/chat/completions (stream: true for "
                    "server-sent events), GET /v1/models, /health and /metrics. A request "
                    "may choose its speculation with \"speculative\": {\"method\": \"token\", "
                    "\"gamma\": 4}. Needs pip install 'verispec[serve]'; --replicas N serves "
                    "it from N Ray Serve replicas (pip install 'verispec[ray]').")
    _add_arguments(p)
    return p


def _check_host(host: str, err: TextIO) -> None:
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        print(f"verispec serve: warning: binding {host}, not a loopback address: the server "
              "is reachable from the network and has no authentication", file=err)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's settings from ``verispec serve``'s parsed arguments."""
    return ServerConfig(method=args.method, gamma=args.gamma, drafter=args.drafter,
                        max_batch=args.max_batch, max_queue=args.max_queue,
                        model_name=args.served_model_name,
                        default_max_tokens=args.default_max_tokens,
                        shutdown_timeout_s=args.shutdown_timeout)


def _run_replicas(args: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    """Serve on Ray Serve if the arguments ask for replicas (None: they do not)."""
    from verispec.server.replica_options import ModelSpec, ReplicaOptions, load_factory

    options = ReplicaOptions.from_args(args)
    if options is None:
        return None
    config = config_from_args(args)
    spec = ModelSpec.from_args(args)
    options.engine_max_ongoing(config.max_batch, config.max_queue)
    if spec.factory is not None:  # a bad name fails here, not in every replica
        load_factory(spec.factory)
    try:
        from verispec.server.ray_runner import serve_replicas
    except ImportError as exc:
        raise RuntimeError(f"--replicas, --min-replicas/--max-replicas and --address need the "
                           f"ray extra ({exc.name} is missing): pip install 'verispec[ray]'"
                           ) from None
    return serve_replicas(spec, config, options, host=args.host, port=args.port,
                          address=args.address, log_level=args.log_level, out=out, err=err)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Load the pair, build the app and serve until SIGINT/SIGTERM (on Ray Serve replicas
    when the arguments ask for them)."""
    try:
        from verispec.server.runner import serve
    except ImportError as exc:
        raise RuntimeError(f"verispec serve needs the serve extra ({exc.name} is missing): "
                           "pip install 'verispec[serve]'") from None
    from verispec.server.replica_options import ModelSpec

    config = config_from_args(args)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in [0, 65535], got {args.port}")
    _check_host(args.host, err)
    status = _run_replicas(args, out, err)
    if status is not None:
        return status
    target, draft = ModelSpec.from_args(args).load(
        progress=lambda msg: print(msg, file=err, flush=True))
    return serve(target, draft, config, host=args.host, port=args.port,
                 log_level=args.log_level, out=out, err=err)


class _StrictParser(argparse.ArgumentParser):
    """A parser whose errors raise ValueError instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def build_parser(strict: bool = False) -> argparse.ArgumentParser:
    """The parser of ``python -m verispec.server`` (``verispec serve``'s arguments);
    ``strict``: errors raise ValueError rather than exit (for arguments given as data)."""
    cls = _StrictParser if strict else argparse.ArgumentParser
    p = cls(prog="python -m verispec.server",
            description="verispec serve: an OpenAI-compatible server")
    _add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """``python -m verispec.server``; returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        return run(args, out, err)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"verispec serve: error: {exc}", file=err)
        return 2
