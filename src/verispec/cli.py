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
    from verispec.models.loading import QUANTIZE_CHOICES

    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: embedded name, local dir, hub id or toy spec "
                        f"(default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"draft model (default {DEFAULT_DRAFT})")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="precision; auto picks bfloat16 where the device has fast bf16 "
                        "(the choice is printed)")
    p.add_argument("--draft-quantize", choices=QUANTIZE_CHOICES, default="none",
                   help="int8: dynamic int8 linear layers for the draft (CPU, float32); "
                        "verification stays exact because q is the quantized draft's own")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verifier", dest="verifier", default=None, choices=list(METHODS),
                   help="verification method (see the list below; default block); after "
                        "--method pearl: the verifier of each window, token or block")
    p.add_argument("--method", dest="method", default=None, choices=list(METHODS),
                   help="the method, when --verifier is to name its verification rule "
                        "(--method pearl --verifier token); alone, the same as --verifier")
    p.add_argument("--drafter", choices=["model", "ngram"], default="model",
                   help="draft model or prompt-lookup n-gram drafter")
    p.add_argument("--draft-stop", type=float, default=None, metavar="P",
                   help="token/block with the model drafter: end a draft early where the draft "
                        "model's own top probability (at T=1) is below P; still lossless")
    p.add_argument("--gamma", type=_gamma_arg, default=None,
                   help="draft length γ (default: 8; 4 for mjsd/mjgd); pearl: the window, "
                        "'auto' (its default) measures c = T(target)/T(draft) and uses round(c)")
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
    m.add_argument("--no-pre-verify", dest="pre_verify", action="store_const", const=False,
                   default=None, help="pearl: ablation, the target idles while the draft drafts")
    m.add_argument("--no-post-verify", dest="post_verify", action="store_const", const=False,
                   default=None, help="pearl: ablation, the draft idles while the target verifies")
    m.add_argument("--draft-threads", type=int, default=None,
                   help="pearl: torch threads of the draft worker (default: a third of the cores)")
    m.add_argument("--target-threads", type=int, default=None,
                   help="pearl: torch threads of the target worker (default: the other cores)")
    m.add_argument("--timeline", default=None, metavar="OUT.png",
                   help="pearl: draw each model's busy/idle timeline as a PNG")


def _gamma_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def _resolve_method(args: argparse.Namespace) -> None:
    """``--method NAME [--verifier RULE]`` or ``--verifier NAME``: afterwards ``args.verifier``
    is the method's name and ``args.window_verifier`` pearl's verification rule (or None)."""
    args.window_verifier = None
    if args.method is not None:
        if args.verifier is not None:
            if not METHODS[args.method].auto_gamma:  # only pearl verifies with a chosen rule
                raise ValueError(f"--method {args.method} takes no --verifier; use --verifier "
                                 f"{args.method} alone")
            args.window_verifier = args.verifier
        args.verifier = args.method
    elif args.verifier is None:
        args.verifier = "block"
    if args.gamma == "auto" and not METHODS[args.verifier].auto_gamma:
        raise ValueError(f"--gamma auto is for pearl only; {args.verifier} needs an integer")
    if args.timeline is not None and args.verifier != "pearl":
        raise ValueError("--timeline needs --method pearl")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verispec", description="Speculative decoding with exact verification.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         epilog=_methods_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the prompt text (or give many with --prompts FILE.jsonl)")
    _add_model_args(gen)
    _add_generation_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    gen.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                     help="batched mode: one prompt per line, a JSON string or an object "
                          '{"prompt": text or token ids, "seed": int, "max_new_tokens": int} '
                          "(seed and budget optional); outputs come in input order, with --json "
                          "one JSON object per prompt per line")
    gen.add_argument("--batch-size", type=int, default=None,
                     help="batched mode: rows decoded at once (default 8); a finished row's "
                          "slot takes the next prompt")

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

    from verispec.bench.options import BENCH_EPILOG, add_bench_arguments

    bench = sub.add_parser("bench", help="benchmark methods × temperatures × γ against ar and "
                           "transformers", epilog=BENCH_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_args(bench)
    add_bench_arguments(bench)

    from verispec.theory.cli import add_commands as add_theory_commands

    add_theory_commands(sub)  # ``audit`` and ``theory``
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

    _resolve_method(args)
    if args.prompts is not None:
        return _cmd_generate_batch(args, out, err)
    if args.prompt is None:
        raise ValueError("give a prompt, or a file of prompts with --prompts FILE.jsonl")
    if args.batch_size is not None:
        raise ValueError("--batch-size needs --prompts FILE.jsonl")
    progress = (lambda msg: print(msg, file=err))
    target = load_model(args.target, dtype=args.dtype, progress=progress)
    info = METHODS[args.verifier]
    draft: Any = None
    if info.uses_draft and (args.drafter == "model" or args.verifier == "mjsd"):
        draft = load_model(args.draft, dtype=args.dtype, progress=progress,
                           quantize=args.draft_quantize)
    streamer = None if args.json else _Streamer(getattr(target, "tokenizer", None), out)
    if streamer is not None:
        out.write(args.prompt)
    options = {k: getattr(args, k) for k in
               ("epsilon", "residual", "num_drafts", "num_beams", "threshold", "paper_warp",
                "window_verifier", "pre_verify", "post_verify", "draft_threads", "target_threads")}
    result = generate(
        target, draft, args.prompt, verifier=args.verifier, gamma=args.gamma,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        max_new_tokens=args.max_new_tokens, drafter=args.drafter, dtype=args.dtype,
        on_tokens=streamer, draft_stop=args.draft_stop, **options,
    )
    if args.json:
        payload = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}
        out.write(json.dumps(payload) + "\n")
    else:
        out.write("\n\n" + result.stats.summary() + "\n")
    if args.timeline is not None:
        from verispec.engine.pearl.timeline import draw_timeline

        st: Any = result.stats
        waits = ", ".join(f"{lane} waits {frac:.0%}" for lane, frac in st.wait_fraction.items())
        draw_timeline(st.timeline, args.timeline, end=st.decode_time_s,
                      title=f"PEARL γ={st.gamma}, {st.verifier} verification: {waits}")
        print(f"timeline written to {args.timeline}", file=err)
    return 0


