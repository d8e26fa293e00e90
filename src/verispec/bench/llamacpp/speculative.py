"""``llamacpp-spec``: llama.cpp's own speculative decoding, the ``llama-speculative-simple``
example program built from the llama.cpp sources vendored in llama-cpp-python's sdist, run
as a subprocess and read back from its output and debug log (see
:mod:`verispec.bench.llamacpp` for how it speculates and how its output is counted)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import verispec.bench.llamacpp.library as library  # noqa: PLR0402 (a package import would be a cycle)
from verispec.bench.llamacpp.library import (
    LLAMA_CPP_PYTHON_VERSION,
    Progress,
    _ctx_size,
    _installed_version,
    default_threads,
)
from verispec.bench.options import NO_AMX_FLAGS
from verispec.bench.peers import PeerResult
from verispec.models.fetch import cache_dir

__all__ = [
    "BINARY_ENV",
    "SPEC_BUILD",
    "SPEC_TARGET",
    "BuildTarget",
    "SpeculativeOutput",
    "build_record",
    "build_speculative",
    "build_target",
    "check_draft_settings",
    "find_binary",
    "parse_speculative_output",
    "prompt_text",
    "run_spec",
    "speculative_argv",
    "speculative_binary",
]

SPEC_TARGET = "llama-speculative-simple"

SPEC_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    *NO_AMX_FLAGS,
)
"""CMake flags of the example build: native without AMX (as the library's install), static
(self-contained binary), only the libraries the example needs are compiled because only its
target is built."""

NO_SYSTEM_INFO = "not printed by llama-speculative-simple"

BINARY_ENV = "VERISPEC_LLAMA_SPECULATIVE"
"""Environment variable naming a ready ``llama-speculative-simple`` binary to use instead."""


# --------------------------------------------------------------------------- llamacpp-spec


def prompt_text(vocab: Any, prompt: Sequence[int]) -> bytes:
    """The UTF-8 text of ``prompt`` per llama.cpp's vocabulary, checked to tokenize back to
    exactly ``prompt`` the way ``llama-speculative-simple`` tokenizes (special tokens parsed,
    BOS added only if the vocabulary asks for it). Raises ValueError otherwise."""
    ids = [int(t) for t in prompt]
    text = bytes(vocab.detokenize(ids, special=True))
    back = [int(t) for t in vocab.tokenize(text, add_bos=True, special=True)]
    if back != ids:
        at = next((i for i, (a, b) in enumerate(zip(ids, back, strict=False)) if a != b),
                  min(len(ids), len(back)))
        raise ValueError(
            f"llama.cpp re-tokenizes the prompt text differently from the given ids ({len(ids)} "
            f"ids, {len(back)} after the round trip, first difference at position {at}: "
            f"{ids[at:at + 3]} vs {back[at:at + 3]}); llamacpp-spec takes text, so it cannot run "
            "this prompt exactly")
    return text


def _build_root(version: str | None = None) -> Path:
    version = version or _installed_version() or LLAMA_CPP_PYTHON_VERSION
    return cache_dir() / "llama.cpp" / f"llama-cpp-python-{version}"


def speculative_binary() -> Path | None:
    """The ``llama-speculative-simple`` to run: ``$VERISPEC_LLAMA_SPECULATIVE`` if set, else the
    build in ``<cache>/llama.cpp/llama-cpp-python-<version>/build/bin/`` if complete and made
    with today's ``SPEC_CMAKE_FLAGS`` (an older build may carry ggml's AMX backend, which
    crashes on an AMX CPU); None when there is none such yet (:func:`build_speculative`
    makes it)."""
    return find_binary(BINARY_ENV, SPEC_BUILD)


def find_binary(variable: str, build: BuildTarget) -> Path | None:
    """The program named by the environment variable ``variable`` if set (it must be an
    executable file), else ``build``'s finished build in the verispec cache made with its
    flags, else None."""
    env = os.environ.get(variable)
    if env:
        path = Path(env).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"${variable}={env} is not an executable file")
        return path
    return _current_build(_build_root(), build)


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(f"[verispec.llamacpp] {msg}")


def _run_checked(cmd: list[str], what: str, **kwargs: Any) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-25:])
        raise RuntimeError(f"{what} failed (exit code {proc.returncode}): "
                           f"{shlex.join(cmd)}\n{tail}")


def _vendored_source(root: Path, version: str, source: Path | None,
                     progress: Progress | None) -> Path:
    """A llama.cpp source tree: ``source`` (a llama.cpp tree or an unpacked llama-cpp-python
    sdist), else ``root/src`` unpacked from the llama-cpp-python ``version`` sdist that pip
    downloads (the sources llama-cpp-python itself was built from)."""
    if source is not None:
        source = Path(source).expanduser()
        for candidate in (source, source / "vendor" / "llama.cpp"):
            if (candidate / "examples" / "speculative-simple").is_dir():
                return candidate
        raise FileNotFoundError(f"{source} is neither a llama.cpp tree nor an unpacked "
                                "llama-cpp-python sdist (no examples/speculative-simple)")
    src = root / "src"
    if (src / "examples" / "speculative-simple").is_dir():
        return src
    with tempfile.TemporaryDirectory(prefix=".sdist-", dir=root) as tmp:
        _say(progress, f"downloading the llama-cpp-python {version} sdist with pip")
        _run_checked([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                      ":all:", "--disable-pip-version-check", "-q", "-d", tmp,
                      f"llama-cpp-python=={version}"], "pip download")
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise RuntimeError(f"pip download left no sdist in {tmp}")
        staging = Path(tmp) / "unpacked"
        with tarfile.open(archives[0]) as tar:
            members = [m for m in tar.getmembers()
                       if m.name.split("/")[1:3] == ["vendor", "llama.cpp"]]
            tar.extractall(staging, members=members, filter="data")
        found = sorted(staging.glob("*/vendor/llama.cpp"))
        if not found:
            raise RuntimeError(f"no vendor/llama.cpp in {archives[0].name}")
        if src.exists():
            shutil.rmtree(src)
        os.replace(found[0], src)
    return src


@dataclass(frozen=True)
class BuildTarget:
    """One llama.cpp program verispec builds: its CMake target, the build folder under
    ``<cache>/llama.cpp/llama-cpp-python-<version>/`` and the flags it is configured with; the
    record of a finished build is ``<folder>.json`` beside the folder."""

    target: str
    folder: str
    flags: tuple[str, ...]


SPEC_BUILD = BuildTarget(SPEC_TARGET, "build", SPEC_CMAKE_FLAGS)


def _current_build(root: Path, build: BuildTarget = SPEC_BUILD) -> Path | None:
    """The binary of the finished build under ``root`` if it was made with ``build``'s
    flags (None: no finished build, or one made with other flags)."""
    binary = root / build.folder / "bin" / build.target
    try:
        record = json.loads((root / f"{build.folder}.json").read_text("utf-8"))
        flags = list(record["cmake_flags"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return binary if binary.is_file() and flags == list(build.flags) else None


def build_speculative(*, source: str | os.PathLike[str] | None = None, jobs: int | None = None,
                      force: bool = False, progress: Progress | None = None) -> Path:
    """Build ``llama-speculative-simple`` (only that CMake target) from the llama.cpp sources
    vendored in the installed llama-cpp-python's sdist, into
    ``<cache>/llama.cpp/llama-cpp-python-<version>/``; return the binary. Needs cmake and a
    C++17 compiler (ninja if present). Reuses a finished build made with the same flags unless
    ``force``."""
    return build_target(SPEC_BUILD, source=source, jobs=jobs, force=force, progress=progress)


def build_target(build: BuildTarget, *, source: str | os.PathLike[str] | None = None,
                 jobs: int | None = None, force: bool = False,
                 progress: Progress | None = None) -> Path:
    """Build one program (``build``) as :func:`build_speculative` describes; return it."""
    version = _installed_version() or LLAMA_CPP_PYTHON_VERSION
    root = _build_root(version)
    binary = root / build.folder / "bin" / build.target
    if not force and (current := _current_build(root, build)) is not None:
        return current
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError(f"building {build.target} needs cmake (and a C++ compiler); "
                           "install them, e.g. apt-get install cmake g++ (or pip install cmake)")
    root.mkdir(parents=True, exist_ok=True)
    record = root / f"{build.folder}.json"
    record.unlink(missing_ok=True)
    src = _vendored_source(root, version, Path(source) if source is not None else None,
                           progress)
    folder = root / build.folder
    configure = [cmake, "-S", str(src), "-B", str(folder), *build.flags]
    if shutil.which("ninja"):
        configure[1:1] = ["-G", "Ninja"]
    jobs = jobs or default_threads()
    start = time.monotonic()
    _say(progress, f"configuring llama.cpp ({src})")
    if folder.exists() and force:
        shutil.rmtree(folder)
    _run_checked(configure, "cmake configure")
    _say(progress, f"building {build.target} with {jobs} jobs (a few minutes)")
    _run_checked([cmake, "--build", str(folder), "--target", build.target, "-j", str(jobs)],
                 "cmake build")
    if not binary.is_file():
        raise RuntimeError(f"the build finished but {binary} is missing")
    seconds = time.monotonic() - start
    info = {"llama_cpp_python": version, "source": str(src), "cmake_flags": list(build.flags),
            "target": build.target, "build_seconds": round(seconds, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    record.write_text(json.dumps(info, indent=2) + "\n", "utf-8")
    _say(progress, f"built {binary} in {seconds:.0f}s")
    return binary


def check_draft_settings(gamma: int, p_min: float) -> None:
    """llama.cpp's draft settings: γ = ``--spec-draft-n-max`` ≥ 1, ``p_min`` in [0, 1]."""
    if gamma < 1:
        raise ValueError(f"llamacpp-spec needs gamma >= 1, got {gamma}")
    if not 0.0 <= p_min <= 1.0:
        raise ValueError(f"p_min must be in [0, 1], got {p_min}")


