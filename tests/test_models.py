"""The one model interface: rows, ragged extends, per-row rollback and row selection must be
invisible — every row's logits equal a fresh single-row forward of its tokens.

For the tiny Hugging Face model (float32) within atol 1e-5 (1e-4 after random ragged
operations); for the exact toy models identically.
"""

from __future__ import annotations

import random as pyrandom
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from verispec.models.base import CausalLM, ContextTooLongError
from verispec.models.hf import HFCausalLM
from verispec.models.toy import MarkovLM, RandomContextLM

ATOL_HF = 1e-5


def _fresh(make: Callable[[], CausalLM], tokens: list[int]) -> Tensor:
    """Logits [k, V] for every position of ``tokens`` from a model with an empty cache."""
    model = make()
    model.add_rows([[]])
    return model.extend([tokens])[0]


def _close(a: Tensor, b: Tensor, exact: bool) -> bool:
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
    model.add_rows([seq[:4]])
    model.extend([seq[4:5]], num_logits=1)
    model.extend([seq[5:11]])  # a block of 6, of which only 2 are kept
    model.rollback(7)
    assert model.length == 7 and model.lengths == [7]
    after = model.extend([seq[7:13]])[0]  # [6, V]
    assert _close(after, fresh[7:13], exact)
    # Rolling back to the current length is a no-op; rolling back to 0 empties the row.
    model.rollback(13)
    assert _close(model.extend([seq[13:16]])[0], fresh[13:16], exact)
    model.rollback(0)
    assert model.length == 0 and model.rows == 1
    assert _close(model.extend([seq[:4]])[0], fresh[:4], exact)
    # num_logits keeps only the last positions.
    model.rollback(2)
    last = model.extend([seq[2:9]], num_logits=3)
    assert last.shape == (1, 3, model.vocab_size)
    assert _close(last[0], fresh[6:9], exact)


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
    model.add_rows([prefix[:-1]])
    model.select_rows([0, 0, 0])  # fork
    assert model.rows == 3
    # Pending last prefix token + the branch, as the engine scores multi-draft blocks.
    block = torch.tensor([[prefix[-1]] + b for b in branches])  # [3, 5]
    logits = model.extend(block, num_logits=4)  # [3, 4, V]
    assert logits.shape == (3, 4, vocab)
    for m, b in enumerate(branches):
        assert _close(logits[m], _fresh(make, prefix + b)[-4:], exact), f"branch {m}"
    keep, kept_len = 1, len(prefix) + 2  # keep branch 1, truncated to two of its tokens
    model.select_rows([keep])  # join
    model.rollback(kept_len)
    assert model.rows == 1 and model.length == kept_len
    after = model.extend([nxt])[0]  # [3, V]
    expected = _fresh(make, prefix + branches[keep][:2] + nxt)[-3:]
    assert _close(after, expected, exact)
    # A second fork/join cycle from the joined cache (join on the last branch, full length).
    model.select_rows([0, 0])
    more = [_seq(40, 2, vocab), _seq(41, 2, vocab)]
    model.extend(more, num_logits=1)
    model.select_rows([1])
    tail = _seq(42, 2, vocab)
    expected = _fresh(make, prefix + branches[keep][:2] + nxt + more[1] + tail)[-2:]
    assert _close(model.extend([tail])[0], expected, exact)


def _random_ops(model: CausalLM, reference: Callable[[list[int]], Tensor], vocab: int,
                atol: float, steps: int = 30) -> None:
    """Drive ``model`` with random ragged operations; compare every row to ``reference``."""
    rng = pyrandom.Random(0)
    rows: list[list[int]] = []
    model.reset()
    for step in range(steps):
        op = rng.choice(["extend", "extend", "rollback", "select", "add"]) if rows else "add"
        if op == "add":
            new = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 7))]
                   for _ in range(rng.randrange(1, 3))]
            model.add_rows(new)
            rows += [list(r) for r in new]
        elif op == "extend":
            toks = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 5))] for _ in rows]
            if not any(toks):
                toks[0] = [1]
            n = rng.choice([None, 1, 2])
            n = None if n is not None and n > max(len(t) for t in toks) else n
            logits = model.extend(toks, num_logits=n)  # [R, n, V]
            for b, t in enumerate(toks):
                rows[b] += t
                width = len(t) if n is None else min(n, len(t))
                for j in range(width):  # left aligned: entry j follows token k_b − n_b + j
                    upto = len(rows[b]) - width + j + 1
                    want = reference(rows[b][:upto])
                    assert torch.allclose(logits[b, j].double(), want.double(), atol=atol,
                                          rtol=0), (step, b, j)
        elif op == "rollback":
            keep = [rng.randrange(0, len(r) + 1) for r in rows]
            model.rollback(keep)
            rows = [r[:n] for r, n in zip(rows, keep, strict=True)]
        else:
            idx = [rng.randrange(len(rows)) for _ in range(rng.randrange(1, 5))]
            model.select_rows(idx)
            rows = [list(rows[i]) for i in idx]
        assert model.lengths == [len(r) for r in rows]


