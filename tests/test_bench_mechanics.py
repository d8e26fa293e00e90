"""Benchmark mechanics of ``verispec bench``: fixed-length decoding (``ignore_eos``), the
randomised order of the configs, decode-only timing of every side, threads, the peers'
options and provenance. Toy, tiny and fake models only; nothing is downloaded."""

from __future__ import annotations

import io
import itertools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer

import verispec
from verispec.bench import measure, sides
from verispec.bench.grid import Config, expand_grid, parse_method, parse_methods
from verispec.bench.lawcheck import token_terms
from verispec.bench.llamacpp import default_threads
from verispec.bench.peers import PeerResult, run_peer
from verispec.bench.run import settings_from_args
from verispec.bench.runner import BenchSettings, _without, plan, read_results, run_benchmark
from verispec.cli import build_parser
from verispec.models.hf import HFCausalLM
from verispec.models.toy import RandomContextLM


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "s.jsonl", [{"prompt": "ABCAB", "category": "a"},
                                              {"prompt": "BBA", "category": "a"},
                                              {"prompt": "CADE", "category": "b"}])


def eos_pair() -> tuple[RandomContextLM, RandomContextLM]:
    """A toy pair of 5 tokens whose EOS (0) has probability ~1/5 at every step."""
    return RandomContextLM(5, 1, eos_token_id=0), RandomContextLM(5, 2, eos_token_id=0)