def speculative_argv(binary: str | os.PathLike[str], *, target_gguf: str | os.PathLike[str],
                     draft_gguf: str | os.PathLike[str], prompt_file: str | os.PathLike[str],
                     gamma: int, temperature: float, seed: int, max_new_tokens: int,
                     threads: int, n_ctx: int, flash_attn: bool = True, p_min: float = 0.0,
                     ignore_eos: bool = False) -> list[str]:
    """Command line of one ``llama-speculative-simple`` run.

    γ is ``--spec-draft-n-max`` (``--spec-draft-n-min 0``); ``p_min`` is
    ``--spec-draft-p-min``: the draft stops proposing at the first position where its top
    token's probability (its own sampler's: temperature 1 over its 10 most probable tokens)
    is below ``p_min`` (0: always γ tokens). ``ignore_eos`` adds ``--ignore-eos``: llama.cpp
    then gives every end-of-generation id of the vocabulary a −inf logit bias in the target's
    sampler (never sampled, so never accepted from a draft either).

    The example stops once its count *exceeds* ``-n``, hence ``-n max_new_tokens - 1``; when
    at most one token of budget is left it still drafts a full γ (its per-round cap of 0 means
    "no cap"), so a run can overshoot by up to γ tokens, which the caller cuts off. ``-bf``
    reads the prompt bytes verbatim and ``--no-escape`` keeps backslashes as they are. The
    sampler chain is temperature alone (pure temperature sampling; at T = 0 llama.cpp samples
    greedily). ``-lv 5`` (debug) prints the drafting statistics and, every round, the drafted
    ids and the last accepted id, from which the generated ids are read exactly (this logging
    costs no measurable CPU time).
    """
    check_draft_settings(gamma, p_min)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    t = str(threads)
    return [
        str(binary),
        "-m", str(target_gguf),
        "-md", str(draft_gguf),
        "--spec-type", "draft-simple",
        "--spec-draft-n-max", str(gamma),
        "--spec-draft-n-min", "0",
        "--spec-draft-p-min", f"{float(p_min):g}",
        "-bf", str(prompt_file),
        "--no-escape",
        "-n", str(max_new_tokens - 1),
        "-c", str(n_ctx),
        "-b", str(n_ctx),
        "-ub", "512",
        "-t", t, "-tb", t, "-td", t, "-tbd", t,
        "-fa", "on" if flash_attn else "off",
        "--samplers", "temperature",
        "--temp", repr(float(max(temperature, 0.0))),
        "--top-k", "0", "--top-p", "1", "--min-p", "0", "--repeat-penalty", "1",
        "--seed", str(int(seed) & 0xFFFFFFFF),
        "--color", "off",
        "-lv", "5",
        *(["--ignore-eos"] if ignore_eos else []),
    ]


