"""The int8 kernel table: every kernel this CPU may use computes the exact integer product of
an adversarial layer, every other one is refused, and the choice follows what the kernels
do (not only the CPU flags). Runs on every x86-64 machine, with and without VNNI."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verispec.models.native import kernels
from verispec.models.native.kernels import KERNELS, Int8Kernel
from verispec.telemetry.machine import cpu_info

x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                         reason="the int8 table has x86-64 kernels only")
VNNI_FLAGS = {"avx512_vnni", "avx_vnni", "amx_int8"}
ISA_CAPS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "VERISPEC_INT8_GEMM": "avx2"}
ALL = [pytest.param(k, id=str(k)) for k in KERNELS["x86_64"]]


def _caps_set() -> bool:
    return any(os.environ.get(e) for e in kernels.ISA_ENV)


@x86
@pytest.mark.parametrize("kernel", ALL)
def test_each_kernel_is_exact_where_used_and_refused_elsewhere(
        kernel: Int8Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A proven kernel gives the exact integer product of weights ±127 and inputs at the
    extreme codes, at every pass size; one that does not is refused, not skipped."""
    monkeypatch.setenv(kernels.KERNEL_ENV, str(kernel))
    error = kernels.exactness_error(kernel)
    if kernel in kernels.proven():
        assert error <= 1e-6  # float32 rounding of an exact int32
        assert kernels.choose()[0] == kernel  # the override is honoured
        assert kernels.varying_pass_sizes(kernel) == []  # rows never see each other
    else:  # saturated int16 pair sums, or rows that see each other
        assert error > 1e-2 or kernels.varying_pass_sizes(kernel)
        with pytest.raises(ValueError, match="not exact on this CPU"):
            kernels.choose()


@x86
def test_a_kernel_whose_rows_see_each_other_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact integer products are not enough: a kernel whose float epilogue rounds one way
    for a one-row pass and another way for wider passes (as oneDNN's own scaling does on a
    CPU with AMX) is refused, with the pass sizes that differ."""
    real = kernels.matmul

    def one_row_rounds_apart(kernel: Int8Kernel, packed: object, u: torch.Tensor,
                             *args: torch.Tensor) -> torch.Tensor:
        out = real(kernel, packed, u, *args)  # [M, N]
        return torch.nextafter(out, out + 1) if u.shape[0] == 1 else out  # one ulp

    good = kernels.proven()[0]
    assert kernels.varying_pass_sizes(good) == []
    monkeypatch.setattr(kernels, "matmul", one_row_rounds_apart)
    assert kernels.varying_pass_sizes(good) == [1]
    kernels._self_test.cache_clear()
    kernels.proven.cache_clear()
    try:
        assert good not in kernels.proven()
        assert "rows see each other: passes of 1 rows" in str(kernels._self_test()[good])
        assert kernels.exactness_error(good) <= 1e-6  # the products alone are still exact
    finally:
        kernels._self_test.cache_clear()
        kernels.proven.cache_clear()


@x86
def test_code_width_follows_the_cpu() -> None:
    """7-bit codes are exact on every x86-64 CPU with AVX2; 8-bit codes saturate without
    VNNI and are exact with AVX-512 VNNI (when no ISA cap hides it)."""
    flags = cpu_info().flags
    if "avx2" not in flags:
        pytest.skip("no AVX2")
    proven = kernels.proven()
    assert {k for k in KERNELS["x86_64"] if k.bits == 7} <= set(proven)
    eight = [k for k in KERNELS["x86_64"] if k.bits == 8]
    if not flags & VNNI_FLAGS or _caps_set():
        assert not set(eight) & set(proven)
        assert all(kernels.exactness_error(k) > 1e-2 for k in eight)
        assert kernels.choose()[0].bits == 7  # type: ignore[union-attr]
    elif "avx512_vnni" in flags:
        assert set(eight) <= set(proven)
        assert kernels.choose()[0].bits == 8  # type: ignore[union-attr]
    else:  # avx_vnni only: fbgemm uses its VNNI kernels only with avx512_vnni
        assert Int8Kernel("fbgemm", 8) not in proven


@x86
def test_isa_caps_make_any_cpu_behave_as_avx2() -> None:
    """With oneDNN, fbgemm and verispec's kernel capped at AVX2 (read once per process: a
    subprocess), 8-bit codes saturate on either CPU family, only 7-bit kernels are proven,
    an 8-bit override is refused, and the machine signature (and so every cache file name)
    changes."""
    code = (
        "import json, os\n"
        "from verispec.models.native import kernels as k\n"
        "out = {'proven': [str(x) for x in k.proven()], 'sig': k.signature(),\n"
        "       'error8': k.exactness_error(k.Int8Kernel('onednn', 8)),\n"
        "       'chosen': str(k.choose()[0]), 'report': k.report()}\n"
        "os.environ[k.KERNEL_ENV] = 'onednn/8'\n"
        "try:\n"
        "    k.choose(); out['refused'] = False\n"
        "except ValueError:\n"
        "    out['refused'] = True\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, **ISA_CAPS}
    env.pop(kernels.KERNEL_ENV, None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(out["proven"]) == ["fbgemm+onednn/7", "fbgemm/7", "onednn/7",
                                     "verispec+onednn/7"]
    assert out["error8"] > 1e-2 and out["refused"]
    assert out["chosen"] == "fbgemm+onednn/7"  # the libraries agree: passes split by size
    assert out["report"][0] == "ISA caps: " + ", ".join(f"{e}={v}" for e, v in ISA_CAPS.items())
    for library in ("onednn", "fbgemm"):
        assert any(line.startswith(f"| {library} | 8 bits |") and line.endswith("| refused |")
                   for line in out["report"])
    # verispec's kernel saturates on its AVX2 path too; with oneDNN beside it, the two
    # libraries' saturated sums also differ, so the mixed kernel's rows see each other
    mixed = [line for line in out["report"] if line.startswith("| verispec+onednn | 8 bits |")]
    assert len(mixed) == 1 and not mixed[0].endswith("| exact |")
    assert out["sig"] != kernels.signature() or _caps_set()


@x86
def test_the_cli_reports_every_kernel_its_verdict_and_the_choice(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``verispec models kernels`` lists every kernel of the table with its self-test verdict
    (exact for the proven ones, refused for the others) and the kernel int8 models use."""
    from verispec.cli import main

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.delenv(kernels.KERNEL_ENV, raising=False)
    out = io.StringIO()
    assert main(["models", "kernels"], out=out, err=io.StringIO()) == 0
    text = out.getvalue()
    for kernel in KERNELS["x86_64"]:
        # a refused mixed kernel whose libraries differ is named for that
        verdict = "exact" if kernel in kernels.proven() else "(refused|rows see each other[^|]*)"
        name = re.escape(kernel.name)
        assert re.search(rf"^\| {name} \| {kernel.bits} bits \| [^|]+ \| {verdict} \|$",
                         text, re.MULTILINE), kernel
    assert f"chosen: {kernels.choose()[0]} (" in text
    record = tmp_path / "kernels.json"  # --out keeps it, --table prints it again
    assert main(["models", "kernels", "--out", str(record)], out=io.StringIO(),
                err=io.StringIO()) == 0
    again = io.StringIO()
    assert main(["models", "kernels", "--table", str(record)], out=again,
                err=io.StringIO()) == 0
    lines = again.getvalue().splitlines()
    assert lines[0].startswith("machine: ") and "\n".join(lines[1:]) + "\n" == text


