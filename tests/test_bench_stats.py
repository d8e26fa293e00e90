"""The bench's statistics on synthetic result rows: columns that agree with their ratios,
decode-only figures, comparisons with peers, intervals over prompts, and the rebuilding of
the reports from a results file. No model is loaded."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from verispec.bench.comparisons import peer_comparisons, peer_configs
from verispec.bench.metrics import (
    decode_throughput,
    paired_ratio_ci,
    prompt_ratio_ci,
    summarize,
)
from verispec.bench.report import (
    build_summary,
    canonical_order,
    main,
    read_results_file,
    render_markdown,
    write_reports,
)

ROOT = Path(__file__).resolve().parents[1]
Row = dict[str, Any]


def _script(name: str) -> ModuleType:
    """A module of ``benchmarks/`` (they import each other by plain name)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def row(method: str, prompt: int, repeat: int, tokens: int, seconds: float, *,
        gamma: Any = None, temperature: float = 0.0, category: str = "c",
        base: str | None = None, lossless: bool = True, **extra: Any) -> Row:
    base = base or method.split("[")[0]
    if gamma is None:
        gamma = 0 if base in ("ar", "llamacpp-ar", "hf-ar") else 4
    config = f"{method}|T={temperature:g}|g={gamma}|b=1"
    out = {"key": f"{config}|p{prompt}|r={repeat}", "config": config, "method": method,
           "base_method": base, "options": {}, "temperature": temperature, "gamma": gamma,
           "batch_size": 1, "suite": "s", "category": category, "prompt_id": f"p{prompt}",
           "prompt_index": prompt, "repeat": repeat, "seed": 100 * repeat + prompt,
           "tokens": tokens, "seconds": seconds, "target_calls": tokens, "iterations": tokens,
           "accepted_total": 0, "drafted_total": 0, "nll_sum": 1.0, "lossless": lossless}
    out.update(extra)
    return out


def timed(tokens: int, seconds: float, prefill: float, first_tokens: int = 0) -> Row:
    """The timing fields the runner writes: ``first_tokens`` generated within the prefill
    (0: it covers the prompt; 1: up to the first token)."""
    return {"prefill_seconds": prefill, "decode_seconds": seconds - prefill,
            "decode_tokens": tokens - first_tokens,
            "prefill_covers": "prompt" if first_tokens == 0 else "first_token"}


def grid_rows(seed: int = 0, repeats: int = 2, prompts: int = 5) -> list[Row]:
    """ar, block and token at T = 0 with random times and prefill times (new rows)."""
    rng = random.Random(seed)
    rows = []
    for r in range(repeats):
        for p in range(prompts):
            for m, speed in (("ar", 1.0), ("block", 1.6), ("token", 1.4)):
                tokens = rng.randint(20, 60)
                seconds = tokens / (10 * speed * rng.uniform(0.7, 1.3))
                rows.append(row(m, p, r, tokens, seconds,
                                **timed(tokens, seconds, seconds * rng.uniform(0.05, 0.3))))
    return rows


def pooled(summary: list[Row], method: str) -> Row:
    return next(s for s in summary if s["method"] == method and s["category"] == "all")


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


# ---------------------------------------------------------------- columns and ratios


def test_tok_s_columns_divide_to_the_stated_paired_ratio():
    summary = summarize(grid_rows())
    ar, block = pooled(summary, "ar"), pooled(summary, "block")
    assert block["tokens_per_s"] / ar["tokens_per_s"] == pytest.approx(
        block["speedup_vs_ar"], rel=1e-12)
    assert block["decode_tokens_per_s"] / ar["decode_tokens_per_s"] == pytest.approx(
        block["speedup_vs_ar_decode"], rel=1e-12)
    assert block["speedup_pairs"] == block["speedup_decode_pairs"] == 5


