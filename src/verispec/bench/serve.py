"""Load benchmark of ``verispec serve``: N concurrent streaming clients on loopback.

For every config (a method with one of the ``--gamma`` values: ``block γ=auto``,
``block γ=8``; ``ar`` once), temperature and concurrency (1, 2, 4, 8 by default) the
benchmark sends the suite's prompts (HumanEval and/or Spec-Bench JSONL, see
:mod:`verispec.bench.suites`) through ``concurrency`` clients at once, each request
streamed, ``--repeats`` times (interleaved: repeat → temperature → concurrency → config),
and measures per cell:

* throughput: completion tokens of the cell / its wall time (tokens/s);
* time to first token (send → first text chunk) and time per output token ((last chunk −
  first chunk) / (tokens − 1)), p50 and p99 over the cell's requests;
* block efficiency (mean over requests) and mean γ (drafted tokens per target pass), from
  the ``speculative`` extension.

The tables (:mod:`verispec.bench.serve_report`) average repeats and compare every γ auto
config with the best other config at each temperature and concurrency, paired by repeat.
The method and γ are chosen per request (``"speculative": {"method": ..., "gamma": ...}``)
so one server serves every cell. Without ``--url`` the benchmark starts ``python -m verispec.server`` on
127.0.0.1 with a free port and ``--max-batch`` = the largest concurrency, and stops it with
SIGTERM at the end. Output: a markdown table on stdout and the JSON in ``--out``.

Peers: ``--peer NAME`` with ``--url`` benchmarks another OpenAI-compatible server (one
config, labelled NAME; ``--peer-command`` records how it was started), and ``--vllm
plain|spec:K[:METHOD]`` starts vLLM's CPU build on ``--target``/``--draft`` through
:mod:`verispec.bench.vllm` and stops it after. A peer's requests carry no ``speculative``
extension and ask for usage in the stream (``stream_options``); the report records the
peer's name, URL, command and version (``GET /version``). ``python -m
verispec.bench.serve_report MERGED.json A.json B.json`` puts the cells of several reports
(verispec's and its peers') in one table.

Run: ``python -m verispec.bench.serve --methods ar,token,block --concurrency 1,2,4,8``
(needs ``pip install 'verispec[serve,bench]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verispec.bench.measure import machine_description
from verispec.bench.server_process import sigterm_interrupts
from verispec.bench.serve_report import auto_comparisons, render_comparisons, render_means
from verispec.bench.vllm import (
    DTYPES,
    PeerSpec,
    VllmServer,
    build_command,
    find_vllm,
    free_port,
    peer_arg,
    server_version,
    vllm_environment,
)
from verispec.models.options import add_model_args

__all__ = ["Cell", "Sample", "build_parser", "launched", "main", "render_table", "run_benchmark",
           "summarize"]

START_TIMEOUT_S = 900.0  # loading the real pair may fetch and convert it first


@dataclass
class Sample:
    """One streamed request: its timings and tokens (``error`` set if it failed)."""

    prompt_id: str
    tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float = 0.0
    block_efficiency: float | None = None
    drafted: int = 0
    target_calls: int = 0
    error: str | None = None


@dataclass
class Cell:
    """One (config, temperature, concurrency, repeat) cell of the benchmark."""

    method: str
    gamma: str | None
    temperature: float
    repeat: int
    concurrency: int
    requests: int
    errors: int
    tokens: int
    wall_s: float
    throughput_tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    block_efficiency: float | None
    mean_gamma: float | None
    samples: list[Sample] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The config: ``ar``, ``block γ=auto``, ``block γ=8`` (the server's γ: the method)."""
        return self.method if self.gamma is None else f"{self.method} γ={self.gamma}"


@dataclass(frozen=True)
class Config:
    """A method with one γ (None: the server's / the method's own)."""

    method: str
    gamma: str | None


@dataclass
class Job:
    """A prompt as the benchmark sends it: chat messages or completion text."""

    id: str
    text: str
    chat: bool


def _numbers(kind: type, minimum: float) -> Callable[[str], list[Any]]:
    """An argparse type: comma-separated ``kind`` values, each ≥ ``minimum``."""
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values "
                                             f">= {minimum:g}, got {text!r}")
        return values
    return parse


_ints, _floats = _numbers(int, 1), _numbers(float, 0)


