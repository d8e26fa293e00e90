"""The int8 target's passes on oneDNN's int8 matmul and on verispec's own
(:mod:`verispec.models.native.gemm_kernel`), side by side in one process
(:mod:`int8_passes`: the two alternate pass by pass). Every layer's product runs on one
library per pass (the model's timed split and its online re-timing are set aside); the
activation codes come from the fused codes kernel on both sides, and the logits are the same
bits on both (checked on each pass kind before timing).

    python benchmarks/int8_gemm.py [--rounds 15] --out int8-gemm.json
    python benchmarks/int8_gemm.py --table int8-gemm.json
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import int8_passes
import torch

import verispec.models.native.kernels as kernels
from verispec.models.base import CausalLM
from verispec.models.native import gemm_kernel
from verispec.models.native.weights import int8_layers

PATHS = ("oneDNN", "verispec")
FORCED = {"oneDNN": kernels.ALL_ROWS, "verispec": kernels.NO_ROWS}
#: decoding passes, plus 16 rows of one token (a server's batch) and 2 × 9 (two verifications)
PASSES = (*int8_passes.PASSES, (16, 1), (2, 9))


def _same_logits(target: CausalLM, use: Callable[[str], None]) -> None:
    """Raise unless both libraries give the same logits bit for bit on 3 rows × 5 tokens."""
    out = int8_passes.logits_by_path(target, PATHS, use)
    if not torch.equal(out[PATHS[0]], out[PATHS[1]]):
        raise SystemExit("the two libraries' logits differ")


def measure(rounds: int) -> dict[str, Any]:
    target = int8_passes.load_target()
    net = target.net  # type: ignore[attr-defined]
    layers = int8_layers(net)
    kernel = layers[0].kernel
    if kernel.libraries != ("verispec", "onednn"):
        raise SystemExit(f"the target runs {kernel}, not verispec+onednn "
                         f"({gemm_kernel.status()})")
    net.libraries = None  # no online re-timing: each pass runs where it is sent
    for layer in layers:  # both libraries packed (the timed split may have freed one)
        for library in kernel.libraries:
            if library not in layer.packed:
                layer.packed[library] = kernels.pack(library, layer._keep[0])

    def use(path: str) -> None:
        for layer in layers:
            layer.wide_from = FORCED[path]

    _same_logits(target, use)
    times = int8_passes.alternate(target, PATHS, use, rounds, PASSES)
    return int8_passes.header() | {
        "kernel": str(kernel), "gemm_kernel": gemm_kernel.status(), "rounds": rounds,
        "command": f"python benchmarks/int8_gemm.py --rounds {rounds}", "passes": times}


def table(data: dict[str, Any]) -> str:
    return int8_passes.table(data, PATHS, f"{data['gemm_kernel']}; same logits on both",
                             "oneDNN / verispec")


def main(argv: list[str] | None = None) -> int:
    return int8_passes.main(__doc__.split("\n\n")[0], measure, table, argv)


if __name__ == "__main__":
    sys.exit(main())
