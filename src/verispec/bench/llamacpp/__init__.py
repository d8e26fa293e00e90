"""llama.cpp as a benchmark peer: its plain decoding and its own speculative decoding.

Both peers run the embedded pair's GGUF files (:func:`verispec.models.fetch.model_path` with
``fmt="gguf"``; ``verispec models fetch`` keeps them), i.e. the *quantized* models, not the
float32 safetensors verispec's own methods run.

* ``llamacpp-ar``: plain decoding of the target GGUF through llama-cpp-python. The prompt is
  evaluated from the given token ids (no text round trip), then one token per call is sampled
  by a llama.cpp sampler chain built here: ``greedy`` at T = 0, else ``temp(T)`` followed by
  ``dist(seed)`` and nothing else (no top-k / top-p / min-p / repetition penalty), so it draws
  from the target's own tempered law, with one RNG stream for the whole request. It stops at
  any of the given EOS ids or at the budget. Only generation is timed (prefill + decode, the
  sampling included); loading is not, and loaded models are cached per (file, threads, flash
  attention) in this process (:func:`load_gguf`, :func:`clear_cache`). Its
  ``prefill_seconds`` is the time of ``eval(prompt)`` (the whole prompt, one call) plus the
  first token's sampling: the first generated token is out when it ends.
* ``llamacpp-spec``: llama.cpp's own draft-model speculative decoding, the
  ``llama-speculative-simple`` example program built from the llama.cpp sources vendored in
  the same llama-cpp-python sdist (:func:`build_speculative`, or
  ``python -m verispec.bench.llamacpp build-spec``; :func:`run_llamacpp` builds it on first
  use, which takes minutes), run as a subprocess (:func:`speculative_argv`) and parsed
  (:func:`parse_speculative_output`). The program takes the prompt as *text*: the ids are
  detokenized with llama.cpp's own vocabulary, and the run is refused unless llama.cpp
  tokenizes that text back to exactly the same ids (:func:`prompt_text`).

How llama.cpp speculates (``--spec-type draft-simple``): every round the draft proposes
``--spec-draft-n-max`` = γ tokens greedily (its most probable token at each step; with the
default ``p_min`` = 0, ``--spec-draft-p-min 0``, it never stops a draft early; the method
option ``llamacpp-spec[p_min=P]`` stops it at the first position where the top token's
probability under the draft's own sampler, temperature 1 over its 10 most probable tokens,
is below P), the target scores
``[last token, d_1..d_γ]`` in one batch, and at each position the *target's own sampler*
draws a token; the draft token is accepted when it equals that draw, and the first
mismatching draw (or the draw after γ accepted tokens) ends the round. At T = 0 this is the
target's greedy decoding (up to batch-size-dependent float rounding). At T > 0 it is still
exact in distribution: with a greedy (one-point) draft, accepting d with probability p(d) and
otherwise emitting a draw from p restricted to tokens ≠ d is exactly speculative sampling
with q = δ_d, so every emitted token is a draw of the target's own law. What it gives up
against verispec's verifiers is efficiency (a one-point draft accepts with p(d) only), not
exactness; and it uses its own RNG, so T > 0 outputs differ token by token from the other
peers' at the same seed.

Differences from the other peers to keep in mind: llama.cpp stops at *every*
end-of-generation token of the GGUF's vocabulary (for the embedded Qwen2.5 pair
``<|im_end|>`` 151645 and ``<|endoftext|>`` 151643, as verispec does, and also
``<|fim_pad|>``, ``<|repo_name|>``, ``<|file_sep|>`` 151662-151664 and ``</s>`` 128247,
which verispec's EOS list does not hold;
it cannot be told otherwise without changing the sampling law) and its example may overrun
the budget by a round; the tokens returned are cut at the budget and at the first EOS of the
given list, and the time is llama.cpp's own "encoded" + "decoded" time (model loading and
warm-up excluded). In ``speculative-simple.cpp`` the "encoded" time (``t_enc_start`` to
``t_enc_end``) covers the target's sampler and the speculator's set-up, the target's decode
of the prompt *except its last token* and the draft's reading of that same batch
(``common_speculative_process``, ``common_speculative_begin``); the last prompt token is
the first position of the first verification batch, so the first generated token comes out
of the "decoded" phase. ``prefill_seconds`` is that "encoded" time (the same span as
verispec's own ``prefill_time_s``). The generated ids are read from the program's debug
log (each round's accepted draft ids and the target's token; the final end-of-generation id
included) and checked against its printed text; without those log lines they are recovered
by tokenizing the printed text again (noted in ``PeerResult.notes``).

For the two-sample law test, which needs thousands of seeded generations of one prompt,
llama.cpp's speculation is also served: ``llama-server --model-draft`` built from the same
sources (:mod:`verispec.bench.llamacpp.server`, ``python -m verispec.bench.llamacpp
build-server``) drafts and verifies with the same code as the example, keeps both models
loaded and the prompt cached, and answers one request per seed.

Fixed length (``ignore_eos``): the example always stops at an end-of-generation token, and
its ``--ignore-eos`` (``common/arg.cpp``, applied in ``common_init_from_params``) adds a −inf
logit bias on *every* end-of-generation id of the vocabulary to the target's sampler
(placed before the temperature), so those ids are never sampled, and a draft token that is
one is never accepted: past that point the law is the target's restricted to the other ids
(renormalised), not the target's own. ``llamacpp-ar`` does exactly the same under
``ignore_eos`` (the same −inf biases, from :func:`eog_ids`, ahead of its sampler chain),
so the two llama.cpp peers keep one law between them; the ids masked are reported in
``PeerResult.masked_tokens`` and the bench's law check uses the target's law with them
removed. (verispec's ``ignore_eos`` and the transformers peers' instead keep sampling EOS
from the unchanged law and go on.)

Counting (same conventions as :mod:`verispec.bench.peers`): ``target_calls`` counts target
forward calls including the prefill; ``target_positions`` counts the positions they scored
minus the prompt's first ``len(prompt) − 1``. For ``llamacpp-spec`` they are derived from
the program's own counters (rounds = generated − accepted), and ``draft_calls`` is
1 (prompt) + rounds (the draft re-reads each verified batch) + drafted tokens.

Provenance (:func:`provenance`, :func:`build_record`): the llama-cpp-python version, llama.cpp's
``system_info`` string, the CMake flags of the pip build (unknown: llama-cpp-python records
none; the ggml options and commit its installed CMake package files record are given
instead); for ``llama-speculative-simple`` its ``build.json`` (CMake flags, source version)
with entries of its ``CMakeCache.txt``, the ``system_info`` line it prints if any (the
example of llama-cpp-python 0.3.36 prints none: it never calls
``common_params_print_info``; recorded as such) and the ``n_threads`` of the thread pools
its debug log reports.

Install (llama-cpp-python compiles llama.cpp from source; these flags build only the native
CPU library, no examples, tests, tools, server or multimodal library, no AMX backend:
:data:`verispec.bench.options.NO_AMX_FLAGS` says why)::

    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \\
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \\
      -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_C_FLAGS=-mno-amx-int8 \\
      -DCMAKE_CXX_FLAGS=-mno-amx-int8" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \\
      pip install --no-cache-dir -e '.[peers]'

(``--no-cache-dir``: pip would otherwise reuse a wheel cached from a build with other flags.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from verispec.bench.llamacpp.library import (
    DEFAULT_EOS,
    INSTALL_COMMAND,
    INSTALL_COMMAND_PLAIN,
    LLAMA_CPP_PYTHON_VERSION,
    PEERS,
    LlamaCppUnavailableError,
    Progress,
    _installed_version,
    _llama_cpp,
    clear_cache,
    default_threads,
    eog_ids,
    forward_ms,
    llamacpp_available,
    load_gguf,
    provenance,
    run_ar,
)
from verispec.bench.llamacpp.speculative import (
    SPEC_TARGET,
    SpeculativeOutput,
    build_record,
    build_speculative,
    parse_speculative_output,
    prompt_text,
    run_spec,
    speculative_argv,
    speculative_binary,
)
from verispec.bench.peers import PeerResult

__all__ = [
    "DEFAULT_EOS",
    "INSTALL_COMMAND",
    "INSTALL_COMMAND_PLAIN",
    "LLAMA_CPP_PYTHON_VERSION",
    "PEERS",
    "LlamaCppUnavailableError",
    "SpeculativeOutput",
    "build_record",
    "build_speculative",
    "clear_cache",
    "default_threads",
    "eog_ids",
    "forward_ms",
    "llamacpp_available",
    "load_gguf",
    "parse_speculative_output",
    "prompt_text",
    "provenance",
    "run_llamacpp",
    "speculative_argv",
    "speculative_binary",
]


def run_llamacpp(name: str, prompt_ids: Sequence[int], *, target_gguf: str | os.PathLike[str],
                 draft_gguf: str | os.PathLike[str] | None, temperature: float,
                 gamma: int | None, max_new_tokens: int, seed: int, threads: int | None = None,
                 eos_token_ids: Sequence[int] = DEFAULT_EOS, flash_attn: bool = True,
                 binary: str | os.PathLike[str] | None = None,
                 progress: Progress | None = None, timeout: float | None = None,
                 ignore_eos: bool = False, p_min: float = 0.0) -> PeerResult:
    """Run peer ``llamacpp-ar`` or ``llamacpp-spec`` on one prompt (token ids).

    ``eos_token_ids``: the target's EOS ids (verispec's ``target.eos_token_ids``).
    ``ignore_eos``: decode the whole budget, end-of-generation ids masked (see above).
    ``p_min``: ``llamacpp-spec``'s ``--spec-draft-p-min`` (``llamacpp-ar`` takes none).
    ``threads``: llama.cpp threads for both models (default: every CPU this process may use).
    ``binary``: a ``llama-speculative-simple`` to use (default :func:`speculative_binary`,
    built on first use by :func:`build_speculative`). Raises
    :class:`LlamaCppUnavailableError` (with the install command) without llama-cpp-python.
    """
    if name not in PEERS:
        raise ValueError(f"unknown llama.cpp peer {name!r}; known: {', '.join(PEERS)}")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    _llama_cpp()  # both peers need it (spec: the vocabulary)
    if name == "llamacpp-ar":
        if p_min:
            raise ValueError("llamacpp-ar does not draft: it takes no p_min")
        return run_ar(prompt, gguf=target_gguf, temperature=temperature,
                      max_new_tokens=max_new_tokens, seed=seed, threads=threads,
                      eos=eos_token_ids, flash_attn=flash_attn, ignore_eos=ignore_eos)
    if draft_gguf is None:
        raise ValueError("llamacpp-spec needs a draft GGUF")
    if gamma is None:
        raise ValueError("llamacpp-spec needs an integer gamma")
    return run_spec(prompt, target_gguf=target_gguf, draft_gguf=draft_gguf,
                    temperature=temperature, gamma=gamma, max_new_tokens=max_new_tokens,
                    seed=seed, threads=threads, eos=eos_token_ids, flash_attn=flash_attn,
                    binary=binary, progress=progress, timeout=timeout, p_min=p_min,
                    ignore_eos=ignore_eos)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verispec.bench.llamacpp {status,build-spec,build-server}``."""
    import argparse

    from verispec.bench.llamacpp.server import SERVER_BUILD, build_server, server_binary

    parser = argparse.ArgumentParser(prog="python -m verispec.bench.llamacpp",
                                     description="llama.cpp peers: status and program builds")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="is llama-cpp-python usable, are the programs built")
    builders = {"build-spec": (SPEC_TARGET, build_speculative),
                "build-server": (SERVER_BUILD.target, build_server)}
    for command, (target, _) in builders.items():
        build = sub.add_parser(command, help=f"build {target} into the verispec cache")
        build.add_argument("--source", default=None,
                           help="a llama.cpp tree or an unpacked llama-cpp-python sdist "
                                "(default: download the installed version's sdist with pip)")
        build.add_argument("--jobs", type=int, default=None)
        build.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "status":
        reason = llamacpp_available()
        state = f"usable, version {_installed_version()}" if reason is None else reason
        print(f"llama-cpp-python: {state}")
        print(f"{SPEC_TARGET}: {speculative_binary() or 'not built with the current flags'}")
        print(f"{SERVER_BUILD.target}: {server_binary() or 'not built with the current flags'}")
        return 0 if reason is None else 1
    path = builders[args.command][1](source=args.source, jobs=args.jobs, force=args.force,
                                     progress=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0
