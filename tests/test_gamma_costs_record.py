"""γ auto's pass costs are timed once per key (models, machine, grid) and read back from
disk while a fresh timing of the two one-row steps and of the draft's first pass agrees with
the record's c and first pass over a step; models with no source on disk are never recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verispec.engine import costs
from verispec.engine.costs import (
    BATCH_MAX_K,
    PROBE_SIZES,
    RECORD_CHECK_TOLERANCE,
    measure_costs,
    timing_file,
)
from verispec.models import timing
from verispec.models.toy import RandomContextLM

pytestmark = pytest.mark.usefixtures("one_thread")


def _named(model: RandomContextLM, name: str) -> RandomContextLM:
    """A toy model that poses as one loaded from a directory (so its costs are recorded)."""
    model.name = name
    model.source = f"/models/{name}"  # type: ignore[attr-defined]
    return model


def test_pass_costs_are_timed_once_per_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second measurement with the same models, machine and grid reads the record
    (no timing); another key is timed again."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    calls: list[int] = []
    real = timing.grid_costs

    def counted(*args: object, **kw: object) -> object:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(timing, "grid_costs", counted)
    monkeypatch.setattr(costs, "record_agrees", lambda *args, **kw: True)  # next test
    target, draft = _named(RandomContextLM(3, seed=1), "target-a"), \
        _named(RandomContextLM(3, seed=2), "draft-a")
    first = measure_costs(target, draft, context=8, reps=1, rows=(1, 2))
    assert len(calls) == 1 and first.batch is not None
    assert sorted(first.target) == list(PROBE_SIZES) and first.batch.rows == (1, 2)
    assert first.batch.ks(2) == tuple(k for k in PROBE_SIZES if k <= BATCH_MAX_K)
    assert list((tmp_path / "timing").glob("*.json"))
    again = measure_costs(target, draft, context=8, reps=1, rows=(1, 2))
    assert len(calls) == 1 and again == first and again.batch == first.batch
    other = _named(RandomContextLM(3, seed=2), "draft-b")
    measure_costs(target, other, context=8, reps=1, rows=(1, 2))
    assert len(calls) == 2
    measure_costs(target, draft, context=8, reps=1, rows=(1, 2, 4))
    assert len(calls) == 3
    measure_costs(target, draft, context=8, reps=1, rows=(1, 2), refresh=True)
    assert len(calls) == 4
    assert timing_file("x").parent == tmp_path / "timing"
    records = set((tmp_path / "timing").glob("*.json"))
    in_memory = RandomContextLM(3, seed=3), RandomContextLM(3, seed=4)  # no source: never kept
    measure_costs(*in_memory, context=8, reps=1, rows=(1, 2))
    measure_costs(*in_memory, context=8, reps=1, rows=(1, 2))
    assert len(calls) == 6 and set((tmp_path / "timing").glob("*.json")) == records


def test_a_record_that_prices_the_draft_otherwise_than_now_is_timed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record timed while the draft ran slow (a busy minute) is replaced at the next
    read whose fresh one-row steps give a c more than RECORD_CHECK_TOLERANCE away from
    the record's; a record that agrees is kept, untimed."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    step = {"target-c": 0.040, "draft-c": 0.010}  # seconds of a one-row one-token pass
    calls: list[list[tuple[int, int]]] = []

    def fake_grid(models: list, context: int, reps: int, **kw: object) -> list[dict]:
        calls.append([shape for _, shapes in models for shape in shapes])
        return [{(r, k): step[m.name] * (r + 0.1 * (k - 1)) for r, k in shapes}
                for m, shapes in models]

    monkeypatch.setattr(timing, "grid_costs", fake_grid)
    monkeypatch.setattr(timing, "prefill_cost", lambda *args, **kw: 0.001)
    target, draft = _named(RandomContextLM(3, seed=1), "target-c"), \
        _named(RandomContextLM(3, seed=2), "draft-c")

    def c() -> float:
        got = measure_costs(target, draft, context=8, reps=1, rows=(1, 2))
        return got.target[1] / got.draft

    assert c() == pytest.approx(4.0) and len(calls) == 1  # timed and recorded
    assert c() == pytest.approx(4.0) and calls[-1] == [(1, 1), (1, 1), (1, 2)]  # checked
    assert len(calls) == 2
    step["draft-c"] = 0.010 * (RECORD_CHECK_TOLERANCE + 1)  # a disturbed timing, recorded
    measure_costs(target, draft, context=8, reps=1, rows=(1, 2), refresh=True)
    assert len(calls) == 3
    step["draft-c"] = 0.010  # the draft runs at its speed again
    assert c() == pytest.approx(4.0)  # checked, disagreed, timed again
    assert len(calls) == 5 and len(calls[-1]) > 2
    assert c() == pytest.approx(4.0) and len(calls) == 6  # the new record agrees
    step["draft-c"] = 0.010 * (RECORD_CHECK_TOLERANCE - 0.1)  # within the tolerance: kept
    assert c() == pytest.approx(4.0) and len(calls) == 7


def test_a_record_whose_draft_first_pass_was_timed_dear_is_timed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft's first pass of an iteration (two tokens per row) recorded at twice its
    step, where it now runs at 1.1 steps, is a fixed cost on every drafting iteration that
    only longer blocks amortise: the record is replaced although its c still agrees; a
    first pass within RECORD_CHECK_TOLERANCE of the fresh one is kept."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    first = {"factor": 2.0}  # the draft's (1, 2) pass over its (1, 1) step
    calls: list[list[tuple[int, int]]] = []

    def fake_grid(models: list, context: int, reps: int, **kw: object) -> list[dict]:
        calls.append([shape for _, shapes in models for shape in shapes])
        step = {"target-f": 0.040, "draft-f": 0.010}
        return [{(r, k): step[m.name] * r * (first["factor"] if (m.name, k) == ("draft-f", 2)
                                             else 1 + 0.1 * (k - 1)) for r, k in shapes}
                for m, shapes in models]

    monkeypatch.setattr(timing, "grid_costs", fake_grid)
    monkeypatch.setattr(timing, "prefill_cost", lambda *args, **kw: 0.001)
    target, draft = _named(RandomContextLM(3, seed=1), "target-f"), \
        _named(RandomContextLM(3, seed=2), "draft-f")

    def first_pass() -> float:
        got = measure_costs(target, draft, context=8, reps=1, rows=(1,))
        assert got.target[1] / got.draft == pytest.approx(4.0)
        assert got.draft_first is not None
        return got.draft_first / got.draft

    assert first_pass() == pytest.approx(2.0) and len(calls) == 1  # timed dear, recorded
    first["factor"] = 1.1  # the first pass runs at its speed
    assert first_pass() == pytest.approx(1.1)  # checked, disagreed, timed again
    assert len(calls) == 3 and calls[1] == [(1, 1), (1, 1), (1, 2)] and len(calls[2]) > 3
    first["factor"] = 1.1 * (RECORD_CHECK_TOLERANCE - 0.1)  # within the tolerance: kept
    assert first_pass() == pytest.approx(1.1) and len(calls) == 4
