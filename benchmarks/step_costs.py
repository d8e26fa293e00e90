"""Step costs of every runtime of the embedded pair: one forward pass of k tokens after a
200-token context (median of 7), native int8, int4 (the draft; its int8 form runs passes
over 4 or more tokens) and float32 and llama.cpp's Q4_K_M GGUF, as a Markdown table.

    python benchmarks/step_costs.py        # needs the peers extra for the llama.cpp rows
"""

from __future__ import annotations

import statistics

import torch

from verispec.bench.llamacpp import forward_ms, llamacpp_available
from verispec.models.fetch import model_path
from verispec.models.native import load_native
from verispec.models.timing import pass_costs

KS = (1, 2, 4, 9)
PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
PRECISIONS = {PAIR[0]: ("int8", "float32"), PAIR[1]: ("int8", "int4", "float32")}


def _row(name: str, label: str, ms: dict[int, float]) -> str:
    cells = " | ".join(f"{ms[k]:.1f}" for k in KS)
    return f"| {name} | {label} | {cells} | {ms[9] / ms[1]:.2f} |"


def main() -> None:
    torch.set_num_threads(2)
    print("| model | runtime | " + " | ".join(f"k = {k}" for k in KS) + " (ms) | V(9) |")
    print("|---|---|" + "---|" * (len(KS) + 1))
    for name in PAIR:
        for precision in PRECISIONS[name]:
            model = load_native(model_path(name, "hf"), precision,
                                online_rotations=name != PAIR[1])  # as drafts load
            costs = pass_costs(model, context=200, ks=KS, reps=7)
            print(_row(name, f"native {precision}", {k: v * 1e3 for k, v in costs.items()}),
                  flush=True)
            del model
        if llamacpp_available() is None:
            gguf = model_path(name, "gguf")
            ms = {k: statistics.median(forward_ms(gguf, context=200, batch=k, repeats=7))
                  for k in KS}
            print(_row(name, "llama.cpp Q4_K_M", ms), flush=True)


if __name__ == "__main__":
    main()
