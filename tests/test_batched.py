"""Batched speculative decoding through the one engine: rows decoded together must each
be the request decoded alone.

* Greedy: every row of a batched run equals the same request decoded alone, token for token,
  with prompts of different lengths, per-row budgets and an EOS that ends rows at different
  steps, for ar, token, block, greedy-block, lossy and multidraft.
* Sampling: a row's output with seed s is the same alone and in a batch; negative control:
  a generator shared by all rows breaks it.
* Statistics per row and for the batch, input errors, the API and the CLI's prompt files.
(The exact laws of batched rows are in ``test_engine_exact.py``; the model layer's ragged
rows in ``test_models.py``.)
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

import verispec
from verispec.api import make_drafter
from verispec.cli import main
from verispec.engine.loop import Engine
from verispec.engine.request import GenerationOutput, Request
from verispec.methods import build_method
from verispec.models.base import CausalLM, ContextTooLongError
from verispec.models.hf import HFCausalLM
from verispec.models.toy import RandomContextLM
from verispec.sampling import Randomness, Sampling

METHODS6 = [("ar", {}), ("token", {}), ("block", {}), ("greedy-block", {}),
            ("lossy", {"epsilon": 0.2}), ("multidraft", {"num_drafts": 3})]


def _run_batch(target: CausalLM, draft: CausalLM | None, prompts: list[list[int]], name: str,
               opts: dict, sampling: Sampling, budgets: list[int], seeds: list[int],
               batch_size: int, gamma: int = 3, drafter: str = "model",
               randoms: list[Randomness] | None = None) -> list[GenerationOutput]:
    method = build_method(name, **opts)
    maker = None if name == "ar" else make_drafter(target, draft, method, kind=drafter)
    randoms = randoms or [Randomness(torch.Generator().manual_seed(s)) for s in seeds]
    engine = Engine(target, batch_size=batch_size)
    return engine.run([Request(p, method, method.adjust_sampling(sampling), n, r,
                               gamma if maker is not None else 0, maker)
                       for p, n, r in zip(prompts, budgets, randoms, strict=True)])


def _run_single(target: CausalLM, draft: CausalLM | None, prompt: list[int], name: str,
                opts: dict, sampling: Sampling, budget: int, seed: int, gamma: int = 3,
                drafter: str = "model") -> GenerationOutput:
    return _run_batch(target, draft, [prompt], name, opts, sampling, [budget], [seed], 1,
                      gamma, drafter)[0]


# Greedy: rows equal the request decoded alone, token for token.

def test_greedy_rows_equal_single_requests_on_tiny_hf(tiny: Callable[[str], HFCausalLM]) -> None:
    greedy = Sampling(temperature=0)
    prompts = [[1, 2, 3, 4, 9, 10], [7], [20, 21, 22], list(range(30, 41)), [3, 3]]
    budgets = [10, 6, 12, 8, 9]
    target, draft = tiny("target"), tiny("close")
    # An EOS taken from row 0's greedy path ends some rows early and others at their budget.
    path = _run_single(target, draft, prompts[0], "ar", {}, greedy, 10, 0).tokens
    target.eos_token_ids = frozenset({path[4]})
    for name, opts in METHODS6:
        want = [_run_single(target, draft, p, name, opts, greedy, n, seed=4)
                for p, n in zip(prompts, budgets, strict=True)]
        got = _run_batch(target, draft, prompts, name, opts, greedy, budgets, [4] * 5,
                         batch_size=3)
        assert [g.tokens for g in got] == [w.tokens for w in want], name
        if name != "lossy":  # lossy may leave the greedy path (and so miss the EOS)
            reasons = {w.stats.stop_reason for w in want}
            assert reasons == {"eos", "max_new_tokens"}, (name, reasons)
        assert len({w.stats.iterations for w in want}) > 1  # rows end at different steps


# Sampling: a row's output does not depend on its batch.

@pytest.mark.parametrize("name, opts", METHODS6)
def test_sampled_row_is_the_same_alone_and_in_a_batch_toy(name: str, opts: dict) -> None:
    target, draft = RandomContextLM(6, seed=11, eos_token_id=5), RandomContextLM(6, seed=12)
    sampling = Sampling(temperature=0.9)
    prompts = [[1, 2, 3], [0], [2, 2, 2, 2, 1], [3, 1], [4, 4, 0]]
    budgets = [12, 7, 15, 10, 9]
    seeds = [5, 5, 6, 7, 8]
    batched = _run_batch(target, draft, prompts, name, opts, sampling, budgets, seeds,
                         batch_size=2)
    for i, p in enumerate(prompts):
        alone = _run_single(target, draft, p, name, opts, sampling, budgets[i], seeds[i])
        api = verispec.generate(target, draft, p, method=name, gamma=3, temperature=0.9,
                                max_new_tokens=budgets[i], seed=seeds[i], **opts)
        assert batched[i].tokens == alone.tokens == api.tokens, (name, i)


@pytest.mark.parametrize("name, opts", [("block", {}), ("multidraft", {"num_drafts": 2})])
def test_sampled_row_is_the_same_alone_and_in_a_batch_tiny_hf(
        name: str, opts: dict, tiny: Callable[[str], HFCausalLM]) -> None:
    target, draft = tiny("target"), tiny("close")
    sampling = Sampling(temperature=1.0)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40], [1, 2, 3], [60, 61]]
    budgets = [10, 16, 12, 8]
    batched = _run_batch(target, draft, prompts, name, opts, sampling, budgets, [9] * 4,
                         batch_size=3, gamma=4)
    for i in (1, 2):
        alone = _run_single(target, draft, prompts[i], name, opts, sampling, budgets[i], 9,
                            gamma=4)
        assert batched[i].tokens == alone.tokens, i


def test_negative_control_a_shared_generator_couples_the_rows() -> None:
    target, draft = RandomContextLM(6, seed=11), RandomContextLM(6, seed=12)
    sampling = Sampling()
    prompts = [[1, 2, 3], [0, 1], [2, 2]]
    alone = [_run_single(target, draft, p, "block", {}, sampling, 10, 3).tokens for p in prompts]
    fair = _run_batch(target, draft, prompts, "block", {}, sampling, [10] * 3, [3] * 3, 3)
    shared = Randomness(torch.Generator().manual_seed(3))
    coupled = _run_batch(target, draft, prompts, "block", {}, sampling, [10] * 3, [3] * 3, 3,
                         randoms=[shared] * 3)
    assert [o.tokens for o in fair] == alone
    assert [o.tokens for o in coupled] != alone  # the equality check above can fail


def test_ngram_drafter_rows_equal_single_requests() -> None:
    target = RandomContextLM(4, seed=2, sharpness=4.0)
    prompts = [[0, 1, 2, 0, 1], [3, 3, 3], [1, 2, 1, 2, 1, 2]]
    sampling = Sampling(temperature=0.7)
    out = _run_batch(target, None, prompts, "block", {}, sampling, [12] * 3, [1, 2, 3], 2,
                     gamma=4, drafter="ngram")
    for i, p in enumerate(prompts):
        want = _run_single(target, None, p, "block", {}, sampling, 12, i + 1, gamma=4,
                           drafter="ngram")
        assert out[i].tokens == want.tokens
        assert out[i].stats.tau_histogram == want.stats.tau_histogram
    assert any(o.stats.accepted_total > 0 for o in out)  # the n-gram drafts got accepted


def test_per_row_and_aggregate_statistics() -> None:
    target, draft = RandomContextLM(5, seed=1, eos_token_id=4), RandomContextLM(5, seed=2)
    sampling = Sampling()
    prompts = [[1, 2, 3], [0], [2, 2, 2, 2, 1], [3, 1]]
    budgets = [9, 12, 6, 8]
    res = verispec.generate_batch(target, draft, prompts, method="multidraft[num_drafts=2]",
                                  gamma=3, max_new_tokens=budgets, seeds=[1, 2, 3, 4],
                                  batch_size=2)
    s = res.stats
    for i, (row, p) in enumerate(zip(res.results, prompts, strict=True)):
        want = _run_single(target, draft, p, "multidraft", {"num_drafts": 2}, sampling,
                           budgets[i], i + 1)
        for key in ("iterations", "target_calls", "tokens_emitted", "accepted_total",
                    "tau_histogram", "target_tokens_scored", "extra_tokens_scored",
                    "stop_reason", "prefill_calls", "draft_calls"):
            assert getattr(row.stats, key) == getattr(want.stats, key), (i, key)
        assert row.stats.nll_sum == pytest.approx(want.stats.nll_sum, abs=1e-9)
        assert row.stats.tokens_emitted == len(row.tokens)
    rows = [r.stats for r in res.results]
    assert s.requests == 4 and s.batch_size == 2
    assert s.tokens_emitted == sum(len(r.tokens) for r in res.results)
    assert s.target_calls == sum(r.target_calls for r in rows)
    assert s.accepted_total == sum(r.accepted_total for r in rows)
    assert s.extra_tokens_scored == sum(r.extra_tokens_scored for r in rows) > 0
    assert s.target_passes < s.target_calls  # rows shared target passes
    assert 1 < s.mean_batch_rows <= 2
    assert s.block_efficiency == pytest.approx(s.tokens_emitted / s.target_calls)
    assert s.tokens_per_second == pytest.approx(s.tokens_emitted / s.wall_time_s)
    d = s.to_dict()
    assert d["tokens_per_second"] == s.tokens_per_second and d["mean_batch_rows"] == s.mean_batch_rows
    assert "4 requests, batch size 2" in s.summary()
    json.dumps(d)


def test_engine_input_errors() -> None:
    target = RandomContextLM(4, seed=1, max_length=5)
    ar = build_method("ar")
    rand = Randomness(torch.Generator().manual_seed(0))
    engine = Engine(target, batch_size=2)
    with pytest.raises(ValueError, match="empty"):
        engine.submit(Request([], ar, Sampling(), 3, rand))
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.submit(Request([1], ar, Sampling(), 0, rand))
    with pytest.raises(ValueError, match="needs a drafter"):
        Request([1], ar, Sampling(), 3, rand, gamma=2)
    with pytest.raises(ValueError, match="batch_size"):
        Engine(target, batch_size=0)
    with pytest.raises(ValueError, match="gamma"):
        Request([1], ar, Sampling(), 3, rand, gamma=-1)
    with pytest.raises(ContextTooLongError):
        engine.submit(Request([0, 1, 2, 3, 0], ar, Sampling(), 3, rand))
    outs = engine.run([Request([1, 2, 3], ar, Sampling(), 9, rand),
                       Request([2], ar, Sampling(), 9, Randomness(torch.Generator()))])
    assert [o.stats.stop_reason for o in outs] == ["context_window", "context_window"]
    assert [len(o.tokens) for o in outs] == [2, 4]


def test_api_generate_batch_matches_generate_per_prompt() -> None:
    """With a fixed γ a seeded prompt's output does not depend on the batch."""
    prompts = ["ABC", "A", "BBBBD"]
    for method, gamma in (("block", 8), ("multidraft[num_drafts=2]", 8), ("ar", None),
                          ("mjsd", None), ("greedy-block", 3)):
        res = verispec.generate_batch("toy:random:5:1", "toy:random:5:2", prompts,
                                      method=method, gamma=gamma, max_new_tokens=9,
                                      seeds=[5, 6, 7], batch_size=2)
        for p, s, r in zip(prompts, [5, 6, 7], res.results, strict=True):
            one = verispec.generate("toy:random:5:1", "toy:random:5:2", p, method=method,
                                    gamma=gamma, max_new_tokens=9, seed=s)
            assert (r.tokens, r.text) == (one.tokens, one.text), method
        assert res.stats.requests == 3 and res.stats.tokens_emitted == 27
        assert res.stats.gamma == (gamma if gamma is not None else
                                   (0 if method == "ar" else 4))  # mjsd's beam: its default


