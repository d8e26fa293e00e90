"""γ auto's prior across processes: the pair's acceptance recorded on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verispec.engine import history as recorded
from verispec.engine.costs import PassCosts
from verispec.engine.gamma import (HISTORY_CAP, HISTORY_MIN, PRIOR_ALPHA, PRIOR_WEIGHT, Acceptance,
                                   AutoGamma, PairHistory)
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
    for _ in range(8):
        first.observe(4, 4)  # first position accepted, 3 later ones accepted
    for _ in range(2):
        first.observe(4, 1)  # first accepted, the second rejected
    first.save()
    second = RecordedHistory(file)
    assert (second.first_accepted, second.first_tested) == (10.0, 10.0)
    assert (second.rest_accepted, second.rest_tested) == (24.0, 26.0)
    assert second.recorded == 36.0
    pooled = 34 / 36  # each rate taken toward the rate over all positions
    assert second.prior().first == pytest.approx((10 + PRIOR_WEIGHT * pooled) / (10 + PRIOR_WEIGHT))
    assert second.prior().rest == pytest.approx((24 + PRIOR_WEIGHT * pooled) / (26 + PRIOR_WEIGHT))


@pytest.mark.parametrize("text", [
    "not json", json.dumps({"first": [5, 5]}),
    json.dumps({"version": 2, "first": [9, 5], "rest": [1, 2]}),
    json.dumps({"version": 2, "first": [1, 5], "rest": [-1, 2]}),
    json.dumps({"version": 2, "first": ["nan", 50], "rest": [1, 2]}),
    json.dumps({"version": 2, "first": [1, 2, 3], "rest": [1, 2]}),
    json.dumps({"version": 2, "first": [1, 2, 3], "rest": [3]}),
    json.dumps({"version": 1, "accepted": 40, "tested": 50}),  # one rate for all positions
    json.dumps({"version": 99, "first": [4, 5], "rest": [4, 5]})])
def test_an_unusable_record_starts_from_nothing(tmp_path: Path, text: str) -> None:
    file = tmp_path / "h.json"
    file.write_text(text)
    h = RecordedHistory(file)
    assert (h.accepted, h.tested) == (0.0, 0.0)
    assert h.prior() == Acceptance.iid(PRIOR_ALPHA)


def test_history_weighs_at_most_its_cap(tmp_path: Path) -> None:
    h = PairHistory()
    for _ in range(HISTORY_CAP // 5 + 5):
        h.observe(4, 4)  # 4 positions tested, all accepted
        h.observe(4, 0)  # the first rejected
    assert h.tested == pytest.approx(HISTORY_CAP)
    assert h.first_accepted / h.first_tested == pytest.approx(0.5, rel=1e-3)
    assert h.rest_accepted / h.rest_tested == pytest.approx(1.0, rel=1e-3)
    first_accepted = h.first_accepted
    for _ in range(100):  # a change of prompts moves the prior by its share of the cap
        h.observe(4, 0)
    assert h.tested == pytest.approx(HISTORY_CAP)
    kept = (HISTORY_CAP / (HISTORY_CAP + 1)) ** 100  # each added position scales the rest
    assert h.first_accepted == pytest.approx(first_accepted * kept)
    file = tmp_path / "big.json"
    file.write_text(json.dumps({"version": 2, "first": [4e5, 5e5], "rest": [4e5, 5e5]}))
    big = RecordedHistory(file)
    assert big.tested == pytest.approx(HISTORY_CAP)
    assert (big.prior().first, big.prior().rest) == pytest.approx((0.8, 0.8))


def test_saves_are_spaced_and_made_at_exit(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "h.json"
    monkeypatch.setattr(recorded, "SAVE_INTERVAL_S", 3600.0)
    h = RecordedHistory(file)
    h.observe(4, 3)
    assert not file.exists()  # within the interval: held
    recorded._save_all()  # what exit runs
    assert json.loads(file.read_text())["rest"] == [2.0, 3.0]
    monkeypatch.setattr(recorded, "SAVE_INTERVAL_S", 0.0)
    h.observe(5, 5)
    assert json.loads(file.read_text())["rest"] == [6.0, 7.0]


def test_a_process_records_its_counts_when_it_exits(tmp_path: Path) -> None:
    file = tmp_path / "h.json"
    code = ("from pathlib import Path; from verispec.engine.history import RecordedHistory; "
            f"h = RecordedHistory(Path({str(file)!r})); h.observe(8, 7)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert json.loads(file.read_text())["first"] == [1.0, 1.0]


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
    assert fresh.learning and fresh.prior == Acceptance.iid(PRIOR_ALPHA)
    first_gamma = fresh.choose()
    served = pair_history(target, draft, "block", sampling)
    for _ in range(HISTORY_MIN):
        served.observe(20, 19)
    recorded._save_all()
    target, draft = _pair()  # "the next process": nothing held in memory for these
    later = AutoGamma(COSTS, history=pair_history(target, draft, "block", sampling))
    assert not later.learning
    assert later.prior == served.prior()
    assert later.choose() > first_gamma
