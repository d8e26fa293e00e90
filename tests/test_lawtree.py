"""The two-sample law test's prefix-tree statistic (verispec.bench.lawstats): its nodes and
cells, its level on k-token samples, a deviation after the first token seen below the root
where the first token alone shows nothing; and llama.cpp's shared-context sampler
(verispec.bench.lawsource), which must draw what one generation per seed draws."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

from verispec.bench.lawsource import llamacpp_samples
from verispec.bench.lawstats import ALPHA, permutation_test, tree_of


def test_tree_nodes_cells_and_depths() -> None:
    """Root: first tokens a (30) and b (20) are cells; node (a,): next tokens x and y are
    cells; node (b,) has one next token only, so it is no node; shares 1/2."""
    seqs = [("a", "x")] * 20 + [("a", "y")] * 10 + [("b", "x")] * 20
    tree = tree_of(seqs, 25)
    assert tree.sizes.tolist() == [50.0, 30.0]
    assert tree.totals.tolist() == [30.0, 20.0, 20.0, 10.0]
    assert tree.depth_of_cell.tolist() == [0, 0, 1, 1]
    assert tree.node_of_cell.tolist() == [0, 0, 1, 1]
    assert np.flatnonzero(tree.cells[:, 3]).tolist() == list(range(20, 30))  # (a, y)
    assert tree.nodes.sum(1).tolist() == [2.0] * 30 + [1.0] * 20  # (b, x): the root only


def _two_token(rng: np.random.Generator, n: int, first: np.ndarray,
               second: list[np.ndarray]) -> list[tuple[int, int]]:
    x1 = rng.choice(len(first), n, p=first)
    return [(int(a), int(rng.choice(len(second[a]), p=second[a]))) for a in x1]


FIRST = np.array([0.5, 0.3, 0.2])
SECOND = [np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.8]), np.array([0.5, 0.5])]


def test_level_on_two_token_samples() -> None:
    rng = np.random.default_rng(4)
    pvalues = [permutation_test([(_two_token(rng, 80, FIRST, SECOND),
                                  _two_token(rng, 80, FIRST, SECOND)) for _ in range(2)],
                                permutations=199, seed=rep).pvalue for rep in range(150)]
    pv = np.array(pvalues)
    assert (pv < ALPHA).mean() <= 0.04 and (pv < 0.05).mean() <= 0.1
    assert 0.3 < (pv < 0.5).mean() < 0.7


def test_a_second_token_deviation_is_seen_below_the_root() -> None:
    """Same first-token law, the second token after 0 drawn from another law: the tree test
    flags it; the same samples cut to their first token are not flagged."""
    rng = np.random.default_rng(5)
    wrong = [np.array([0.3, 0.3, 0.4]), SECOND[1], SECOND[2]]
    samples = [(_two_token(rng, 300, FIRST, wrong), _two_token(rng, 300, FIRST, SECOND))
               for _ in range(2)]
    tree = permutation_test(samples, seed=0)
    assert tree.flagged and tree.pvalue <= 0.005 and all(n >= 2 for n in tree.nodes)
    first = permutation_test([([s[:1] for s in a], [s[:1] for s in b]) for a, b in samples],
                             seed=0)
    assert not first.flagged and first.nodes == [1, 1]


# --------------------------------------------------------------------------- llama.cpp


class _FakeLlama:
    """A llama-cpp-python ``Llama`` stand-in: a cache of tokens (``n_tokens`` truncates it
    at the next eval, as the real one does) whose logits depend on every cached token."""

    def __init__(self) -> None:
        self.cache: list[int] = []
        self.n_tokens = 0
        self.evals = 0
        self.ctx = self

    def reset(self) -> None:
        self.cache, self.n_tokens = [], 0

    def eval(self, tokens: list[int]) -> None:
        self.cache = self.cache[:self.n_tokens] + list(tokens)
        self.n_tokens = len(self.cache)
        self.evals += len(tokens)

    def probs(self) -> np.ndarray:
        g = np.random.default_rng(hash(tuple(self.cache)) % (1 << 32))
        p = g.random(6) ** 3
        return p / p.sum()


class _FakeLibrary:
    """``llama_sampler_sample``: a draw from the context's law with the chain's own stream."""

    @staticmethod
    def llama_sampler_sample(chain: np.random.Generator, ctx: _FakeLlama, idx: int) -> int:
        assert idx == -1
        return int(chain.choice(6, p=ctx.probs()))


def _alone(llm: _FakeLlama, prompt: list[int], seed: int, tokens: int, eos: int) -> tuple:
    """One generation on its own: the whole prompt read, then one token at a time."""
    chain, out = np.random.default_rng(seed), []
    llm.reset()
    llm.eval(prompt)
    while True:
        out.append(_FakeLibrary.llama_sampler_sample(chain, llm, -1))
        if out[-1] == eos or len(out) >= tokens:
            return tuple(out)
        llm.eval([out[-1]])


def test_shared_llamacpp_sampling_draws_what_each_generation_draws(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from verispec.bench.llamacpp import library

    llm = _FakeLlama()

    @contextlib.contextmanager
    def sampler(lib: object, temperature: float, seed: int) -> Iterator[np.random.Generator]:
        yield np.random.default_rng(seed)

    monkeypatch.setattr(library, "_llama_cpp", lambda: _FakeLibrary)
    monkeypatch.setattr(library, "_sampler", sampler)
    monkeypatch.setattr(library, "load_gguf", lambda *a, **kw: llm)
    prompt, seeds, eos = [3, 1, 4], list(range(60)), 5
    got = llamacpp_samples("llamacpp-ar", prompt, seeds, tokens=3, temperature=1.0, gamma=1,
                           target_gguf="t.gguf", draft_gguf=None, eos=[eos])
    shared_evals = llm.evals
    want = [_alone(_FakeLlama(), prompt, s, 3, eos) for s in seeds]
    assert got == want
    assert any(len(s) < 3 for s in got) and len(set(got)) > 5  # EOS and many sequences
    assert shared_evals < sum(len(prompt) + len(s) - 1 for s in want) / 5


# --------------------------------------------------------------------------- shared contexts


def test_shared_prefix_rows_score_each_context_once() -> None:
    """Rows with equal contexts share one wrapped row; rows part when they add other tokens
    or roll back differently; every row's logits are the plain model's for its context."""
    import torch

    from verispec.bench.lawsource import SharedPrefixLM
    from verispec.models.toy import RandomContextLM

    plain, shared = RandomContextLM(7, seed=3), SharedPrefixLM(RandomContextLM(7, seed=3))
    for m in (plain, shared):
        m.add_rows([[0, 1, 2]] * 4)
    assert shared.inner.rows == 1 and shared.lengths == [3] * 4
    steps = [[[4], [4], [5], [4, 6]], [[1], [1], [1], [2]]]
    for tokens in steps:
        want, got = plain.extend(tokens), shared.extend(tokens)  # [R, n, V]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert shared.inner.rows == 3  # (4, 1) twice, (5, 1), (4, 6, 2)
    for m in (plain, shared):
        m.rollback([4, 5, 4, 3])
        m.select_rows([1, 0, 0, 3])
    assert shared.lengths == plain.lengths == [5, 4, 4, 3]
    tokens = [[2], [2], [3], [1]]
    torch.testing.assert_close(shared.extend(tokens), plain.extend(tokens), rtol=0, atol=0)
    assert shared.inner.rows == 4  # rows 1 and 2 shared (0, 1, 2, 4) and parted