def _gammas(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values or any(v != "auto" and not (v.isdigit() and int(v) >= 1) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated γ values (integers >= 1 or "
                                         f"auto), got {text!r}")
    return values


def configs(methods: str, gammas: list[str] | None) -> list[Config]:
    """Every method with every γ (``ar`` and methods without γ values once)."""
    out = []
    for method in [m.strip() for m in methods.split(",") if m.strip()]:
        for gamma in ([None] if method == "ar" or not gammas else gammas):
            out.append(Config(method, gamma))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verispec bench serve",
                                description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--url", default=None,
                   help="benchmark a running server (http://127.0.0.1:PORT) instead of "
                        "starting one; its model id is read from /v1/models")
    p.add_argument("--methods", default="ar,token,block",
                   help="comma-separated methods (default: %(default)s)")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8],
                   help="comma-separated numbers of concurrent clients (default 1,2,4,8)")
    p.add_argument("--suite", default="humaneval",
                   help="humaneval and/or JSONL files (Spec-Bench or {\"prompt\": ...}), "
                        "comma-separated (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=16,
                   help="the first N prompts of each category (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64, help="budget per request")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every request decodes exactly its budget (the ignore_eos extension "
                        "of verispec and vLLM): sides compare equal output lengths")
    p.add_argument("--temperatures", type=_floats, default=[0.0],
                   help="comma-separated temperatures (default 0 = greedy)")
    p.add_argument("--gamma", type=_gammas, default=None,
                   help="comma-separated γ values for the speculative methods, each a config "
                        "of its own: integers or auto (default: the server's / the method's)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every cell this many times, interleaved (default 1)")
    p.add_argument("--seed", type=int, default=0, help="request i gets seed SEED + i")
    p.add_argument("--chat-template", choices=["auto", "on", "off"], default="auto",
                   help="send Spec-Bench turns to /v1/chat/completions (auto: if the model "
                        "has a chat template)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed warm-up request of each method")
    p.add_argument("--out", default="serve-bench.json", help="the JSON report")
    _add_peer_args(p)
    return p


def _add_peer_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("peers (other servers; requests without the speculative "
                             "extension)")
    g.add_argument("--peer", default=None, metavar="NAME",
                   help="benchmark --url (or --vllm) as the peer NAME: one config labelled "
                        "NAME, --methods and --gamma ignored")
    g.add_argument("--peer-command", default=None,
                   help="the command that started the --url peer, for the report")
    g.add_argument("--vllm", type=peer_arg, default=None, metavar="plain|spec:K[:METHOD]",
                   help="start vLLM's CPU build on --target/--draft (verispec.bench.vllm) "
                        "on 127.0.0.1, benchmark it as a peer (default name vllm-plain, "
                        "vllm-spec-kK[-METHOD]) and stop it")
    g.add_argument("--vllm-path", default=None,
                   help="the vLLM venv, its bin/vllm or bin/python (default $VERISPEC_VLLM "
                        "or ~/.cache/verispec/vllm-venv)")
    g.add_argument("--vllm-dtype", choices=DTYPES, default="float32",
                   help="vLLM's --dtype (default %(default)s)")
    g.add_argument("--vllm-kv-cache-gib", type=int, default=4,
                   help="vLLM's KV cache in GiB (VLLM_CPU_KVCACHE_SPACE, default %(default)s)")


# -- the server -----------------------------------------------------------------------------

@contextmanager
def _vllm_server(args: argparse.Namespace) -> Iterator[str]:
    """vLLM started for ``--vllm`` (its command kept in ``args.peer_command``)."""
    python = find_vllm(args.vllm_path)
    argv = build_command(python, args.target, port=free_port(), draft=args.draft,
                         spec=args.vllm, dtype=args.vllm_dtype)
    env = vllm_environment(len(os.sched_getaffinity(0)), args.vllm_kv_cache_gib, python)
    server = VllmServer(argv, env)
    args.peer_command = server.command
    print(f"starting vLLM: {server.command}\nlog: {server.log_path}",
          file=sys.stderr, flush=True)
    with server:
        yield server.url


@contextmanager
def _server(args: argparse.Namespace, max_batch: int) -> Iterator[str]:
    """The URL of a server: ``--url``, vLLM for ``--vllm``, or ``verispec serve`` started
    here; what was started is stopped after."""
    if args.url:
        yield args.url.rstrip("/")
        return
    if args.vllm:
        with _vllm_server(args) as url:
            yield url
        return
    argv = [sys.executable, "-m", "verispec.server", "--target", args.target,
            "--draft", args.draft, "--precision", args.precision, "--host", "127.0.0.1",
            "--port", "0", "--max-batch", str(max_batch), "--max-queue", str(4 * max_batch),
            "--log-level", "warning", "--shutdown-timeout", "10"]
    for flag in ("target_precision", "draft_precision"):
        if getattr(args, flag):
            argv += ["--" + flag.replace("_", "-"), getattr(args, flag)]
    with launched(argv) as url:
        yield url


