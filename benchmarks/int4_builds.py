"""Two versions of verispec's int4 kernel (or, with ``--kernel int8``, of its int8 matmul)
side by side: the whole pass of a model that runs it.

The baseline is the kernel's source (``csrc/int4_gemv.c``, ``csrc/int8_gemm.c``) as it was at
a git revision (``--baseline REV``), the other the checkout's. Both are built as verispec
builds the kernel and loaded in one process; the model (the embedded 1.5B target, or with
``--model draft`` the 0.5B draft, loaded as ``--precision int4`` or ``int8`` loads it; an
int8 model runs the matmul on the pass sizes its library split gives it) reads a 200-token
context, and then, in
``--rounds`` rounds, each build in turn times ``--passes`` passes of k tokens after it
(rolled back each time) for every k of ``--tokens``, each build's replayed passes
(:mod:`verispec.models.native.replay`) bound once and kept as in decoding. Before timing,
both builds' logits are compared bit for bit on every k (a speed change must not change a
result). ``--isa avx2`` runs the kernel's AVX2 path (``VERISPEC_INT4_KERNEL=avx2``,
``VERISPEC_INT8_GEMM=avx2``) where the CPU has AVX-512 VNNI.

    python benchmarks/int4_builds.py --baseline REV [--kernel int4] [--model target]
        [--isa auto] [--out F]
    python benchmarks/int4_builds.py --table F
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import results_io

CONTEXT = 200
BUILDS = ("baseline", "checkout")
#: --kernel -> (its module in verispec.models.native, the variable that asks for its AVX2 path)
KERNELS = {"int4": ("int4_kernel", "VERISPEC_INT4_KERNEL"),
           "int8": ("gemm_kernel", "VERISPEC_INT8_GEMM")}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(results_io.ROOT), *args], capture_output=True,
                          text=True, check=True).stdout


def _baseline_source(source: Path, rev: str, folder: Path) -> Path:
    """The kernel's ``source`` as it was at ``rev``, written into ``folder``."""
    rel = source.relative_to(results_io.ROOT).as_posix()
    path = folder / source.name
    path.write_text(_git("show", f"{rev}:{rel}"))
    return path


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if not args.baseline:
        raise SystemExit("--baseline REV: the git revision of the kernel to time against")
    try:
        commit = _git("rev-parse", "--verify", f"{args.baseline}^{{commit}}").strip()
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"--baseline {args.baseline}: not a commit here ({err.stderr.strip()})")
    module_name, env = KERNELS[args.kernel]
    if args.isa == "avx2":
        os.environ[env] = "avx2"  # read when the kernel is first loaded
    import torch

    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
    from verispec.models.loading import load_model

    kernel = importlib.import_module(f"verispec.models.native.{module_name}")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as folder:
        base = _baseline_source(kernel.SOURCE, args.baseline, Path(folder))
        libraries = {"baseline": kernel.load_library(base, f"{args.kernel}-baseline"),
                     "checkout": kernel.load_library(kernel.SOURCE)}
    for build, (lib, why) in libraries.items():
        if lib is None:
            raise SystemExit(f"the {build} build does not run here: {why}")
    name = DEFAULT_TARGET if args.model == "target" else DEFAULT_DRAFT
    model: Any = load_model(name, precision=args.kernel, role=args.model)
    g = torch.Generator().manual_seed(0)
    model.reset()
    model.add_rows([torch.randint(1000, 20000, (CONTEXT,), generator=g).tolist()])
    tokens = {k: torch.randint(1000, 20000, (1, k), generator=g) for k in args.tokens}

    replays: dict[str, dict[Any, Any]] = {b: {} for b in BUILDS}  # bound to each build

    def run(build: str, k: int) -> tuple[float, Any]:
        with mock.patch.object(kernel, "_load", lambda: libraries[build]):
            model.net.replays = replays[build]
            start = time.perf_counter()
            logits = model.extend(tokens[k])
            took = time.perf_counter() - start
            model.rollback([CONTEXT])
        return took, logits

    equal = {k: bool(torch.equal(run("baseline", k)[1], run("checkout", k)[1]))
             for k in args.tokens}
    if not all(equal.values()):
        raise SystemExit(f"the builds' logits differ: {equal}")
    rounds = []
    for _ in range(args.rounds):
        rounds.append({b: {str(k): [run(b, k)[0] for _ in range(args.passes)]
                           for k in args.tokens} for b in BUILDS})
    rec = results_io.record(__file__, args, results_io.torch_info())
    rec.update({"kernel_status": kernel.status(), "context": CONTEXT, "baseline_commit": commit,
                "same_logits": equal, "rounds": rounds})
    return rec


def table(rec: dict[str, Any]) -> str:
    """Per k: each build's median over rounds of its round medians, and the median and
    range over rounds of checkout / baseline."""
    a = rec["args"]
    status = rec.get("kernel_status", rec.get("int4_kernel"))  # the latter: older records
    base, commit = a["baseline"], rec.get("baseline_commit")
    if commit is None and base == "HEAD":  # older records: HEAD was the checkout's commit
        commit = rec["checkout"]["commit"]
    if commit and not commit.startswith(base):  # a name (HEAD, a branch): add its commit
        base = f"{base} ({commit[:7]})"
    head = (f"{a.get('kernel', 'int4')} {a['model']} ({status}), passes after {rec['context']} "
            f"tokens; baseline: the kernel at {base}; same logits on every k")
    lines = [head,
             "| k | baseline, ms | checkout, ms | checkout / baseline, median [min, max] |",
             "|---|---|---|---|"]
    for k in a["tokens"]:
        per = {b: [statistics.median(r[b][str(k)]) for r in rec["rounds"]] for b in BUILDS}
        ratios = [c / b for b, c in zip(per["baseline"], per["checkout"], strict=True)]
        lines.append(f"| {k} | {statistics.median(per['baseline']) * 1e3:.1f} | "
                     f"{statistics.median(per['checkout']) * 1e3:.1f} | "
                     f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |")
    return "\n".join(lines)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", help="git revision of the baseline kernel (needed to measure)")
    p.add_argument("--kernel", choices=tuple(KERNELS), default="int4")
    p.add_argument("--model", choices=("target", "draft"), default="target")
    p.add_argument("--isa", choices=("auto", "avx2"), default="auto")
    p.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")],
                   default=list(range(1, 10)), help="tokens per pass, comma-separated")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--passes", type=int, default=7, help="passes timed per k, build and round")


if __name__ == "__main__":
    raise SystemExit(results_io.cli(__doc__.split("\n\n")[0], measure, table, options=options))