@dataclass
class SpeculativeOutput:
    """What one ``llama-speculative-simple`` run printed."""

    text: bytes
    """Generated text (stdout without the echoed prompt); the final EOG token is not printed."""
    n_input: int
    encode_seconds: float
    decode_seconds: float
    n_predict: int
    """Tokens generated, a final end-of-generation token included."""
    n_drafted: int
    n_accept: int
    draft_stats: dict[str, int] = field(default_factory=dict)
    """``calls_begin``, ``calls_draft``, ``calls_accept``, ``gen_drafts``, ``acc_drafts``,
    ``gen_tokens``, ``acc_tokens`` of the draft implementation, when printed."""
    target_prompt_positions: int | None = None
    """llama.cpp's target perf counter of positions in multi-token calls (prefill included)."""
    target_single_calls: int | None = None
    """llama.cpp's target perf counter of single-token calls."""
    ids: list[int] | None = None
    """Generated ids read from the debug log (every round's accepted draft ids and the target's
    last token, so a final end-of-generation token included); None without a debug log."""
    system_info: str | None = None
    """A ``system_info:`` line (threads and CPU features), if the program printed one (the
    example of llama-cpp-python 0.3.36 prints none: it never calls
    ``common_params_print_info``)."""
    logged_threads: list[int] = field(default_factory=list)
    """The ``n_threads`` of every "threadpool init" debug line (the thread pools it made)."""

    @property
    def seconds(self) -> float:
        return self.encode_seconds + self.decode_seconds

    @property
    def rounds(self) -> int:
        """Target verification calls: each emits its accepted tokens plus one."""
        return self.n_predict - self.n_accept


