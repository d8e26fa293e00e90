"""Exact total-variation distance between the int8 target's first-token law and llama.cpp's
Q4_K_M target's, at the prompts of a law test: the size of the difference the two-sample
law test (``python -m verispec.bench.lawtest``) has to see to flag ``llamacpp-ar``.

    python benchmarks/peer_first_token_tv.py LAWTEST_DIR/lawtest.json   # needs the peers extra
"""

from __future__ import annotations

import argparse
import json

import torch

from verispec.bench.lawsource import next_token_law
from verispec.bench.llamacpp.library import next_token_law as peer_next_token_law
from verispec.models.fetch import model_path
from verispec.models.loading import load_model


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    """TV of two laws over vocabularies that may differ in size (the extra ids count fully)."""
    n = min(p.shape[0], q.shape[0])
    return 0.5 * float((p[:n] - q[:n]).abs().sum() + p[n:].sum() + q[n:].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lawtest", help="lawtest.json of a law test run (its prompts and models)")
    args = ap.parse_args()
    with open(args.lawtest, encoding="utf-8") as f:
        record = json.load(f)
    config = record["config"]
    temperature = float(config["temperature"])
    target = load_model(config["target"], precision=config.get("precision", "auto"))
    gguf = str(model_path(config["target"], "gguf"))
    print(f"| prompt | TV(int8 p₁, Q4_K_M p₁) at T = {temperature:g} |")
    print("|---|---|")
    values = []
    for prompt in record["prompts"]:
        values.append(tv(next_token_law(target, prompt["ids"], temperature),
                         peer_next_token_law(gguf, prompt["ids"], temperature)))
        print(f"| {prompt['id']} | {values[-1]:.4f} |")
    print(f"| mean | {sum(values) / len(values):.4f} |")


if __name__ == "__main__":
    main()
