"""Bad input gets a clear, specific error (checksum / truncated downloads: test_fetch.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor

import verispec
from verispec.models.base import ContextTooLongError
from verispec.models.hf import HFCausalLM
from verispec.models.loading import IncompatibleModelsError, load_model
from verispec.models.toy import RandomContextLM
from verispec.sampling import NonFiniteLogitsError, Sampling
from verispec.verify import block_verify, token_verify


def _toys(vocab: int = 4) -> tuple[RandomContextLM, RandomContextLM]:
    return RandomContextLM(vocab, seed=1), RandomContextLM(vocab, seed=2)


class PoisonedLM(RandomContextLM):
    """A toy model whose distribution after ``poison_at`` tokens holds ``value`` (NaN / inf)."""

    def __init__(self, vocab: int, seed: int, value: float, poison_at: int) -> None:
        super().__init__(vocab, seed)
        self.value, self.poison_at = value, poison_at

    def next_probs(self, context: Sequence[int]) -> Tensor:
        probs = super().next_probs(context).clone()
        if len(context) >= self.poison_at:
            probs[1] = self.value
        return probs


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("gamma", [0, -1])
def test_gamma_below_one(method: str, gamma: int) -> None:
    target, draft = _toys()
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        verispec.generate(target, draft, [0], method=method, gamma=gamma)


@pytest.mark.parametrize("options, match", [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": -0.2}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -3}, "top_k"),
])
def test_bad_sampling_parameters(options: dict, match: str) -> None:
    target, draft = _toys()
    with pytest.raises(ValueError, match=match):
        verispec.generate(target, draft, [0], method="block", gamma=2, **options)
    with pytest.raises(ValueError, match=match):
        Sampling(**options)


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("poisoned", ["target", "draft"])
def test_non_finite_logits(value: float, poisoned: str) -> None:
    bad = PoisonedLM(4, seed=3, value=value, poison_at=3)
    good = RandomContextLM(4, seed=4)
    target, draft = (bad, good) if poisoned == "target" else (good, bad)
    with pytest.raises(NonFiniteLogitsError, match="non-finite logits"):
        verispec.generate(target, draft, [0, 1, 2], method="token", gamma=2,
                          max_new_tokens=5)


def test_all_minus_inf_row_is_non_finite() -> None:
    with pytest.raises(NonFiniteLogitsError, match="-inf everywhere"):
        Sampling().probs(torch.full((2, 3), -math.inf, dtype=torch.float64))


WARPS = [Sampling(), Sampling(temperature=0), Sampling(top_k=2), Sampling(top_p=0.5),
         Sampling(temperature=0.7, top_k=3, top_p=0.9)]


@pytest.mark.parametrize("sampling", WARPS, ids=lambda s: s.describe())
@pytest.mark.parametrize("value", [math.nan, math.inf, "all -inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_warp_refuses_non_finite_logits(sampling: Sampling, value: object,
                                              dtype: torch.dtype) -> None:
    """One poisoned row among good ones is refused by every warp, greedy included, with
    the reason; finite logits (-inf entries allowed) pass."""
    logits = torch.randn((3, 2, 5), generator=torch.Generator().manual_seed(0)).to(dtype)
    logits[0, 1, 3] = -math.inf
    sampling.probs(logits)  # fine
    if value == "all -inf":
        logits[2, 0] = -math.inf
        match = "-inf everywhere"
    else:
        logits[1, 1, 2] = value  # type: ignore[assignment]
        match = "non-finite logits"
    with pytest.raises(NonFiniteLogitsError, match=match):
        sampling.probs(logits)


def test_logits_that_overflow_at_a_low_temperature_are_refused() -> None:
    logits = torch.tensor([[3e38, 1.0, -3e38]])
    with pytest.raises(NonFiniteLogitsError, match="temperature"):
        Sampling(temperature=0.01).probs(logits)


@pytest.mark.parametrize("prompt", [[], ""])
def test_empty_prompt(prompt: list | str) -> None:
    target, draft = _toys()
    with pytest.raises(ValueError, match="empty"):
        verispec.generate(target, draft, prompt, method="block", gamma=2)


@pytest.mark.parametrize("prompt_len", [8, 11])
def test_prompt_longer_than_context(prompt_len: int) -> None:
    target = RandomContextLM(4, seed=1, max_length=8)
    draft = RandomContextLM(4, seed=2, max_length=8)
    with pytest.raises(ContextTooLongError, match="context window"):
        verispec.generate(target, draft, [1] * prompt_len, method="block", gamma=2)


def test_extend_past_context_window() -> None:
    model = RandomContextLM(4, seed=1, max_length=5)
    with pytest.raises(ContextTooLongError, match="exceed the context window"):
        model.add_rows([[0, 1, 2, 3, 0, 1]])  # a prefill longer than the window
    model.add_rows([[]])
    model.extend(torch.tensor([0, 1, 2]))
    with pytest.raises(ContextTooLongError, match="exceed the context window"):
        model.extend(torch.tensor([0, 1, 2]))
    model.add_rows([[3]])  # a second row: each row is checked against the window
    with pytest.raises(ContextTooLongError, match="exceed the context window"):
        model.extend([[0, 1, 2], [0]])
    assert model.lengths == [3, 1]  # nothing was appended by the refused passes


def test_extend_needs_one_token_list_per_row() -> None:
    model = RandomContextLM(4, seed=1)
    with pytest.raises(ValueError, match="the cache has 0"):
        model.extend([0, 1])  # a model starts with no rows
    model.add_rows([[0], [1, 2]])
    with pytest.raises(ValueError, match="got tokens for 1 rows, the cache has 2"):
        model.extend([0, 1])
    with pytest.raises(ValueError, match="at least one token"):
        model.extend([[], []])
    with pytest.raises(ValueError, match="token id outside"):
        model.extend([[4], [0]])


def test_missing_model_path() -> None:
    with pytest.raises(FileNotFoundError, match="/nonexistent/dir"):
        load_model("/nonexistent/dir")


def test_different_vocabularies() -> None:
    with pytest.raises(IncompatibleModelsError, match="vocabulary sizes differ"):
        verispec.generate(RandomContextLM(4, seed=1), RandomContextLM(5, seed=2), [0],
                          method="block", gamma=2, drafter="model")


def test_different_tokenizers(tiny: Callable[[str], HFCausalLM],
                              tiny_foreign_tokenizer: HFCausalLM) -> None:
    target, draft = tiny("target"), tiny_foreign_tokenizer
    assert target.vocab_size == draft.vocab_size  # only the tokenizers differ
    with pytest.raises(IncompatibleModelsError, match="tokenizers differ"):
        verispec.generate(target, draft, [1, 2, 3], method="token", gamma=2)


def test_unknown_method_options_and_bad_budget() -> None:
    target, draft = _toys()
    with pytest.raises(ValueError, match="unknown method"):
        verispec.generate(target, draft, [0], method="nope")
    with pytest.raises(ValueError, match="only pearl takes a verifier"):
        verispec.generate(target, draft, [0], method="block", verifier="token")
    with pytest.raises(ValueError, match="does not take the option"):
        verispec.generate(target, draft, [0], method="block", epsilon=0.1)
    with pytest.raises(ValueError, match="does not take the option"):
        verispec.generate(target, draft, [0], method="block[epsilon=0.1]")
    with pytest.raises(ValueError, match="in brackets at the end"):
        verispec.generate(target, draft, [0], method="lossy[epsilon=0.1")
    with pytest.raises(ValueError, match="not key=value"):
        verispec.generate(target, draft, [0], method="lossy[0.1]")
    with pytest.raises(ValueError, match="max_new_tokens"):
        verispec.generate(target, draft, [0], method="block", gamma=2, max_new_tokens=0)
    with pytest.raises(ValueError, match="drafter must be"):
        verispec.generate(target, draft, [0], method="block", gamma=2, drafter="oracle")


# --------------------------------------------------------------------------------------
# Verifier inputs.
# --------------------------------------------------------------------------------------

def _inputs(b: int = 3, gamma: int = 2, v: int = 4) -> tuple[Tensor, Tensor, Tensor]:
    p = torch.full((b, gamma + 1, v), 1 / v, dtype=torch.float64)
    q = torch.full((b, gamma, v), 1 / v, dtype=torch.float64)
    return p, q, torch.zeros((b, gamma), dtype=torch.int64)


@pytest.mark.parametrize("verify", [token_verify, block_verify], ids=["token", "block"])
def test_verifier_input_errors(verify: Callable) -> None:
    g = torch.Generator().manual_seed(0)
    p, q, x = _inputs()
    verify(p, q, x, g)  # the well-formed inputs are accepted
    with pytest.raises(ValueError, match="expected target_probs"):
        verify(p[0], q, x, g)  # missing batch dimension
    with pytest.raises(ValueError, match="shape mismatch"):
        verify(p, q[:, :1], x, g)  # γ of q differs from γ of p
    with pytest.raises(ValueError, match="shape mismatch"):
        verify(p, q, x[:, :1], g)  # γ of the tokens differs
    with pytest.raises(ValueError, match="shape mismatch"):
        verify(p[:, :, :3], q, x, g)  # vocabularies differ
    with pytest.raises(ValueError, match="shape mismatch"):
        verify(p[:2], q, x, g)  # batch sizes differ
    with pytest.raises(TypeError, match="int64"):
        verify(p, q, x.to(torch.int32), g)
    with pytest.raises(TypeError, match="differ"):
        verify(p, q.float(), x, g)