_EVENT_RE = re.compile(
    r"draft candidate\s+0, pos\s+(?P<pos>[0-9]+):\s+(?P<tok>-?[0-9]+) \("
    r"|accepted (?P<acc>[0-9]+)/(?P<n>[0-9]+) draft tokens, the last target token is: "
    r"\((?P<last>-?[0-9]+)\)")
_STDOUT_HEAD = b"\n\n"
_STDOUT_TAIL = b"\n\n\n\n"
_NUM = r"([0-9]+(?:\.[0-9]*)?)"


def _search(pattern: str, text: str, what: str) -> re.Match[str]:
    m = re.search(pattern, text)
    if m is None:
        raise ValueError(f"llama-speculative-simple output has no {what} line "
                         f"(pattern {pattern!r}); its last lines:\n"
                         + "\n".join(text.strip().splitlines()[-15:]))
    return m


def _ids_from_debug(stderr: str) -> list[int] | None:
    """The ids every round emitted: its first ``k`` drafted ids (candidate 0 at positions
    0, 1, ... of the latest draft) and then the target's own token. None if the log has no
    round lines or they do not add up."""
    ids: list[int] = []
    draft: list[int] = []
    rounds = 0
    for m in _EVENT_RE.finditer(stderr):
        if m.group("pos") is not None:
            if int(m.group("pos")) == 0:
                draft = []
            draft.append(int(m.group("tok")))
            continue
        accepted, size = int(m.group("acc")), int(m.group("n"))
        if accepted > size or accepted > len(draft):
            return None
        ids.extend(draft[:accepted])
        ids.append(int(m.group("last")))
        draft = []
        rounds += 1
    return ids if rounds else None


