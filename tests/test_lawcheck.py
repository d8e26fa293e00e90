"""The bench's output-law check: exact samples pass, a sampler at the wrong temperature or a
greedy-biased one is flagged."""

from __future__ import annotations

import torch

from verispec.bench.lawcheck import law_check, token_terms


def _check(sample_temperature: float, score_temperature: float, n: int = 3000,
           seed: int = 0) -> object:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((n, 50), generator=g, dtype=torch.float64) * 2.0  # [n, V] contexts
    probs = torch.softmax(logits / sample_temperature, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=g)[:, 0].tolist()
    z, v, pits = token_terms(logits, tokens, score_temperature, g)
    return law_check(z, v, pits)


def test_exact_samples_pass() -> None:
    for seed in range(3):
        check = _check(1.0, 1.0, seed=seed)
        assert not check.flagged and abs(check.z) < 3.3 and check.ks_pvalue > 1e-3


def test_wrong_temperatures_are_flagged() -> None:
    cold = _check(0.8, 1.0)
    assert cold.flagged and cold.z < -3.3 and cold.excess_nll < 0
    hot = _check(1.25, 1.0)
    assert hot.flagged and hot.z > 3.3


def test_ks_catches_tokens_drawn_from_the_wrong_places() -> None:
    """Tokens from a permuted distribution (the same probabilities on other tokens): the
    probability-integral transform is far from uniform."""
    g = torch.Generator().manual_seed(5)
    n, v = 3000, 20
    logits = torch.randn((n, v), generator=g, dtype=torch.float64) * 2.0
    probs = torch.softmax(logits, dim=-1)
    shuffled = probs.flip(-1)  # same multiset of probabilities per row, other tokens
    tokens = torch.multinomial(shuffled, 1, generator=g)[:, 0].tolist()
    check = law_check(*token_terms(logits, tokens, 1.0, g))
    assert check.flagged and check.ks_pvalue < 1e-3