@contextmanager
def launched(argv: Sequence[str], timeout_s: float = START_TIMEOUT_S,
             stop_wait_s: float = 120.0) -> Iterator[str]:
    """Run ``verispec serve``'s command line ``argv`` (port 0: a free one) until it prints
    its URL (at most ``timeout_s``), yield the URL, and stop it with SIGTERM afterwards
    (killed if it has not exited within ``stop_wait_s``), also when the benchmark is ended
    by SIGTERM or Ctrl-C."""
    with sigterm_interrupts():  # a terminated benchmark still stops its server
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            timer.cancel()
            if " on http://" not in line:
                raise RuntimeError(f"verispec serve did not start (exit status {proc.wait(60)}): "
                                   f"{line!r}")
            yield line.split(" on ", 1)[1].split()[0]
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(stop_wait_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)


# -- the clients ----------------------------------------------------------------------------

def _extension(config: Config) -> dict[str, Any]:
    spec: dict[str, Any] = {"method": config.method}
    if config.gamma is not None and config.method != "ar":
        spec["gamma"] = config.gamma if config.gamma == "auto" else int(config.gamma)
    return {"speculative": spec}


async def _one(client: Any, model: str, job: Job, seed: int, config: Config,
               temperature: float, args: argparse.Namespace) -> Sample:
    """Send one streamed request and time it."""
    sample = Sample(job.id)
    common: dict[str, Any] = {"model": model, "max_tokens": args.max_tokens,
                              "temperature": temperature, "seed": seed, "stream": True}
    extra: dict[str, Any] = {"ignore_eos": True} if args.ignore_eos else {}
    if args.peer:  # a peer gets no speculative extension; usage comes in a chunk of its own
        common["stream_options"] = {"include_usage": True}
    else:
        extra |= _extension(config)
    if extra:
        common["extra_body"] = extra
    start = time.perf_counter()
    first = last = None
    try:
        if job.chat:
            stream = await client.chat.completions.create(
                messages=[{"role": "user", "content": job.text}], **common)
        else:
            stream = await client.completions.create(prompt=job.text, **common)
        async for chunk in stream:
            now = time.perf_counter()
            choice = chunk.choices[0] if chunk.choices else None
            text = (choice.delta.content if job.chat else choice.text) if choice else None
            if text:
                first = now if first is None else first
                last = now
            if chunk.usage is not None:
                sample.tokens = chunk.usage.completion_tokens
            if choice is not None and choice.finish_reason is not None:
                ext = (chunk.model_extra or {}).get("speculative") or {}
                sample.block_efficiency = ext.get("block_efficiency")
                sample.drafted = int(ext.get("drafted_tokens") or 0)
                sample.target_calls = int(ext.get("target_calls") or 0)
    except Exception as exc:  # a failed request is counted, not fatal
        sample.error = f"{type(exc).__name__}: {exc}"
    sample.latency_s = time.perf_counter() - start
    if first is not None:
        sample.ttft_s = first - start
        if sample.tokens > 1 and last is not None:
            sample.tpot_s = (last - first) / (sample.tokens - 1)
    return sample


async def _cell(client: Any, model: str, jobs: list[Job], config: Config, temperature: float,
                concurrency: int, repeat: int, args: argparse.Namespace) -> Cell:
    """All jobs through ``concurrency`` concurrent clients."""
    todo: asyncio.Queue[tuple[int, Job]] = asyncio.Queue()
    for item in enumerate(jobs):
        todo.put_nowait(item)
    samples: list[Sample] = []

    async def worker() -> None:
        while not todo.empty():
            i, job = todo.get_nowait()
            samples.append(await _one(client, model, job, args.seed + i, config, temperature,
                                      args))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summarize(config, temperature, repeat, concurrency, samples,
                     time.perf_counter() - start)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(config: Config, temperature: float, repeat: int, concurrency: int,
              samples: list[Sample], wall_s: float) -> Cell:
    """A cell's figures from its samples."""
    ok = [s for s in samples if s.error is None]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [s.tpot_s for s in ok if s.tpot_s is not None]
    effs = [s.block_efficiency for s in ok if s.block_efficiency is not None]
    tokens = sum(s.tokens for s in ok)
    calls = sum(s.target_calls for s in ok)
    mean_gamma = sum(s.drafted for s in ok) / calls if calls else None
    return Cell(config.method, config.gamma, temperature, repeat, concurrency, len(samples),
                len(samples) - len(ok), tokens, wall_s, tokens / wall_s if wall_s > 0 else 0.0,
                _pct(ttft, 50), _pct(ttft, 99), _pct(tpot, 50), _pct(tpot, 99),
                float(np.mean(effs)) if effs else None, mean_gamma, samples)


async def _model_id(client: Any) -> str:
    models = await client.models.list()
    return str(models.data[0].id)


async def _chat_supported(client: Any, model: str, text: str) -> bool:
    """Whether the server's model has a chat template (one probe request)."""
    import openai

    try:
        await client.chat.completions.create(model=model, max_tokens=1, messages=[
            {"role": "user", "content": text}])
    except openai.BadRequestError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return body.get("code") != "no_chat_template"
    return True