def parse_speculative_output(stdout: bytes, stderr: str | bytes, *,
                             prompt: bytes) -> SpeculativeOutput:
    """Parse a run: stdout is ``"\\n\\n" + prompt + generated + "\\n\\n\\n\\n"``; the counts and
    timings are on stderr."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    head = _STDOUT_HEAD + prompt
    if not stdout.startswith(head):
        raise ValueError("llama-speculative-simple did not echo the prompt as expected (its "
                         f"stdout starts {stdout[:80]!r})")
    body = stdout[len(head):]
    body = body.removesuffix(_STDOUT_TAIL) if body.endswith(_STDOUT_TAIL) \
        else body.removesuffix(_STDOUT_HEAD)
    enc = _search(r"encoded\s+([0-9]+) tokens in\s+" + _NUM + " seconds", stderr, "'encoded'")
    dec = _search(r"decoded\s+([0-9]+) tokens in\s+" + _NUM + " seconds", stderr, "'decoded'")
    n_predict = int(_search(r"n_predict\s*=\s*([0-9]+)", stderr, "n_predict").group(1))
    n_drafted = int(_search(r"n_drafted\s*=\s*([0-9]+)", stderr, "n_drafted").group(1))
    n_accept = int(_search(r"n_accept\s*=\s*([0-9]+)", stderr, "n_accept").group(1))
    stats: dict[str, int] = {}
    m = re.search(r"statistics\s+\S+: #calls\(b,g,a\) =\s*([0-9]+)\s+([0-9]+)\s+([0-9]+), "
                  r"#gen drafts =\s*([0-9]+), #acc drafts =\s*([0-9]+), "
                  r"#gen tokens =\s*([0-9]+), #acc tokens =\s*([0-9]+)", stderr)
    if m is not None:
        names = ("calls_begin", "calls_draft", "calls_accept", "gen_drafts", "acc_drafts",
                 "gen_tokens", "acc_tokens")
        stats = dict(zip(names, (int(g) for g in m.groups()), strict=True))
    # the target context's perf counters come after "target:" (the draft has its own)
    tail = stderr[stderr.rfind("target:"):] if "target:" in stderr else stderr
    pe = re.search(r"prompt eval time =\s*" + _NUM + r" ms /\s*([0-9]+) tokens", tail)
    ev = re.search(r"[^t] eval time =\s*" + _NUM + r" ms /\s*([0-9]+) runs", tail)
    sysinfo = re.search(r"system_info: (.*)", stderr)
    pools = sorted({int(n) for n in re.findall(r"threadpool init, n_threads = ([0-9]+)", stderr)})
    return SpeculativeOutput(
        text=body, n_input=int(enc.group(1)), encode_seconds=float(enc.group(2)),
        decode_seconds=float(dec.group(2)), n_predict=n_predict, n_drafted=n_drafted,
        n_accept=n_accept, draft_stats=stats,
        target_prompt_positions=int(pe.group(2)) if pe else None,
        target_single_calls=int(ev.group(2)) if ev else None, ids=_ids_from_debug(stderr),
        system_info=sysinfo.group(1).strip(" |") if sysinfo else None, logged_threads=pools)


def _eog_checker(vocab: Any) -> Callable[[int], bool]:
    """``llama_vocab_is_eog`` of the GGUF's vocabulary (its end-of-generation tokens)."""
    llama_cpp = library._llama_cpp()
    pointer = llama_cpp.llama_model_get_vocab(vocab.model)
    return lambda token: bool(llama_cpp.llama_vocab_is_eog(pointer, int(token)))


