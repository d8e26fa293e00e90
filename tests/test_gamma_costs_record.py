"""γ auto's pass costs are timed once per key (models, machine, grid) and read back from
disk while a fresh timing of the two one-row steps and of the draft's first pass agrees with
the record's c and first pass over a step; models with no source on disk are never recorded.
"""

from __future__ import annotations

from collections.abc import Callable
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


Seconds = Callable[[str, int, int, int], float]  # (model name, R, k, shapes timed) -> s


def _fake_timing(monkeypatch: pytest.MonkeyPatch, seconds: Seconds, name: str,
                 calls: list[list[tuple[int, int]]]) -> tuple[RandomContextLM, RandomContextLM]:
    """Pass timings from ``seconds`` in place of real ones (each call's shapes appended to
    ``calls``), and a target and a draft named ``target-NAME`` and ``draft-NAME`` that pose
    as models loaded from a directory."""
    def fake_grid(models: list, context: int, reps: int, **kw: object) -> list[dict]:
        shapes = [shape for _, shapes in models for shape in shapes]
        calls.append(shapes)
        return [{(r, k): seconds(m.name, r, k, len(shapes)) for r, k in mine}
                for m, mine in models]

    monkeypatch.setattr(timing, "grid_costs", fake_grid)
    monkeypatch.setattr(timing, "prefill_cost", lambda *args, **kw: 0.001)
    return (_named(RandomContextLM(3, seed=1), f"target-{name}"),
            _named(RandomContextLM(3, seed=2), f"draft-{name}"))


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

    target, draft = _fake_timing(
        monkeypatch, lambda name, r, k, _: step[name] * (r + 0.1 * (k - 1)), "c", calls)

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

    step = {"target-f": 0.040, "draft-f": 0.010}
    target, draft = _fake_timing(
        monkeypatch, lambda name, r, k, _: step[name] * r * (
            first["factor"] if (name, k) == ("draft-f", 2) else 1 + 0.1 * (k - 1)), "f", calls)

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


def test_a_record_is_checked_as_gamma_auto_prices_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid's timing of a one-row draft step can come out dear beside the two-row one
    (1.7× here); the monotone fit γ auto prices with replaces it by the two-row time, and
    that fit is what the check compares, so the record is kept rather than timed again at
    every read (a raw comparison would find c and the first pass 1.7× off)."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    calls: list[list[tuple[int, int]]] = []

    def seconds(name: str, r: int, k: int, timed: int) -> float:
        if name == "target-m":
            return 0.040 * (r + 0.1 * (k - 1))
        if (r, k) == (1, 1):  # the grid's one-row step dear; the check times three passes
            return 0.010 if timed == 3 else 0.017
        return 0.010 * (1 + 0.05 * (r - 1)) * (1.08 if k == 2 else 1.0)  # memory bound

    target, draft = _fake_timing(monkeypatch, seconds, "m", calls)
    first = measure_costs(target, draft, context=8, reps=1, rows=(1, 2))
    assert first.draft == pytest.approx(0.0105)  # the fit: the two-row step
    again = measure_costs(target, draft, context=8, reps=1, rows=(1, 2))
    assert len(calls) == 2 and len(calls[1]) == 3  # checked and kept
    assert again.draft == pytest.approx(0.0105)
    assert again.draft_first == pytest.approx(0.0108)
