"""The options of ``verispec bench`` (kept free of heavy imports: the CLI builds its parser
from this module before anything is loaded)."""

from __future__ import annotations

import argparse

__all__ = ["BENCH_EPILOG", "INSTALL_COMMAND", "NO_AMX_FLAGS", "PIP_CMAKE_FLAGS",
           "add_bench_arguments"]

#: ggml's AMX int8 matmul in llama-cpp-python 0.3.36 dies with SIGILL (``tilezero`` in
#: ``ggml_backend_amx_mul_mat`` on a worker thread) on an Intel Xeon with AMX under Linux: the
#: tile-data permission is requested and the tile configuration loaded on one thread only
#: (ggml-org/llama.cpp pull request 26954). ``-mno-amx-int8`` leaves ``__AMX_INT8__``
#: undefined even after ``-march=native``, so ggml compiles without that backend and runs its
#: AVX-512 VNNI kernels there; on CPUs without AMX the flag changes nothing.
NO_AMX_FLAGS = ("-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8")

PIP_CMAKE_FLAGS = (
    "-DGGML_NATIVE=ON",
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    *NO_AMX_FLAGS,
)
"""CMake flags of llama-cpp-python's documented install (native CPU library only: no examples,
tests, tools, server or multimodal library; no AMX: :data:`NO_AMX_FLAGS`);
:mod:`verispec.bench.llamacpp.library` builds its install commands from them."""

INSTALL_COMMAND = (f'CMAKE_ARGS="{" ".join(PIP_CMAKE_FLAGS)}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) '
                   "pip install --no-cache-dir -e '.[peers]'")
"""The install command of the llama.cpp peers from a verispec checkout (the ``peers`` extra
pins llama-cpp-python)."""

BENCH_EPILOG = """\
Every method in the registry (verispec generate --help) can be benchmarked, with options in
brackets: lossy[epsilon=0.05], multidraft[num_drafts=4], mjsd[num_beams=4]; γ may be auto
(chosen by measurement). Peers measured in the same run: hf-ar (transformers' generate),
hf-assisted (assisted generation with exactly γ draft tokens), hf-assisted-default
(transformers' own drafting heuristic), llamacpp-ar (llama.cpp's plain decoding of the
original Q4_K_M target GGUF) and llamacpp-spec (llama.cpp's own speculative decoding of the
GGUF pair, llamacpp-spec[p_min=P] for its --spec-draft-p-min); the llama.cpp peers need
the extra `peers`, installed from a verispec checkout with
  {install}
At T > 0 summary.md gives each method's and peer's one-sample calibration check of its tokens
under the target's law (Z of NLL − entropy, KS of randomized PITs) and flags departures; the
two-sample test of the first tokens' law is `python -m verispec.bench.lawtest`.

Output in --out: results.jsonl (one line per prompt x config x repeat, appended as it runs:
rerun the same command to resume), summary.md, summary.json (list "rows"), PNG plots.
Compare two runs: verispec bench --compare A/summary.json B/summary.json
""".replace("{install}", INSTALL_COMMAND)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the grid, suite and report options (the model options are added by the CLI)."""
    p.add_argument("--methods", default="ar,token,block,hf-ar,hf-assisted",
                   help="comma-separated methods and peers (default: %(default)s)")
    p.add_argument("--temperatures", "--temperature", dest="temperatures", default="0",
                   help="comma-separated temperatures, 0 = greedy (default: %(default)s)")
    p.add_argument("--gamma", default="8",
                   help="comma-separated draft lengths γ, or auto (default: %(default)s)")
    p.add_argument("--suite", default="humaneval",
                   help="humaneval and/or JSONL files (Spec-Bench question_id/category/turns, "
                        "or {\"prompt\": ...}), comma-separated (default: %(default)s)")
    p.add_argument("--categories", default=None,
                   help="comma-separated categories to keep (default: all)")
    p.add_argument("--num-prompts", "--prompts", dest="num_prompts", type=int, default=5,
                   help="the first N prompts of each category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1,
                   help="repeats with different seeds; figures are mean ± std over them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", default="1",
                   help="comma-separated batch sizes; > 1 uses batched decoding "
                        "(default: %(default)s)")
    p.add_argument("--drafter", choices=["model", "ngram"], default="model")
    p.add_argument("--chat-template", choices=["auto", "on", "off"], default="auto",
                   help="wrap Spec-Bench turns in the target's chat template (auto: if it has one)")
    p.add_argument("--out", default="verispec-bench",
                   help="report directory; an existing one is resumed (default: %(default)s)")
    p.add_argument("--no-hf", dest="hf", action="store_false",
                   help="drop the transformers peers (hf-*) from --methods")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed warm-up generation of each config")
    p.add_argument("--ignore-eos", action="store_true",
                   help="fixed length: every side decodes exactly --max-new-tokens (verispec "
                        "and hf-* draw past EOS from the target's law; the llama.cpp peers "
                        "never sample end-of-generation tokens: llama.cpp's --ignore-eos)")
    p.add_argument("--order", choices=["random", "fixed"], default="random",
                   help="order of the configs on each prompt: shuffled per repeat and prompt "
                        "(seeded, reproducible) or the grid's (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads of torch and of the llama.cpp peers (default: the CPUs "
                        "this process may run on)")
    p.add_argument("--output", default=None, help="also write summary.json to this file")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), default=None,
                   help="print the per-metric ratio B / A of two summary.json files and exit")
