"""Step costs and decoding speed of the native dense runtime on a GPU (or any torch device).

The GPU machines this runs on reach no package registry, so the embedded pair's weights are
not there: the models are randomly initialised in the exact shapes of the embedded pair
(Qwen2.5-Coder 1.5B target, 0.5B draft; tied 151,936-row heads). Timings are real; what the
models say is noise. Acceptance is therefore measured with a draft that *is* the target (a
second native copy of the same weights), which gives the speed-up speculation reaches at
acceptance ≈ 1 on this device — the ceiling that the engine's own time per iteration allows
— next to plain decoding with the same engine. (Random models with tied embeddings mostly
repeat their last token at T = 0, so the 0.5B-shaped random draft is accepted often too:
its row times the draft's step, not a real acceptance.)

    python benchmarks/cuda_steps.py --device cuda --precision bfloat16 --tokens 128
    python benchmarks/cuda_steps.py --device cpu --shapes tiny     # a quick check anywhere

Then ``generate_batch`` with ``--batch-sizes`` rows (one random prompt per row, every row
decoding ``--tokens``): ``ar``, ``block`` at the fixed γ and ``block`` with γ auto, both with
the target copy as draft. γ auto must not cost throughput where speculation does not pay on
this device (the better of ``ar`` and fixed γ is the bar).

Prints a Markdown table and writes ``--out`` (JSON) with the device's name; ``--table FILE``
prints the tables of such a file again (with γ auto over the better of ``ar`` and fixed γ
at each batch size), loading nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from verispec import generate, generate_batch
from verispec.models.native import NativeCausalLM, from_hf_module
from verispec.models.timing import pass_costs
from verispec.telemetry.machine import cpu_info

KS = (1, 2, 4, 9)
CONTEXT = 200
#: The embedded pair's shapes (their config.json files): hidden, MLP, layers, heads, KV heads.
SHAPES: dict[str, dict[str, tuple[int, int, int, int, int]]] = {
    "embedded": {"target": (1536, 8960, 28, 12, 2), "draft": (896, 4864, 24, 14, 2)},
    "tiny": {"target": (64, 128, 2, 4, 2), "draft": (32, 64, 2, 4, 2)},
}
VOCAB = {"embedded": 151936, "tiny": 512}


class _Ids:
    """A tokenizer stand-in: token i is the text ``<i>``."""

    eos_token_id = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(self.vocab)}

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def _module(shape: tuple[int, int, int, int, int], vocab: int, device: torch.device) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, mlp, layers, heads, kv = shape
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, max_position_embeddings=4096,
                         rope_theta=1e6, tie_word_embeddings=True, eos_token_id=None,
                         bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).eval()


def _model(module: Any, name: str, precision: str, device: torch.device) -> NativeCausalLM:
    return from_hf_module(module, _Ids(module.config.vocab_size), name, precision,
                          device=device)


def _decode(target: NativeCausalLM, draft: NativeCausalLM, method: str,
            gamma: int | str | None,
            prompt: list[int], tokens: int, repeats: int) -> dict[str, float]:
    """Median tokens/s over ``repeats`` runs at T = 0, every run decoding ``tokens``, after
    one untimed run (allocations, kernel selection, γ auto's grid timed or read)."""
    speeds, result = [], None
    for i in range(repeats + 1):
        result = generate(target, draft, prompt, method=method, gamma=gamma, temperature=0,
                          max_new_tokens=tokens, ignore_eos=True)
        if i:
            speeds.append(len(result.tokens) / result.stats.wall_time_s)
    assert result is not None
    s = result.stats
    return {"tokens_per_s": statistics.median(speeds), "target_passes": s.target_passes,
            "accepted_per_pass": s.accepted_total / max(s.iterations, 1),
            "wall_ms_per_token": 1e3 / statistics.median(speeds)}


def _decode_batch(target: NativeCausalLM, draft: NativeCausalLM, method: str,
                  gamma: int | str | None, prompts: list[list[int]], tokens: int,
                  repeats: int) -> dict[str, float]:
    """Median tokens/s of ``generate_batch`` over ``repeats`` runs, all rows at once, T = 0,
    after one untimed run."""
    speeds, stats = [], None
    for i in range(repeats + 1):
        out = generate_batch(target, draft, prompts, method=method, gamma=gamma,
                             temperature=0, max_new_tokens=tokens, batch_size=len(prompts),
                             ignore_eos=True)
        stats = out.stats
        if i:
            speeds.append(sum(len(r.tokens) for r in out.results) / stats.wall_time_s)
    assert stats is not None
    # Stats.iterations counts row-iterations (one per row and engine iteration).
    return {"tokens_per_s": statistics.median(speeds), "row_iterations": stats.iterations,
            "drafted_per_row_iteration": stats.drafted_total / max(stats.iterations, 1)}


BATCHED_HEAD = ("| rows | run | tok/s | row-iterations | drafted per row-iteration |\n"
                "|---|---|---|---|---|")
DECODE_HEAD = ("| run | tok/s | ms/token | target passes | accepted per pass |\n"
               "|---|---|---|---|---|")


def _header(report: dict[str, Any]) -> str:
    return (f"device: {report['device']}; torch {report['torch']}; {report['precision']}; "
            f"shapes {report['shapes']}")


def _steps_head() -> str:
    return ("| model | " + " | ".join(f"k = {k}" for k in KS) + " (ms) | V(9) |\n|---|"
            + "---|" * (len(KS) + 1))


def _steps_row(role: str, ms: dict[Any, float]) -> str:
    by_k = {int(k): v for k, v in ms.items()}  # JSON keys are strings
    return (f"| {role} | " + " | ".join(f"{by_k[k]:.2f}" for k in KS)
            + f" | {by_k[9] / by_k[1]:.2f} |")


def _decode_row(label: str, row: dict[str, float]) -> str:
    return (f"| {label} | {row['tokens_per_s']:.1f} | {row['wall_ms_per_token']:.2f} | "
            f"{row['target_passes']} | {row['accepted_per_pass']:.2f} |")


def _batched_row(key: str, row: dict[str, float]) -> str:
    rows, label = key.split(" rows, ", 1)
    return (f"| {rows} | {label} (draft = target copy) | {row['tokens_per_s']:.1f} | "
            f"{row['row_iterations']} | {row['drafted_per_row_iteration']:.2f} |")


def _auto_vs_best(batched: dict[str, dict[str, float]]) -> list[str]:
    """γ auto's tokens/s over the better of ``ar`` and the fixed γ, per batch size."""
    lines = ["| rows | γ auto / better of ar and fixed γ | better |", "|---|---|---|"]
    for rows in dict.fromkeys(key.split(" rows, ")[0] for key in batched):
        runs = {k.split(" rows, ", 1)[1]: v["tokens_per_s"] for k, v in batched.items()
                if k.startswith(f"{rows} rows, ")}
        auto = runs.pop("block γ auto", None)
        if auto is not None and runs:
            best = max(runs, key=lambda label: runs[label])
            lines.append(f"| {rows} | {auto / runs[best]:.3f}× | {best} |")
    return lines


def table(report: dict[str, Any]) -> str:
    """The tables of a file written by ``--out``, as the run printed them."""
    lines = [_header(report), _steps_head()]
    lines += [_steps_row(role, ms) for role, ms in report["steps_ms"].items()]
    lines += ["", DECODE_HEAD] + [_decode_row(k, v) for k, v in report["decode"].items()]
    if report.get("batched"):
        lines += ["", BATCHED_HEAD] + [_batched_row(k, v) for k, v in report["batched"].items()]
        lines += ["", *_auto_vs_best(report["batched"])]
    return "\n".join(lines)


def _batched(target: NativeCausalLM, twin: NativeCausalLM, vocab: int, args: Any) -> dict:
    """``ar``, fixed γ and γ auto through ``generate_batch`` at each batch size."""
    g = torch.Generator().manual_seed(2)
    report: dict[str, Any] = {}
    print("\n" + BATCHED_HEAD)
    for rows in args.batch_sizes:
        prompts = [torch.randint(vocab, (CONTEXT,), generator=g).tolist() for _ in range(rows)]
        runs = {"ar": ("ar", None), f"block γ {args.gamma}": ("block", args.gamma),
                "block γ auto": ("block", "auto")}
        for label, (method, gamma) in runs.items():
            row = _decode_batch(target, twin, method, gamma, prompts, args.tokens, args.repeats)
            report[f"{rows} rows, {label}"] = row
            print(_batched_row(f"{rows} rows, {label}", row), flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--shapes", default="embedded", choices=tuple(SHAPES))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-sizes", default="1,4,8",
                    type=lambda v: [int(x) for x in v.split(",") if x],
                    help="rows of the generate_batch runs (empty: none)")
    ap.add_argument("--out", default="")
    ap.add_argument("--table", default="", help="print the tables of a file written by --out")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table, encoding="utf-8") as f:
            print(table(json.load(f)))
        return
    if args.tokens < 1 or args.gamma < 1 or args.repeats < 1 or min(args.batch_sizes,
                                                                     default=1) < 1:
        ap.error("--tokens, --gamma, --repeats and --batch-sizes must be at least 1")
    device = torch.device(args.device)
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{cpu_info().model_name}, {torch.get_num_threads()} threads")
    vocab = VOCAB[args.shapes]
    modules = {role: _module(shape, vocab, device) for role, shape in SHAPES[args.shapes].items()}
    models = {role: _model(m, role, args.precision, device) for role, m in modules.items()}
    report: dict[str, Any] = {"device": name, "torch": torch.__version__,
                              "precision": args.precision, "shapes": args.shapes,
                              "context": CONTEXT, "steps_ms": {}, "decode": {}}
    print(_header(report))
    print(_steps_head())
    for role, model in models.items():
        ms = {k: v * 1e3 for k, v in pass_costs(model, context=CONTEXT, ks=KS, reps=7).items()}
        report["steps_ms"][role] = ms
        print(_steps_row(role, ms))
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(vocab, (CONTEXT,), generator=g).tolist()
    twin = _model(modules["target"], "target-copy", args.precision, device)
    runs = {"ar": ("ar", None, models["draft"]),
            f"block γ {args.gamma}, draft = 0.5B shape": ("block", args.gamma, models["draft"]),
            f"block γ {args.gamma}, draft = target copy": ("block", args.gamma, twin),
            "block γ auto, draft = target copy": ("block", "auto", twin)}
    print("\n" + DECODE_HEAD)
    start = time.perf_counter()
    for label, (method, gamma, draft) in runs.items():
        row = _decode(models["target"], draft, method, gamma, prompt, args.tokens, args.repeats)
        report["decode"][label] = row
        print(_decode_row(label, row), flush=True)
    report["decode_seconds"] = time.perf_counter() - start
    report["batched"] = _batched(models["target"], twin, vocab, args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
