"""The int8 target's passes with torch's float64 attention and with verispec's
(:mod:`verispec.models.native.attention_kernel`), side by side in one process
(:mod:`int8_passes`: the two alternate pass by pass). Everything else in a pass is the same
code; the two attentions round differently (a float32 ulp or so of the attention's output),
so the logits are compared for closeness, not bits, before timing. Both read a float64 cache
(the one torch's attention needs to be exact; where verispec's kernel runs the target keeps
a float32 one, :func:`~verispec.models.native.attention_kernel.exact_dtype`).

    python benchmarks/attention.py [--rounds 15] --out attention.json
    python benchmarks/attention.py --table attention.json
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import int8_passes
import torch

from verispec.models.base import CausalLM
from verispec.models.native import attention_kernel

PATHS = ("torch", "verispec")
#: decoding passes, plus 16 rows of one token (a server's batch) and 2 × 9 (two verifications)
PASSES = (*int8_passes.PASSES, (16, 1), (2, 9))
CLOSE = 1e-4  # relative to the logits' scale


def _close_logits(target: CausalLM, use: Callable[[str], None]) -> None:
    """Raise unless both attentions give logits within :data:`CLOSE` of each other."""
    out = int8_passes.logits_by_path(target, PATHS, use)
    a, b = out[PATHS[0]], out[PATHS[1]]
    if float((a - b).abs().max()) > CLOSE * float(a.abs().max()):
        raise SystemExit("the two attentions' logits differ by more than float rounding")


def measure(rounds: int) -> dict[str, Any]:
    if not attention_kernel.available():
        raise SystemExit(attention_kernel.status())
    target = int8_passes.load_target()
    for net in (target.net, target.prefill_net):  # type: ignore[attr-defined]
        if net is not None:
            net.attention_dtype = torch.float64
    takes = attention_kernel.takes

    def use(path: str) -> None:
        attention_kernel.takes = takes if path == "verispec" else (lambda q, cache: False)

    try:
        _close_logits(target, use)
        times = int8_passes.alternate(target, PATHS, use, rounds, PASSES)
    finally:
        attention_kernel.takes = takes
    return int8_passes.header() | {
        "attention": attention_kernel.status(), "rounds": rounds,
        "command": f"python benchmarks/attention.py --rounds {rounds}", "passes": times}


def table(data: dict[str, Any]) -> str:
    return int8_passes.table(data, PATHS, f"{data['attention']} against torch's float64 "
                             "scaled_dot_product_attention", "torch / verispec")


def main(argv: list[str] | None = None) -> int:
    return int8_passes.main(__doc__.split("\n\n")[0], measure, table, argv)


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main())
