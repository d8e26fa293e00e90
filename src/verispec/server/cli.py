"""``verispec serve``: argument parsing and start-up.

:func:`add_command` adds ``serve`` to the ``verispec`` subparsers and :func:`run` executes
it (``verispec.cli`` wires both, as for ``audit``); :func:`main` is ``python -m
verispec.server``. Exit status 0 after a clean shutdown (SIGINT/SIGTERM), 1 if the server
failed; bad input raises ValueError (exit 2 through ``verispec.cli.main``).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from verispec.checks import parse_gamma
from verispec.models.options import add_model_args

__all__ = ["add_command", "build_parser", "main", "run"]


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
                   help="uvicorn's log level (default info)")


def add_command(sub: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``verispec`` subparsers."""
    p = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (completions, chat, streaming, "
        "continuous batching)",
        description="Serve the target with speculative decoding behind OpenAI's API: "
                    "POST /v1/completions and /v1/chat/completions (stream: true for "
                    "server-sent events), GET /v1/models, /health and /metrics. A request "
                    "may choose its speculation with \"speculative\": {\"method\": \"token\", "
                    "\"gamma\": 4}. Needs pip install 'verispec[serve]'.")
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


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Load the pair, build the app and serve until SIGINT/SIGTERM."""
    try:
        from verispec.server.runner import serve
    except ImportError as exc:
        raise RuntimeError(f"verispec serve needs the serve extra ({exc.name} is missing): "
                           "pip install 'verispec[serve]'") from None
    from verispec.api import load_pair
    from verispec.server.config import ServerConfig

    config = ServerConfig(method=args.method, gamma=args.gamma, drafter=args.drafter,
                          max_batch=args.max_batch, max_queue=args.max_queue,
                          model_name=args.served_model_name,
                          default_max_tokens=args.default_max_tokens,
                          shutdown_timeout_s=args.shutdown_timeout,
                          warm_costs=args.gamma == "auto")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in [0, 65535], got {args.port}")
    _check_host(args.host, err)
    pair = load_pair(args.target, None if args.no_draft else args.draft,
                     needs_draft=not args.no_draft,
                     precision=args.target_precision or args.precision,
                     draft_precision=args.draft_precision or args.precision,
                     progress=lambda msg: print(msg, file=err, flush=True))
    return serve(pair.target, pair.draft, config, host=args.host, port=args.port,
                 log_level=args.log_level, out=out, err=err)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m verispec.server`` (``verispec serve``'s arguments)."""
    p = argparse.ArgumentParser(prog="python -m verispec.server",
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