def test_tok_s_is_the_geometric_mean_over_prompts_of_per_prompt_geometric_means():
    rows = grid_rows(seed=3)
    block = pooled(summarize(rows), "block")
    mine = [r for r in rows if r["method"] == "block"]
    per_prompt = [geomean([r["tokens"] / r["seconds"] for r in mine if r["prompt_id"] == p])
                  for p in dict.fromkeys(r["prompt_id"] for r in mine)]
    assert block["tokens_per_s"] == pytest.approx(geomean(per_prompt), rel=1e-12)
    assert block["pooled_tokens_per_s"] == pytest.approx(
        sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine))
    per_repeat = [geomean([r["tokens"] / r["seconds"] for r in mine if r["repeat"] == k])
                  for k in (0, 1)]
    assert block["per_repeat"]["tokens_per_s"] == pytest.approx(per_repeat)
    assert block["tokens_per_s_std"] == pytest.approx(statistics.stdev(per_repeat))


def test_speedup_averages_repeats_per_prompt_before_the_interval():
    rows = grid_rows(seed=5, repeats=3, prompts=4)
    block = pooled(summarize(rows), "block")
    index = {(r["method"], r["prompt_id"], r["repeat"]): r for r in rows}
    logs: dict[str, list[float]] = {}
    for (m, p, k), r in index.items():
        if m == "block":
            a = index[("ar", p, k)]
            logs.setdefault(p, []).append(math.log((r["tokens"] / r["seconds"])
                                                   / (a["tokens"] / a["seconds"])))
    point, ci = paired_ratio_ci([statistics.fmean(v) for v in logs.values()])
    assert block["speedup_vs_ar"] == pytest.approx(point)
    assert block["speedup_vs_ar_ci95"] == [pytest.approx(ci[0]), pytest.approx(ci[1])]
    assert prompt_ratio_ci(logs) == (pytest.approx(point), (pytest.approx(ci[0]),
                                                            pytest.approx(ci[1])))


# ---------------------------------------------------------------- decode-only figures


def test_decode_figures_come_from_the_decode_fields_for_peers_too():
    rows = [row("ar", p, 0, 41, 5.0, **timed(41, 5.0, 1.0 + p)) for p in range(3)]
    rows += [row("llamacpp-ar", p, 0, 21, 3.0, **timed(21, 3.0, 0.5, first_tokens=1))
             for p in range(3)]
    summary = summarize(rows)
    ar, peer = pooled(summary, "ar"), pooled(summary, "llamacpp-ar")
    decode = geomean([41 / (5.0 - 1.0 - p) for p in range(3)])
    assert ar["decode_tokens_per_s"] == pytest.approx(decode)
    assert ar["tpot_ms"] == pytest.approx(1000 / decode)
    assert ar["prefill_ms"] == pytest.approx(1000 * geomean([1.0, 2.0, 3.0]))
    assert ar["decode_prompts"] == 3
    assert peer["decode_tokens_per_s"] == pytest.approx(20 / 2.5)
    assert peer["prefill_ms"] == pytest.approx(500)
    assert peer["speedup_vs_ar_decode"] == pytest.approx(8.0 / decode)
    assert peer["speedup_vs_ar"] == pytest.approx(7.0 / 8.2)


