"""llama.cpp's speculative decoding served: ``llama-server --model-draft``, built from the same
vendored llama.cpp sources as ``llama-speculative-simple`` and run on 127.0.0.1.

The server drafts and verifies with the same code as the example program
(``common/speculative.cpp``'s draft-simple drafter and ``common_sampler_sample_and_accept_n``:
the draft proposes its most probable tokens, the target's own sampler draws at every drafted
position and a draft token is kept while it equals that draw), so it samples the same law.
What it adds is a process that stays up: both models load once and each request reuses the
cached prompt of the one before (``cache_prompt``), so thousands of seeded generations of the
same prompt cost a request each instead of a process each (about 6 s per generation for the
example program on the embedded pair, mostly loading). The two-sample law test
(:mod:`verispec.bench.lawtest`) uses it for ``llamacpp-spec``.

Budget and drafting: the server drafts at most ``n_predict − generated − 1`` tokens per
round; a request whose first k tokens are kept asks for k + 1 (:func:`spec_budget`: every
kept token after the first is still drawn at a drafted position) and is cut to its first k.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verispec.bench.llamacpp.library import Progress, default_threads
from verispec.bench.llamacpp.speculative import (
    SPEC_CMAKE_FLAGS,
    BuildTarget,
    build_target,
    check_draft_settings,
    find_binary,
)
from verispec.bench.server_process import HOST, ServerProcess, free_port

__all__ = [
    "SERVER_BUILD",
    "SERVER_ENV",
    "SpecServer",
    "build_server",
    "completion_body",
    "server_argv",
    "server_binary",
    "spec_budget",
]

SERVER_ENV = "VERISPEC_LLAMA_SERVER"
"""Environment variable naming a ready ``llama-server`` binary to use instead."""

SERVER_BUILD = BuildTarget(
    "llama-server", "build-server",
    tuple(f.replace("TOOLS=OFF", "TOOLS=ON").replace("SERVER=OFF", "SERVER=ON")
          .replace("EXAMPLES=ON", "EXAMPLES=OFF") for f in SPEC_CMAKE_FLAGS))
"""The example build's flags with llama.cpp's tools and server switched on, examples off."""

START_TIMEOUT_S = 300.0  # loading both models and warming up
REQUEST_TIMEOUT_S = 600.0


def server_binary() -> Path | None:
    """The ``llama-server`` to run: ``$VERISPEC_LLAMA_SERVER`` if set, else the finished build
    in the verispec cache made with :data:`SERVER_BUILD`'s flags; None when there is none yet
    (:func:`build_server` makes it)."""
    return find_binary(SERVER_ENV, SERVER_BUILD)


def build_server(*, source: str | os.PathLike[str] | None = None, jobs: int | None = None,
                 force: bool = False, progress: Progress | None = None) -> Path:
    """Build ``llama-server`` (only that CMake target) as
    :func:`~verispec.bench.llamacpp.speculative.build_speculative` builds the example."""
    return build_target(SERVER_BUILD, source=source, jobs=jobs, force=force, progress=progress)


def spec_budget(tokens: int) -> int:
    """``n_predict`` of a request whose first ``tokens`` tokens are kept: ``tokens + 1``. The
    server drafts ``min(γ, n_predict − generated − 1)`` tokens per round, so with this budget
    every round before the ``tokens``-th token drafts at least up to it: each kept token after
    the first (which comes from the prompt's pass) is drawn at a drafted position of a
    verification round, as in an unbounded generation. Drafting past the kept tokens would
    change none of them (only the rows the target scores with them)."""
    if tokens < 1:
        raise ValueError(f"need tokens >= 1, got {tokens}")
    return tokens + 1


def server_argv(binary: str | os.PathLike[str], *, target_gguf: str | os.PathLike[str],
                draft_gguf: str | os.PathLike[str], port: int, gamma: int, threads: int,
                n_ctx: int, p_min: float = 0.0, flash_attn: bool = True,
                slots: int = 1) -> list[str]:
    """Command line of a ``llama-server`` with ``slots`` slots of ``n_ctx`` positions each,
    the draft model and γ =
    ``--spec-draft-n-max`` (``--spec-draft-n-min 0``, ``--spec-draft-p-min p_min``), listening
    on 127.0.0.1 only; the sampler chain is set per request (:func:`completion_body`)."""
    check_draft_settings(gamma, p_min)
    if slots < 1:
        raise ValueError(f"llama-server needs slots >= 1, got {slots}")
    t = str(threads)
    return [
        str(binary), "-m", str(target_gguf), "-md", str(draft_gguf),
        "--spec-type", "draft-simple", "--spec-draft-n-max", str(gamma),
        "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{float(p_min):g}",
        "--host", HOST, "--port", str(port), "-np", str(slots),
        "-c", str(n_ctx * slots),
        "-t", t, "-tb", t, "-td", t, "-tbd", t, "-fa", "on" if flash_attn else "off",
        "--no-webui",
    ]


def completion_body(prompt: Sequence[int], *, seed: int, n_predict: int, temperature: float,
                    gamma: int, p_min: float = 0.0) -> dict[str, Any]:
    """A ``/completion`` request: the prompt as token ids, the sampler chain temperature alone
    (greedy at T = 0; no top-k / top-p / min-p / penalties, as ``llamacpp-ar`` samples), the
    draft settings of :func:`server_argv` and the generated ids returned."""
    return {
        "prompt": [int(t) for t in prompt], "n_predict": int(n_predict),
        "seed": int(seed) & 0xFFFFFFFF, "temperature": float(max(temperature, 0.0)),
        "samplers": ["temperature"], "top_k": 0, "top_p": 1.0, "min_p": 0.0,
        "repeat_penalty": 1.0, "cache_prompt": True, "return_tokens": True, "stream": False,
        "speculative.n_max": int(gamma), "speculative.n_min": 0,
        "speculative.p_min": float(p_min),
    }


class SpecServer(ServerProcess):
    """A running ``llama-server`` with the draft model
    (:class:`~verispec.bench.server_process.ServerProcess`, ready once ``/health`` answers):
    ``complete`` returns the generated ids of one seeded request (thread-safe: up to
    ``slots`` requests run at once, batched by the server)."""

    def __init__(self, *, target_gguf: str | os.PathLike[str], draft_gguf: str | os.PathLike[str],
                 gamma: int, n_ctx: int, threads: int | None = None, p_min: float = 0.0,
                 slots: int = 1, binary: str | os.PathLike[str] | None = None,
                 log_path: Path | None = None, progress: Progress | None = None) -> None:
        found = binary or server_binary() or build_server(progress=progress)
        self.gamma, self.p_min = gamma, p_min
        argv = server_argv(found, target_gguf=target_gguf, draft_gguf=draft_gguf,
                           port=free_port(), gamma=gamma, threads=threads or default_threads(),
                           n_ctx=n_ctx, p_min=p_min, slots=slots)
        super().__init__(argv, {}, name="llama-server", ready_path="/health",
                         start_timeout_s=START_TIMEOUT_S, log_path=log_path)

    def complete(self, prompt: Sequence[int], *, seed: int, n_predict: int,
                 temperature: float) -> dict[str, Any]:
        """One ``/completion`` request (:func:`completion_body`); the server's JSON answer,
        whose ``tokens`` are the generated ids."""
        body = completion_body(prompt, seed=seed, n_predict=n_predict, temperature=temperature,
                               gamma=self.gamma, p_min=self.p_min)
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:  # loopback
                answer = dict(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"llama-server answered {exc.code}: "
                               f"{exc.read().decode('utf-8', 'replace')[:500]}") from exc
        if not isinstance(answer.get("tokens"), list):
            raise RuntimeError(f"llama-server returned no token ids: {str(answer)[:300]}")
        return answer
