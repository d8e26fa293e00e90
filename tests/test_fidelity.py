"""The fidelity measurement: KL(reference ‖ test) along the reference's greedy text."""

from __future__ import annotations

import math

import pytest
import torch

from verispec.bench.fidelity import compare, compare_many, int8_schemes, summarize
from verispec.models.loading import load_model


def test_a_model_against_itself_has_zero_kl_and_agrees() -> None:
    ref = load_model("toy:random:6:1")
    row = compare(ref, ref, [1, 2, 3], tokens=12, prompt_id="p")
    assert row.positions == 12 and row.agree and row.first_difference is None
    assert abs(row.mean_kl) < 1e-12 and abs(row.max_kl) < 1e-12


def test_kl_is_the_exact_divergence_of_the_next_token_laws() -> None:
    """Against another model the mean KL is the average of KL(p ‖ q) computed directly
    from the two models' next-token distributions along the reference's greedy text."""
    ref, other = load_model("toy:random:6:1"), load_model("toy:random:6:2")
    prompt, tokens = [1, 2], 8
    rows = compare_many(ref, {"same": ref, "other": other}, prompt, tokens=tokens)
    assert rows["same"].mean_kl == pytest.approx(0.0, abs=1e-12)
    text = list(prompt)
    kls = []
    for _ in range(tokens):  # the reference's greedy continuation, one token at a time
        laws = []
        for m in (ref, other):
            m.reset()
            m.add_rows([text[:-1]])
            laws.append(torch.log_softmax(m.extend([text[-1:]])[0, -1].double(), -1))
            m.reset()
        kls.append(float((laws[0].exp() * (laws[0] - laws[1])).sum()))
        text.append(int(laws[0].argmax()))
    assert rows["other"].mean_kl == pytest.approx(sum(kls) / tokens, rel=1e-9)
    assert rows["other"].mean_kl > 0
    summary = summarize([rows["other"], rows["same"]])
    assert summary["mean_kl"] == pytest.approx(sum(kls) / tokens / 2, rel=1e-9)
    assert summary["prompts"] == 2 and math.isfinite(summary["prompt_mean_kl_ci95"])


def test_int8_schemes_refuse_a_malformed_block_pair() -> None:
    with pytest.raises(ValueError, match="down/o pairs"):
        int8_schemes("toy:random:6:1", "128x64")
