"""The lines that the tables rendered from each AMD EPYC Zen 4 report hold (file -> lines,
each file rendered once): the figures the docs quote from those files."""

from __future__ import annotations

BEST = "| best lossless verispec config: block γ=auto | best llamacpp-ar config: llamacpp-ar "

EXPECTED: dict[str, tuple[str, ...]] = {
    "step-costs-epyc-zen4.json": (
        "| native int8 | 44.4 | 46.5 | 50.6 | 71.4 | 1.61 |",
        ("| native int4 (verispec's int4 kernel (avx512-vnni)) | 25.9 | 29.6 | 44.8 | 74.1 "
        "| 2.86 |"),
        "| llama.cpp Q4_K_M | 33.8 | 49.2 | 80.6 | 181.6 | 5.38 |"),
    "step-costs-epyc-zen4-fused-rope.json": (
        ("| native int4 (verispec's int4 kernel (avx512-vnni)) | 22.8 | 27.1 | 41.7 | 68.3 "
        "| 3.00 |"),
        "| llama.cpp Q4_K_M | 33.1 | 55.1 | 78.8 | 183.8 | 5.54 |"),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-fused-rope-results.jsonl": (
        "target int4, draft int4", "humaneval (40)",
        BEST + "| 40 | 1.54× [1.41, 1.67] | 1.37× [1.29, 1.45] |",
        BEST + "| 40 | 1.49× [1.37, 1.61] | 1.30× [1.24, 1.37] |",
        "| block | auto | 3.64 | 2.64 | 33.82 | 40.10 | 24.9 | 414.2 | 1.21× [1.14, 1.30] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-f32-attention-results.jsonl": (
        "target int4, draft int4", "humaneval (40)", "no acceptance recorded",
        BEST + "| 40 | 1.61× [1.49, 1.74] | 1.47× [1.38, 1.57] |",
        "| block | auto | 3.30 | 2.30 | 37.08 | 45.54 | 22.0 | 393.7 | 1.22× [1.15, 1.29] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-f32-attention-recorded-results.jsonl": (
        "target int4, draft int4", "from 1024 positions recorded by earlier runs",
        BEST + "| 40 | 1.55× [1.44, 1.68] | 1.41× [1.33, 1.50] |",
        BEST + "| 40 | 1.48× [1.36, 1.61] | 1.30× [1.24, 1.36] |",
        "| block | auto | 3.50 | 2.50 | 34.67 | 42.22 | 23.7 | 408.8 | 1.15× [1.09, 1.21] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-f32-attention-fresh-results.jsonl": (
        "target int4, draft int4", "no acceptance recorded",
        ("| best lossless verispec config: ar | best llamacpp-ar config: llamacpp-ar | 40 "
        "| 1.36× [1.27, 1.45] | 1.22× [1.18, 1.27] |"),
        "| block | auto | 1.02 | 0.02 | 30.28 | 36.56 | 27.4 | 394.1 | 0.99× [0.96, 1.02] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-explore-fresh-results.jsonl": (
        "target int4, draft int4", "no acceptance recorded",
        BEST + "| 40 | 1.56× [1.44, 1.70] | 1.42× [1.34, 1.51] |",
        "| block | auto | 3.22 | 2.22 | 36.32 | 44.40 | 22.5 | 395.7 | 1.20× [1.13, 1.27] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-explore-recorded-results.jsonl": (
        "target int4, draft int4", "from 1024 positions recorded by earlier runs",
        BEST + "| 40 | 1.59× [1.48, 1.71] | 1.44× [1.35, 1.53] |",
        BEST + "| 40 | 1.54× [1.41, 1.68] | 1.33× [1.27, 1.39] |",
        "| block | auto | 2.27 | 1.27 | 34.03 | 39.65 | 25.2 | 397.9 | 1.13× [1.04, 1.22] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-48c1a8c-results.jsonl": (
        "target int4, draft int4", "from 1024 positions recorded by earlier runs",
        BEST + "| 40 | 1.51× [1.39, 1.63] | 1.36× [1.27, 1.46] |",
        "| block | auto | 3.73 | 2.73 | 30.75 | 36.88 | 27.1 | 426.1 | 1.21× [1.14, 1.28] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-replay-a-results.jsonl": (
        "target int4, draft int4", "from 1024 positions recorded by earlier runs",
        BEST + "| 40 | 1.67× [1.54, 1.80] | 1.53× [1.43, 1.63] |",
        "| block | auto | 3.95 | 2.95 | 38.35 | 47.44 | 21.1 | 400.4 | 1.23× [1.16, 1.31] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-replay-b-results.jsonl": (
        "target int4, draft int4", "no acceptance recorded, the generic prior",
        BEST + "| 40 | 1.63× [1.51, 1.77] | 1.49× [1.40, 1.59] |",
        "| block | auto | 3.42 | 2.42 | 36.28 | 44.32 | 22.6 | 401.5 | 1.23× [1.16, 1.30] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-replay-c-results.jsonl": (
        "target int4, draft int4", "α₀ 0.925 at a block's first position",
        BEST + "| 40 | 1.58× [1.44, 1.73] | 1.43× [1.33, 1.55] |",
        "| block | auto | 3.90 | 2.90 | 32.69 | 39.77 | 25.1 | 431.8 | 1.24× [1.15, 1.33] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-replay-d-results.jsonl": (
        "target int4, draft int4", "α₀ 0.920 at a block's first position",
        BEST + "| 40 | 1.68× [1.55, 1.82] | 1.54× [1.45, 1.63] |",
        "| block | auto | 4.14 | 3.14 | 37.58 | 46.35 | 21.6 | 404.0 | 1.20× [1.14, 1.27] "),
    "serve-gamma-auto-epyc-zen4-replay.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 0.962× [0.784, 1.181] | 0.581× [0.462, 0.730] |",
        "| 0 | 4 | block γ=auto | ar | 0.907× [0.767, 1.072] | 1.093× [1.020, 1.172] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.031× [0.938, 1.134] | 0.555× [0.452, 0.682] |"),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-l2-prefetch-e-results.jsonl": (
        "target int4, draft int4", "no acceptance recorded, the generic prior",
        BEST + "| 40 | 1.76× [1.62, 1.90] | 1.63× [1.53, 1.74] |",
        "| block | auto | 3.58 | 2.58 | 37.79 | 46.77 | 21.4 | 407.7 | 1.30× [1.23, 1.37] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-l2-prefetch-f-results.jsonl": (
        "target int4, draft int4", "α₀ 0.924 at a block's first position",
        BEST + "| 40 | 1.72× [1.59, 1.86] | 1.60× [1.50, 1.70] |",
        BEST + "| 40 | 1.70× [1.57, 1.85] | 1.51× [1.43, 1.58] |",
        "| block | auto | 3.18 | 2.18 | 36.79 | 45.44 | 22.0 | 408.2 | 1.23× [1.16, 1.31] "),
    "serve-gamma-auto-epyc-zen4-l2-prefetch.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 0.983× [0.920, 1.050] | 0.548× [0.432, 0.696] |",
        "| 1 | 2 | block γ=auto | block γ=8 | 1.157× [1.087, 1.231] | 0.742× [0.497, 1.109] |"),
    "draft-formats-subset-auto-epyc-zen4.json": (
        "| 0 | int4-subset | 43.84 | 1.057 [0.968, 1.154] over 16 prompts | 3.20 |",
        "| 1 | int4-subset | 36.55 | 1.023 [0.954, 1.097] over 16 prompts | 2.64 |"),
    "int8-builds-l2-prefetch-target-epyc-zen4.json": (
        "baseline: the kernel at HEAD (9afd1e0); same logits on every k",
        "| 16 | 106.7 | 99.1 | 0.940 [0.772, 0.961] |"),
    "int4-builds-prefetch-target-epyc-zen4.json": (
        "| 4 | 38.1 | 30.8 | 0.814 [0.702, 0.841] |",
        "| 5 | 35.9 | 31.7 | 0.890 [0.848, 0.899] |"),
    "int4-builds-prefetch-target-epyc-zen4-emulated-avx2.json": (
        "| 1 | 29.6 | 24.5 | 0.828 [0.814, 0.865] |",),
    "int4-builds-prefetch-draft-epyc-zen4.json": (
        "| 1 | 10.1 | 10.1 | 1.011 [0.992, 1.104] |",),
    "int4-builds-prefetch-draft-epyc-zen4-emulated-avx2.json": (
        "| 1 | 11.7 | 9.8 | 0.845 [0.806, 1.125] |",),
    "draft-step-bytes-replay-epyc-zen4.json": (
        "| 0 | 10.88 | 32.3 | 8.60 | 1.27 | 12.34 | 0.882 |",
        "| 4 | 10.33 | 33.4 | 8.32 | 1.24 | 12.01 | 0.860 |"),
    "float32-attention-epyc-zen4.json": (
        "| qwen2.5-coder-0.5b-instruct, 1 × 1 | 13.1 | 12.7 | 1.047× [0.890, 1.147] |",
        "| qwen2.5-coder-1.5b-instruct, 1 × 5 | 38.6 | 37.1 | 1.050× [0.918, 1.125] |"),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-fused-rope-recorded-results.jsonl": (
        "target int4, draft int4", "from 1024 positions recorded by earlier runs",
        BEST + "| 40 | 1.53× [1.42, 1.66] | 1.36× [1.30, 1.42] |",
        "| block | auto | 3.17 | 2.17 | 34.52 | 41.06 | 24.4 | 411.2 | 1.21× [1.15, 1.27] "),
    "main-bench-humaneval-epyc-zen4-own-kernels-results.jsonl": (
        "target int8, draft int4", "family 25, model 17",
        BEST + "| 20 | 1.29× [1.23, 1.36] | 1.07× [0.97, 1.19] |",
        ("| block γ=auto | llamacpp-spec[gamma=3,p_min=0.75] γ=3 | 20 "
        "| 2.18× [1.96, 2.42] | 1.93× [1.78, 2.08] |")),
    "main-bench-humaneval-epyc-zen4-recent-blocks-results.jsonl": (
        "target int8, draft int4", "family 25, model 17",
        BEST + "| 20 | 1.45× [1.40, 1.51] | 1.24× [1.13, 1.35] |",
        BEST + "| 20 | 1.33× [1.18, 1.49] | 1.17× [1.10, 1.24] |",
        ("| block γ=auto | llamacpp-spec[gamma=3,p_min=0.75] γ=3 | 20 "
        "| 2.35× [2.26, 2.44] | 2.14× [1.99, 2.30] |")),
    "main-bench-humaneval-epyc-zen4-int4-target-recent-blocks-results.jsonl": (
        "target int4, draft int4",
        BEST + "| 20 | 1.58× [1.47, 1.69] | 1.31× [1.23, 1.41] |",
        BEST + "| 20 | 1.48× [1.32, 1.67] | 1.27× [1.19, 1.35] |"),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-results.jsonl": (
        "target int4, draft int4", "humaneval (40)",
        BEST + "| 40 | 1.37× [1.24, 1.50] | 1.19× [1.11, 1.28] |",
        BEST + "| 40 | 1.39× [1.28, 1.52] | 1.20× [1.14, 1.25] |",
        "| block | auto | 2.51 | 1.51 | 30.20 | 35.74 | 28.0 | 447.4 | 1.09× [1.02, 1.16] "),
    "main-bench-humaneval-epyc-zen4-int4-target-40-prompts-recorded-results.jsonl": (
        "target int4, draft int4", "from 1024 positions recorded by earlier runs",
        BEST + "| 40 | 1.39× [1.26, 1.53] | 1.21× [1.13, 1.30] |",
        "| block | auto | 3.21 | 2.21 | 28.68 | 33.51 | 29.8 | 447.5 | 1.22× [1.14, 1.31] "),
    "main-bench-humaneval-epyc-zen4-int4-target-results.jsonl": (
        "target int4, draft int4",
        BEST + "| 20 | 1.47× [1.30, 1.67] | 1.18× [1.06, 1.31] |",
        ("| block γ=auto | best llamacpp-spec config: llamacpp-spec[gamma=3,p_min=0.75] "
        "γ=3 | 20 | 2.13× [1.91, 2.37] | 1.88× [1.71, 2.06] |")),
    "gamma-sweep-humaneval-epyc-zen4-own-kernels-results.jsonl": (
        "| block | 6 ★ | 20 | 0.97× [0.94, 1.01] |",),
    "gamma-sweep-humaneval-epyc-zen4-int4-target-f32-attention-results.jsonl": (
        "| block | 4 ★ | 20 | 0.98× [0.96, 1.00] |", "| block | 3 | 20 | 1.04× [1.01, 1.07] |"),
    "gamma-sweep-humaneval-epyc-zen4-int4-target-explore-results.jsonl": (
        "| block | 4 ★ | 20 | 0.97× [0.95, 1.00] |", "| block | 3 | 20 | 1.07× [1.03, 1.11] |"),
    "gamma-sweep-humaneval-epyc-zen4-int4-target-results.jsonl": (
        "| block | 4 ★ | 20 | 0.96× [0.92, 1.00] |", "| block | 2 | 20 | 0.98× [0.96, 1.01] |"),
    "gamma-sweep-humaneval-epyc-zen4-recent-blocks-results.jsonl": (
        "| block | 6 ★ | 20 | 1.00× [0.98, 1.02] |", "| block | 4 | 20 | 1.01× [0.98, 1.04] |"),
    "serve-gamma-auto-epyc-zen4.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 0.956× [0.864, 1.057] | 0.599× [0.421, 0.852] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.018× [0.857, 1.209] | 0.706× [0.538, 0.925] |",
        "| 1 | 16 | block γ=auto | ar | 1.011× [0.971, 1.052] |"),
    "serve-gamma-auto-one-client-epyc-zen4.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 0.990× [0.966, 1.014] | 0.608× [0.514, 0.721] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.050× [0.972, 1.135] | 0.688× [0.583, 0.812] |"),
    "serve-gamma-auto-one-client-epyc-zen4-explore.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 0.995× [0.959, 1.034] | 0.596× [0.514, 0.691] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.080× [1.040, 1.122] | 0.662× [0.602, 0.729] |"),
    "serve-gamma-auto-epyc-zen4-explore-2e9c357.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 1.017× [0.874, 1.184] | 0.622× [0.541, 0.716] |",
        "| 0 | 16 | block γ=auto | ar | 0.960× [0.916, 1.006] | 1.107× [0.951, 1.289] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.032× [0.784, 1.358] | 0.678× [0.581, 0.792] |"),
    "serve-gamma-auto-epyc-zen4-explore.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 0.962× [0.778, 1.190] | 0.523× [0.330, 0.831] |",
        "| 1 | 4 | block γ=auto | ar | 0.930× [0.774, 1.116] | 1.114× [0.672, 1.848] |"),
    "serve-gamma-auto-4-8-clients-epyc-zen4-explore.json": (
        "| 0 | 4 | block γ=auto | ar | 0.988× [0.881, 1.110] | 1.036× [0.793, 1.352] |",
        "| 1 | 8 | block γ=auto | ar | 0.974× [0.793, 1.196] | 1.098× [0.734, 1.642] |"),
    "draft-step-bytes-epyc-zen4.json": (
        "int4 draft: 97 int4 layers reading 277.9 MB per pass",
        "| 0 | 11.35 | 33.6 | 8.28 | 1.37 |", "| 4 | 11.64 | 35.5 | 7.83 | 1.49 |"),
    "policy-time-epyc-zen4.json": ("| baseline | 4 | 0.602 | 0.578 | 54.8 | 0, 0 |",
                                   "| this | 4 | 0.381 | 0.378 | 49.3 | 0, 0 |"),
    "serve-gamma-auto-epyc-zen4-recent-blocks.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 1.059× [0.969, 1.158] | 0.629× [0.543, 0.729] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.019× [0.866, 1.199] | 0.711× [0.494, 1.021] |",
        "| 1 | 4 | block γ=auto | ar | 0.920× [0.819, 1.034] | 1.223× [0.944, 1.585] |"),
    "batch-gamma-b1-epyc-zen4.json": ("geometric mean 0.982 (rounds: 0.956, 0.988, 1.003)",
                                      "γ auto / block γ=4 = 0.986"),
    "batch-gamma-b4-epyc-zen4.json": ("geometric mean 1.008 (rounds: 1.099, 0.946, 0.985)",),
    "batch-gamma-b8-epyc-zen4.json": ("geometric mean 0.967 (rounds: 0.997, 0.921, 0.984)",),
    "batch-gamma-b8-epyc-zen4-five-rounds.json": (
        "geometric mean 0.995 (rounds: 1.002, 0.991, 1.005, 0.994, 0.983)",),
    "batch-gamma-b4-t1-epyc-zen4.json": ("geometric mean 0.962 (rounds: 1.035, 0.882, 0.974)",),
    "batch-gamma-b1-t1-epyc-zen4-before-re-timing.json": (
        ("geometric mean 0.945 (rounds: 0.811, 0.958, 0.918, 0.945, 0.921, 0.990, 0.989, "
        "0.970, 0.993, 0.973)"), "first pass at 22.9 ms"),
    "batch-gamma-b1-t1-epyc-zen4-whole-request-estimate.json": (
        "geometric mean 0.964 (rounds: 0.983, 1.017, 0.987, 0.956, 0.881)",
        "γ auto / block γ=4 = 0.938", "ROW_DECAY set to 1.0"),
    "acceptance-memory-t0-g4-epyc-zen4.json": (
        "20 requests, 297 full blocks", "decay 1.0: 0.988 × the prior's",
        "decay 0.6 (ROW_DECAY): 0.885 × the prior's"),
    "acceptance-memory-t1-g4-epyc-zen4.json": (
        "24 requests, 373 full blocks", "decay 1.0: 1.016 × the prior's",
        "decay 0.6 (ROW_DECAY): 0.929 × the prior's"),
    "acceptance-memory-t1-g6-epyc-zen4.json": (
        "16 requests, 220 full blocks", "decay 1.0: 0.995 × the prior's",
        "decay 0.6 (ROW_DECAY): 0.960 × the prior's"),
    "step-costs-epyc-zen4-emulated-avx2.json": (
        "emulated AVX2); int8 kernel fbgemm+onednn/7",
        "| native int8 | 45.7 | 53.5 | 68.8 | 134.9 | 2.95 |"),
    "draft-formats-rotations-epyc-zen4.json": (
        "| int8-rotated | 20.9 | 22.7 | 23.9 | 1.50 |",
        "| 0 | int8-rotated | 26.15 | 0.997 [0.955, 1.040] over 8 prompts | 4.38 |"),
    "batch-gamma-b1-t1-epyc-zen4.json": (
        ("geometric mean 0.990 (rounds: 1.048, 1.003, 0.914, 0.984, 1.034, 1.101, 0.844, "
        "0.981, 1.060, 0.955)"), "γ auto / block γ=4 = 0.962"),
    "int4-builds-avx2-sums-in-place-target-epyc-zen4-emulated-avx2.json": (
        "baseline: the kernel at HEAD (9c77809); same logits on every k",
        "| 4 | 47.1 | 37.9 | 0.811 [0.801, 0.843] |",
        "| 6 | 73.6 | 51.7 | 0.712 [0.672, 0.725] |",
        "| 8 | 100.5 | 69.5 | 0.694 [0.656, 0.725] |",
        "| 9 | 101.0 | 75.7 | 0.778 [0.712, 0.807] |"),
    "int4-builds-avx2-sums-in-place-draft-epyc-zen4-emulated-avx2.json": (
        "| 1 | 8.9 | 8.8 | 1.014 [0.955, 1.030] |",
        "| 4 | 18.5 | 15.3 | 0.831 [0.817, 0.893] |",
        "| 8 | 37.9 | 27.5 | 0.728 [0.721, 0.742] |"),
    "main-bench-humaneval-epyc-zen4-int8-target-l2-prefetch-results.jsonl": (
        "target int8, draft int4", "humaneval (20)",
        BEST + "| 20 | 1.67× [1.56, 1.80] | 1.42× [1.25, 1.62] |",
        BEST + "| 20 | 1.55× [1.39, 1.74] | 1.32× [1.21, 1.44] |",
        "| block | auto | 5.59 | 4.59 | 35.35 | 43.67 | 22.9 | 397.1 | 1.88× [1.67, 2.11] ",
        "| block | auto | 4.50 | 3.51 | 33.98 | 39.80 | 25.1 | 396.7 | 1.71× [1.55, 1.88] "),
    "main-bench-humaneval-epyc-zen4-int8-target-40-prompts-l2-prefetch-results.jsonl": (
        "target int8, draft int4", "humaneval (40)",
        BEST + "| 40 | 1.59× [1.52, 1.67] | 1.41× [1.31, 1.52] |",
        BEST + "| 40 | 1.49× [1.38, 1.60] | 1.28× [1.20, 1.37] |",
        "| block | auto | 5.82 | 4.82 | 35.09 | 41.97 | 23.8 | 406.6 | 1.94× [1.78, 2.11] ",
        "| block | auto | 4.66 | 3.66 | 31.62 | 36.90 | 27.1 | 402.3 | 1.74× [1.61, 1.88] "),
    "serve-gamma-auto-epyc-zen4-int8-l2-prefetch.json": (
        "| 0 | 1 | block γ=auto | block γ=8 | 1.000× [0.838, 1.193] | 0.544× [0.371, 0.799] |",
        "| 1 | 1 | block γ=auto | block γ=8 | 1.093× [0.983, 1.214] | 0.616× [0.446, 0.851] |",
        "| 1 | 4 | block γ=auto | ar | 0.937× [0.771, 1.139] | 1.000× [0.545, 1.835] |"),
    "batch-gamma-b1-epyc-zen4-8edacd7.json": (
        "geometric mean 0.961 (rounds: 0.880, 0.992, 1.022, 1.058, 0.869)",
        "γ auto 29.76 tok/s / block γ=8 30.73 = 0.969",
        "block γ=auto 33.42, block γ=4 35.42, block γ=8 32.21; γ auto / block γ=4 = 0.944"),
    "batch-gamma-b4-epyc-zen4-8edacd7.json": (
        "block γ=auto: median 50.51 tok/s (rounds 55.65, 52.91, 50.51, 44.09, 35.96)",
        "geometric mean 0.953 (rounds: 0.997, 1.054, 1.073, 0.900, 0.775)",
        "γ auto 46.66 tok/s / ar 48.06 = 0.971"),
    "batch-gamma-b4-t1-epyc-zen4-8edacd7.json": (
        "ar: median 40.31 tok/s (rounds 40.04, 51.05, 53.04, 40.31, 39.27)",
        "geometric mean 0.944 (rounds: 0.989, 0.905, 0.835, 1.025, 0.981)",
        "γ auto 45.21 tok/s / block γ=2 44.67 = 1.012"),
    "batch-gamma-b8-epyc-zen4-8edacd7.json": (
        "block γ=auto: median 63.55 tok/s (rounds 59.89, 65.12, 63.55, 65.07, 61.93)",
        "geometric mean 0.973 (rounds: 0.994, 0.966, 0.966, 0.983, 0.956)"),
    "serve-gamma-auto-4-clients-epyc-zen4-8-repeats.json": (
        "| 0 | 4 | block γ=auto | 8 | 0 | 43.62 | 1548.3 | 54.6 | 2.17 | 1.37 |",
        "| 0 | 4 | block γ=auto | ar | 0.958× [0.885, 1.037] | 1.008× [0.840, 1.210] |",
        "| 1 | 4 | block γ=auto | ar | 1.012× [0.950, 1.078] | 0.980× [0.858, 1.119] |"),
    "step-costs-epyc-zen4-emulated-avx2-sums-in-place.json": (
        "emulated AVX2); int8 kernel fbgemm+onednn/7",
        ("| qwen2.5-coder-1.5b-instruct | native int4 (verispec's int4 kernel (avx2, as "
         "VERISPEC_INT4_KERNEL=avx2 asks)) | 33.6 | 40.9 | 48.1 | 90.3 | 2.69 |"),
        "| qwen2.5-coder-1.5b-instruct | llama.cpp Q4_K_M | 37.5 | 58.2 | 92.8 | 213.0 | 5.68 |"),
}