def settings(out: Path, suite: Path, **kw: Any) -> BenchSettings:
    base: dict[str, Any] = {
        "methods": parse_methods("ar,token,block"), "temperatures": [1.0], "gammas": [2, 3],
        "suites": [str(suite)], "out": out, "num_prompts": None, "max_new_tokens": 12,
        "repeats": 1, "seed": 3, "target": "toy-eos-target", "draft": "toy-eos-draft",
        "warmup": False,
    }
    base.update(kw)
    return BenchSettings(**base)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each perf_counter call advances 2⁻¹⁰ s (differences are exact in floating point)."""
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 2.0**-10)
    monkeypatch.setattr(measure, "rss_bytes", lambda: 100 * 2**20)


# ---------------------------------------------------------------- ignore_eos (engine)


@pytest.mark.parametrize("method", ["ar", "token", "block", "mjgd"])
def test_ignore_eos_decodes_the_budget_from_the_target_law(method: str) -> None:
    target, draft = eos_pair()
    gamma = None if method == "ar" else 3
    common: dict[str, Any] = {"method": method, "gamma": gamma, "temperature": 1.0,
                              "seed": 4, "max_new_tokens": 30}
    stops = verispec.generate(target, draft, [1, 2, 3], **common)
    assert stops.stats.stop_reason == "eos" and len(stops.tokens) < 30
    full = verispec.generate(target, draft, [1, 2, 3], ignore_eos=True, **common)
    assert len(full.tokens) == 30 and full.stats.stop_reason == "max_new_tokens"
    assert 0 in full.tokens[:-1]  # EOS was drawn and decoding went on
    # the same draws as on the target without EOS ids: past an EOS every token comes from
    # the method's law at the extended context, nothing else changes
    free = target.spawn()
    free.eos_token_ids = frozenset()
    assert verispec.generate(free, draft, [1, 2, 3], **common).tokens == full.tokens
    assert target.eos_token_ids == frozenset({0})  # the caller's model is left as it was


def test_ignore_eos_in_batches() -> None:
    target, draft = eos_pair()
    prompts = [[1, 2], [3, 4, 1], [2]]
    out = verispec.generate_batch(target, draft, prompts, method="block", gamma=2,
                                  temperature=1.0, seeds=[1, 2, 3], max_new_tokens=15,
                                  ignore_eos=True)
    assert [len(r.tokens) for r in out.results] == [15, 15, 15]
    for p, s, r in zip(prompts, [1, 2, 3], out.results, strict=True):  # batching changes none
        alone = verispec.generate(target, draft, p, method="block", gamma=2, temperature=1.0,
                                  seed=s, max_new_tokens=15, ignore_eos=True)
        assert alone.tokens == r.tokens


# ---------------------------------------------------------------- order


def grid() -> list[Config]:
    return expand_grid(parse_methods("ar,token,block,lossy[epsilon=0.1]"), [0.0, 1.0], [2, 4])


def test_random_order_is_a_reproducible_permutation_per_prompt() -> None:
    configs = grid()
    ids = ["p0", "p1", "p2", "p3"]
    units = plan(configs, 4, 2, order="random", seed=5, prompt_ids=ids)
    assert units == plan(configs, 4, 2, order="random", seed=5, prompt_ids=ids)
    per: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for u in units:
        per[(u.repeat, u.prompts[0])].append(u)
    sequences = []
    for here in per.values():
        assert sorted(u.config.key for u in here) == sorted(c.key for c in configs)
        assert [u.order for u in here] == list(range(len(configs)))
        sequences.append(tuple(u.config.key for u in here))
    assert len(set(sequences)) == len(sequences)  # a different order on every prompt
    assert sequences[0] != tuple(c.key for c in configs)
    other = plan(configs, 4, 2, order="random", seed=6, prompt_ids=ids)
    assert [u.config for u in other] != [u.config for u in units]
    # the order depends on the prompt's id, not on its position in the list
    moved = plan(configs, 2, 1, order="random", seed=5, prompt_ids=["p1", "p0"])
    assert [u.config for u in moved[:len(configs)]] == [u.config for u in per[(0, 1)]]


def test_fixed_order_keeps_the_grid_order() -> None:
    configs = grid()
    units = plan(configs, 3, 2, order="fixed", seed=5, prompt_ids=["a", "b", "c"])
    assert [u.config for u in units] == configs * 6
    assert [u.order for u in units[:len(configs)]] == list(range(len(configs)))
    assert units == plan(configs, 3, 2)  # the default
    batched = [*configs[:2], Config(configs[1].method, 0.0, 2, 2)]
    slots = [(u.prompts, u.order) for u in plan(batched, 3, 1)]
    assert slots == [((0,), 0), ((0,), 1), ((0, 1), 2), ((1,), 0), ((1,), 1), ((2,), 0),
                     ((2,), 1), ((2,), 2)]
    with pytest.raises(ValueError, match="order"):
        plan(configs, 1, 1, order="shuffled")


def test_runner_runs_and_records_the_random_order(tmp_path: Path, suite: Path) -> None:
    s = settings(tmp_path / "o", suite, repeats=2)
    seen: list[dict[str, Any]] = []
    run_benchmark(s, target=eos_pair()[0], draft=eos_pair()[1], err=io.StringIO(),
                  on_row=seen.append)
    by_prompt: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in seen:
        by_prompt[(row["repeat"], row["prompt_id"])].append(row)
    orders = set()
    for rows in by_prompt.values():
        assert [r["order"] for r in rows] == list(range(5))  # ran in the recorded slots
        orders.add(tuple(r["config"] for r in rows))
    assert len(orders) > 1
    meta = json.loads((s.out / "run.json").read_text())
    assert meta["order"] == "random" and meta["ignore_eos"] is False
    summary = json.loads((s.out / "summary.json").read_text())
    assert summary["meta"]["order"] == "random"
    # the summary lists the methods in the grid's order, whatever order they ran in
    assert [r["method"] for r in summary["rows"] if r["category"] == "all"][:1] == ["ar"]


# ---------------------------------------------------------------- fixed length in the bench


def test_bench_ignore_eos_rows_reach_the_budget(tmp_path: Path, suite: Path) -> None:
    target, draft = eos_pair()
    plain = settings(tmp_path / "plain", suite)
    run_benchmark(plain, target=target, draft=draft, err=io.StringIO())
    rows = list(read_results(plain.out / "results.jsonl").values())
    assert any(r["tokens"] < 12 for r in rows) and not any(r["ignore_eos"] for r in rows)
    fixed = settings(tmp_path / "fixed", suite, ignore_eos=True, batch_sizes=[1, 2])
    summary = run_benchmark(fixed, target=target, draft=draft, err=io.StringIO())
    rows = list(read_results(fixed.out / "results.jsonl").values())
    assert {r["batch_size"] for r in rows} == {1, 2}
    assert all(r["tokens"] == 12 and r["ignore_eos"] for r in rows)
    assert all(r["stop_reason"] == "max_new_tokens" for r in rows)
    assert summary["meta"]["ignore_eos"] is True
    assert json.loads((fixed.out / "run.json").read_text())["ignore_eos"] is True
    fixed.ignore_eos = False  # resuming with another value is refused
    with pytest.raises(ValueError, match="ignore_eos: True there, False now"):
        run_benchmark(fixed, target=target, draft=draft, err=io.StringIO())


def test_resume_checks_order_threads_and_reads_older_run_files(tmp_path: Path,
                                                               suite: Path) -> None:
    target, draft = eos_pair()
    s = settings(tmp_path / "o", suite, methods=parse_methods("ar"), order="fixed")
    run_benchmark(s, target=target, draft=draft, err=io.StringIO())
    path = s.out / "run.json"
    meta = json.loads(path.read_text())
    assert (meta["order"], meta["ignore_eos"], meta["threads"]) == ("fixed", False,
                                                                    default_threads())
    for key in ("order", "ignore_eos", "threads"):  # a file written before they existed
        del meta[key]
    path.write_text(json.dumps(meta))
    run_benchmark(s, target=target, draft=draft, err=io.StringIO())  # fixed, false: accepted
    with pytest.raises(ValueError, match="order: 'fixed' there, 'random' now"):
        run_benchmark(settings(s.out, suite, methods=parse_methods("ar")), target=target,
                      draft=draft, err=io.StringIO())
    meta["threads"] = default_threads() + 1
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="threads"):
        run_benchmark(s, target=target, draft=draft, err=io.StringIO())


# ---------------------------------------------------------------- timing and threads


def test_verispec_rows_split_prefill_and_decode(tmp_path: Path, suite: Path,
                                                fake_clock: None) -> None:
    s = settings(tmp_path / "o", suite, batch_sizes=[1, 2], methods=parse_methods("ar,block"))
    run_benchmark(s, target=eos_pair()[0], draft=eos_pair()[1], err=io.StringIO())
    rows = list(read_results(s.out / "results.jsonl").values())
    for r in rows:
        assert r["prefill_covers"] == "prompt" and r["decode_tokens"] == r["tokens"]
        assert r["prefill_seconds"] > 0 and r["decode_seconds"] > 0
        assert r["prefill_seconds"] + r["decode_seconds"] == r["seconds"]
        if r["batch_size"] == 1:
            assert r["prefill_seconds"] == r["prefill_time_s"]  # the engine's admission
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["batch_size"] == 2:
            calls[f"{r['config']}|{r['order']}|{r['prompt_index'] // 2}"].append(r)
    for group in calls.values():  # a batch's prefill is shared like its time
        shares = {round(r["prefill_seconds"] / r["seconds"], 12) for r in group}
        assert len(shares) == 1


def test_threads_are_set_for_the_run_and_recorded(tmp_path: Path, suite: Path) -> None:
    before = torch.get_num_threads()
    s = settings(tmp_path / "o", suite, methods=parse_methods("ar"), threads=1)
    summary = run_benchmark(s, target=eos_pair()[0], err=io.StringIO())
    assert torch.get_num_threads() == before  # restored
    assert summary["meta"]["threads"] == summary["meta"]["torch_threads"] == 1
    assert all(r["threads"] == 1 for r in read_results(s.out / "results.jsonl").values())
    assert settings(tmp_path / "d", suite).thread_count == default_threads()
    with pytest.raises(ValueError, match="threads"):
        run_benchmark(settings(tmp_path / "x", suite, threads=0), target=eos_pair()[0],
                      err=io.StringIO())


def test_cli_options_reach_the_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["bench", "--target", "toy:random:5:1", "--draft", "toy:random:5:2", "--methods",
         "ar,llamacpp-spec[p_min=0],llamacpp-spec[p_min=0.5]", "--gamma", "2,4,8",
         "--ignore-eos", "--order", "fixed", "--threads", "3", "--out", str(tmp_path)])
    s = settings_from_args(args)
    assert (s.ignore_eos, s.order, s.threads, s.thread_count) == (True, "fixed", 3, 3)
    keys = [c.key for c in expand_grid(s.methods, s.temperatures, s.gammas)]
    assert [k for k in keys if "p_min=0.5" in k] == [
        f"llamacpp-spec[p_min=0.5]|T=0|g={g}|b=1" for g in (2, 4, 8)]
    default = settings_from_args(build_parser().parse_args(["bench", "--out", str(tmp_path)]))
    assert (default.ignore_eos, default.order, default.threads) == (False, "random", None)


# ---------------------------------------------------------------- transformers peers


@pytest.fixture
def tiny_with_eos(tiny_modules: dict[str, Any]) -> tuple[HFCausalLM, int, list[int]]:
    """The tiny target with an EOS id that its greedy continuation of PROMPT reaches."""
    module = tiny_modules["target"]
    plain = HFCausalLM(module, TinyTokenizer(), "tiny")
    greedy = verispec.generate(plain, None, PROMPT, method="ar", temperature=0,
                               max_new_tokens=12).tokens
    eos = greedy[2]
    return HFCausalLM(module, TinyTokenizer(), "tiny", eos_token_ids=frozenset({eos})), eos, greedy


PROMPT = [1, 5, 9, 2]


def test_hf_ar_time_to_first_token_and_fixed_length(tiny_with_eos: Any, one_thread: None) -> None:
    target, eos, greedy = tiny_with_eos
    cut = greedy[:greedy.index(eos) + 1]
    stops = run_peer("hf-ar", target, None, PROMPT, temperature=0.0, gamma=None,
                     max_new_tokens=12, seed=0)
    assert stops.tokens == cut
    full = run_peer("hf-ar", target, None, PROMPT, temperature=0.0, gamma=None,
                    max_new_tokens=12, seed=0, ignore_eos=True)
    assert full.tokens == greedy  # past the EOS: the target's own (greedy) choices
    ours = verispec.generate(target, None, PROMPT, method="ar", temperature=0,
                             max_new_tokens=12, ignore_eos=True)
    assert ours.tokens == full.tokens
    assert full.first_tokens == 1 and full.threads == torch.get_num_threads()
    assert full.prefill_seconds is not None and 0 < full.prefill_seconds < full.seconds
    row = sides.peer_fields("hf-ar", full)
    assert row["prefill_covers"] == "first_token" and row["decode_tokens"] == 11
    assert row["decode_seconds"] == pytest.approx(full.seconds - full.prefill_seconds)


def test_hf_assisted_first_block(tiny_with_eos: Any, tiny: Any, one_thread: None) -> None:
    target, _, greedy = tiny_with_eos
    res = run_peer("hf-assisted", target, tiny("close"), PROMPT, temperature=0.0, gamma=3,
                   max_new_tokens=12, seed=0, ignore_eos=True)
    assert res.tokens == greedy and 1 <= res.first_tokens <= 4
    row = sides.peer_fields("hf-assisted", res)
    assert row["prefill_covers"] == "first_step"
    assert row["decode_tokens"] == 12 - res.first_tokens


# ---------------------------------------------------------------- llama.cpp peers in the runner


@pytest.fixture
def fake_llamacpp(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """llama.cpp peers that return a scripted result (toy token ids) and record their call."""
    import verispec.bench.llamacpp as L

    calls: list[dict[str, Any]] = []

    def run(name: str, ids: list[int], **kw: Any) -> PeerResult:
        calls.append({"name": name, **kw})
        spec = name == "llamacpp-spec"
        info = {"speculative_system_info": "not printed by llama-speculative-simple",
                "speculative_threads_logged": [kw["threads"]], "speculative_binary": "/b",
                "speculative_build": {"cmake_flags": ["-DGGML_NATIVE=ON"],
                                      "llama_cpp_python": "0.3.36"}} if spec else {}
        return PeerResult(tokens=[1, 2, 3, 4][:kw["max_new_tokens"]], seconds=2.0,
                          target_calls=3, prefill_seconds=0.5, first_tokens=0 if spec else 1,
                          masked_tokens=(0,) if kw["ignore_eos"] else (), threads=kw["threads"],
                          info=info, notes=[f"{name} ran"])

    monkeypatch.setattr(sides, "run_llamacpp", run)
    monkeypatch.setattr(sides, "gguf", lambda spec: f"/models/{spec}.gguf")
    monkeypatch.setattr(L, "llamacpp_available", lambda: None)
    monkeypatch.setattr(L, "provenance", lambda: {
        "llama_cpp_python": "0.3.36", "system_info": "CPU : AVX2 = 1",
        "cmake_flags": "unknown (pip build; flags not recorded by llama-cpp-python)",
        "installed_build": {"GGML_NATIVE": "ON"}})
    return calls


def test_llamacpp_peers_in_the_runner(tmp_path: Path, suite: Path,
                                      fake_llamacpp: list[dict[str, Any]]) -> None:
    methods = parse_methods("ar,llamacpp-ar,llamacpp-spec[p_min=0],llamacpp-spec[p_min=0.5]")
    s = settings(tmp_path / "o", suite, methods=methods, gammas=[2, 4], ignore_eos=True,
                 threads=1, max_new_tokens=4)
    summary = run_benchmark(s, target=eos_pair()[0], draft=eos_pair()[1], err=io.StringIO())
    spec_calls = [c for c in fake_llamacpp if c["name"] == "llamacpp-spec"]
    assert {(c.get("p_min"), c["gamma"]) for c in spec_calls} == {
        (0.0, 2), (0.0, 4), (0.5, 2), (0.5, 4)}
    assert all(c["threads"] == 1 and c["ignore_eos"] for c in fake_llamacpp)
    assert all("p_min" not in c for c in fake_llamacpp if c["name"] == "llamacpp-ar")
    rows = list(read_results(s.out / "results.jsonl").values())
    ar = next(r for r in rows if r["method"] == "llamacpp-ar")
    assert (ar["prefill_seconds"], ar["decode_seconds"], ar["decode_tokens"],
            ar["prefill_covers"]) == (0.5, 1.5, 3, "first_token")
    spec = next(r for r in rows if r["method"] == "llamacpp-spec[p_min=0.5]")
    assert (spec["decode_tokens"], spec["prefill_covers"]) == (4, "prompt")
    assert spec["law_masked_tokens"] == [0] and spec["threads"] == 1
    assert spec["peer_info"]["system_info"] == "CPU : AVX2 = 1"
    notes = " ".join(spec["notes"])
    assert "llama-cpp-python 0.3.36" in notes and "flags not recorded" in notes
    assert "-DGGML_NATIVE=ON" in notes and "not printed by llama-speculative-simple" in notes
    meta = summary["meta"]["llamacpp"]
    assert meta["threads"] == 1 and meta["cmake_flags"].startswith("unknown (pip build")
    assert meta["speculative_build"]["cmake_flags"] == ["-DGGML_NATIVE=ON"]
    assert meta["speculative_threads_logged"] == [1]


def test_peer_options_are_checked() -> None:
    assert parse_method("llamacpp-spec[p_min=0.25]").option_dict() == {"p_min": 0.25}
    for bad, message in [("llamacpp-spec[p_min=1.5]", r"p_min must be a number in \[0, 1\]"),
                         ("llamacpp-spec[n_max=3]", "takes no option 'n_max'; its options: p_min"),
                         ("llamacpp-ar[p_min=0.5]", "takes no option 'p_min'; it takes none"),
                         ("hf-assisted[p_min=0.5]", "it takes none")]:
        with pytest.raises(ValueError, match=message):
            parse_method(bad)


# ---------------------------------------------------------------- the law check


def test_law_check_removes_the_masked_ids() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, generator=g, dtype=torch.float64)  # [n, V]
    tokens = [0, 5, 3, 1]  # never 2 (masked)
    masked = token_terms(_without(logits, [2, 99]), tokens, 0.7,
                         torch.Generator().manual_seed(1))
    kept = torch.cat([logits[:, :2], logits[:, 3:]], dim=-1)  # [n, V − 1], id 2 gone
    reference = token_terms(kept, [t - (t > 2) for t in tokens], 0.7,
                            torch.Generator().manual_seed(1))
    assert masked[0] == pytest.approx(reference[0]) and masked[1] == pytest.approx(reference[1])
    assert masked[2] == pytest.approx(reference[2])
    assert _without(logits, []) is logits


def test_a_method_spec_can_fix_its_own_gamma() -> None:
    """``gamma=`` in a spec fixes that method's γ whatever the grid's γ list holds; peers need
    an integer, methods that do not draft refuse it, and the method never receives it."""
    from verispec.bench.grid import expand_grid, parse_method

    methods = [parse_method(s) for s in ("ar", "block", "llamacpp-spec[gamma=4,p_min=0.5]",
                                         "token[gamma=auto]")]
    configs = expand_grid(methods, [0.0], [None, 6])
    got = {(c.method.label, c.gamma) for c in configs}
    assert got == {("ar", 0), ("block", None), ("block", 6),
                   ("llamacpp-spec[gamma=4,p_min=0.5]", 4), ("token[gamma=auto]", None)}
    spec = methods[2]
    assert spec.option_dict() == {"p_min": 0.5} and spec.fixed_gamma == (4,)
    for bad, fragment in (("llamacpp-spec[gamma=auto]", "integer gamma"),
                          ("ar[gamma=3]", "does not draft"), ("block[gamma=0]", ">= 1")):
        with pytest.raises(ValueError, match=fragment):
            parse_method(bad)


def test_no_hf_drops_only_the_transformers_peers() -> None:
    """``--no-hf`` removes hf-* and keeps the llama.cpp peers and verispec's methods."""
    from verispec.bench.run import settings_from_args
    from verispec.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "--methods", "ar,block,hf-ar,hf-assisted,llamacpp-ar,llamacpp-spec[gamma=4]",
         "--no-hf"])
    labels = [m.label for m in settings_from_args(args).methods]
    assert labels == ["ar", "block", "llamacpp-ar", "llamacpp-spec[gamma=4]"]


@pytest.mark.parametrize("missing", [(), ("amx_int8",)], ids=["every-flag", "one-missing"])
def test_machine_line_names_only_the_flags_a_cpu_lacks(monkeypatch: pytest.MonkeyPatch,
                                                       missing: tuple[str, ...]) -> None:
    from verispec.telemetry.machine import CpuInfo

    flags = frozenset(measure.KERNEL_FLAGS) - set(missing)
    monkeypatch.setattr(measure, "cpu_info", lambda: CpuInfo("Test CPU", "6", "1", flags))
    text = measure.machine_description()
    assert text.startswith("Test CPU (family 6, model 1)")
    assert ("(no amx_int8)" in text) == bool(missing)
    assert "(no )" not in text
