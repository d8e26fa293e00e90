"""Cost of one forward pass as a function of the rows and tokens it scores."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from verispec.models.base import CausalLM

__all__ = ["grid_costs", "interleaved_costs", "pass_costs", "prefill_cost"]


def pass_costs(model: CausalLM, context: int = 200, ks: Sequence[int] = tuple(range(1, 10)),
               reps: int = 5, *, warmup: int = 1, seed: int = 0) -> dict[int, float]:
    """Median seconds of one ``extend`` of k tokens (one row) after ``context`` tokens.

    Runs on ``model.spawn()`` (the caller's rows are untouched) with random token ids; each
    pass is rolled back before the next. The ks are interleaved within each repetition, so
    slow phases of a busy machine spread over all of them. V(k) = cost(k) / cost(1).
    """
    return interleaved_costs([(model, ks)], context, reps, warmup=warmup, seed=seed)[0]


def interleaved_costs(models: Sequence[tuple[CausalLM, Sequence[int]]], context: int = 200,
                      reps: int = 5, *, warmup: int = 1, seed: int = 0,
                      ) -> list[dict[int, float]]:
    """:func:`pass_costs` of several models (each with its own ks) timed in turns: every
    repetition times each model's passes once, so a busy minute slows all of them alike and
    their ratios (a pair's c and V(k)) stay steady."""
    grids = grid_costs([(model, [(1, k) for k in ks]) for model, ks in models], context, reps,
                       warmup=warmup, seed=seed)
    return [{k: t[(1, k)] for k in ks} for t, (_, ks) in zip(grids, models, strict=True)]


def grid_costs(models: Sequence[tuple[CausalLM, Sequence[tuple[int, int]]]], context: int = 200,
               reps: int = 5, *, warmup: int = 1, seed: int = 0,
               ) -> list[dict[tuple[int, int], float]]:
    """Median seconds of one ``extend`` of k tokens into each of R rows, for every shape
    (R, k) given per model, timed in turns as in :func:`interleaved_costs`.

    Each model gets one spawned twin per row count, its R rows prefilled with ``context``
    random tokens; every pass (random ids, [R, k]) is rolled back before the next."""
    g = torch.Generator().manual_seed(seed)
    twins: list[dict[int, CausalLM]] = []
    for model, shapes in models:
        mine = {}
        for rows in sorted({r for r, _ in shapes}):
            twin = model.spawn()
            twin.add_rows([torch.randint(model.vocab_size, (context,), generator=g).tolist()
                           for _ in range(rows)])
            mine[rows] = twin
        twins.append(mine)
    times: list[dict[tuple[int, int], list[float]]] = [{s: [] for s in shapes}
                                                       for _, shapes in models]
    for rep in range(warmup + reps):
        for mine, (_, shapes), out in zip(twins, models, times, strict=True):
            for rows, k in shapes:
                twin = mine[rows]
                new = torch.randint(twin.vocab_size, (rows, k), generator=g)  # [R, k]
                start = time.perf_counter()
                logits = twin.extend(new)
                if logits.device.type == "cuda":
                    torch.cuda.synchronize(logits.device)
                elapsed = time.perf_counter() - start
                twin.rollback(context)
                if rep >= warmup:
                    out[(rows, k)].append(elapsed)
    return [{s: statistics.median(v) for s, v in t.items()} for t in times]


def prefill_cost(model: CausalLM, context: int = 200, reps: int = 3, *, seed: int = 0) -> float:
    """Median seconds of reading a prompt of ``context`` random tokens into a fresh row (on
    ``model.spawn()``), after one untimed reading."""
    g = torch.Generator().manual_seed(seed)
    times = []
    for rep in range(1 + reps):
        twin = model.spawn()
        prefix = torch.randint(model.vocab_size, (context,), generator=g).tolist()
        start = time.perf_counter()
        twin.add_rows([prefix])
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        if rep:
            times.append(time.perf_counter() - start)
    return statistics.median(times)