def test_old_rows_without_prefill_seconds():
    """verispec rows fall back on prefill_time_s (it ends before the first generated token:
    every token is decoded); llama.cpp rows without prefill_seconds have no decode figure,
    shown as –."""
    rows = [row("ar", p, 0, 11, 2.0, prefill_time_s=1.0) for p in range(2)]
    rows += [row("llamacpp-ar", p, 0, 11, 1.5) for p in range(2)]
    summary = summarize(rows)
    ar, peer = pooled(summary, "ar"), pooled(summary, "llamacpp-ar")
    assert ar["decode_tokens_per_s"] == pytest.approx(11.0)
    assert ar["prefill_ms"] == pytest.approx(1000)
    assert peer["decode_tokens_per_s"] is None and peer["tpot_ms"] is None
    assert peer["prefill_ms"] is None and peer["speedup_vs_ar_decode"] is None
    assert peer["decode_prompts"] == 0
    assert peer["speedup_vs_ar"] == pytest.approx(2.0 / 1.5)
    md = render_markdown(build_summary({}, rows))
    line = next(x for x in md.splitlines() if x.startswith("| llamacpp-ar |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5:8] == ["–", "–", "–"]  # decode tok/s, TPOT, prefill
    # a prefill time without the decode fields tells no decode rate for a peer
    assert decode_throughput(row("hf-ar", 0, 0, 11, 1.5, prefill_seconds=0.5)) is None
    assert decode_throughput(row("ar", 0, 0, 11, 1.5, **timed(11, 1.5, 0.5))) == 11.0


# ---------------------------------------------------------------- comparisons with peers


def peer_grid_rows() -> list[Row]:
    """Per prompt (4) and repeat (2): ar, block γ=4, a lossy method, llamacpp-ar and a
    grid of llamacpp-spec configs (γ 4 and 8, and an options label at γ 8)."""
    rng = random.Random(11)
    speeds = {("ar", None, "ar"): 1.0, ("block", 4, "block"): 1.5,
              ("lossy[epsilon=0.2]", 4, "lossy"): 3.0, ("llamacpp-ar", None, "llamacpp-ar"): 1.1,
              ("llamacpp-spec", 4, "llamacpp-spec"): 1.2,
              ("llamacpp-spec", 8, "llamacpp-spec"): 1.3,
              ("llamacpp-spec[p_min=0.5]", 8, "llamacpp-spec"): 1.4}
    rows = []
    for k in range(2):
        for p in range(4):
            for (m, g, base), speed in speeds.items():
                seconds = 4.0 / (speed * rng.uniform(0.8, 1.2))
                first = 1 if base == "llamacpp-ar" else 0
                rows.append(row(m, p, k, 40, seconds, gamma=g, base=base,
                                lossless=base != "lossy",
                                **timed(40, seconds, 0.4 * rng.uniform(0.8, 1.2), first)))
    return rows


def test_comparisons_pair_each_lossless_config_with_each_peer_config():
    rows = peer_grid_rows()
    entries = peer_comparisons(rows)
    plain = {(e["method"], e["peer"], e["peer_gamma"]) for e in entries
             if e["method_role"] == e["peer_role"] == "config"}
    peers = [("llamacpp-ar", 0), ("llamacpp-spec", 4), ("llamacpp-spec", 8),
             ("llamacpp-spec[p_min=0.5]", 8)]
    assert plain == {(m, p, g) for m in ("ar", "block") for p, g in peers}  # lossy excluded
    e = next(e for e in entries if e["method"] == "block" and e["peer"] == "llamacpp-spec"
             and e["peer_gamma"] == 8 and e["peer_role"] == "config")
    mine = {(r["prompt_id"], r["repeat"]): r for r in rows if r["method"] == "block"}
    theirs = {(r["prompt_id"], r["repeat"]): r for r in rows
              if r["method"] == "llamacpp-spec" and r["gamma"] == 8}
    logs: dict[str, list[float]] = {}
    for key, a in mine.items():
        b = theirs[key]
        logs.setdefault(key[0], []).append(math.log(b["seconds"] / a["seconds"]))
    point, ci = prompt_ratio_ci(logs)
    assert e["speedup"] == pytest.approx(point) and e["pairs"] == 4
    assert e["speedup_ci95"] == [pytest.approx(ci[0]), pytest.approx(ci[1])]
    assert e["speedup"] == pytest.approx(e["tokens_per_s"] / e["peer_tokens_per_s"])
    assert e["speedup_decode"] is not None and e["speedup_decode_ci95"] is not None


def test_best_peer_config_of_a_grid_and_best_lossless_config():
    rows = peer_grid_rows()
    grid = peer_configs(rows)
    spec = [p for p in grid if p["kind"] == "llamacpp-spec"]
    fastest = max(spec, key=lambda p: p["tokens_per_s"])
    assert [p["best"] for p in spec].count(True) == 1 and fastest["best"]
    assert next(p for p in grid if p["kind"] == "llamacpp-ar")["best"]
    entries = peer_comparisons(rows)
    vs_best = [e for e in entries if e["peer_role"] == "best llamacpp-spec config"
               and e["method_role"] == "config"]
    assert {e["method"] for e in vs_best} == {"ar", "block"}
    assert all(e["peer"] == fastest["peer"] and e["peer_gamma"] == fastest["gamma"]
               for e in vs_best)
    top = [e for e in entries if e["method_role"] == "best lossless verispec config"]
    assert {e["peer_role"] for e in top} == {"best llamacpp-ar config",
                                             "best llamacpp-spec config"}
    assert all(e["method"] == "block" and e["gamma"] == 4 for e in top)  # not the lossy one
    md = render_markdown(build_summary({}, rows))
    assert "### Against peers (paired per prompt)" in md
    assert "best lossless verispec config: block γ=4" in md
    assert f"best llamacpp-spec config: {fastest['peer']} γ={fastest['gamma']}" in md
    assert f"| {fastest['peer']} ★ | {fastest['gamma']} |" in md


def test_no_comparisons_without_peers():
    summary = build_summary({}, grid_rows())
    assert summary["comparisons"] == [] and summary["peer_configs"] == []
    assert "Against peers" not in render_markdown(summary)


# ---------------------------------------------------------------- benchmarks/paired.py


def test_paired_intervals_treat_prompts_as_the_unit():
    paired = _script("paired")
    once = {f"p{i}": [r] for i, r in enumerate((1.10, 1.30, 0.95, 1.25))}
    rounds = [(p, v[0]) for _ in range(3) for p, v in once.items()]  # 3 identical rounds
    assert paired.geomean_interval(rounds) == pytest.approx(paired.geomean_interval(once))
    mean, lo, hi = paired.geomean_interval(once)
    logs = [math.log(v[0]) for v in once.values()]
    point, ci = paired_ratio_ci(logs)
    assert (mean, lo, hi) == pytest.approx((point, ci[0], ci[1]))
    # twelve independent-looking pairs would give a narrower interval: not what is reported
    _, narrow = paired_ratio_ci([math.log(r) for _, r in rounds])
    assert narrow[1] - narrow[0] < hi - lo
    # rounds that differ are averaged in logs within each prompt first
    varied = [("a", 1.0), ("a", 1.21), ("b", 1.5), ("b", 1.5), ("c", 0.9), ("c", 1.0)]
    expect = paired_ratio_ci([math.log(1.1), math.log(1.5), math.log(math.sqrt(0.9))])
    got = paired.geomean_interval(varied)
    assert got == pytest.approx((expect[0], *expect[1]))
    assert paired.geomean_interval({"only": [2.0, 2.0]}) == (pytest.approx(2.0), None, None)
    assert "over 4 prompts" in paired.format_interval(rounds)
    assert "no interval" in paired.format_interval([("x", 1.2)])


# ---------------------------------------------------------------- benchmarks/gamma_replay.py


def test_gamma_replay_keeps_the_run_of_matches_and_charges_each_pass():
    """A replayed iteration keeps the matches from its start up to the first mismatch (at
    most γ) plus the target's own token, and costs γ draft steps and a (γ + 1)-token pass;
    the draft reads the context once, at its first draft."""
    replay = _script("gamma_replay")
    from verispec.engine.gamma import AutoGamma, FixedGamma, PassCosts

    costs = PassCosts({1: 1.0, 2: 1.5, 3: 2.0}, draft=0.25, draft_prefill=0.01)
    match = [True, True, False, True, True, True, True, False]
    # γ 2 from 0: keeps 2 (positions 0, 1), emits 3 -> 3; keeps 2 -> 6; room for γ 1 -> 8
    expect = 10 * 0.01 + 2 * (2 * 0.25 + 2.0) + (0.25 + 1.5)
    assert replay.replay(match, 10, FixedGamma(2), costs) == pytest.approx(expect)
    assert replay.replay(match, 10, FixedGamma(0), costs) == pytest.approx(8 * 1.0)
    # a mismatch at the first drafted position keeps nothing: every iteration emits one token
    assert replay.replay([False] * 4, 0, FixedGamma(1), costs) == pytest.approx(3 * 1.75 + 1.0)
    matches = {"a": (10, match), "b": (5, [True] * 6)}
    assert replay.speedup(matches, costs, lambda h: FixedGamma(0)) == pytest.approx(1.0)
    gain = replay.speedup(matches, costs, lambda h: AutoGamma(costs, history=h))
    assert gain > 1.0  # drafting pays on these costs and matches


def test_categories_script_has_decode_figures_for_llamacpp_with_prefill_seconds():
    categories = _script("categories")
    rows = []
    for k in range(2):
        for p in range(3):
            rows.append(row("block", p, k, 41, 2.0 + 0.1 * p + 0.05 * k, prefill_time_s=0.5))
            rows.append(row("llamacpp-ar", p, k, 41, 3.0, **timed(41, 3.0, 0.5, 1)))
    text = categories.table(rows, "block", ["llamacpp-ar"])
    line = next(x for x in text.splitlines() if x.startswith("| all (3)"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    logs = {p: [math.log((41 / (1.5 + 0.1 * p + 0.05 * k)) / (40 / 2.5)) for k in range(2)]
            for p in range(3)}
    point, ci = prompt_ratio_ci(logs)
    assert cells[3] == f"{point:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]"
    new_fields = ("prefill_seconds", "decode_seconds", "decode_tokens", "prefill_covers")
    old = [{k: v for k, v in r.items() if k not in new_fields} for r in rows]
    line = next(x for x in categories.table(old, "block", ["llamacpp-ar"]).splitlines()
                if x.startswith("| all (3)"))
    assert [c.strip() for c in line.strip("|").split("|")][3] == "–"


# ---------------------------------------------------------------- regeneration


def write_results(path: Path, rows: list[Row], torn: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + ('{"key": "torn' if torn else ""))
    return path


def test_report_command_rebuilds_the_summary_from_results_alone(tmp_path: Path):
    rows = [{**r, "order": i % 7} for i, r in enumerate(peer_grid_rows())]  # random order
    rows = canonical_order(rows, {})
    assert [r["method"] for r in rows[:3]] == ["ar", "block", "lossy[epsilon=0.2]"]
    assert rows[-1]["method"] == "llamacpp-spec[p_min=0.5]" and rows[-1]["repeat"] == 1
    shuffled = rows[:]
    random.Random(2).shuffle(shuffled)
    run = tmp_path / "run"
    run.mkdir()
    write_results(run / "results.jsonl", shuffled, torn=True)
    (run / "run.json").write_text(json.dumps({"target": "t-model", "draft": "d-model",
                                              "max_new_tokens": 40, "seed": 3}))
    assert main([str(run / "results.jsonl"), "--out", str(tmp_path / "a"), "--no-plots"]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    expected = json.loads(json.dumps(build_summary(summary["meta"], rows)))
    assert summary == expected  # run order does not matter, the torn line is dropped
    assert summary["meta"]["target"] == "t-model"
    assert summary["meta"]["prompts_per_category"] == {"c": 4}
    md = (tmp_path / "a" / "summary.md").read_text()
    assert md == render_markdown(summary)
    assert "target `t-model`" in md and "40 new tokens" in md
    assert "regenerated from `results.jsonl`" in md
    assert len(read_results_file(run / "results.jsonl")) == len(rows)


def test_report_module_runs_as_a_command(tmp_path: Path):
    results = write_results(tmp_path / "results.jsonl", grid_rows())
    done = subprocess.run([sys.executable, "-m", "verispec.bench.report", str(results),
                           "--out", str(tmp_path / "out"), "--no-plots"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# verispec bench")
    bad = subprocess.run([sys.executable, "-m", "verispec.bench.report",
                          str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "error" in bad.stderr


def test_write_reports_adds_comparisons_from_the_results_next_to_it(tmp_path: Path):
    rows = peer_grid_rows()
    write_results(tmp_path / "results.jsonl", rows)
    summary: dict[str, Any] = {"meta": {}, "rows": summarize(rows)}
    write_reports(tmp_path, summary)
    assert summary["comparisons"] == peer_comparisons(rows)
    assert "Against peers" in (tmp_path / "summary.md").read_text()


def test_law_check_is_labelled_as_a_one_sample_calibration_check():
    rows = [row("ar", p, 0, 3, 1.0, temperature=1.0, law_z_sum=0.5, law_v_sum=3.0,
                law_pits=[0.2, 0.5, 0.8]) for p in range(2)]
    md = render_markdown(build_summary({}, rows))
    assert ("One-sample calibration check of emitted tokens under the target's law (Z of "
            "NLL − entropy, KS of randomized PIT)") in md


def test_bench_help_names_the_one_sample_check_and_the_two_sample_test():
    from verispec.bench.options import BENCH_EPILOG

    text = " ".join(BENCH_EPILOG.split())
    assert "one-sample calibration check" in text and "KS of randomized PITs" in text
    assert "two-sample test of the first tokens' law is `python -m verispec.bench.lawtest`" in text
    assert "checked against the target's law" not in text


def test_summary_shows_the_llamacpp_provenance_whole_and_nothing_without_it():
    """meta["llamacpp"] (:func:`verispec.bench.sides.llamacpp_meta`) and torch's threads give
    a "Peer provenance" block, one line per item, long values whole; a meta without the key
    (older results) gives no block."""
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DCMAKE_C_FLAGS=-mno-amx-int8"]
    system = " | ".join(f"FLAG{i} = 1" for i in range(40))  # long: must not be cut
    meta = {"torch_threads": 3, "llamacpp": {
        "llama_cpp_python": "0.3.36", "system_info": system,
        "cmake_flags": "unknown (pip build)",
        "installed_build": {"GGML_NATIVE": "ON", "GGML_BLAS": "OFF"}, "threads": 2,
        "speculative_build": {"cmake_flags": flags, "cmake_cache": {"GGML_OPENMP": "ON"}},
        "speculative_system_info": None, "speculative_threads_logged": [2]}}
    rows = [row("ar", p, 0, 3, 1.0) for p in range(2)]
    lines = render_markdown(build_summary(meta, rows)).splitlines()
    block = lines[lines.index("Peer provenance:") + 2:lines.index("Notes:") - 1]
    assert block == [
        "- llama.cpp (llama-cpp-python): 0.3.36",
        ("- llama.cpp build options: CMake flags unknown (pip build); installed CMake files "
         "record GGML_NATIVE=ON, GGML_BLAS=OFF"),
        ("- llama-speculative-simple build flags: " + " ".join(flags)
         + "; CMake cache GGML_OPENMP=ON"),
        f"- llama.cpp system_info: {system}",
        "- threads: llama.cpp 2 (llama-speculative-simple logged 2); torch 3"]
    # without llamacpp-spec: no speculative lines; without the key: no block at all
    del meta["llamacpp"]["speculative_build"], meta["llamacpp"]["speculative_threads_logged"]
    md = render_markdown(build_summary(meta, rows))
    assert "Peer provenance:" in md and "llama-speculative-simple" not in md
    assert "- threads: llama.cpp 2; torch 3" in md
    md = render_markdown(build_summary({"torch_threads": 3}, rows))
    assert "Peer provenance" not in md and "llama.cpp" not in md and "torch 3" not in md


def test_gamma_auto_is_paired_with_every_fixed_gamma_and_the_best_is_marked():
    """γ auto / fixed γ per prompt (repeats averaged in logs first), the fastest fixed γ
    marked, rendered in the report; a method without γ auto gets no entry."""
    from verispec.bench.comparisons import gamma_auto_comparisons

    rng = random.Random(3)
    rows = []
    speeds = {2: 1.2, 4: 1.5, "auto": 1.4}
    for p in range(6):
        for r in range(2):
            for gamma, speed in speeds.items():
                tokens = 50
                rows.append(row("block", p, r, tokens,
                                tokens / (10 * speed * rng.uniform(0.9, 1.1)), gamma=gamma))
            rows.append(row("token", p, r, 50, 4.0, gamma=3))
    entries = gamma_auto_comparisons(rows)
    assert [(e["method"], e["gamma"], e["best"]) for e in entries] == [
        ("block", 2, False), ("block", 4, True)]
    auto = [x for x in rows if x["gamma"] == "auto"]
    for e in entries:
        fixed = [x for x in rows if x["method"] == "block" and x["gamma"] == e["gamma"]]
        per_prompt = [statistics.fmean(math.log(a["tokens"] / a["seconds"] * b["seconds"]
                                                / b["tokens"])
                                       for a in auto for b in fixed
                                       if a["prompt_id"] == b["prompt_id"] == f"p{p}"
                                       and a["repeat"] == b["repeat"]) for p in range(6)]
        assert e["ratio"] == pytest.approx(math.exp(statistics.fmean(per_prompt)))
        assert e["pairs"] == 6 and e["ratio_ci95"][0] < e["ratio"] < e["ratio_ci95"][1]
    summary = {"meta": {}, "rows": summarize(rows), "gamma_auto": entries}
    text = render_markdown(summary)
    assert "γ chosen by measurement against fixed γ" in text and "| block | 4 ★ | 6 |" in text
