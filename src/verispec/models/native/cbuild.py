"""Building verispec's C kernels (``csrc/``): each source is compiled once per machine (about
a second) into verispec's cache directory, under a name that hashes the source, the flags,
the compiler and torch's version, and linked against the OpenMP runtime torch itself loads,
so its threads are torch's."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import torch

__all__ = ["BUILD_SECONDS", "CSRC", "build", "chosen_isa", "compiler", "env_choice", "isa_library",
           "sources_identity", "unbuildable", "x86_library"]

BUILD_SECONDS = 120
CSRC = Path(__file__).with_name("csrc")  # verispec's C kernels


def _torch_lib() -> Path:
    return Path(torch.__file__).parent / "lib"


def compiler() -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on the path (None: none)."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def unbuildable() -> str | None:
    """Why no kernel can be built here (None: one can be tried)."""
    if not (_torch_lib() / "libgomp.so.1").exists():
        return "this torch build has no libgomp to share"
    if compiler() is None:
        return "no C compiler to build verispec's: set CC"
    return None


def _compile(cc: str, source: Path, flags: Sequence[str], out: Path) -> None:
    """Compile ``source`` into ``out`` (atomically), linked to torch's own libgomp."""
    out.parent.mkdir(parents=True, exist_ok=True)
    obj, tmp = out.with_suffix(f".{os.getpid()}.o"), out.with_suffix(f".{os.getpid()}.tmp")
    lib = _torch_lib()
    try:
        subprocess.run([cc, *flags, "-c", str(source), "-o", str(obj)], check=True,
                       capture_output=True, text=True, timeout=BUILD_SECONDS)
        subprocess.run([cc, "-shared", str(obj), "-o", str(tmp), f"-L{lib}", "-l:libgomp.so.1",
                        f"-Wl,-rpath,{lib}"], check=True, capture_output=True, text=True,
                       timeout=BUILD_SECONDS)
        tmp.replace(out)
    finally:
        obj.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


@cache
def sources_identity(directory: Path = CSRC) -> str:
    """A hash of every C source in ``directory``: what a native model's pass costs depend on
    besides its weights and the machine, so that a record timed with other kernel code is
    timed again rather than trusted."""
    digest = hashlib.sha256()
    for source in sorted(directory.glob("*.c")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


def build(source: Path, stem: str, flags: Sequence[str]) -> ctypes.CDLL:
    """The compiled ``source``, built now if its cached copy is missing. Raises OSError or
    subprocess.SubprocessError where it cannot be built or loaded (see :func:`unbuildable`
    for the reasons known beforehand)."""
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler")
    from verispec.models.fetch import cache_dir

    version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    key = hashlib.sha256("|".join([source.read_text(), torch.__version__, version,
                                   " ".join(flags)]).encode()).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"{stem}-{key}.so"
    if not out.exists():
        _compile(cc, source, flags, out)
    return ctypes.CDLL(str(out))


def x86_library(source: Path, stem: str, flags: Sequence[str]) -> tuple[ctypes.CDLL | None, str]:
    """(the compiled ``source``, "") for an x86-64 kernel, or (None, why it cannot run here:
    another architecture, :func:`unbuildable`, or the compiler's complaint)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"it is for x86-64, not {platform.machine()}"
    why = unbuildable()
    if why is not None:
        return None, why
    try:
        return build(source, stem, flags), ""
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return None, f"it did not build: {detail.strip()[:300]}"


def env_choice(name: str, choices: Sequence[str]) -> str:
    """The environment variable ``name``: one of ``choices``, the first where it is unset;
    another value is refused with a ValueError that lists them."""
    value = os.environ.get(name, choices[0])
    if value not in choices:
        listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise ValueError(f"{name} must be {listed}, not {value!r}")
    return value


def isa_library(lib: ctypes.CDLL, best: str, isas: dict[int, str], needs: tuple[str, str],
                env: str, avx2_asked: bool, runs: str, fallback: str,
                ) -> tuple[ctypes.CDLL | None, str]:
    """A kernel's bound library and what runs, in words: ``(lib, "{runs} ({isa})")`` with the
    instruction set of ``isas`` that its C function ``best`` reports as this CPU's best, or
    its AVX2 path where ``avx2_asked`` (by ``env``=avx2); ``(None, "{fallback} (...)")``
    where the CPU has neither of the two ``needs`` (the ``isas``' names in words)."""
    level = int(getattr(lib, best)())
    if level not in isas:
        return None, f"{fallback} (this CPU has neither {needs[0]} nor {needs[1]})"
    if avx2_asked:
        return lib, f"{runs} (avx2, as {env}=avx2 asks)"
    return lib, f"{runs} ({isas[level]})"


def chosen_isa(lib: ctypes.CDLL | None, best: str, avx2_asked: bool) -> int:
    """The instruction set a kernel's library runs with: the best its C function ``best``
    reports for this CPU, or 1 (its AVX2 path) where ``avx2_asked``; 0 without a library."""
    if lib is None:
        return 0
    level = int(getattr(lib, best)())
    return min(level, 1) if avx2_asked else level
