"""Every committed results file renders from the file alone (``benchmarks/tables.py``), and
the rendered tables hold the figures the docs quote from it. No model is loaded and nothing
depends on the CPU: the renderers read JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from report_lines_zen4 import EXPECTED as ZEN4_LINES

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "docs" / "reports"


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tables"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _render(tables: ModuleType, name: str) -> str:
    text: str = tables.render(REPORTS / name)
    return text


def _assert_kernel_self_tests(tables: ModuleType, cpu: str, chosen: str, machine: str) -> None:
    """``kernels-CPU.json`` chose ``chosen`` with 8-bit codes exact on ``machine``;
    ``kernels-CPU-emulated-avx2.json`` refused the saturated 8-bit kernels and chose 7 bits."""
    kernels = _render(tables, f"kernels-{cpu}.json")
    assert "| fbgemm | 8 bits | 0 | exact |" in kernels
    assert f"chosen: {chosen} (" in kernels and machine in kernels
    capped = _render(tables, f"kernels-{cpu}-emulated-avx2.json")
    assert "| fbgemm | 8 bits | 0.99 | refused |" in capped
    assert "chosen: fbgemm+onednn/7 (" in capped


def test_every_committed_file_is_known_and_renders(tables: ModuleType,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert tables.check(REPORTS) == []
    assert tables.main(["--check", str(REPORTS)]) == 0
    assert "every one known and rendered" in capsys.readouterr().out


def test_an_unknown_or_broken_file_fails_the_check(tables: ModuleType, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("what is this?\n")
    (tmp_path / "serve-broken.json").write_text("{}\n")  # a known kind that cannot render
    (tmp_path / "specbench-1.jsonl").write_text("{}\n")  # an input: named, not an error
    problems = tables.check(tmp_path)
    assert len(problems) == 2
    assert any("notes.txt" in p and "not a known kind" in p for p in problems)
    assert any("serve-broken.json" in p for p in problems)
    assert tables.main(["--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "notes.txt" in out and "2 not rendered" in out


def test_lawtest_renders_its_markdown(tables: ModuleType) -> None:
    for run in ("lawtest-humaneval-epyc", "lawtest-llamacpp-spec-xeon-amx"):
        md = (REPORTS / run / "lawtest.md").read_text(encoding="utf-8")
        assert _render(tables, f"{run}/lawtest.json") + "\n" == md
    text = _render(tables, "lawtest-humaneval-epyc/lawtest.json")
    assert "| token | ar | 0.4985 | 0.7450 | no |" in text
    assert "| block | ar | 0.4054 | 0.6360 | no |" in text


def test_fidelity_figures_and_the_ratios_of_a_pair(tables: ModuleType) -> None:
    seven = _render(tables, "int8-fidelity-7bit-zen4.json")  # against its 8-bit partner
    assert "| int8-fidelity-7bit-zen4 | int8 | 12 | 815 | 0.00243 |" in seven
    assert "| 0.136 | 5 of 12 |" in seven
    assert "| int8-fidelity-8bit-zen4 | int8 | 12 | 815 | 0.00089 |" in seven
    assert "| 0.013 | 7 of 12 |" in seven
    assert "| 12 of 12 | 1.25–6.52 | 2.79 [" in seven
    hadamard = _render(tables, "int8-fidelity-hadamard-7bit-xeon-amx.json")
    assert "| 12 of 12 | 1.38–4.14 | 2.26 [" in hadamard  # Hadamard blocks, 7 / 8 bits
    assert "| 12 of 12 | 1.67–9.34 | 2.59 [" in hadamard  # dense blocks
    for figures in ("0.00208 | 0.00139 | 0.056 | 4 of 12", "0.00189 | 0.00125 | 0.047 | 6 of 12",
                    "0.00086 | 0.00084 | 0.038 | 7 of 12", "0.00081 | 0.00045 | 0.015 | 8 of 12"):
        assert figures in hadamard
    epyc = _render(tables, "int8-fidelity-7bit-epyc.json")  # against the Xeon's 8-bit run
    assert "| 10 of 12 | 1.16–3.45 |" in epyc  # the prompts with same-length texts
    assert "| int8-fidelity | int8 | 12 | 980 | 0.00132 |" in epyc


def test_draft_formats_paired_ratios(tables: ModuleType) -> None:
    text = _render(tables, "draft-formats-xeon-vnni.json")
    assert "| int8 | 32.6 | 37.8 | 44.2 | 1.48 |" in text
    assert "| 0 | int4 | 14.20 | 1.124 [1.051, 1.202] over 8 prompts | 4.75 |" in text
    assert "| 1 | int4 | 14.66 | 1.144 [0.904, 1.447] over 8 prompts | 3.43 |" in text
    kernel = _render(tables, "draft-formats-int4-kernel-xeon-vnni.json")
    assert "1.151 [1.086, 1.219]" in kernel and "1.072 [0.925, 1.243]" in kernel
    subset = _render(tables, "draft-formats-subset-auto-xeon-amx.json")
    assert "0.929 [0.825, 1.046]" in subset and "1.131 [1.019, 1.254]" in subset


def test_draft_vocabulary_counts(tables: ModuleType) -> None:
    text = _render(tables, "draft-vocabulary-humaneval-xeon-amx.json")
    assert "1983 positions" in text and "at 1882" in text
    assert "| 16384 | 1801 (95.7%) | 1866 (99.1%) | 18 |" in text
    assert "| 32768 | 1850 (98.3%) | 1874 (99.6%) | 9 |" in text


def test_cuda_steps_tables(tables: ModuleType) -> None:
    bf16 = _render(tables, "cuda-steps-h100-bf16.json")
    assert "| target | 8.07 | 8.99 | 8.88 | 8.93 | 1.11 |" in bf16
    assert "| ar | 87.5 | 11.43 | 128 |" in bf16
    assert "| block γ 4, draft = target copy | 100.1 | 9.99 | 29 | 3.41 |" in bf16
    batched = _render(tables, "cuda-steps-h100-bf16-batched.json")
    assert "| 1 | 0.954× | ar |" in batched and "| 8 | 0.928× | ar |" in batched
    assert "| block γ auto, draft = target copy | 46.0 |" in batched


def test_pearl_tables(tables: ModuleType) -> None:
    text = _render(tables, "pearl-bench.json")
    t0, t1 = text.split("T=1")
    assert "pearl-token" in t0 and " 0.80 " in t0 and " 0.81 " in t0  # × sequential SD
    assert " 6.66 " in t1 and " 8.20 " in t1  # accepted per phase: token, block windows


def test_serve_reports_old_rows_ttft_and_peer_ratios(tables: ModuleType) -> None:
    old = _render(tables, "serve-bench.json")  # rows from before configs and repeats
    assert "TTFT p50 ms" in old
    assert "| 0 | 1 | ar | 1 | 0 | 7.80 | 738.1 | 118.4 | 1.00 | — |" in old
    assert "| 0 | 8 | block | 1 | 0 | 17.70 | 10092.8 | 240.1 | 5.67 | — |" in old
    epyc = _render(tables, "serve-vs-vllm-epyc.json")
    for line in ("| 0 | 1 | block γ=auto | vllm-spec-k4 | 1.560× |",
                 "| 0 | 8 | ar | vllm-plain | 1.315× |",
                 "| 0 | 16 | block γ=auto | vllm-plain | 1.828× |"):
        assert line in epyc
    amx = _render(tables, "serve-vs-vllm-xeon-amx.json")
    for ratio in ("| 1.407× |", "| 1.129× |", "| 0.783× |", "| 0.600× |", "| 0.465× |"):
        assert ratio in amx
    assert "| 0 | 1 | ar | 1 | 0 | 6.96 | 875.1 |" in amx  # TTFT at one client


def test_serve_report_cli_reads_the_old_rows(tmp_path: Path) -> None:
    from verispec.bench import serve_report

    out = tmp_path / "merged.json"
    assert serve_report.main([str(out), str(REPORTS / "serve-bench.json")]) == 0
    merged = json.loads(out.read_text())
    assert len(merged["cells"]) == 12 and merged["peer_comparisons"] == []


def _peer_ratios(tmp_path: Path, verispec: str, suffix: str,
                 digits: int = 3) -> dict[tuple[float, int], float]:
    """verispec's best / the peers' best per (T, clients), merged by serve_report from the
    verispec report and the vLLM plain and spec reports ``serve-vllm-{side}-{suffix}``."""
    from verispec.bench import serve_report

    out = tmp_path / "merged.json"
    peers = [str(REPORTS / f"serve-vllm-{side}-{suffix}") for side in ("plain", "spec")]
    assert serve_report.main([str(out), str(REPORTS / verispec), *peers]) == 0
    return {(c["temperature"], c["concurrency"]): round(c["throughput"]["ratio"], digits)
            for c in json.loads(out.read_text())["peer_comparisons"]}


def test_zen5_server_reports_and_the_peer_ratios(tables: ModuleType, tmp_path: Path) -> None:
    auto = _render(tables, "serve-gamma-auto-epyc-zen5.json")
    for line in ("| 0 | 1 | block γ=auto | block γ=8 | 0.959× [0.906, 1.015] | 0.583× [0.442,",
                 "| 1 | 1 | block γ=auto | block γ=8 | 1.071× [0.943, 1.215] | 0.701× [0.654,",
                 "| 1 | 16 | block γ=auto | ar | 0.997× [0.983, 1.012] |",
                 "| 0 | 1 | ar | 3 | 0 | 19.91 | 407.6 | 44.0 | 1.00 | 0.00 |"):
        assert line in auto
    before = _render(tables, "serve-gamma-auto-epyc-zen5-91a6dba.json")
    assert "| 0 | 1 | ar | 3 | 0 | 13.48 | 498.3 | 65.4 | 1.00 | 0.00 |" in before
    assert "| 0 | 8 | vllm-plain | 1 | 0 | 60.93 |" in _render(
        tables, "serve-vllm-bfloat16-probe-epyc-zen5.json")
    assert "| 0 | 8 | vllm-plain | 1 | 0 | 35.19 |" in _render(
        tables, "serve-vllm-float32-probe-epyc-zen5.json")
    ratios = _peer_ratios(tmp_path, "serve-gamma-auto-epyc-zen5.json", "epyc-zen5.json")
    assert ratios == {(0.0, 1): 1.662, (0.0, 2): 1.404, (0.0, 4): 1.051, (0.0, 8): 0.947,
                      (0.0, 16): 1.027, (1.0, 1): 2.004, (1.0, 2): 1.337, (1.0, 4): 1.065,
                      (1.0, 8): 0.984, (1.0, 16): 1.01}
    for name, line in (
            ("batch-gamma-b1-epyc-zen5-busy-record.json",
             "geometric mean 0.641 (rounds: 0.691, 0.589, 0.648)"),
            ("batch-gamma-b1-epyc-zen5-record-checked.json",
             "geometric mean 0.972 (rounds: 0.966, 0.977, 0.972)"),
            ("batch-gamma-b4-t1-epyc-zen5-repeat.json",
             "geometric mean 0.956 (rounds: 0.986, 0.956, 0.926)"),
            ("thread-pools-epyc-zen5.json", "| ar ms per token | 36.4 | 65.6 | 37.4 |"),
            ("int8-codes-epyc-zen5.json", "| 8 × 5 | 164.5 | 128.2 | 1.269× [1.202, 1.401] |"),
            ("int8-codes-epyc-zen5.json",
             "| prompt read (118 tokens) | 384.6 | 281.5 | 1.369× [1.300, 1.596] |")):
        assert line in _render(tables, name), name


def test_zen4_server_peer_ratios(tables: ModuleType, tmp_path: Path) -> None:
    assert "| 0 | 8 | vllm-plain | 1 | 0 | 18.32 |" in _render(
        tables, "serve-vllm-float32-probe-epyc-zen4.json")
    ratios = _peer_ratios(tmp_path, "serve-gamma-auto-epyc-zen4.json", "epyc-zen4.json")
    assert ratios == {(0.0, 1): 2.35, (0.0, 2): 1.986, (0.0, 4): 1.842, (0.0, 8): 1.632,
                      (0.0, 16): 1.644, (1.0, 1): 3.108, (1.0, 2): 2.426, (1.0, 4): 1.669,
                      (1.0, 8): 1.682, (1.0, 16): 1.672}


def test_zen5_fused_codes_server_report_and_the_peer_ratios(tables: ModuleType,
                                                             tmp_path: Path) -> None:
    serve = "serve-gamma-auto-epyc-zen5-bc56c01.json"
    for name, line in (
            (serve, "| 0 | 1 | block γ=auto | block γ=8 | 1.001× [0.919, 1.089] | 0.596× [0.495,"),
            (serve, "| 1 | 1 | block γ=auto | block γ=8 | 1.018× [0.954, 1.087] | 0.652× [0.414,"),
            (serve, "| 0 | 16 | block γ=auto | ar | 0.983× [0.982, 0.984] |"),
            (serve, "| 0 | 8 | ar | 3 | 0 | 75.83 | 2130.1 | 62.6 | 1.00 | 0.00 |"),
            ("batch-gamma-b1-epyc-zen5-8f1ed81.json",
             "geometric mean 0.971 (rounds: 0.966, 0.973, 0.976)"),
            ("batch-gamma-b4-epyc-zen5-8f1ed81.json",
             "geometric mean 0.994 (rounds: 0.999, 1.007, 0.977)"),
            ("batch-gamma-b8-epyc-zen5-8f1ed81.json",
             "geometric mean 1.019 (rounds: 0.984, 1.027, 1.048)"),
            ("batch-gamma-b4-t1-epyc-zen5-8f1ed81.json",
             "geometric mean 0.866 (rounds: 0.878, 0.916, 0.807)"),
            ("step-costs-epyc-zen5-8f1ed81.json",
             "| qwen2.5-coder-1.5b-instruct | native int8 | 31.1 | 34.7 | 41.2 | 56.8 | 1.83 |"),
            ("batch-gamma-b4-t1-epyc-zen5-8f1ed81-second.json",
             "geometric mean 0.991 (rounds: 1.034, 0.963, 0.977)"),
            ("pass-costs-b4-t1-epyc-zen5-8f1ed81.json",
             "| 4 | 41.6 | 52.7 | 70.1 | 110.5 |  | 12.9 | 27.0 | 2.09 |"),
            ("pass-costs-b4-t0-epyc-zen5-8f1ed81.json",
             "| 4 | 48.6 | 57.4 | 70.6 | 110.4 |  | 13.5 | 19.8 | 1.47 |"),
            ("main-bench-humaneval-epyc-zen5-8f1ed81-results.jsonl",
             "| block γ=auto | llamacpp-ar | 20 | 1.38× [1.32, 1.45] | 1.22× [1.11, 1.34] |"),
            ("main-bench-humaneval-epyc-zen5-8f1ed81-results.jsonl",
             "| block γ=auto | llamacpp-ar | 20 | 1.19× [1.07, 1.32] | 1.08× [0.99, 1.18] |")):
        assert line in _render(tables, name), name
    ratios = _peer_ratios(tmp_path, "serve-gamma-auto-epyc-zen5-bc56c01.json",
                          "epyc-zen5-beside-bc56c01.json")
    assert ratios == {(0.0, 1): 1.834, (0.0, 2): 1.632, (0.0, 4): 1.397, (0.0, 8): 1.253,
                      (0.0, 16): 1.218, (1.0, 1): 2.353, (1.0, 2): 1.843, (1.0, 4): 1.377,
                      (1.0, 8): 1.241, (1.0, 16): 1.279}


def test_zen5_own_int8_matmul_server_report_and_the_peer_ratios(tables: ModuleType,
                                                               tmp_path: Path) -> None:
    serve = _render(tables, "serve-gamma-auto-epyc-zen5-b315c74.json")
    for line in ("| 0 | 1 | block γ=auto | block γ=8 | 0.963× [0.940, 0.987] | 0.577× [0.389,",
                 "| 1 | 1 | block γ=auto | block γ=8 | 1.007× [0.934, 1.086] | 0.694× [0.653,",
                 "| 1 | 4 | block γ=auto | ar | 0.962× [0.814, 1.138] |",
                 "| 0 | 8 | ar | 3 | 0 | 90.58 | 1980.2 | 47.9 | 1.00 | 0.00 |"):
        assert line in serve, line
    ratios = _peer_ratios(tmp_path, "serve-gamma-auto-epyc-zen5-b315c74.json",
                          "epyc-zen5-beside-b315c74.json", digits=4)
    assert ratios == {(0.0, 1): 2.2066, (0.0, 2): 2.0001, (0.0, 4): 1.6268, (0.0, 8): 1.5358,
                      (0.0, 16): 1.5718, (1.0, 1): 2.5085, (1.0, 2): 2.0962, (1.0, 4): 1.6537,
                      (1.0, 8): 1.4996, (1.0, 16): 1.5743}
    for name, line in (
            ("int8-gemm-epyc-zen5.json", "| 8 × 1 | 55.6 | 41.0 | 1.348× [1.159, 1.394] |"),
            ("int8-gemm-epyc-zen5.json", "| 1 × 9 | 53.8 | 38.2 | 1.406× [1.360, 1.525] |"),
            ("main-bench-humaneval-epyc-zen5-6f9cc06-results.jsonl",
             "| block γ=auto | llamacpp-ar | 20 | 1.50× [1.43, 1.57] | 1.33× [1.20, 1.47] |"),
            ("main-bench-humaneval-epyc-zen5-6f9cc06-results.jsonl",
             "| block γ=auto | llamacpp-ar | 20 | 1.37× [1.25, 1.49] | 1.25× [1.17, 1.34] |"),
            ("main-bench-humaneval-epyc-zen5-b315c74-results.jsonl",
             "| block γ=auto | llamacpp-ar | 20 | 1.48× [1.41, 1.57] | 1.31× [1.19, 1.45] |"),
            ("kernels-epyc-zen5-own-matmul.json", "| verispec+onednn | 8 bits | 0 | exact |"),
            ("step-costs-epyc-zen5-6f9cc06.json",
             "| qwen2.5-coder-1.5b-instruct | native int8 | 36.2 | 37.4 | 39.5 | 46.2 | 1.28 |"),
            ("kernels-epyc-zen5-own-matmul-emulated-avx2.json",
             "| verispec+onednn | 7 bits | 6e-08 | exact |")):
        assert line in _render(tables, name), name


def test_zen5_attention_kernel_server_report_and_the_peer_ratios(tables: ModuleType,
                                                                 tmp_path: Path) -> None:
    serve = _render(tables, "serve-gamma-auto-epyc-zen5-19fa458.json")
    for line in ("| 0 | 1 | block γ=auto | block γ=8 | 0.912× [0.860, 0.966] | 0.607× [0.333,",
                 "| 1 | 4 | block γ=auto | ar | 0.915× [0.867, 0.966] |"):
        assert line in serve, line
    ratios = _peer_ratios(tmp_path, "serve-gamma-auto-epyc-zen5-19fa458.json",
                          "epyc-zen5-beside-19fa458.json")
    assert ratios == {(0.0, 1): 2.117, (0.0, 2): 1.78, (0.0, 4): 1.508, (0.0, 8): 1.531,
                      (0.0, 16): 1.513, (1.0, 1): 2.181, (1.0, 2): 1.853, (1.0, 4): 1.658,
                      (1.0, 8): 1.604, (1.0, 16): 1.593}
    envelope = _render(tables, "serve-gamma-auto-epyc-zen5-43cf6af.json")
    for line in ("| 0 | 1 | block γ=auto | block γ=8 | 0.962× [0.873, 1.059] | 0.588× [0.469,",
                 "| 1 | 1 | block γ=auto | block γ=8 | 1.062× [0.938, 1.201] | 0.673× [0.544,",
                 "| 1 | 4 | block γ=auto | ar | 0.969× [0.678, 1.384] |"):
        assert line in envelope, line
    for name, mean in (("b1", "0.963 (rounds: 0.958, 0.982, 0.949)"),
                       ("b4", "1.002 (rounds: 0.996, 1.004, 1.006)"),
                       ("b8", "0.974 (rounds: 0.980, 0.964, 0.977)"),
                       ("b4-t1", "1.001 (rounds: 0.988, 1.021, 0.994)")):
        batch = _render(tables, f"batch-gamma-{name}-epyc-zen5-own-kernels.json")
        assert f"geometric mean {mean}" in batch, name
    main = _render(tables, "main-bench-humaneval-epyc-zen5-ce583e4-results.jsonl")
    assert "| block γ=auto | llamacpp-ar | 20 | 1.55× [1.47, 1.63] | 1.37× [1.24, 1.52] |" \
        in main
    assert "| block γ=auto | llamacpp-ar | 20 | 1.47× [1.33, 1.62] | 1.30× [1.22, 1.39] |" \
        in main
    attention = _render(tables, "attention-epyc-zen5.json")
    assert "| 8 × 1 | 50.7 | 47.2 | 1.092× [1.041, 1.187] |" in attention
    assert "| 16 × 1 | 72.9 | 63.0 | 1.163× [1.110, 1.240] |" in attention


def test_files_with_renderers_before(tables: ModuleType) -> None:
    steps = _render(tables, "step-costs-xeon-vnni.json")
    assert "| native int8 | 77.7 | 87.8 | 95.2 | 119.9 | 1.54 |" in steps
    kernels = _render(tables, "int4-kernels-xeon-vnni.json")
    assert "| 9728 × 896 × 24 | 105 | 1 | 14.95 | 10.28 | 8.98 |" in kernels
    timing = _render(tables, "draft-format-timing-xeon-vnni.json")
    assert "| 1 | layers, streamed | 25.7 | 18.9 | int4 |" in timing
    batch = _render(tables, "batch-gamma-b8-xeon-vnni-first-token.json")
    assert "geometric mean 0.993 (rounds: 0.990, 0.989, 1.002)" in batch
    batch = _render(tables, "batch-gamma-b8-xeon-vnni-first-pass.json")
    assert "geometric mean 0.997 (rounds: 0.990, 1.019, 0.983)" in batch
    batch = _render(tables, "batch-gamma-b4-t1-xeon-vnni.json")
    assert "geometric mean 0.972 (rounds: 0.993, 1.036, 0.894, 0.956, 0.985)" in batch
    assert "over all rounds (seeds per round): γ auto 32.73 tok/s / block γ=4 33.68 = 0.972" \
        in batch
    costs = _render(tables, "pass-costs-xeon-vnni.json")
    assert "| 8 | 126.4 | 162.2 | 223.4 | 379.8 |  | 34.2 | 62.7 | 1.83 |" in costs
    ray = _render(tables, "ray-overhead-epyc-zen4.jsonl")
    assert "| 3.52, 3.32, 2.73 | 5.92, 5.03, 3.92 | 5.21, 5.02, 4.04 |" in ray
    _assert_kernel_self_tests(tables, "epyc-zen5", "fbgemm+onednn/8", "family 26, model 2")
    batch = _render(tables, "batch-gamma-b4-epyc-zen5.json")
    assert "geometric mean 0.994 (rounds: 1.007, 0.998, 0.978)" in batch
    batch = _render(tables, "batch-gamma-b1-epyc-zen5.json")
    assert "geometric mean 0.954 (rounds: 0.971, 0.953, 0.939)" in batch
    steps = _render(tables, "step-costs-epyc-zen5.json")
    assert "| 44.4 | 47.9 | 49.3 | 62.4 | 1.40 |" in steps


def test_zen5_int4_target_reports(tables: ModuleType) -> None:
    fidelity = _render(tables, "int4-fidelity-target-epyc-zen5.json")
    assert "| int4-fidelity-target-epyc-zen5 | int4 | 12 | 815 | 0.02098 | 0.00892 | 0.494 " \
        "| 1 of 12 |" in fidelity
    steps = _render(tables, "step-costs-epyc-zen5-fa92db7.json")
    assert "| native int4 (verispec's int4 kernel (avx512-vnni)) | 20.5 | 24.8 | 28.0 | 41.5 " \
        "| 2.02 |" in steps
    assert "| llama.cpp Q4_K_M | 27.0 | 39.5 | 60.9 | 109.2 | 4.05 |" in steps
    main = _render(tables, "main-bench-humaneval-epyc-zen5-int4-target-results.jsonl")
    assert "target int4, draft int4" in main
    assert "| best lossless verispec config: block γ=auto | best llamacpp-ar config: " \
        "llamacpp-ar | 20 | 1.77× [1.59, 1.97] | 1.54× [1.40, 1.70] |" in main


def test_zen4_own_kernel_reports(tables: ModuleType) -> None:
    _assert_kernel_self_tests(tables, "epyc-zen4", "verispec+onednn/8", "family 25, model 17")
    for name, lines in ZEN4_LINES.items():
        rendered = _render(tables, name)
        for line in lines:
            assert line in rendered, (name, line)


def test_results_files_render_the_tables_of_their_committed_reports(
        tables: ModuleType) -> None:
    """Every table line of a committed ``X.md`` is in the tables rendered from
    ``X-results.jsonl`` (with ``X-meta.json``)."""
    pairs = [(p, p.with_name(p.name.removesuffix("-results.jsonl") + ".md"))
             for p in sorted(REPORTS.glob("*-results.jsonl"))]
    pairs = [(r, md) for r, md in pairs if md.is_file()]
    assert pairs
    for results, md in pairs:
        rendered = set(tables.render(results).splitlines())
        committed = [line for line in md.read_text(encoding="utf-8").splitlines()
                     if line.startswith("|")]
        missing = [line for line in committed if line not in rendered]
        assert not missing, f"{results.name}: {missing[:3]}"


def test_each_file_names_its_command(tables: ModuleType) -> None:
    assert tables.command_of(REPORTS / "int8-fidelity-7bit-zen4.json").endswith(
        "--against " + str(REPORTS / "int8-fidelity-8bit-zen4.json"))
    meta = REPORTS / "main-bench-humaneval-xeon-amx-meta.json"
    assert f"--meta {meta}" in tables.command_of(
        REPORTS / "main-bench-humaneval-xeon-amx-results.jsonl")
    assert tables.command_of(REPORTS / "specbench-3-per-category.jsonl") == ""
    assert tables.kind_of(REPORTS / "notes.txt") is None


def test_pearl_prints_while_running_what_its_file_renders(
        capsys: pytest.CaptureFixture[str]) -> None:
    from verispec.bench import pearl

    rows = {name: pearl.Row(name, tokens=20, seconds=s, accepted=a, phases=4,
                            busy={"draft": 1.0, "target": 1.5}, outputs=[[1], [2]])
            for name, s, a in (("ar", 10.0, 0), ("sd-token γ=8", 8.0, 6),
                               ("sd-block γ=8", 7.5, 7), ("pearl-block", 7.0, 9))}
    results: dict[str, object] = {"runs": {}, "precision": ["int8", "int4"],
                                  "max_new_tokens": 10}
    pearl._report(rows, 0.0, 8, results)
    printed = capsys.readouterr().out
    assert "T=0, 2 HumanEval prompts, 10 new tokens, precision target int8, draft int4" in printed
    assert printed.strip().splitlines() == pearl._run_lines(results, "T=0")
    entry = results["runs"]["T=0"]["pearl-block"]  # type: ignore[index]
    assert entry["speedup_vs_sd"] == pytest.approx(7.5 / 7.0)  # over sd-block
    assert entry["identical_to_ar"] == [2, 2]


def test_a_serve_run_is_merged_with_the_vllm_reports_it_is_set_against(
        tables: ModuleType) -> None:
    text = _render(tables, "serve-verispec-vs-vllm-xeon-vnni.json")
    for line in ("| 0 | 1 | block γ=auto | vllm-spec-k4 | 2.254× [2.143, 2.371] |",
                 "| 0 | 8 | ar | vllm-plain | 1.637× [1.550, 1.728] |",
                 "| 1 | 1 | block γ=auto | vllm-plain | 2.772× [2.036, 3.773] |"):
        assert line in text
    first_token = _render(tables, "serve-gamma-auto-first-token-xeon-vnni.json")
    assert "| 0 | 1 | block γ=auto | vllm-spec-k4 | 2.308× [2.186, 2.436] |" in first_token
    assert "| 0 | 8 | block γ=auto | vllm-plain | 1.702× [1.637, 1.770] |" in first_token
    for name, line in (("serve-gamma-auto-admitted-reader-xeon-vnni.json",
                        "| 1 | 16 | block γ=auto | vllm-plain | 1.721× [1.557, 1.903] |"),
                       ("serve-gamma-auto-xeon-vnni.json",
                        "| 0 | 8 | ar | vllm-plain | 1.647× [1.458, 1.859] |"),
                       ("serve-gamma-auto-first-position-xeon-vnni.json",
                        "| 0 | 4 | block γ=auto | vllm-plain | 1.412× [1.247, 1.597] |")):
        assert line in _render(tables, name)