def test_toy_model_rows_match_the_table_exactly() -> None:
    model = RandomContextLM(6, seed=5)
    _random_ops(model, lambda toks: model.next_probs(tuple(toks)).log(), 6, atol=0.0)


def test_hf_model_rows_match_single_forward_passes(tiny: Callable[[str], HFCausalLM]) -> None:
    model = tiny("target")

    def reference(tokens: list[int]) -> Tensor:
        return _fresh(lambda: tiny("target"), tokens)[-1]

    _random_ops(model, reference, 64, atol=1e-4, steps=40)


def test_spawn_shares_weights_not_the_cache(tiny: Callable[[str], HFCausalLM]) -> None:
    for model in (tiny("target"), RandomContextLM(4, seed=0)):
        model.add_rows([[1, 2, 3]])
        twin = model.spawn()
        assert twin.rows == 0 and model.lengths == [3]
        twin.add_rows([[1, 2]])
        a = twin.extend([[3]], num_logits=1)
        b = model.extend([[1]], num_logits=1)
        model.rollback(3)
        assert model.lengths == [3] and twin.lengths == [3]
        assert a.shape == b.shape


def test_rollback_beyond_cache_and_bad_rows_raise(tiny: Callable[[str], HFCausalLM]) -> None:
    for model in (tiny("target"), RandomContextLM(4, seed=0)):
        model.add_rows([[1, 2, 3]])
        with pytest.raises(ValueError, match="roll back"):
            model.rollback(4)
        with pytest.raises(ValueError):
            model.rollback(-1)
        with pytest.raises(ValueError, match="rows"):
            model.extend([[1], [2]])
        with pytest.raises(ValueError, match="row index"):
            model.select_rows([1])
        with pytest.raises(ValueError, match="token id"):
            model.extend([[999]])
        with pytest.raises(ValueError, match="at least one token"):
            model.extend([[]])
        with pytest.raises(ValueError, match="num_logits"):
            model.extend([[1, 2]], num_logits=3)
        with pytest.raises(ValueError, match="exactly one"):
            model.select_rows([0, 0])
            _ = model.length


def test_context_window_is_enforced() -> None:
    model = RandomContextLM(4, seed=0, max_length=5)
    model.add_rows([[1, 2, 3]])
    with pytest.raises(ContextTooLongError):
        model.extend([[1, 2, 3]])
    with pytest.raises(ContextTooLongError):
        model.add_rows([[1] * 6])


def test_hf_wrapper_reports_config(tiny: Callable[[str], HFCausalLM]) -> None:
    model = tiny("target")
    assert model.vocab_size == 64
    assert model.max_length == 256
    assert model.eos_token_ids == frozenset()
    assert model.precision == "float32"
    model.add_rows([[3, 4]])
    out = model.extend([5], num_logits=1)
    assert out.shape == (1, 1, 64) and out.dtype == torch.float32
    assert model.length == 3 and model.forward_calls == 2  # the prefill and the extend


def test_toy_logits_are_the_table_at_temperature_one() -> None:
    from verispec.sampling import Sampling

    model = RandomContextLM(4, seed=9)
    ctx = [0, 3, 1]
    model.add_rows([[]])
    logits = model.extend([ctx])[0]  # [3, V], float64 log-probabilities
    probs = Sampling().probs(logits)
    for end in range(1, 4):
        assert torch.allclose(probs[end - 1], model.next_probs(tuple(ctx[:end])), atol=1e-15)
    assert logits.dtype == torch.float64
