"""KV-cache bookkeeping of the model layer: rollback and fork/join must be invisible.

For the tiny Hugging Face model (float32) logits after extend / rollback / extend, and after
fork / extend[M, k] / join / extend, must equal the logits of a fresh prefill of the same
tokens within atol 1e-5. For the exact toy models they must be identical.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from verispec.models.base import CausalLM
from verispec.models.hf import HFCausalLM
from verispec.models.toy import MarkovLM, RandomContextLM
from verispec.sampling import Sampling

ATOL_HF = 1e-5


def _fresh(make: Callable[[], CausalLM], tokens: list[int]) -> torch.Tensor:
    """Logits [k, V] for every position of ``tokens`` from a model with an empty cache."""
    model = make()
    return model.extend(torch.tensor(tokens, dtype=torch.int64))


def _close(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    if exact:
        return torch.equal(a, b)
    return torch.allclose(a, b, atol=ATOL_HF, rtol=0)


def _seq(seed: int, n: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _makers(tiny: Callable[[str], HFCausalLM]) -> dict[str, tuple[Callable[[], CausalLM], bool]]:
    return {
        "hf": (lambda: tiny("target"), False),
        "random-context": (lambda: RandomContextLM(5, seed=3), True),
        "markov": (lambda: MarkovLM.random(5, seed=4), True),
    }


@pytest.mark.parametrize("kind", ["hf", "random-context", "markov"])
def test_extend_rollback_extend_equals_fresh_prefill(
    kind: str, tiny: Callable[[str], HFCausalLM]
) -> None:
    make, exact = _makers(tiny)[kind]
    model = make()
    seq = _seq(11, 16, model.vocab_size)
    fresh = _fresh(make, seq)  # [16, V]
    # The engine's pattern: prefill, score a block, roll back into it, score the next block.
    model.extend(torch.tensor(seq[:5]), num_logits=1)
    model.extend(torch.tensor(seq[5:11]))  # a block of 6, of which only 2 are kept
    model.rollback(7)
    assert model.length == 7
    after = model.extend(torch.tensor(seq[7:13]))  # [6, V]
    assert _close(after, fresh[7:13], exact)
    # Rolling back to the current length is a no-op; rolling back to 0 empties the cache.
    model.rollback(13)
    assert _close(model.extend(torch.tensor(seq[13:16])), fresh[13:16], exact)
    model.rollback(0)
    assert model.length == 0
    assert _close(model.extend(torch.tensor(seq[:4])), fresh[:4], exact)
    # num_logits keeps only the last positions.
    model.rollback(2)
    last = model.extend(torch.tensor(seq[2:9]), num_logits=3)
    assert last.shape == (3, model.vocab_size)
    assert _close(last, fresh[6:9], exact)


@pytest.mark.parametrize("kind", ["hf", "random-context", "markov"])
def test_fork_extend_branches_join_equals_fresh_prefill(
    kind: str, tiny: Callable[[str], HFCausalLM]
) -> None:
    make, exact = _makers(tiny)[kind]
    model = make()
    vocab = model.vocab_size
    prefix = _seq(21, 6, vocab)
    branches = [_seq(22 + m, 4, vocab) for m in range(3)]  # M = 3 continuations of k = 4
    nxt = _seq(30, 3, vocab)
    model.extend(torch.tensor(prefix[:-1]), num_logits=1)
    model.fork(3)
    assert model.rows == 3
    # Pending last prefix token + the branch, as the engine scores multi-draft blocks.
    block = torch.tensor([[prefix[-1]] + b for b in branches])  # [3, 5]
    logits = model.extend(block, num_logits=4)  # [3, 4, V]
    assert logits.shape == (3, 4, vocab)
    for m, b in enumerate(branches):
        assert _close(logits[m], _fresh(make, prefix + b)[-4:], exact), f"branch {m}"
    keep, kept_len = 1, len(prefix) + 2  # keep branch 1, truncated to two of its tokens
    model.join(keep, kept_len)
    assert model.rows == 1 and model.length == kept_len
    after = model.extend(torch.tensor(nxt))  # [3, V]
    expected = _fresh(make, prefix + branches[keep][:2] + nxt)[-3:]
    assert _close(after, expected, exact)
    # A second fork/join cycle from the joined cache (join on the last branch, full length).
    model.fork(2)
    more = torch.tensor([_seq(40, 2, vocab), _seq(41, 2, vocab)])  # [2, 2]
    model.extend(more, num_logits=1)
    model.join(1, model.length)
    tail = _seq(42, 2, vocab)
    expected = _fresh(make, prefix + branches[keep][:2] + nxt + more[1].tolist() + tail)[-2:]
    assert _close(model.extend(torch.tensor(tail)), expected, exact)


def test_rollback_beyond_cache_raises(tiny: Callable[[str], HFCausalLM]) -> None:
    for model in (tiny("target"), RandomContextLM(4, seed=0)):
        model.extend(torch.tensor([1, 2, 3]))
        with pytest.raises(ValueError, match="roll back"):
            model.rollback(4)
        with pytest.raises(ValueError):
            model.rollback(-1)


def test_hf_wrapper_reports_config(tiny: Callable[[str], HFCausalLM]) -> None:
    model = tiny("target")
    assert model.vocab_size == 64
    assert model.max_length == 256
    assert model.eos_token_ids == frozenset()
    out = model.extend(torch.tensor([3, 4, 5]), num_logits=1)
    assert out.shape == (1, 64) and out.dtype == torch.float32
    assert model.length == 3 and model.forward_calls == 1


def test_toy_logits_are_the_table_at_temperature_one() -> None:
    model = RandomContextLM(4, seed=9)
    ctx = [0, 3, 1]
    logits = model.extend(torch.tensor(ctx))  # [3, V], float64 log-probabilities
    probs = Sampling().probs(logits)
    for end in range(1, 4):
        assert torch.allclose(probs[end - 1], model.next_probs(tuple(ctx[:end])), atol=1e-15)
    assert logits.dtype == torch.float64


# ---------------------------------------------------------------- int8 draft


def test_int8_draft_is_its_own_q_and_greedy_stays_exact(tiny: Callable[[str], HFCausalLM]) -> None:
    from verispec.api import generate, generate_batch
    from verispec.models.loading import quantize_int8

    draft = tiny("close")
    quantized = quantize_int8(draft)
    assert quantized.name == "tiny-close+int8"
    prompt = [3, 9, 4, 17]
    # [1, 4, V]: the quantized draft is a different model (its own q), not the float one.
    ids = torch.tensor([prompt])
    with torch.no_grad():
        diff = (quantized.model(ids).logits - draft.model(ids).logits).abs().max().item()
    assert diff > 0.0
    # The float draft is left untouched (the quantized copy is a deep copy).
    assert isinstance(draft.model.model.layers[0].mlp.up_proj, torch.nn.Linear)
    ar = generate(tiny("target"), None, prompt, verifier="ar", temperature=0.0,
                  max_new_tokens=24)
    for verifier in ("token", "block"):
        out = generate(tiny("target"), quantize_int8(tiny("close")), prompt, verifier=verifier,
                       gamma=4, temperature=0.0, max_new_tokens=24)
        assert out.tokens == ar.tokens
    # inplace converts the wrapper's own module (no second copy in memory).
    # A private copy: the fixture's module is shared by other tests and must stay float.
    own = HFCausalLM(copy.deepcopy(tiny("close").model), None, name="own")
    assert quantize_int8(own, inplace=True).model is own.model
    # The batched engine runs the quantized draft too (ragged rows, greedy = ar per row).
    prompts = [prompt, [5, 1], [8, 8, 2, 30, 11]]
    batch = generate_batch(tiny("target"), quantize_int8(tiny("close")), prompts,
                           verifier="block", gamma=4, temperature=0.0, max_new_tokens=12,
                           batch_size=2)
    for p, row in zip(prompts, batch.results, strict=True):
        one = generate(tiny("target"), None, p, verifier="ar", temperature=0.0,
                       max_new_tokens=12)
        assert row.tokens == one.tokens


def test_int8_quantization_refuses_what_it_cannot_do(tiny: Callable[[str], HFCausalLM]) -> None:
    from verispec.models.loading import load_model, quantize_int8

    with pytest.raises(ValueError, match="float32"):
        # Module.to works in place: convert a private copy, not the shared fixture module.
        bf16 = copy.deepcopy(tiny("close").model).to(torch.bfloat16)
        quantize_int8(HFCausalLM(bf16, None, name="bf16"))
    with pytest.raises(TypeError, match="transformers model"):
        quantize_int8(MarkovLM.random(5, 0))
    with pytest.raises(ValueError, match="cannot be quantized"):
        load_model("toy:markov:5:1", quantize="int8")
    with pytest.raises(ValueError, match="quantize must be"):
        load_model("toy:markov:5:1", quantize="int4")
    # Refused before the (slow) load: the path is never looked up.
    with pytest.raises(ValueError, match="needs float32 weights"):
        load_model("/nonexistent/model-dir", dtype="bfloat16", quantize="int8")
