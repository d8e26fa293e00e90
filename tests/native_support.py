"""Fixtures and helpers shared by the native runtime's tests (tiny random Qwen2 modules of
``conftest.make_tiny_model``; the embedded real pair where it is in the cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, make_tiny_model

from verispec.models.native import (
    NativeCausalLM,
    from_hf_module,
    kernels,
)
from verispec.models.native.linear import int8_available

CACHE = Path(os.environ.get("VERISPEC_CACHE", "~/.cache/verispec")).expanduser()
REAL_TARGET = CACHE / "qwen2.5-coder-1.5b-instruct"
REAL_DRAFT = CACHE / "qwen2.5-coder-0.5b-instruct"

needs_int8 = pytest.mark.skipif(not int8_available(), reason="no exact int8 kernel here")
PRECS = ["float32", pytest.param("int8", marks=needs_int8)]


@pytest.fixture(scope="module")
def module() -> Any:
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verispec-cache")


@pytest.fixture(autouse=True)
def own_cache(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
              module_cache: Path) -> Path | None:
    """verispec's cache directory (quantized weights, the kernel choice) in a temporary
    directory for the tiny models; integration tests keep the real one (their models and
    quantized weights live there)."""
    if "integration" in request.keywords:
        return None
    monkeypatch.setenv("VERISPEC_CACHE", str(module_cache))
    return module_cache


def native(module: Any, precision: str = "float32") -> NativeCausalLM:
    return from_hf_module(module, TinyTokenizer(), f"native-{precision}", precision)


def native_int8(module: Any, kernel: kernels.Int8Kernel) -> NativeCausalLM:
    """The tiny module in int8 on one given kernel; a mixed kernel runs one-row passes on
    its first library and every wider pass on its second (so a test that compares pass
    sizes compares the two libraries)."""
    from verispec.models.native.config import NativeConfig
    from verispec.models.native.weights import build_int8, int8_layers, int8_state, module_tensors

    config = NativeConfig.from_hf(module.config)
    net = build_int8(config, int8_state(config, module_tensors(module)), kernel)
    for layer in int8_layers(net):
        layer.wide_from = 2
    return NativeCausalLM(net, TinyTokenizer(), str(kernel), precision="int8")


#: every int8 kernel proven exact on this CPU (7-bit codes on every x86-64 CPU with AVX2)
PROVEN = [pytest.param(k, id=str(k)) for k in kernels.proven()]
#: the proven mixed kernels (two libraries that agree bit for bit)
MIXED = [pytest.param(k, id=str(k)) for k in kernels.proven() if k.wide is not None]


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(64, (n,), generator=g).tolist()


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """|a - b| ≤ rel · max|b| (relative to the logits' scale)."""
    a, b = a.float(), b.float()
    assert a.shape == b.shape
    err = float((a - b).abs().max())
    assert err <= rel * float(b.abs().max()), f"max abs error {err}"


def cpu_flags() -> set[str]:
    """The CPU's flags as Linux lists them (empty where /proc/cpuinfo has none)."""
    info = Path("/proc/cpuinfo")
    for line in (info.read_text().splitlines() if info.exists() else []):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def kernel_status_in_a_process(module: str, env: dict[str, str]) -> str:
    """What ``verispec.models.native.<module>``'s ``available()`` and ``status()`` print in a
    fresh Python with ``env`` added (a kernel is chosen once per process)."""
    code = (f"from verispec.models.native import {module} as k; "
            "print(k.available(), k.status())")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, check=True, timeout=120).stdout
