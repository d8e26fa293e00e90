"""Tests for the llama.cpp peers (verispec.bench.llamacpp).

The glue is tested with test doubles (no llama-cpp-python, no GGUF, no compiled example):
the missing-install message, the sampler chain and stopping of ``llamacpp-ar``, the model
cache, the ``llama-speculative-simple`` command line, the parsing of its output and the
assembly of a ``PeerResult`` from a fake binary. Tests that need the real library, the
embedded GGUFs or the built example are marked ``integration`` and skipped when absent.
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import itertools
import math
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

L = importlib.import_module("verispec.bench.llamacpp")
LIB = importlib.import_module("verispec.bench.llamacpp.library")
SPEC = importlib.import_module("verispec.bench.llamacpp.speculative")

REPO = Path(__file__).resolve().parents[1]
EOS = 151645


class LogitBias(ctypes.Structure):
    """The layout of ``llama_cpp.llama_logit_bias``."""

    _fields_ = [("token", ctypes.c_int32), ("bias", ctypes.c_float)]


# --------------------------------------------------------------------------- install message


def test_missing_install_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    reason = L.llamacpp_available()
    assert reason is not None
    assert "llama-cpp-python" in reason and "not installed" in reason
    assert L.INSTALL_COMMAND in reason and L.INSTALL_COMMAND_PLAIN in reason
    with pytest.raises(L.LlamaCppUnavailableError) as ei:
        L.run_llamacpp("llamacpp-ar", [1, 2], target_gguf="t.gguf", draft_gguf=None,
                       temperature=0.0, gamma=None, max_new_tokens=4, seed=0)
    assert L.INSTALL_COMMAND in str(ei.value)
    assert isinstance(ei.value, ImportError)


def test_broken_library_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "llama_cpp":
            raise OSError("libllama.so: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    reason = L.llamacpp_available()
    assert reason is not None and "does not load" in reason and "libllama.so" in reason
    assert L.INSTALL_COMMAND in reason


def test_install_command_and_extra_agree() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["peers"] == [f"llama-cpp-python=={L.LLAMA_CPP_PYTHON_VERSION}"]
    cmd = L.INSTALL_COMMAND
    assert cmd.startswith('CMAKE_ARGS="-DGGML_NATIVE=ON ')
    for flag in ("-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF"):
        assert flag in cmd
    assert "--no-cache-dir" in cmd and cmd.endswith("-e '.[peers]'")
    assert f"'llama-cpp-python=={L.LLAMA_CPP_PYTHON_VERSION}'" in L.INSTALL_COMMAND_PLAIN


def test_argument_errors() -> None:
    common: dict[str, Any] = dict(target_gguf="t.gguf", draft_gguf="d.gguf", temperature=0.0,
                                  gamma=4, max_new_tokens=8, seed=0)
    with pytest.raises(ValueError, match="unknown llama.cpp peer"):
        L.run_llamacpp("llamacpp-nope", [1], **common)
    with pytest.raises(ValueError, match="empty"):
        L.run_llamacpp("llamacpp-ar", [], **common)
    with pytest.raises(ValueError, match="max_new_tokens"):
        L.run_llamacpp("llamacpp-ar", [1], **{**common, "max_new_tokens": 0})
    with pytest.raises(ValueError, match="temperature"):
        L.run_llamacpp("llamacpp-ar", [1], **{**common, "temperature": -1.0})


# --------------------------------------------------------------------------- llamacpp-ar doubles


class FakeLlamaCpp:
    """The few llama_cpp C-API functions the peer uses; sampling replays a script."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.chains: list[list[tuple[str, Any]]] = []
        self.freed = 0
        self.sampled_ctx: list[Any] = []

    def llama_sampler_chain_default_params(self) -> str:
        return "params"

    def llama_sampler_chain_init(self, params: Any) -> list[tuple[str, Any]]:
        chain: list[tuple[str, Any]] = []
        self.chains.append(chain)
        return chain

    def llama_sampler_chain_add(self, chain: list[tuple[str, Any]], smpl: Any) -> None:
        chain.append(smpl)

    def llama_sampler_init_greedy(self) -> tuple[str, Any]:
        return ("greedy", None)

    def llama_sampler_init_temp(self, t: float) -> tuple[str, Any]:
        return ("temp", t)

    def llama_sampler_init_dist(self, seed: int) -> tuple[str, Any]:
        return ("dist", seed)

    def llama_sampler_sample(self, chain: Any, ctx: Any, idx: int) -> int:
        assert idx == -1
        self.sampled_ctx.append(ctx)
        return self.script.pop(0)

    def llama_sampler_free(self, chain: Any) -> None:
        self.freed += 1

    llama_logit_bias = LogitBias

    def llama_sampler_init_logit_bias(self, n_vocab: int, n: int, biases: Any) -> tuple[Any, ...]:
        return ("logit_bias", n_vocab, [(b.token, b.bias) for b in biases[:n]])


