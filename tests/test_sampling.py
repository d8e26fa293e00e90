"""The inverse-CDF sampler (two levels, batched over rows) and the allocator settings the
engine applies for its per-iteration tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from verispec.engine.memory import MALLOC_ENV, keep_freed_memory
from verispec.sampling import CDF_CHUNK, Randomness, choose_rows, inverse_cdf, sample_from


def _expected(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first id whose float64 cumulative weight exceeds u × total (one flat cumsum)."""
    cdf = probs.double().cumsum(-1)  # [B, V]
    x = u.double()[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, x, right=True)[:, 0]


@pytest.mark.parametrize("vocab", [3, CDF_CHUNK, CDF_CHUNK + 1, 3 * CDF_CHUNK + 517])
def test_inverse_cdf_returns_the_id_whose_interval_holds_the_uniform(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    probs = torch.rand((6, vocab), generator=g) ** 4  # [6, V], uneven weights
    probs[:, ::7] = 0.0  # zero-weight ids, some at chunk edges
    u = torch.rand((6, 400), generator=g)  # [6, 400]
    for j in range(u.shape[1]):
        got = inverse_cdf(probs, u[:, j])
        assert torch.equal(got, _expected(probs, u[:, j])), j
        assert bool((probs.gather(1, got[:, None]) > 0).all())


def test_inverse_cdf_edges_of_the_unit_interval() -> None:
    probs = torch.zeros((2, 2 * CDF_CHUNK + 5))
    probs[0, [0, CDF_CHUNK + 1]] = 1.0  # two positive ids in different chunks
    probs[1, -1] = 2.0  # only the last id (in the tail chunk)
    below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    assert inverse_cdf(probs, torch.tensor([0.0, 0.0])).tolist() == [0, probs.shape[1] - 1]
    assert inverse_cdf(probs, torch.stack([below_one] * 2)).tolist() == [
        CDF_CHUNK + 1, probs.shape[1] - 1]
    with pytest.raises(ValueError, match="no finite positive mass"):
        inverse_cdf(torch.zeros((1, 10)), torch.tensor([0.5]))


def test_sample_from_draws_the_law_and_never_a_zero_weight_id() -> None:
    vocab, n = 5000, 40_000
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(vocab, generator=g) * 2, -1)
    probs[1] = 0.0
    probs /= probs.sum()
    draws = sample_from(probs.expand(n, vocab), g)  # [n]
    counts = torch.bincount(draws, minlength=vocab).double()
    assert counts[1] == 0
    expected = probs.double() * n
    big = expected > 20
    chi2 = float(((counts - expected)[big] ** 2 / expected[big]).sum())
    df = int(big.sum()) - 1
    assert abs(chi2 - df) < 5 * (2 * df) ** 0.5  # about 5 standard deviations
    # negative control: the same statistic sees the ten likeliest ids' weight lowered by 25%
    skew = probs.clone()
    skew[probs.topk(10).indices] *= 0.75
    counts = torch.bincount(sample_from(skew.expand(n, vocab), g), minlength=vocab).double()
    chi2 = float(((counts - expected)[big] ** 2 / expected[big]).sum())
    assert chi2 - df > 5 * (2 * df) ** 0.5


def _rows(seed: int, sizes: list[int], vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(torch.randn((m, vocab), generator=g) * 3, -1) for m in sizes]


@pytest.mark.parametrize("shared", [True, False])
def test_choose_rows_equals_each_rows_own_choice(shared: bool) -> None:
    sizes, vocab = [1, 3, 1, 2], 2 * CDF_CHUNK + 11
    parts = _rows(0, sizes, vocab)
    if shared:  # consecutive rows of one tensor: drawn from a view of it
        parts = list(torch.cat(parts).split(sizes))
    mine = [Randomness(torch.Generator().manual_seed(10 + k)) for k in range(len(sizes))]
    alone = [Randomness(torch.Generator().manual_seed(10 + k)) for k in range(len(sizes))]
    for _ in range(20):
        got = choose_rows(mine, parts)
        want = [r.choose(p) for r, p in zip(alone, parts, strict=True)]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    for a, b in zip(mine, alone, strict=True):  # the generators moved alike
        assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_choose_rows_asks_a_subclass_row_by_row() -> None:
    """The exact replay subclasses Randomness to enumerate outcomes: it must see every row."""
    calls: list[int] = []

    class Counting(Randomness):
        def choose(self, probs: torch.Tensor) -> torch.Tensor:
            calls.append(probs.shape[0])
            return probs.argmax(-1)

    parts = _rows(1, [1, 2], 50)
    got = choose_rows([Counting(torch.Generator()), Counting(torch.Generator())], parts)
    assert calls == [1, 2]
    assert [t.tolist() for t in got] == [p.argmax(-1).tolist() for p in parts]
    with pytest.raises(ValueError, match="random sources"):
        choose_rows([Randomness(torch.Generator())], parts)


_FAULTS = """
import json, resource, sys, torch
from verispec.engine.memory import keep_freed_memory
applied = keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.randn(8, 5, 151_936)  # [B, γ+1, V]: one iteration's p at B = 8, γ = 4
def iteration():  # two 24 MB blocks alive at once, then freed (p and a verifier's weights)
    p = torch.softmax(x, -1)
    return float((p * 0.5).sub_(p).clamp_min_(0).sum())
iteration()
start = faults()
for _ in range(50):
    iteration()
print(json.dumps({"applied": applied, "faults": faults() - start}))
"""


def _faults(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _FAULTS], env={**os.environ, **env},
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_freed_iteration_tensors_are_reused_without_page_faults() -> None:
    kept = _faults({MALLOC_ENV: ""})
    system = _faults({MALLOC_ENV: "system"})
    assert kept["applied"] is True and system["applied"] is False
    # 50 iterations of two 24 MB blocks (6,000 pages each): kept, at most one growth of the
    # heap faults them in; glibc's default trims the freed heap top and maps blocks afresh
    assert int(kept["faults"]) < 2 * 6000 + 2000  # type: ignore[call-overload]
    assert int(kept["faults"]) < int(system["faults"]) / 2  # type: ignore[call-overload]


def test_malloc_setting_refuses_an_unknown_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from verispec.engine import memory

    monkeypatch.setattr(memory, "_applied", None)
    monkeypatch.setenv(MALLOC_ENV, "jemalloc")
    with pytest.raises(ValueError, match=MALLOC_ENV):
        keep_freed_memory()
    monkeypatch.setattr(memory, "_applied", None)
    monkeypatch.setenv(MALLOC_ENV, "system")
    assert keep_freed_memory() is False
