"""How far a lower-precision model is from the float32 reference, on benchmark prompts.

For every prompt: the reference's greedy continuation of ``tokens`` tokens, then, along that
same text (teacher forcing, one pass per model), the per-token KL divergence
KL(p_ref || p_test) of the next-token distributions at temperature 1; and whether the test
model's own greedy continuation is the same ``tokens`` tokens. Speculative decoding with the
test model as the target samples the *test* model's law exactly; this measures how far that
law is from the float32 model's.

``python -m verispec.bench.fidelity --precision int8 --num-prompts 20 --tokens 128``

``--blocks 128/64,256/128`` compares int8 models built with those block sizes of the run-time
rotations before ``down_proj`` / ``o_proj`` (``0``: none; a ``:dense`` suffix, as in
``256/64:dense``, takes dense random orthogonal blocks instead of Kronecker products of
signed Hadamard matrices; :func:`~verispec.models.native.weights.int8_state`) on the same
reference texts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from verispec.api import generate
from verispec.models.base import CausalLM

__all__ = ["PromptFidelity", "compare", "compare_many", "int8_schemes", "main"]


@dataclass
class PromptFidelity:
    """One prompt: mean and max KL over the positions scored, and greedy agreement."""

    prompt_id: str
    positions: int
    mean_kl: float
    max_kl: float
    agree: bool
    first_difference: int | None


def _logprobs(model: CausalLM, ids: list[int], first: int) -> torch.Tensor:
    """log p(· | ids[:i+1]) for i = first-1 .. len(ids)-2: [n, V] float64."""
    model.reset()
    model.add_rows([ids[: first - 1]])
    logits = model.extend([ids[first - 1 : -1]])[0]  # [n, V]
    model.reset()
    return torch.log_softmax(logits.double(), dim=-1)


def compare(reference: CausalLM, test: CausalLM, prompt: list[int], *, tokens: int,
            prompt_id: str = "") -> PromptFidelity:
    """KL(reference || test) along the reference's greedy continuation, and agreement."""
    return compare_many(reference, {"test": test}, prompt, tokens=tokens,
                        prompt_id=prompt_id)["test"]


def compare_many(reference: CausalLM, tests: dict[str, CausalLM], prompt: list[int], *,
                 tokens: int, prompt_id: str = "") -> dict[str, PromptFidelity]:
    """:func:`compare` for several test models along one reference continuation."""
    ref = generate(reference, None, prompt, method="ar", temperature=0, max_new_tokens=tokens)
    ids = prompt + ref.tokens
    lp_ref = _logprobs(reference, ids, len(prompt))  # [n, V]
    out = {}
    for name, test in tests.items():
        own = generate(test, None, prompt, method="ar", temperature=0, max_new_tokens=tokens)
        lp_test = _logprobs(test, ids, len(prompt))
        kl = (lp_ref.exp() * (lp_ref - lp_test)).sum(-1)  # [n]
        diff = next((i for i, (a, b) in enumerate(zip(ref.tokens, own.tokens, strict=False))
                     if a != b), None)
        if diff is None and len(ref.tokens) != len(own.tokens):
            diff = min(len(ref.tokens), len(own.tokens))
        out[name] = PromptFidelity(prompt_id, int(kl.numel()), float(kl.mean()),
                                   float(kl.max()), diff is None, diff)
    return out


def int8_schemes(model: str, blocks: str, eos_token_ids: frozenset[int] = frozenset(),
                 ) -> dict[str, CausalLM]:
    """int8 models of ``model`` for each ``down/o`` pair of rotation block sizes in
    ``blocks`` (comma-separated; 0 = no rotation), built in memory (not cached), stopping
    at ``eos_token_ids`` like the reference."""
    import json
    from pathlib import Path

    from verispec.models.fetch import resolve
    from verispec.models.native import NativeCausalLM, NativeConfig
    from verispec.models.native.weights import build_int8, dir_tensors, int8_state

    schemes = {pair: pair.removesuffix(":dense").partition("/")[::2]
               for pair in blocks.split(",")}  # name -> (down, o)
    for pair, (down, o) in schemes.items():
        if not (down.isdigit() and o.isdigit()):
            raise ValueError(f"--blocks takes down/o pairs like 128/64 or 256/64:dense, "
                             f"got {pair!r}")
    path = Path(resolve(model))
    config = NativeConfig.from_hf(json.loads((path / "config.json").read_text()))
    out: dict[str, CausalLM] = {}
    for pair, (down, o) in schemes.items():
        state = int8_state(config, dir_tensors(path), down_block=int(down) or None,
                           o_block=int(o) or None, hadamard=not pair.endswith(":dense"))
        out[f"int8 {pair}"] = NativeCausalLM(build_int8(config, state), name=f"int8 {pair}",
                                             eos_token_ids=eos_token_ids)
    return out


