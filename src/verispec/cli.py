"""The ``verispec`` command line: ``generate``, ``demo``, ``models``, ``bench``, ``audit``,
``theory`` and ``serve``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from verispec.methods import METHODS
from verispec.checks import parse_gamma
from verispec.models.options import add_model_args

__all__ = ["build_parser", "main"]



def _methods_help() -> str:
    width = max(len(name) for name in METHODS)
    lines = ["methods (--method NAME or NAME[option=value,...]):"]
    for info in METHODS.values():
        tag = "lossless" if info.lossless else "NOT lossless"
        lines.append(f"  {info.name:<{width}}  [{tag}] {info.summary}")
        opts = info.options()
        if opts:
            lines.append(f"  {'':<{width}}  options: "
                         + ", ".join(f"{k}={v}" for k, v in opts.items()))
    return "\n".join(lines)


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", dest="method", default="block", metavar="METHOD",
                   help="method, with options in brackets: block, 'lossy[epsilon=0.05]', "
                        "'multidraft[num_drafts=4]', 'pearl[verifier=token]' (default block; "
                        "all methods and their options are listed below)")
    p.add_argument("--drafter", choices=["model", "ngram"], default="model",
                   help="draft model or prompt-lookup n-gram drafter")
    p.add_argument("--draft-stop", type=float, default=None, metavar="P",
                   help="token/block with the model drafter: end a draft early where the draft "
                        "model's own top probability (at T=1) is below P; still lossless")
    p.add_argument("--gamma", type=parse_gamma, default=None,
                   help="draft length γ (default: 8; 4 for mjsd/mjgd; auto with --prompts "
                        "where the draft model drafts: chosen per iteration for the batch); "
                        "pearl: the window, 'auto' (its default) measures c = "
                        "T(target)/T(draft) and uses round(c)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the target's chat template (instruct models)")
    p.add_argument("--timeline", default=None, metavar="OUT.png",
                   help="pearl: draw each model's busy/idle timeline as a PNG")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verispec", description="Speculative decoding with exact verification.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         epilog=_methods_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the prompt text (or give many with --prompts FILE.jsonl)")
    add_model_args(gen)
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
    kern = msub.add_parser("kernels", help="the int8 kernels' exactness self-test on this CPU "
                           "and which kernel int8 models use")
    kern.add_argument("--out", type=Path, default=None,
                      help="also write the self-test and the machine to this JSON file")
    kern.add_argument("--table", type=Path, default=None,
                      help="print the self-test of a JSON file written by --out (runs nothing)")
    path = msub.add_parser("path", help="print where a fetched embedded model lives")
    path.add_argument("name", help="an embedded model name")
    path.add_argument("--format", dest="fmt", choices=["hf", "gguf"], default="hf",
                      help="hf: the converted safetensors directory; gguf: the verified GGUF file")

    demo = sub.add_parser("demo", help="ar vs token vs block on a HumanEval prompt: the output "
                          "and the measured speed-up")
    add_model_args(demo)
    demo.add_argument("--task", type=int, default=0, help="HumanEval task index")
    demo.add_argument("--gamma", type=parse_gamma, default="auto",
                      help="draft length, or auto (chosen by measurement; the default)")
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--seed", type=int, default=0)

    from verispec.bench.options import BENCH_EPILOG, add_bench_arguments

    bench = sub.add_parser("bench", help="benchmark methods × temperatures × γ against ar and "
                           "the peers", epilog=BENCH_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(bench)
    add_bench_arguments(bench)

    from verispec.theory.cli import add_commands as add_theory_commands

    add_theory_commands(sub)  # ``audit`` and ``theory``
    from verispec.server.cli import add_command as add_serve_command

    add_serve_command(sub)  # ``serve``
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


def _pair(args: argparse.Namespace, err: TextIO) -> Any:
    """The models the request of ``args`` needs (its plan says whether a draft is one)."""
    from verispec.api import load_pair
    from verispec.plan import RequestConfig, plan_request

    plan = plan_request(RequestConfig(args.method, gamma=args.gamma, drafter=args.drafter,
                                      draft_stop=args.draft_stop, temperature=args.temperature,
                                      top_k=args.top_k, top_p=args.top_p))

    def progress(msg: str) -> None:
        print(msg, file=err)

    return load_pair(args.target, args.draft, needs_draft=plan.needs_draft,
                     precision=args.precision, target_precision=args.target_precision,
                     draft_precision=args.draft_precision, progress=progress)


def _chat(tokenizer: Any, prompt: str) -> str:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat needs a target whose tokenizer has a chat template")
    return str(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             tokenize=False, add_generation_prompt=True))


def _cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from verispec.api import generate

    if args.timeline is not None and not args.method.startswith("pearl"):
        raise ValueError("--timeline needs --method pearl")
    if args.prompts is not None:
        return _cmd_generate_batch(args, out, err)
    if args.prompt is None:
        raise ValueError("give a prompt, or a file of prompts with --prompts FILE.jsonl")
    if args.batch_size is not None:
        raise ValueError("--batch-size needs --prompts FILE.jsonl")
    pair = _pair(args, err)
    prompt = _chat(pair.target.tokenizer, args.prompt) if args.chat else args.prompt
    streamer = None if args.json else _Streamer(pair.target.tokenizer, out)
    if streamer is not None:
        out.write(args.prompt if args.chat else prompt)
        out.write("\n" if args.chat else "")
    result = generate(
        pair.target, pair.draft, prompt, method=args.method, gamma=args.gamma,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        max_new_tokens=args.max_new_tokens, drafter=args.drafter, draft_stop=args.draft_stop,
        on_tokens=streamer,
    )
    if args.json:
        payload = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}
        out.write(json.dumps(payload) + "\n")
    else:
        out.write("\n\n" + result.stats.summary() + "\n")
    if args.timeline is not None:
        from verispec.telemetry.timeline import draw_timeline

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

    if args.prompt is not None:
        raise ValueError("give either a prompt or --prompts FILE.jsonl, not both")
    if args.draft_stop is not None:
        raise ValueError("--draft-stop is not available with --prompts (batched decoding)")
    items = _read_prompts(args.prompts)
    pair = _pair(args, err)
    tokenizer = pair.target.tokenizer
    prompts = [_chat(tokenizer, p) if args.chat and isinstance(p, str) else p
               for p in (item["prompt"] for item in items)]
    batch = generate_batch(
        pair.target, pair.draft, prompts, method=args.method, gamma=args.gamma,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seeds=[item.get("seed", args.seed) for item in items],
        max_new_tokens=[item.get("max_new_tokens", args.max_new_tokens) for item in items],
        batch_size=8 if args.batch_size is None else args.batch_size, drafter=args.drafter,
    )
    for index, (prompt, result) in enumerate(zip(prompts, batch.results, strict=True)):
        if args.json:
            payload = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict()}
            out.write(json.dumps(payload) + "\n")
            continue
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
    if args.models_command == "path":
        out.write(f"{f.model_path(args.name, args.fmt)}\n")
        return 0
    if args.models_command == "kernels":
        return _kernels(args.out, args.table, out)
    for model in f.EMBEDDED_MODELS.values():
        path = f.cache_dir() / model.name
        state = "cached" if f.is_complete(path, model) else "not fetched"
        out.write(f"{model.role:6}  {model.name:32}  {state:11}  {model.description}\n")
    return 0


def _kernels(into: Path | None, table: Path | None, out: TextIO) -> int:
    """``verispec models kernels``: this CPU's self-test (also written to ``into``), or the
    one a file recorded (``table``)."""
    from verispec.models.native import kernels

    if table is not None:
        data = json.loads(table.read_text(encoding="utf-8"))
        out.write(f"machine: {data['machine']}\n" + "\n".join(kernels.report(data)) + "\n")
        return 0
    data = kernels.record()
    if into is not None:
        from verispec.bench.measure import machine_description

        into.write_text(json.dumps({"machine": machine_description(), **data}, indent=1) + "\n",
                        encoding="utf-8")
    out.write("\n".join(kernels.report(data)) + "\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Entry point of the ``verispec`` console script; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "serve"]:  # the server load benchmark has its own options
        from verispec.bench.serve import main as bench_serve

        return bench_serve(argv[2:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _cmd_generate(args, out, err)
        if args.command == "models":
            return _cmd_models(args, out, err)
        if args.command in ("audit", "theory"):
            from verispec.theory.cli import run as run_theory

            return run_theory(args, out, err)
        if args.command == "serve":
            from verispec.server.cli import run as run_serve

            return run_serve(args, out, err)
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