def test_generate_batch_chooses_gamma_auto_by_default_where_the_draft_model_drafts() -> None:
    prompts = ["ABC", "A"]
    args = ("toy:random:5:1", "toy:random:5:2", prompts)
    assert verispec.generate_batch(*args, max_new_tokens=4).stats.gamma == "auto"
    assert verispec.generate_batch(*args, max_new_tokens=4, gamma=2).stats.gamma == 2
    ngram = verispec.generate_batch(*args, max_new_tokens=4, drafter="ngram")
    assert ngram.stats.gamma == 8  # prompt lookup has no draft model to time: the default
    assert verispec.generate("toy:random:5:1", "toy:random:5:2", "AB",
                             max_new_tokens=4).stats.gamma == 8  # one prompt: unchanged
    with pytest.raises(ValueError, match="schedule of its own"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", prompts, method="mjgd")
    with pytest.raises(ValueError, match="seeds"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", prompts, seeds=[1])
    with pytest.raises(TypeError, match="list of prompts"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", "ABC")


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out=out, err=err), out.getvalue(), err.getvalue()


TOY = ["--target", "toy:random:5:1", "--draft", "toy:random:5:2"]


def test_cli_prompts_file_json_lines_in_input_order(tmp_path: Any) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('"ABC"\n{"prompt": "A", "seed": 3}\n\n{"prompt": [1, 2, 2], '
                    '"max_new_tokens": 4}\n')
    code, out, err = _cli("generate", "--prompts", str(path), *TOY, "--batch-size", "2",
                          "--max-new-tokens", "6", "--json", "--method", "token",
                          "--gamma", "8")  # a fixed γ: the seeded text of generate
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3 and "3 requests" in err
    for line, (prompt, seed) in zip(lines, [("ABC", 0), ("A", 3), ("BCC", 0)], strict=True):
        code1, single, _ = _cli("generate", prompt, *TOY, "--json", "--method", "token",
                            "--seed", str(seed), "--max-new-tokens",
                            "4" if prompt == "BCC" else "6")
        assert code1 == 0
        one = json.loads(single)
        assert set(line) == set(one) and set(line["stats"]) == set(one["stats"])
        assert (line["tokens"], line["text"]) == (one["tokens"], one["text"])
    code, out, _ = _cli("generate", "--prompts", str(path), *TOY, "--max-new-tokens", "6")
    assert code == 0 and out.count("=== prompt") == 3 and "3 requests, batch size 8" in out


def test_cli_batch_errors(tmp_path: Any) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"AB"\n{"text": "A"}\n')
    code, _, err = _cli("generate", "--prompts", str(bad), *TOY)
    assert code == 2 and "bad.jsonl:2" in err
    code, _, err = _cli("generate", "AB", "--prompts", str(bad), *TOY)
    assert code == 2 and "not both" in err
    code, _, err = _cli("generate", "AB", "--batch-size", "2", *TOY)
    assert code == 2 and "--batch-size needs --prompts" in err
    code, _, err = _cli("generate", *TOY)
    assert code == 2 and "give a prompt" in err


# The embedded real pair (integration: loads ~10 GB in float32).

@pytest.mark.integration
def test_greedy_batch_equals_single_requests_on_the_real_pair() -> None:
    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
    from verispec.models.loading import load_model

    target = load_model(DEFAULT_TARGET, precision="float32")
    draft = load_model(DEFAULT_DRAFT, precision="float32")
    prompts = ["def fib(n):", "import numpy as np\n\n\ndef mean(xs):\n    \"\"\"",
               "# print hello"]
    for method in ("block", "multidraft[num_drafts=2]"):
        batch = verispec.generate_batch(target, draft, prompts, method=method, gamma=5,
                                        temperature=0, max_new_tokens=[20, 12, 16],
                                        batch_size=2)
        for p, n, r in zip(prompts, [20, 12, 16], batch.results, strict=True):
            one = verispec.generate(target, draft, p, method=method, gamma=5,
                                    temperature=0, max_new_tokens=n)
            assert r.tokens == one.tokens, (method, p, r.text, one.text)
        assert batch.stats.tokens_per_second > 0
