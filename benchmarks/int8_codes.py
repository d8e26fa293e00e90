"""The int8 target's passes with its activation codes made by verispec's fused kernel
(:mod:`verispec.models.native.codes_kernel`) and by torch operators, side by side in one
process (:mod:`int8_passes`: the two alternate pass by pass).

    python benchmarks/int8_codes.py [--rounds 15] --out int8-codes.json
    python benchmarks/int8_codes.py --table int8-codes.json
"""

from __future__ import annotations

import sys
from typing import Any

import int8_passes

from verispec.models.native import codes_kernel
from verispec.models.native.weights import int8_layers

PATHS = ("torch operators", "fused kernel")


def measure(rounds: int) -> dict[str, Any]:
    target = int8_passes.load_target()
    layers = int8_layers(target.net)  # type: ignore[attr-defined]
    if not codes_kernel.available() or not all(x._fused for x in layers):
        raise SystemExit(f"the fused kernel does not run every layer here: "
                         f"{codes_kernel.status()}")

    def use(path: str) -> None:
        for layer in layers:
            layer._fused = path == PATHS[1]

    times = int8_passes.alternate(target, PATHS, use, rounds)
    use(PATHS[1])
    return int8_passes.header() | {
        "codes_kernel": codes_kernel.status(), "rounds": rounds,
        "command": f"python benchmarks/int8_codes.py --rounds {rounds}", "passes": times}


def table(data: dict[str, Any]) -> str:
    return int8_passes.table(data, PATHS, data["codes_kernel"], "torch / fused")


def main(argv: list[str] | None = None) -> int:
    return int8_passes.main(__doc__.split("\n\n")[0], measure, table, argv)


if __name__ == "__main__":
    sys.exit(main())
