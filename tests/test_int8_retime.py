"""A mixed int8 kernel keeps choosing its library from the passes' own times: passes move to
the library that has become faster, looks at the other one cost a bounded share of the time,
the recorded split is the first choice, and the choice never changes a logit. Simulated
clocks for the policy, tiny in-process models for the results; no downloads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer
from native_support import (  # noqa: F401 (fixtures: module, module_cache, own_cache)
    MIXED,
    module,
    module_cache,
    native_int8,
    own_cache,
    seq,
)

from verispec.models.native import from_hf_module, kernels, retime
from verispec.models.native.retime import EXPLORE_EVERY, LibraryClock, size_group
from verispec.models.native.weights import int8_layers

KERNEL = kernels.Int8Kernel("fbgemm", 8, "onednn")


class Host:
    """Fake layers of a mixed kernel and a clock: a pass costs what ``cost`` says for the
    library the layers are set to."""

    def __init__(self, wide_from: int) -> None:
        self.now = 0.0
        self.cost = {"fbgemm": 1.0, "onednn": 1.0}  # seconds per pass
        self.layers: list[Any] = [
            SimpleNamespace(kernel=KERNEL, packed={"fbgemm": 0, "onednn": 0},
                            wide_from=wide_from) for _ in range(3)]
        self.clock = LibraryClock(self.layers, clock=lambda: self.now)
        self.runs: list[str] = []

    def library(self) -> str:
        froms = {layer.wide_from for layer in self.layers}
        assert len(froms) == 1, "every layer of a pass on one library"
        return "onednn" if froms == {kernels.ALL_ROWS} else "fbgemm"

    def passes(self, n: int, rows: int = 1) -> list[str]:
        def forward() -> None:
            self.runs.append(self.library())
            self.now += self.cost[self.runs[-1]]

        start = len(self.runs)
        for _ in range(n):
            self.clock.run(rows, rows, forward)
        return self.runs[start:]


def test_size_groups() -> None:
    assert [size_group(r) for r in (1, 2, 9, 16, 17, 32, 33, 200)] == [
        1, 2, 9, 16, 32, 32, 64, 256]


def test_the_recorded_split_runs_first_and_a_faster_library_takes_over() -> None:
    host = Host(wide_from=2)
    assert host.passes(1, rows=1) == ["fbgemm"] and host.passes(1, rows=4) == ["onednn"]
    host.cost = {"fbgemm": 1.0, "onednn": 2.5}
    runs = host.passes(2000)
    looks = runs.count("onednn")
    # the first look once the group's current library has KEEP times, then rarely
    assert runs[:3] == ["fbgemm", "fbgemm", "onednn"] and runs[3:50] == ["fbgemm"] * 47
    # the looks' extra time is at most 1 / EXPLORE_EVERY of the time of the group's passes
    extra = looks * (host.cost["onednn"] - host.cost["fbgemm"])
    assert extra <= 1.5 * (len(runs) * host.cost["fbgemm"]) / EXPLORE_EVERY
    host.cost = {"fbgemm": 3.0, "onednn": 2.5}  # the host drifts: fbgemm loses
    runs = host.passes(400)
    switched = runs.index("onednn")
    assert switched <= 2 * EXPLORE_EVERY  # seen within a budget of looks
    assert runs[switched:].count("fbgemm") <= 0.05 * len(runs[switched:])
    # another pass size keeps its own times and choice
    assert "4 rows (4 scored): onednn" in host.clock.describe()


def test_one_noisy_pass_does_not_move_a_group() -> None:
    host = Host(wide_from=kernels.NO_ROWS)
    host.cost = {"fbgemm": 1.0, "onednn": 2.0}
    host.passes(300)
    host.cost = {"fbgemm": 5.0, "onednn": 2.0}
    host.passes(1)
    assert host.clock.groups[(1, 1)].current == "fbgemm"  # the median of three holds
    host.cost = {"fbgemm": 1.0, "onednn": 2.0}
    assert host.passes(20).count("fbgemm") >= 19  # a look at most


def test_refused_without_both_libraries() -> None:
    one = SimpleNamespace(kernel=KERNEL, packed={"fbgemm": 0}, wide_from=kernels.NO_ROWS)
    with pytest.raises(ValueError, match="both libraries"):
        LibraryClock([one])  # type: ignore[list-item]
    alone = SimpleNamespace(kernel=kernels.Int8Kernel("fbgemm", 8), packed={"fbgemm": 0},
                            wide_from=kernels.NO_ROWS)
    with pytest.raises(ValueError, match="mixed"):
        LibraryClock([alone])  # type: ignore[list-item]


@pytest.mark.parametrize("kernel", MIXED)
def test_the_library_of_a_pass_never_changes_a_logit(
        module: Any, kernel: kernels.Int8Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looks at every pass (the libraries alternate): 6 tokens in one pass equal one at a
    time and equal the model without re-timing."""
    reference = native_int8(module, kernel)
    timed = native_int8(module, kernel)
    timed.net.libraries = LibraryClock(int8_layers(timed.net))
    monkeypatch.setattr(retime, "EXPLORE_EVERY", 0)
    prefix, block = seq(9, 140), seq(6, 141)
    outs = []
    for m in (reference, timed):
        m.add_rows([prefix])
        together = m.extend([block])[0]  # [6, V]
        m.rollback([len(prefix)])
        singles = torch.cat([m.extend([[t]])[0] for t in block])  # [6, V]
        assert torch.equal(together, singles)
        outs.append(together)
    assert torch.equal(outs[0], outs[1])
    ran = {lib for g in timed.net.libraries.groups.values() for lib in g.times}
    assert ran == set(kernel.libraries)


@pytest.mark.parametrize("kernel", MIXED)
def test_re_timed_where_both_libraries_stay(module: Any, kernel: kernels.Int8Kernel,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "choose", lambda: (kernel, "test"))
    m = from_hf_module(module, TinyTokenizer(), "tiny", "int8")
    layers = int8_layers(m.net)
    both = all(len(layer.packed) == 2 for layer in layers)
    assert (m.net.libraries is not None) == both