def _generated_ids(vocab: Any, prompt: list[int], prompt_bytes: bytes, text: bytes,
                   notes: list[str]) -> list[int]:
    """Ids of the printed continuation: tokenize prompt + text and drop the prompt's ids (the
    same split the model made, whenever the text round-trips)."""
    full = [int(t) for t in vocab.tokenize(prompt_bytes + text, add_bos=True, special=True)]
    if full[:len(prompt)] == prompt:
        ids = full[len(prompt):]
    else:
        notes.append("the continuation merged with the prompt's last token when re-tokenized; "
                     "its ids were tokenized on their own")
        ids = [int(t) for t in vocab.tokenize(text, add_bos=False, special=True)] if text else []
    if bytes(vocab.detokenize(ids, special=True)) != text:
        notes.append("the generated text does not round-trip through llama.cpp's tokenizer; "
                     "token ids are approximate")
    return ids


#: CMake cache entries of the example's build worth reporting.
CACHE_ENTRIES = ("CMAKE_BUILD_TYPE", "CMAKE_CXX_COMPILER", "GGML_NATIVE", "GGML_OPENMP",
                 "GGML_LLAMAFILE", "GGML_CPU_REPACK", "GGML_BLAS", "GGML_CUDA")


def build_record(binary: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record that :func:`build_target` wrote beside ``binary``'s build folder (its CMake
    flags, the llama-cpp-python version of its sources, ...), with the values of
    :data:`CACHE_ENTRIES` in the build's ``CMakeCache.txt`` (``cmake_cache``); None for a
    binary built elsewhere (e.g. named by ``$VERISPEC_LLAMA_SPECULATIVE``)."""
    parents = Path(binary).resolve().parents
    if len(parents) < 3:
        return None
    folder = parents[1]
    try:
        record = dict(json.loads((folder.parent / f"{folder.name}.json").read_text("utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    try:
        cache = (folder / "CMakeCache.txt").read_text("utf-8", "replace")
    except OSError:
        return record
    found = dict(re.findall(r"^(\w+):[A-Z]+=(.*)$", cache, re.MULTILINE))
    record["cmake_cache"] = {k: found[k] for k in CACHE_ENTRIES if k in found}
    return record


def _recovered_ids(out: SpeculativeOutput, vocab: Any, prompt: list[int], text: bytes,
                   eos: Sequence[int], notes: list[str]) -> list[int]:
    """The generated ids up to the program's stop: from its debug log, else by tokenizing its
    printed text again (the final end-of-generation id then guessed, and said so)."""
    is_eog = _eog_checker(vocab)
    if out.ids is not None:
        ids = []
        for token in out.ids:  # the program stops at the first end-of-generation token
            ids.append(token)
            if is_eog(token):
                break
        printed = ids[:-1] if ids and is_eog(ids[-1]) else ids
        if bytes(vocab.detokenize(printed, special=True)) != out.text:
            notes.append("the ids read from llama.cpp's log do not detokenize to its printed "
                         "text")
        return ids
    ids = _generated_ids(vocab, prompt, text, out.text, notes)
    if out.n_predict == len(ids) + 1 and eos:
        ids.append(int(eos[0]))
        notes.append("llama.cpp stopped at an end-of-generation token; without its debug "
                     f"log the id is unknown and taken to be {int(eos[0])}")
    return ids


def _cut(ids: list[int], out: SpeculativeOutput, eos: Sequence[int], is_eog: Callable[[int], bool],
         max_new_tokens: int, notes: list[str]) -> list[int]:
    """``ids`` cut after the first id of ``eos`` (none under ignore_eos: pass ``()``) and at
    the budget, with notes on what llama.cpp did differently."""
    if out.n_predict != len(ids) and len(ids) <= max_new_tokens:
        notes.append(f"llama.cpp counted {out.n_predict} generated tokens, {len(ids)} were "
                     "recovered")
    eos_set = {int(t) for t in eos}
    cut = next((i + 1 for i, t in enumerate(ids) if t in eos_set), None)
    if cut is not None:
        ids = ids[:cut]
    elif ids and is_eog(ids[-1]):
        notes.append(f"llama.cpp stopped at end-of-generation token {ids[-1]}, which is not in "
                     "the EOS list (llama.cpp stops at every end-of-generation token)")
    if len(ids) > max_new_tokens:
        notes.append(f"llama.cpp generated {len(ids)} tokens for a budget of {max_new_tokens}; "
                     "cut at the budget (its time includes the overrun)")
        ids = ids[:max_new_tokens]
    return ids


def run_spec(prompt: list[int], *, target_gguf: str | os.PathLike[str],
             draft_gguf: str | os.PathLike[str], temperature: float, gamma: int,
             max_new_tokens: int, seed: int, threads: int | None, eos: Sequence[int],
             flash_attn: bool, binary: str | os.PathLike[str] | None,
             progress: Progress | None, timeout: float | None, p_min: float = 0.0,
             ignore_eos: bool = False) -> PeerResult:
    """``llamacpp-spec`` on one prompt: ``prefill_seconds`` is the program's "encoded" time,
    ``seconds`` its "encoded" + "decoded" time (see :mod:`verispec.bench.llamacpp`)."""
    for path in (target_gguf, draft_gguf):
        if not Path(path).is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
    binary = binary or speculative_binary() or build_speculative(progress=progress)
    vocab = library._vocab(target_gguf)
    text = prompt_text(vocab, prompt)
    threads = threads or default_threads()
    n_ctx = _ctx_size(len(prompt) + max_new_tokens + gamma + 2)
    with tempfile.TemporaryDirectory(prefix="verispec-llamacpp-") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_bytes(text)
        argv = speculative_argv(binary, target_gguf=target_gguf, draft_gguf=draft_gguf,
                                prompt_file=prompt_file, gamma=gamma, temperature=temperature,
                                seed=seed, max_new_tokens=max_new_tokens, threads=threads,
                                n_ctx=n_ctx, flash_attn=flash_attn, p_min=p_min,
                                ignore_eos=ignore_eos)
        proc = subprocess.run(argv, capture_output=True, check=False, timeout=timeout)
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-25:])
        raise RuntimeError(f"llama-speculative-simple failed (exit code {proc.returncode}): "
                           f"{shlex.join(argv)}\n{tail}")
    out = parse_speculative_output(proc.stdout, stderr, prompt=text)
    stops = f" stopped below p_min={p_min:g}" if p_min else ""
    notes = [(f"llama.cpp speculative decoding (draft-simple, greedy drafts of {gamma}{stops}, "
              f"exact-match verification) of {Path(target_gguf).name} with "
              f"{Path(draft_gguf).name}, {threads} threads, flash attention "
              f"{'on' if flash_attn else 'off'}")]
    masked = library.eog_ids(target_gguf) if ignore_eos else ()
    if ignore_eos:
        notes.append(f"ignore_eos (--ignore-eos): the {len(masked)} end-of-generation ids have "
                     "a -inf logit bias (never sampled)")
    ids = _recovered_ids(out, vocab, prompt, text, () if ignore_eos else eos, notes)
    ids = _cut(ids, out, () if ignore_eos else eos, _eog_checker(vocab), max_new_tokens, notes)
    rounds = out.rounds
    drafted = out.draft_stats.get("gen_tokens", out.n_drafted)
    notes.append(f"llama.cpp: encoded {out.n_input} tokens in {out.encode_seconds:.3f}s, decoded "
                 f"{out.n_predict} in {out.decode_seconds:.3f}s; {rounds} rounds, "
                 f"{out.n_accept}/{out.n_drafted} draft tokens accepted")
    return PeerResult(tokens=ids, seconds=out.seconds, target_calls=int(out.n_input > 1) + rounds,
                      target_positions=rounds + out.n_drafted,
                      draft_calls=1 + rounds + drafted, notes=notes,
                      prefill_seconds=out.encode_seconds, first_tokens=0,
                      masked_tokens=tuple(masked), threads=threads,
                      info={"speculative_system_info": out.system_info or NO_SYSTEM_INFO,
                            "speculative_threads_logged": out.logged_threads,
                            "speculative_build": build_record(binary),
                            "speculative_binary": str(binary)})