def summarize(rows: Sequence[PromptFidelity]) -> dict[str, float]:
    """Mean per-token KL over all positions, its 95% interval over prompts, agreement."""
    positions = sum(r.positions for r in rows)
    mean = sum(r.mean_kl * r.positions for r in rows) / positions
    per = [r.mean_kl for r in rows]
    sd = (sum((x - sum(per) / len(per)) ** 2 for x in per) / max(len(per) - 1, 1)) ** 0.5
    half = 1.96 * sd / math.sqrt(len(per))
    return {"prompts": len(rows), "positions": positions, "mean_kl": mean,
            "prompt_mean_kl_ci95": half, "max_kl": max(r.max_kl for r in rows),
            "greedy_agreement": sum(r.agree for r in rows) / len(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    from verispec.bench.suites import encode, load_suites
    from verispec.models.fetch import DEFAULT_TARGET
    from verispec.models.loading import PRECISIONS, load_model

    ap = argparse.ArgumentParser(prog="python -m verispec.bench.fidelity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_TARGET)
    ap.add_argument("--precision", default="int8", choices=[p for p in PRECISIONS if p != "auto"])
    ap.add_argument("--suite", default="humaneval", help="as in verispec bench")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--blocks", default=None,
                    help="compare int8 models with these down/o rotation blocks, e.g. "
                         "128/64,256/128 (0: none); replaces --precision")
    ap.add_argument("--step-costs", action="store_true",
                    help="also time each test model's pass of 1 and 9 tokens after a 200-token "
                         "context (interleaved, median of 7) and stop")
    ap.add_argument("--out", default=None, help="write the per-prompt rows and summary as JSON")
    args = ap.parse_args(argv)
    # the float32 reference only where texts are compared (a timing generates nothing)
    reference = None if args.step_costs else load_model(args.model, precision="float32")
    eos = frozenset() if reference is None else reference.eos_token_ids
    tests = (int8_schemes(args.model, args.blocks, eos) if args.blocks else
             {args.precision: load_model(args.model, precision=args.precision)})
    if args.step_costs:
        from verispec.models.timing import interleaved_costs

        costs = interleaved_costs([(m, (1, 9)) for m in tests.values()], context=200, reps=7)
        print(json.dumps({name: {f"k={k}": round(c[k] * 1e3, 1) for k in c}
                          for name, c in zip(tests, costs, strict=True)}))
        return 0
    assert reference is not None
    prompts = load_suites(args.suite.split(","), args.num_prompts, None)
    rows: dict[str, list[PromptFidelity]] = {name: [] for name in tests}
    for i, p in enumerate(prompts):
        start = time.perf_counter()
        ids = encode(p, reference.tokenizer, "auto")
        for name, r in compare_many(reference, tests, ids, tokens=args.tokens,
                                    prompt_id=p.id).items():
            rows[name].append(r)
            print(f"[{i + 1}/{len(prompts)}] {p.id} {name}: mean KL {r.mean_kl:.2e}, max "
                  f"{r.max_kl:.2e}, greedy "
                  f"{'agrees' if r.agree else f'differs at {r.first_difference}'} "
                  f"({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    summaries = {name: summarize(r) for name, r in rows.items()}
    print(json.dumps(summaries if args.blocks else summaries[args.precision], indent=2))
    if args.out:
        if args.blocks:
            record = {"schemes": {name: {"summary": summaries[name],
                                         "rows": [asdict(r) for r in rows[name]]}
                                  for name in tests}, "blocks": args.blocks}
        else:
            record = {"summary": summaries[args.precision], "precision": args.precision,
                      "rows": [asdict(r) for r in rows[args.precision]]}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record | {"model": args.model, "tokens": args.tokens}, f, indent=2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