def _read_prompts(path: str) -> list[dict[str, Any]]:
    """Parse a JSONL prompt file into ``{"prompt", "seed"?, "max_new_tokens"?}`` dicts."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    items: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        item = {"prompt": value} if isinstance(value, str) else value
        prompt = item.get("prompt") if isinstance(item, dict) else None
        ok_ids = isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        if not (isinstance(prompt, str) or ok_ids) or not prompt:
            raise ValueError(f"{path}:{number}: expected a JSON string or an object with a "
                             "non-empty \"prompt\" (text or a list of token ids)")
        unknown = set(item) - {"prompt", "seed", "max_new_tokens"}
        if unknown:
            raise ValueError(f"{path}:{number}: unknown key(s) {', '.join(sorted(unknown))}")
        for key in ("seed", "max_new_tokens"):
            if key in item and (not isinstance(item[key], int) or isinstance(item[key], bool)):
                raise ValueError(f"{path}:{number}: {key} must be an integer")
        items.append(item)
    if not items:
        raise ValueError(f"{path}: no prompts")
    return items


def _cmd_generate_batch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from verispec.api import generate_batch
    from verispec.models.loading import load_model

    if args.prompt is not None:
        raise ValueError("give either a prompt or --prompts FILE.jsonl, not both")
    if getattr(args, "draft_stop", None) is not None:
        raise ValueError("--draft-stop is not available with --prompts (batched decoding)")
    items = _read_prompts(args.prompts)
    progress = (lambda msg: print(msg, file=err))
    target = load_model(args.target, dtype=args.dtype, progress=progress)
    info = METHODS[args.verifier]
    draft: Any = None
    if info.uses_draft and args.drafter == "model":
        draft = load_model(args.draft, dtype=args.dtype, progress=progress,
                           quantize=args.draft_quantize)
    options = {k: getattr(args, k) for k in
               ("epsilon", "residual", "num_drafts", "num_beams", "threshold", "paper_warp")}
    batch = generate_batch(
        target, draft, [item["prompt"] for item in items], verifier=args.verifier,
        gamma=args.gamma, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seeds=[item.get("seed", args.seed) for item in items],
        max_new_tokens=[item.get("max_new_tokens", args.max_new_tokens) for item in items],
        batch_size=8 if args.batch_size is None else args.batch_size, drafter=args.drafter,
        dtype=args.dtype, **options,
    )
    for index, (item, result) in enumerate(zip(items, batch.results, strict=True)):
        if args.json:
            payload = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}
            out.write(json.dumps(payload) + "\n")
            continue
        prompt = item["prompt"]
        tokenizer = getattr(target, "tokenizer", None)
        shown = prompt if isinstance(prompt, str) else (
            tokenizer.decode(prompt) if tokenizer is not None else " ".join(map(str, prompt)))
        st = result.stats
        out.write(f"=== prompt {index} ===\n{shown}{result.text}\n"
                  f"[{st.tokens_emitted} tokens, stop: {st.stop_reason}, block efficiency "
                  f"{st.block_efficiency:.3f}, mean accepted {st.mean_accepted:.3f}]\n\n")
    print(batch.stats.summary(), file=err if args.json else out)
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
        if args.command in ("audit", "theory"):
            from verispec.theory.cli import run as run_theory

            return run_theory(args, out, err)
        from verispec.bench import run as bench_run

        if args.command == "demo":
            return bench_run.demo(args, out, err)
        return bench_run.benchmark(args, out, err)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"verispec: error: {exc}", file=err)
        return 2
    except KeyboardInterrupt:
        print("verispec: interrupted", file=err)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