async def run_benchmark(url: str, jobs: list[Job], args: argparse.Namespace) -> list[Cell]:
    """Every method × concurrency cell against the server at ``url``."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=3600.0)
    try:
        model = await _model_id(client)
        chats = [j for j in jobs if j.chat]
        if chats and args.chat_template != "on" and (
                args.chat_template == "off"
                or not await _chat_supported(client, model, chats[0].text)):
            jobs = [Job(j.id, j.text, False) for j in jobs]
        grid = [Config(args.peer, None)] if args.peer else configs(args.methods, args.gamma)
        if args.warmup:
            for config in grid:
                await _one(client, model, jobs[0], args.seed, config, args.temperatures[0], args)
        cells = []
        for repeat in range(args.repeats):
            for temperature in args.temperatures:
                for concurrency in args.concurrency:
                    for config in grid:
                        cell = await _cell(client, model, jobs, config, temperature,
                                           concurrency, repeat, args)
                        gamma = "" if cell.mean_gamma is None else f", mean γ {cell.mean_gamma:.2f}"
                        print(f"  [{repeat + 1}/{args.repeats}] T={temperature:g} {cell.label} "
                              f"x{concurrency}: {cell.throughput_tok_s:.1f} tok/s{gamma}"
                              f"{f', {cell.errors} errors' if cell.errors else ''}",
                              file=sys.stderr, flush=True)
                        cells.append(cell)
        return cells
    finally:
        await client.close()


# -- report ---------------------------------------------------------------------------------

def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.1f}"


def render_table(cells: Sequence[Cell]) -> str:
    """The markdown table of the cells, one row per cell."""
    head = ["T", "repeat", "config", "clients", "requests", "errors", "tokens", "tok/s",
            "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "block eff.", "mean γ"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        eff = "—" if c.block_efficiency is None else f"{c.block_efficiency:.2f}"
        gamma = "—" if c.mean_gamma is None else f"{c.mean_gamma:.2f}"
        row = [f"{c.temperature:g}", str(c.repeat + 1), c.label, str(c.concurrency),
               str(c.requests), str(c.errors), str(c.tokens), f"{c.throughput_tok_s:.1f}",
               _ms(c.ttft_p50_s), _ms(c.ttft_p99_s), _ms(c.tpot_p50_s), _ms(c.tpot_p99_s),
               eff, gamma]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _jobs(args: argparse.Namespace) -> list[Job]:
    from verispec.bench.suites import load_suites

    specs = [s.strip() for s in args.suite.split(",") if s.strip()]
    return [Job(p.id, p.text, p.chat) for p in load_suites(specs, args.num_prompts)]


def _check(args: argparse.Namespace) -> str | None:
    """The error in the options, if any (and ``--peer`` defaulted for ``--vllm``)."""
    if args.max_tokens < 1 or args.num_prompts < 1 or args.repeats < 1:
        return "--max-tokens, --num-prompts and --repeats must be >= 1"
    if args.vllm and args.url:
        return "--vllm starts a server of its own: give --url or --vllm, not both"
    if args.vllm and not args.peer:
        args.peer = args.vllm.name
    if args.peer and not (args.url or args.vllm):
        return "--peer names the server at --url (or the one --vllm starts)"
    if args.peer_command and not args.peer:
        return "--peer-command needs --peer"
    return None


def _peer_record(args: argparse.Namespace, url: str | None) -> dict[str, Any] | None:
    """The peer's name, URL, command and version (None for verispec)."""
    if not args.peer:
        return None
    return {"name": args.peer, "url": url, "command": args.peer_command,
            "version": server_version(url) if url else None}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verispec.bench.serve``; returns the exit status."""
    args = build_parser().parse_args(argv)
    error = _check(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        jobs = _jobs(args)
        with sigterm_interrupts(), _server(args, max(args.concurrency)) as url:
            what = f"peer {args.peer}" if args.peer else f"methods {args.methods}"
            print(f"benchmarking {url}: {len(jobs)} prompts, {what}, "
                  f"clients {args.concurrency}", file=sys.stderr, flush=True)
            peer = _peer_record(args, url)
            cells = asyncio.run(run_benchmark(url, jobs, args))
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: servers stopped, nothing written", file=sys.stderr)
        return 130
    comparisons = auto_comparisons(cells)
    table = "\n\n".join(t for t in (render_means(cells), render_comparisons(comparisons),
                                     render_table(cells)) if t)
    print(table)
    config = {k: str(v) if isinstance(v, PeerSpec) else v for k, v in vars(args).items()}
    report = {"config": config, "prompts": len(jobs), "machine": machine_description(),
              "peer": peer, "cells": [{**asdict(c), "label": c.label} for c in cells],
              "comparisons": comparisons, "markdown": table}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"written {args.out}", file=sys.stderr)
    return 0 if all(c.errors == 0 for c in cells) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
