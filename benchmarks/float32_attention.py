"""The int4 draft's and the int4 target's passes before and after two changes, side by side
in one process: verispec's attention kernel over float32 caches (before: torch's attention
over the draft's float32 cache, and over the float64 cache the target kept for it) and the
SwiGLU computed inside the down projection's int4 call (before: two tensor operations).

Each model keeps one cache per form, made alike after the same 200-token context; a pass of
k tokens runs on each form in turns (the order reversed every other round) and is rolled
back after. The two forms round differently, so the logits are not compared here (the
tests hold each form's exactness).

    python benchmarks/float32_attention.py [--rounds 15] --out float32-attention.json
    python benchmarks/float32_attention.py --table float32-attention.json
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import int8_passes
import torch

from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, model_path
from verispec.models.native import attention_kernel, load_native
from verispec.models.native.linear import Int4Linear

PATHS = ("before", "after")
CONTEXT = 200  # tokens read before the timed passes
PASSES = ((DEFAULT_DRAFT, 1), (DEFAULT_TARGET, 1), (DEFAULT_TARGET, 5))
REPEATS = 6  # passes per path and round; their median is the round's time


def _forms() -> Callable[[str], None]:
    """A switch between the two forms of every pass (``before`` / ``after``)."""
    takes, gated = attention_kernel.takes, Int4Linear.add_gated_to

    def use(path: str) -> None:
        after = path == "after"
        attention_kernel.takes = takes if after else (  # type: ignore[assignment]
            lambda q, cache: cache.dtype == torch.float64 and takes(q, cache))
        Int4Linear.add_gated_to = gated if after else (  # type: ignore[method-assign]
            lambda self, residual, gate_up: None)
    return use


def _runs(name: str, ks: list[int], use: Callable[[str], None]) -> dict[str, Callable[[], None]]:
    """{f"{name} k = {k} {path}": one pass} for each k and path, on caches made alike."""
    target = name == DEFAULT_TARGET
    model = load_native(model_path(name, "hf"), "int4", exact_passes=target)
    ids = torch.randint(model.vocab_size, (CONTEXT,), generator=torch.Generator().manual_seed(0))
    runs, own = {}, model.net.attention_dtype  # the cache the model keeps (float32 here)
    for path in PATHS:
        dtype = torch.float64 if target and path == "before" else own
        model.net.attention_dtype = dtype
        cache = model.spawn()
        cache.add_rows([ids.tolist()])
        for k in ks:
            def run(cache: Any = cache, dtype: torch.dtype = dtype, k: int = k,
                    path: str = path) -> None:
                use(path)
                model.net.attention_dtype = dtype
                cache.extend([[100] * k], check=False)
                cache.rollback([CONTEXT])
            runs[f"{name} k = {k} {path}"] = run
    return runs


def measure(rounds: int) -> dict[str, Any]:
    if not attention_kernel.available():
        raise SystemExit(attention_kernel.status())
    use = _forms()
    times: dict[str, dict[str, list[float]]] = {}
    try:
        for name in dict.fromkeys(n for n, _ in PASSES):
            ks = [k for n, k in PASSES if n == name]
            runs = _runs(name, ks, use)
            for k in ks:
                times[f"{name}, 1 × {k}"] = by_path = {p: [] for p in PATHS}
                for i in range(rounds + 1):  # the first round warms up
                    for path in (PATHS if i % 2 == 0 else PATHS[::-1]):
                        run, took = runs[f"{name} k = {k} {path}"], []
                        for _ in range(REPEATS):
                            start = time.perf_counter()
                            run()
                            took.append(1e3 * (time.perf_counter() - start))
                        if i:
                            by_path[path].append(sorted(took)[REPEATS // 2])
    finally:
        use("after")
    return int8_passes.header() | {
        "rounds": rounds, "command": f"python benchmarks/float32_attention.py --rounds {rounds}",
        "passes": times}


def table(data: dict[str, Any]) -> str:
    return int8_passes.table(data, PATHS, "int4 passes after a 200-token context: torch's "
                             "attention and tensor SwiGLU (before) against verispec's "
                             "attention over float32 caches and the SwiGLU in the down call "
                             "(after)", "before / after")


if __name__ == "__main__":
    sys.exit(int8_passes.main(__doc__.split("\n\n")[0], measure, table))