class FakeLlm:
    ctx = "ctx"

    def __init__(self) -> None:
        self.evals: list[list[int]] = []
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def eval(self, tokens: list[int]) -> None:
        self.evals.append(list(tokens))

    def n_vocab(self) -> int:
        return 151936


@pytest.fixture
def fake_ar(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(script: list[int]) -> tuple[FakeLlamaCpp, FakeLlm, list[dict[str, Any]]]:
        lib, llm, loads = FakeLlamaCpp(script), FakeLlm(), []

        def load(path: Any, **kw: Any) -> FakeLlm:
            loads.append({"path": path, **kw})
            return llm

        for module in (L, LIB):
            monkeypatch.setattr(module, "_llama_cpp", lambda: lib)
        monkeypatch.setattr(LIB, "load_gguf", load)
        return lib, llm, loads

    return install


def test_ar_greedy_stops_at_eos(fake_ar: Any) -> None:
    lib, llm, loads = fake_ar([5, 6, EOS, 7])
    res = L.run_llamacpp("llamacpp-ar", [1, 2, 3], target_gguf="t.gguf", draft_gguf=None,
                         temperature=0.0, gamma=None, max_new_tokens=10, seed=3, threads=2,
                         eos_token_ids=[EOS])
    assert res.tokens == [5, 6, EOS]
    assert lib.chains == [[("greedy", None)]] and lib.freed == 1
    assert llm.resets == 1
    assert llm.evals == [[1, 2, 3], [5], [6]]  # EOS is never evaluated
    assert res.target_calls == 3
    assert res.target_positions == 3  # 3 + 1 + 1 positions - (3 - 1)
    assert res.draft_calls == 0 and res.seconds >= 0
    assert loads == [{"path": "t.gguf", "threads": 2, "n_ctx": 13, "flash_attn": True}]


def test_ar_temperature_chain_and_budget(fake_ar: Any) -> None:
    lib, llm, _ = fake_ar([9, 8, 7, 6, 5])
    res = L.run_llamacpp("llamacpp-ar", [1], target_gguf="t.gguf", draft_gguf=None,
                         temperature=0.7, gamma=None, max_new_tokens=3, seed=42,
                         eos_token_ids=[EOS, 151643])
    assert res.tokens == [9, 8, 7]
    # pure temperature sampling: no top-k / top-p / min-p / penalties in the chain
    assert lib.chains == [[("temp", 0.7), ("dist", 42)]]
    assert llm.evals == [[1], [9], [8]]
    assert (res.target_calls, res.target_positions) == (3, 3)


def test_ar_other_eos_list(fake_ar: Any) -> None:
    fake_ar([151643, 4])
    res = L.run_llamacpp("llamacpp-ar", [1], target_gguf="t.gguf", draft_gguf=None,
                         temperature=0.0, gamma=None, max_new_tokens=2, seed=0,
                         eos_token_ids=[EOS])
    assert res.tokens == [151643, 4]  # <|endoftext|> is not in this EOS list


def test_ar_prefill_time_and_fixed_length(fake_ar: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lib, llm, _ = fake_ar([5, EOS, 6, 7, 8])
    monkeypatch.setattr(LIB, "eog_ids", lambda path: (EOS, 151643))
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 0.25)
    res = L.run_llamacpp("llamacpp-ar", [1, 2], target_gguf="t.gguf", draft_gguf=None,
                         temperature=0.0, gamma=None, max_new_tokens=4, seed=0, threads=3,
                         eos_token_ids=[EOS], ignore_eos=True)
    assert res.tokens == [5, EOS, 6, 7]  # the whole budget: EOS does not stop it
    # the -inf biases of every end-of-generation id come first in the chain
    assert lib.chains == [[("logit_bias", 151936, [(EOS, -math.inf), (151643, -math.inf)]),
                           ("greedy", None)]]
    assert res.masked_tokens == (EOS, 151643) and res.threads == 3
    # perf_counter: start, after eval(prompt) + the first sample, end
    assert (res.prefill_seconds, res.seconds, res.first_tokens) == (0.25, 0.5, 1)
    assert llm.evals == [[1, 2], [5], [EOS], [6]]
    assert any("-inf logit bias" in n for n in res.notes)
    with pytest.raises(ValueError, match="no p_min"):
        L.run_llamacpp("llamacpp-ar", [1], target_gguf="t.gguf", draft_gguf=None,
                       temperature=0.0, gamma=None, max_new_tokens=2, seed=0, p_min=0.5)


def test_ar_without_ignore_eos_has_no_bias(fake_ar: Any) -> None:
    lib, _, _ = fake_ar([5, EOS])
    res = L.run_llamacpp("llamacpp-ar", [1], target_gguf="t.gguf", draft_gguf=None,
                         temperature=0.5, gamma=None, max_new_tokens=4, seed=2,
                         eos_token_ids=[EOS])
    assert res.tokens == [5, EOS] and res.masked_tokens == ()
    assert lib.chains == [[("temp", 0.5), ("dist", 2)]]
    assert res.prefill_seconds is not None and 0 <= res.prefill_seconds <= res.seconds


def test_provenance_and_cmake_records(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "ggml-config.cmake"
    cfg.write_text('set(GGML_NATIVE "ON")\nset(GGML_AVX2 "OFF")\nset(GGML_BUILD_COMMIT "abc")\n'
                   "set(LLAMA_BUILD_COMMIT 0c1e570)\n")
    assert LIB._cmake_values(cfg, ("GGML_NATIVE", "LLAMA_BUILD_COMMIT", "GGML_BLAS")) == {
        "GGML_NATIVE": "ON", "LLAMA_BUILD_COMMIT": "0c1e570"}
    fake = type("M", (), {"llama_print_system_info": staticmethod(lambda: b"CPU : AVX2 = 1 | ")})
    monkeypatch.setattr(LIB, "_llama_cpp", lambda: fake)
    monkeypatch.setattr(LIB, "_installed_build_record", lambda: {"GGML_NATIVE": "ON"})
    info = L.provenance()
    assert info["system_info"] == "CPU : AVX2 = 1"
    assert info["cmake_flags"] == "unknown (pip build; flags not recorded by llama-cpp-python)"
    assert info["installed_build"] == {"GGML_NATIVE": "ON"}
    assert info["llama_cpp_python"] == LIB._installed_version()


def test_provenance_of_the_installed_library() -> None:
    if L.llamacpp_available() is not None:
        pytest.skip("llama-cpp-python not installed (extra 'peers')")
    info = L.provenance()
    assert info["llama_cpp_python"] == LIB._installed_version()
    assert "CPU" in info["system_info"] and info["cmake_flags"] == LIB.CMAKE_FLAGS_UNKNOWN
    if info["installed_build"]:  # scikit-build-core installs the CMake package files
        assert set(info["installed_build"]) <= {*LIB.GGML_OPTIONS, "LLAMA_BUILD_COMMIT"}


def test_bench_help_shows_the_documented_install() -> None:
    options = importlib.import_module("verispec.bench.options")
    assert L.INSTALL_COMMAND in options.BENCH_EPILOG
    assert L.INSTALL_COMMAND in (REPO / "README.md").read_text()
    assert LIB.PIP_CMAKE_FLAGS == options.PIP_CMAKE_FLAGS
    tree = ast.parse((REPO / "src/verispec/bench/options.py").read_text())
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names}
    assert imported <= {"__future__", "argparse"}  # the CLI parser stays import-light


class CountingLlama:
    made: list[dict[str, Any]] = []

    def __init__(self, **kw: Any) -> None:
        self.kw = kw
        self.closed = False
        CountingLlama.made.append(kw)

    def n_ctx(self) -> int:
        return int(self.kw["n_ctx"])

    def close(self) -> None:
        self.closed = True


def test_load_gguf_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    CountingLlama.made = []
    monkeypatch.setattr(LIB, "_llama_cpp", lambda: type("M", (), {"Llama": CountingLlama}))
    monkeypatch.setattr(LIB, "_MODELS", {})
    a = L.load_gguf(gguf, threads=2, n_ctx=300)
    assert L.load_gguf(str(gguf), threads=2, n_ctx=4000) is a  # same file, fits
    assert a.kw["n_ctx"] == 4096 and a.kw["n_batch"] == 4096 and a.kw["n_threads"] == 2
    assert a.kw["flash_attn"] is True and a.kw["verbose"] is False
    b = L.load_gguf(gguf, threads=1, n_ctx=300)  # other thread count: other model
    assert b is not a
    c = L.load_gguf(gguf, threads=2, n_ctx=5000)  # too small: replaced
    assert c is not a and a.closed and c.kw["n_ctx"] == 5120
    assert len(CountingLlama.made) == 3
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        L.load_gguf(tmp_path / "missing.gguf")


def test_module_has_no_hidden_state_leak() -> None:
    # clear_cache on an empty cache is a no-op and never needs llama_cpp
    L.clear_cache()
    assert LIB._MODELS == {} and LIB._VOCABS == {}
    assert os.fspath(SPEC._build_root("0.0.0")).endswith("llama-cpp-python-0.0.0")