def test_no_int8_on_other_architectures(monkeypatch: pytest.MonkeyPatch) -> None:
    """An architecture without a table entry (aarch64) gets no int8, with the reason, and
    ``auto`` picks a float format there."""
    import verispec.models.loading as loading

    monkeypatch.setattr(kernels.platform, "machine", lambda: "aarch64")
    kernel, why = kernels.choose()
    assert kernel is None and "aarch64" in why
    monkeypatch.setattr(loading.platform, "machine", lambda: "aarch64")
    with pytest.raises(ValueError, match="x86-64"):
        loading.resolve_precision("int8", torch.device("cpu"))
    assert loading.resolve_precision("auto", torch.device("cpu"))[0] in ("float32", "bfloat16")


def test_unknown_kernel_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown int8 kernel"):
        kernels.parse("mkl/8")
    monkeypatch.setattr(kernels, "_arch", lambda: "x86_64")
    monkeypatch.setenv(kernels.KERNEL_ENV, "onednn/6")
    with pytest.raises(ValueError, match="unknown int8 kernel"):
        kernels.choose()


@x86
def test_a_proven_mixed_kernel_is_chosen_without_a_machine_timing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where the two libraries of a code width agree bit for bit, the mixed kernel is
    chosen and nothing is timed per machine (its split is timed per model at load)."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.delenv(kernels.KERNEL_ENV, raising=False)
    widest = max(k.bits for k in kernels.proven())
    mixed = [k for k in kernels.proven() if k.bits == widest and k.wide is not None]
    if not mixed:
        pytest.skip("no mixed kernel is proven in this torch")

    def no_timing(_kernel: Int8Kernel) -> float:
        raise AssertionError("timed per machine")

    monkeypatch.setattr(kernels, "_time", no_timing)
    kernel, why = kernels.choose()
    assert kernel == mixed[0] and "agree bit for bit" in why
    assert not kernels._choice_file().exists()


@x86
def test_timed_choice_is_recorded_and_reused(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """Without a mixed kernel, the fastest of the widest proven kernels is timed once per
    machine signature, written to verispec's cache and read back instead of timing again."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.delenv(kernels.KERNEL_ENV, raising=False)
    widest = max(k.bits for k in kernels.proven())
    single = [k for k in kernels.proven() if k.bits == widest and k.wide is None]
    if len(single) < 2:
        pytest.skip("one proven library of the widest code width: nothing to time")
    monkeypatch.setattr(kernels, "proven", lambda: tuple(single))
    first, why = kernels.choose()
    record = json.loads(kernels._choice_file().read_text())
    assert record["kernel"] == str(first) and "fastest here" in why
    assert set(record["times"]) == {str(k) for k in single}

    def no_timing(_kernel: Int8Kernel) -> float:
        raise AssertionError("timed again")

    monkeypatch.setattr(kernels, "_time", no_timing)
    assert kernels.choose()[0] == first
