"""γ auto's prior across processes: the pair's acceptance recorded on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verispec.engine import history as recorded
from verispec.engine.costs import PassCosts
from verispec.engine.gamma import HISTORY_CAP, HISTORY_MIN, PRIOR_ALPHA, AutoGamma, PairHistory
from verispec.engine.history import RecordedHistory, history_file
from verispec.models.toy import RandomContextLM
from verispec.plan import pair_history
from verispec.sampling import Sampling

COSTS = PassCosts({1: 0.1, 2: 0.11, 4: 0.12, 9: 0.15}, 0.03)


def _pair(with_source: bool = True) -> tuple[RandomContextLM, RandomContextLM]:
    target, draft = RandomContextLM(4, seed=1), RandomContextLM(4, seed=2)
    if with_source:  # as a model loaded from a directory is identified
        target.source, draft.source = "/models/t", "/models/d"  # type: ignore[attr-defined]
    return target, draft


def test_counts_written_by_one_history_are_read_by_the_next(tmp_path: Path) -> None:
    file = tmp_path / "h.json"
    first = RecordedHistory(file)
    assert (first.accepted, first.tested, first.recorded) == (0.0, 0.0, 0.0)
    first.add(30, 32)
    first.add(10, 10)
    first.save()
    second = RecordedHistory(file)
    assert (second.accepted, second.tested, second.recorded) == (40.0, 42.0, 42.0)
    assert second.prior() == pytest.approx(40 / 42)


@pytest.mark.parametrize("text", ["not json", json.dumps({"accepted": 5}),
                                  json.dumps({"version": 1, "accepted": 9, "tested": 5}),
                                  json.dumps({"version": 1, "accepted": -1, "tested": 5}),
                                  json.dumps({"version": 1, "accepted": "nan", "tested": 50}),
                                  json.dumps({"version": 99, "accepted": 40, "tested": 50})])
def test_an_unusable_record_starts_from_nothing(tmp_path: Path, text: str) -> None:
    file = tmp_path / "h.json"
    file.write_text(text)
    h = RecordedHistory(file)
    assert (h.accepted, h.tested) == (0.0, 0.0)
    assert h.prior() == PRIOR_ALPHA


def test_history_weighs_at_most_its_cap(tmp_path: Path) -> None:
    h = PairHistory()
    for _ in range(HISTORY_CAP // 10 + 5):
        h.add(9, 10)
    assert h.tested == HISTORY_CAP
    assert h.prior() == pytest.approx(0.9)
    h.add(0, 100)  # a change of prompts moves the prior by its share of the cap
    assert h.prior() == pytest.approx(0.9 * HISTORY_CAP / (HISTORY_CAP + 100))
    file = tmp_path / "big.json"
    file.write_text(json.dumps({"version": 1, "accepted": 8e5, "tested": 1e6}))
    big = RecordedHistory(file)
    assert big.tested == HISTORY_CAP and big.prior() == pytest.approx(0.8)


def test_saves_are_spaced_and_made_at_exit(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "h.json"
    monkeypatch.setattr(recorded, "SAVE_INTERVAL_S", 3600.0)
    h = RecordedHistory(file)
    h.add(3, 4)
    assert not file.exists()  # within the interval: held
    recorded._save_all()  # what exit runs
    assert json.loads(file.read_text())["tested"] == 4.0
    monkeypatch.setattr(recorded, "SAVE_INTERVAL_S", 0.0)
    h.add(5, 5)
    assert json.loads(file.read_text())["tested"] == 9.0


def test_a_process_records_its_counts_when_it_exits(tmp_path: Path) -> None:
    file = tmp_path / "h.json"
    code = ("from pathlib import Path; from verispec.engine.history import RecordedHistory; "
            f"h = RecordedHistory(Path({str(file)!r})); h.add(7, 8)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert json.loads(file.read_text())["accepted"] == 7.0


def test_pair_history_is_recorded_per_pair_method_and_warp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    target, draft = _pair()
    greedy = pair_history(target, draft, "block", Sampling(temperature=0.0))
    assert isinstance(greedy, RecordedHistory)
    assert greedy.file.parent == tmp_path / "acceptance"
    files = {history_file(target, draft, m, w) for m, w in
             [("block", (0.0, None, None)), ("block", (1.0, None, None)),
              ("token", (0.0, None, None))]}
    assert len(files) == 3
    plain_target, plain_draft = _pair(with_source=False)  # built in memory: not recorded
    assert history_file(plain_target, plain_draft, "block", None) is None
    assert type(pair_history(plain_target, plain_draft, "block")) is PairHistory


def test_the_first_request_of_a_new_process_starts_from_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the pair's acceptance on record, a request in a fresh process (new model
    objects) neither starts from the generic prior nor drafts to learn the pair."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    sampling = Sampling(temperature=0.0)
    target, draft = _pair()
    fresh = AutoGamma(COSTS, history=pair_history(target, draft, "block", sampling))
    assert fresh.learning and fresh.prior == PRIOR_ALPHA
    first_gamma = fresh.choose()
    served = pair_history(target, draft, "block", sampling)
    for _ in range(HISTORY_MIN):
        served.add(19, 20)
    recorded._save_all()
    target, draft = _pair()  # "the next process": nothing held in memory for these
    later = AutoGamma(COSTS, history=pair_history(target, draft, "block", sampling))
    assert not later.learning
    assert later.prior == pytest.approx(0.95)
    assert later.choose() > first_gamma
