"""Building a :class:`Transformer` from Hugging Face weights, and the int8 disk cache.

Sources: a Hugging Face directory (``config.json`` and ``*.safetensors``, sharded or not),
read one tensor at a time, or an in-memory transformers module. Fusions made here: q/k/v
into one matrix, gate/up into one matrix.

Int8: every linear layer, lm_head included, becomes int8 with per-output-channel scales.
Int4 (a draft's format where it steps faster; a target's only when asked for): every
linear layer becomes weight-only int4. In both the embedding is
stored as float16 (only the looked-up rows are read). A quantized state is saved in
verispec's cache directory, never in the model's (other tools load every ``*.safetensors``
of a model directory): :func:`cache_file` names one file per model directory, precision,
int8 kernel and machine signature (:func:`~verispec.models.native.kernels.signature`: torch,
CPU flags, ISA caps and the kernels proven exact), so a layout or code width made for
another CPU is never served. It is written under a temporary name and renamed into place,
and loaded directly when present and made from the same weights by the same format version.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import verispec.models.native.kernels as kernels
from verispec.models.native.config import NativeConfig
from verispec.models.native.kernels import Int8Kernel
from verispec.models.native.linear import (
    LAYER_LINEARS,
    DenseLinear,
    Int4Linear,
    Int8Linear,
    SubsetHead,
    quantize_weight,
)
from verispec.models.native.model import Block, Transformer

__all__ = [
    "CACHE_FILES",
    "LAYER_LINEARS",
    "build_dense",
    "build_int4",
    "build_int8",
    "cache_file",
    "dir_tensors",
    "int4_state",
    "int8_layers",
    "int8_state",
    "linear_layers",
    "load_cache",
    "module_tensors",
    "packed_state",
    "save_cache",
]

#: precision -> format version of a cache file's contents
CACHE_VERSIONS = {"int8": "verispec-int8/7", "int4": "verispec-int4/3"}
#: names of the caches that older versions wrote into a model directory (never read as
#: weights, never written any more)
CACHE_FILES = {"int8": "verispec-int8.safetensors", "int4": "verispec-int4.safetensors"}

Getter = Callable[[str], Tensor | None]  # HF tensor name -> tensor (None if absent)


def _prefixes(names: Any) -> str:
    """'model.' for *ForCausalLM checkpoints, '' for bare decoders."""
    return "model." if any(n.startswith("model.layers.") for n in names) else ""


def module_tensors(module: Any) -> Getter:
    """Tensors of an in-memory transformers module, by their checkpoint names."""
    state = module.state_dict()
    return state.get


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    files = [f for f in files if f.name not in CACHE_FILES.values()]
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    return files


def dir_tensors(path: str | os.PathLike[str]) -> Getter:
    """Lazy reader of a Hugging Face directory's safetensors (one tensor at a time)."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for f in _weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as h:
            where.update({name: f for name in h.keys()})  # noqa: SIM118 (not a dict)

    def get(name: str) -> Tensor | None:
        if name not in where:
            return None
        with safe_open(str(where[name]), framework="pt") as h:
            return h.get_tensor(name)

    get.names = list(where)  # type: ignore[attr-defined]
    return get


def _names(get: Getter) -> list[str]:
    names = getattr(get, "names", None)
    if names is None:  # a dict's .get bound method
        names = list(getattr(get, "__self__", {}))
    return names


def _layer_tensors(c: NativeConfig, get: Getter) -> Iterator[dict[str, Tensor | None]]:
    """Per layer: fused weights and biases plus the two RMSNorm weights (float, CPU)."""
    pre = _prefixes(_names(get))

    def cat(*names: str) -> Tensor | None:
        parts = [get(n) for n in names]
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise ValueError(f"some but not all of {names} are present")
        return torch.cat(parts)  # type: ignore[arg-type]

    for i in range(c.layers):
        a, m = f"{pre}layers.{i}.self_attn.", f"{pre}layers.{i}.mlp."
        yield {
            "qkv.weight": cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            "qkv.bias": cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"),
            "o.weight": get(a + "o_proj.weight"),
            "o.bias": get(a + "o_proj.bias"),
            "gate_up.weight": cat(m + "gate_proj.weight", m + "up_proj.weight"),
            "gate_up.bias": cat(m + "gate_proj.bias", m + "up_proj.bias"),
            "down.weight": get(m + "down_proj.weight"),
            "down.bias": get(m + "down_proj.bias"),
            "qkv.norm": get(f"{pre}layers.{i}.input_layernorm.weight"),
            "gate_up.norm": get(f"{pre}layers.{i}.post_attention_layernorm.weight"),
        }


def _embed_and_head(c: NativeConfig, get: Getter) -> tuple[Tensor, Tensor, Tensor]:
    pre = _prefixes(_names(get))
    embed = get(f"{pre}embed_tokens.weight")
    head = get("lm_head.weight")
    if head is None or c.tied:
        head = embed
    norm = get(f"{pre}norm.weight")
    if embed is None or head is None or norm is None:
        raise ValueError("missing embedding, final norm or lm_head weights")
    return embed, head, norm


def build_dense(c: NativeConfig, get: Getter, dtype: torch.dtype, device: torch.device,
                vocabulary: Tensor | None = None) -> Transformer:
    """float32 / bfloat16 weights on any device (an lm_head over the ids ``vocabulary``
    only, when given: :class:`SubsetHead`)."""

    def put(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype).contiguous()

    blocks = []
    for t in _layer_tensors(c, get):
        def lin(name: str, norm: bool = False, t: dict[str, Tensor | None] = t) -> DenseLinear:
            return DenseLinear(put(t[f"{name}.weight"]), put(t[f"{name}.bias"]),  # type: ignore[arg-type]
                               put(t[f"{name}.norm"]) if norm else None, c.norm_eps)

        blocks.append(Block(lin("qkv", True), lin("o"), lin("gate_up", True), lin("down")))
    embed, head, norm = _embed_and_head(c, get)
    tied = head is embed
    embed = put(embed)  # type: ignore[assignment]
    rows = embed if tied else put(head)  # [V, H]
    head_w = rows
    if vocabulary is not None:
        head_w = head_w[vocabulary.to(head_w.device)].contiguous()  # type: ignore[index]
    head_lin = DenseLinear(head_w, None, put(norm), c.norm_eps)  # type: ignore[arg-type]
    return Transformer(c, embed, blocks, _subset(head_lin, vocabulary, c, rows), dtype=dtype,
                       device=device)


def _subset(head: Any, vocabulary: Tensor | None, c: NativeConfig,
            rows: Tensor | None = None) -> Any:
    """``head`` as is, or as a :class:`SubsetHead` over the ids ``vocabulary`` that scores
    context ids from ``rows`` [V, H] (all the head's rows; None: it scores none)."""
    return head if vocabulary is None else SubsetHead(head, vocabulary, c.vocab_size, rows)


def _subset_rows(state: dict[str, Tensor]) -> Tensor | None:
    """The head's rows [V, H] a subset head scores context ids from: its own ``head.rows``,
    the embedding where the head is the embedding (tied, no folding), or None (a cache
    made without them)."""
    if "head.ids" not in state:
        return None
    return state.get("head.rows", state["embed"] if "head.tied" in state else None)


def int4_state(c: NativeConfig, get: Getter, vocabulary: Tensor | None = None,
               ) -> dict[str, Tensor]:
    """Every linear layer (lm_head included: the rows ``vocabulary`` only, when given) as
    weight-only int4 (:class:`~verispec.models.native.linear.Int4Linear`), plus the float16
    embedding: a flat dict of tensors."""
    state: dict[str, Tensor] = {}
    for i, t in enumerate(_layer_tensors(c, get)):
        for n in LAYER_LINEARS:
            state.update(Int4Linear.quantize(t[f"{n}.weight"], t[f"{n}.bias"],  # type: ignore[arg-type]
                                             t.get(f"{n}.norm"), c.norm_eps).state(f"layers.{i}.{n}"))
    embed, head, norm = _embed_and_head(c, get)
    if vocabulary is not None:
        if head is embed:  # the rows of context ids are the embedding's
            state["head.tied"] = torch.ones(1, dtype=torch.uint8)
        else:
            state["head.rows"] = head.to(torch.float16).contiguous()
        head, state["head.ids"] = head[vocabulary], vocabulary
    state.update(Int4Linear.quantize(head, None, norm, c.norm_eps).state("head"))
    state["embed"] = embed.to(torch.float16).contiguous()
    return state


def build_int4(c: NativeConfig, state: dict[str, Tensor]) -> Transformer:
    """The CPU int4 model from :func:`int4_state`'s tensors."""
    blocks = [Block(*[Int4Linear.from_state(state, f"layers.{i}.{n}", c.norm_eps)
                      for n in LAYER_LINEARS]) for i in range(c.layers)]
    head = _subset(Int4Linear.from_state(state, "head", c.norm_eps), state.get("head.ids"), c,
                   _subset_rows(state))
    return Transformer(c, state["embed"], blocks, head, dtype=torch.float32,
                       device=torch.device("cpu"))


# -- int8 ----------------------------------------------------------------------------------------

DOWN_BLOCK = 256  # block size of the online rotation of down_proj's input
O_BLOCK = 64  # block size of the online rotation of o_proj's input
#: layers whose activations are fed as two codes (:class:`Int8Linear`'s ``split``)
SPLIT_LAYERS: tuple[str, ...] = ()


def _rotation(n: int, seed: int = 0) -> Tensor:
    """A fixed random orthogonal matrix [n, n] (QR of a seeded Gaussian matrix)."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn((n, n), generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def _signed_hadamard(n: int, seed: int) -> Tensor:
    """D H / √n [n, n] for n a power of two: Sylvester's Hadamard matrix H with its rows'
    signs D drawn from a seeded generator; orthogonal, every entry ±1/√n."""
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(2, (n, 1), generator=g, dtype=torch.float64) * 2 - 1  # [n, 1]
    return (signs * h / n ** 0.5).float()


def _online_rotation(b: int, seed: int, hadamard: bool) -> tuple[Tensor, Tensor | None]:
    """The run-time rotation of a block of b channels as (A, B): A ⊗ B with A and B signed
    Hadamard matrices of √b channels each (√(2b) and √(b/2) where b is not a square) (``hadamard``), or (R, None)
    with R a dense random orthogonal [b, b]."""
    if not hadamard:
        return _rotation(b, seed=seed), None
    p = 1 << ((b.bit_length()) // 2)  # b = p q, p ≥ q, both powers of two
    return _signed_hadamard(p, seed), _signed_hadamard(b // p, seed + 1)


def _block(width: int, wanted: int) -> int | None:
    """The largest power of two ≤ ``wanted`` dividing ``width`` (None below 8)."""
    b = wanted
    while b >= 8 and width % b:
        b //= 2
    return b if b >= 8 else None


def _folded(t: dict[str, Tensor | None], rot: Tensor | None,
            blocks: dict[str, Tensor]) -> dict[str, Tensor | None]:
    """One layer's float tensors with the residual rotation ``rot`` [H, H] and the run-time
    input rotations ``blocks`` ({layer: [b, b]}) folded in (:func:`int8_state`)."""
    w = {k: (None if v is None else v.float()) for k, v in t.items()}
    if rot is not None:
        for n in ("qkv", "gate_up"):  # read the residual: W diag(γ) Q^T, norm weight 1
            w[f"{n}.weight"] = (w[f"{n}.weight"] * w[f"{n}.norm"]) @ rot.T  # type: ignore[operator]
            w[f"{n}.norm"] = torch.ones_like(w[f"{n}.norm"])  # type: ignore[arg-type]
        for n in ("o", "down"):  # write to the residual: Q W, Q b
            w[f"{n}.weight"] = rot @ w[f"{n}.weight"]  # type: ignore[operator]
            if w[f"{n}.bias"] is not None:
                w[f"{n}.bias"] = rot @ w[f"{n}.bias"]  # type: ignore[operator]
    for n, block in blocks.items():  # a' = a B at run time, W' = W B
        wn, b = w[f"{n}.weight"], block.shape[0]
        w[f"{n}.weight"] = (wn.view(wn.shape[0], -1, b) @ block).view(wn.shape)  # type: ignore[union-attr]
    return w


def int8_state(c: NativeConfig, get: Getter, progress: Callable[[str], None] | None = None, *,
               rotate: bool = True, down_block: int | None = DOWN_BLOCK,
               o_block: int | None = O_BLOCK, split: tuple[str, ...] = SPLIT_LAYERS,
               vocabulary: Tensor | None = None, hadamard: bool = True) -> dict[str, Tensor]:
    """Quantize every linear layer (see :mod:`verispec.models.native.linear`): a flat dict of
    int8 weights, float32 scales, biases, RMSNorm weights and rotations, plus the float16
    embedding. ``vocabulary``: the lm_head keeps these rows only (a draft that scores a
    vocabulary subset, :class:`~verispec.models.native.linear.SubsetHead`).

    Per-token int8 activations lose precision in rows whose energy sits in a few outlier
    channels, so two orthogonal changes of basis spread it first (as in QuaRot/SpinQuant):

    * ``rotate``: the residual stream is turned by a fixed random orthogonal Q [H, H], folded
      into the weights (free at run time). The RMSNorm weights move into the matrices that
      follow them, then embedding rows become e Q^T, matrices reading the residual W Q^T and
      matrices writing to it Q W. RMSNorm commutes with Q, so the float function is the same.
    * ``down_block``, ``o_block``: the inputs of down_proj (after the SiLU gate) and of o_proj
      (the attention heads' outputs), where no folding is possible, are multiplied at run
      time by a block-diagonal orthogonal matrix B (one b×b block repeated, b = 256 and 64)
      and the weights become W B. The block is a Kronecker product of two signed Hadamard
      matrices (16 ⊗ 16 and 8 ⊗ 8; ``hadamard``, as in QuaRot), which spreads every
      channel evenly over the block (all entries ±1/√b) and is applied in two matmuls of
      width √b; ``hadamard=False``: one dense random orthogonal block.

    Measured on the 1.5B target with 8-bit codes (KL(float32 ‖ int8) per token, 600
    positions of code and a chat prompt): plain per-token int8 0.026, SmoothQuant (α = 0.5)
    0.010, the residual rotation and a 64-block down_proj rotation 0.003. With 7-bit codes
    (858 teacher-forced positions of 6 HumanEval solutions): down_proj blocks of 64 0.0032,
    of 128 0.0027, plus o_proj blocks of 64 0.0025; along the float32 model's greedy texts
    of 12 benchmark prompts (``python -m verispec.bench.fidelity --blocks``, 815 positions):
    down_proj/o_proj blocks of 128/64 0.0031, 256/64 0.0024, 256/128 0.0025.
    """
    state: dict[str, Tensor] = {}
    embed, head, final_norm = _embed_and_head(c, get)
    embed, head, final_norm = embed.float(), head.float(), final_norm.float()
    rot = _rotation(c.hidden) if rotate else None  # [H, H] orthogonal
    if rot is not None:
        embed = embed @ rot.T  # [V, H]
        head, final_norm = (head * final_norm) @ rot.T, torch.ones_like(final_norm)
    online = {}  # layer -> the online rotation of its input: (A, B) for A ⊗ B, or (R, None)
    for name, width, wanted, seed in (("down", c.intermediate, down_block, 1),
                                      ("o", c.heads * c.head_dim, o_block, 2)):
        b = _block(width, wanted) if wanted else None
        if b:
            online[name] = _online_rotation(b, seed, hadamard)
    blocks = {n: a if b is None else torch.kron(a, b) for n, (a, b) in online.items()}  # [b, b]

    def add(prefix: str, weight: Tensor, bias: Tensor | None, norm: Tensor | None,
            rot: tuple[Tensor, Tensor | None] | None = None) -> None:
        q, scale = quantize_weight(weight)
        state[f"{prefix}.qweight"], state[f"{prefix}.scale"] = q, scale
        if prefix.rsplit(".", 1)[-1] in split:
            state[f"{prefix}.split"] = torch.ones(1, dtype=torch.uint8)
        if bias is not None:
            state[f"{prefix}.bias"] = bias.float().contiguous()
        if norm is not None:
            state[f"{prefix}.norm"] = norm.float().contiguous()
        if rot is not None:
            state[f"{prefix}.rot"] = rot[0]
            if rot[1] is not None:
                state[f"{prefix}.rot_b"] = rot[1]

    for i, t in enumerate(_layer_tensors(c, get)):
        w = _folded(t, rot, blocks)
        for n in LAYER_LINEARS:
            add(f"layers.{i}.{n}", w[f"{n}.weight"], w[f"{n}.bias"], w.get(f"{n}.norm"),  # type: ignore[arg-type]
                online.get(n))
        if progress and (i + 1) % 8 == 0:
            progress(f"quantized {i + 1}/{c.layers} layers")
    if vocabulary is not None:  # the rows of context ids, as the head reads them
        state["head.rows"] = head.to(torch.float16).contiguous()
        head, state["head.ids"] = head[vocabulary], vocabulary
    add("head", head, None, final_norm)
    state["embed"] = embed.to(torch.float16).contiguous()
    return state


def build_int8(c: NativeConfig, state: dict[str, Tensor], kernel: Int8Kernel | None = None,
               ) -> Transformer:
    """The CPU int8 model from :func:`int8_state`'s tensors (packed for the int8 kernel) or
    from :func:`packed_state`'s (oneDNN weights already packed)."""
    eps = c.norm_eps
    blocks = []
    for i in range(c.layers):
        blocks.append(Block(*[Int8Linear.from_state(state, f"layers.{i}.{name}", eps, kernel)
                              for name in LAYER_LINEARS]))
    head = _subset(Int8Linear.from_state(state, "head", eps, kernel), state.get("head.ids"), c,
                   _subset_rows(state))
    # rows never see each other: neither may attention's rounding
    return Transformer(c, state["embed"], blocks, head, dtype=torch.float32,
                       device=torch.device("cpu")).exact()


def linear_layers(net: Transformer) -> list[Any]:
    """Every linear layer of ``net`` in the order a pass runs them (the head last: a
    SubsetHead's own layer)."""
    head = getattr(net.head, "linear", net.head)
    return [getattr(b, name) for b in net.blocks for name in LAYER_LINEARS] + [head]


def int8_layers(net: Transformer) -> list[Int8Linear]:
    """Every int8 linear layer of ``net`` in the order a pass runs them (the head last)."""
    return [x for x in linear_layers(net) if isinstance(x, Int8Linear)]


def packed_state(net: Transformer) -> dict[str, Tensor]:
    """What the int8 disk cache holds: every layer as its kernel wants it, and the embedding."""
    state: dict[str, Tensor] = {"embed": net.embed}
    for i, block in enumerate(net.blocks):
        for name in LAYER_LINEARS:
            state.update(getattr(block, name).state(f"layers.{i}.{name}"))
    state.update(net.head.state("head"))  # type: ignore[union-attr] (ids too for a subset)
    return state


def _source_stamp(path: Path) -> str:
    """Names, sizes and modification times of the float weights the cache was made from."""
    return json.dumps({f.name: [f.stat().st_size, f.stat().st_mtime_ns]
                       for f in _weight_files(path)}, sort_keys=True)


def cache_file(path: str | os.PathLike[str], precision: str,
               kernel: Int8Kernel | None = None, vocabulary: Tensor | None = None, *,
               online_rotations: bool = True) -> Path:
    """verispec's cache file for the ``precision`` (int8 or int4) weights of the model in
    directory ``path``, made for int8 ``kernel`` (int8 only) and the running CPU's
    :func:`~verispec.models.native.kernels.signature`, with an lm_head over the ids
    ``vocabulary`` (None: all) and, for int8, with or without the run-time rotations of
    :func:`int8_state` (``online_rotations``)."""
    from verispec.models.fetch import cache_dir

    path = Path(path).resolve()
    where = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    if precision == "int8":
        if kernel is None:
            raise ValueError("an int8 cache file is made for one int8 kernel")
        tag = f"int8-{kernel.name}-{kernel.bits}bit" + ("" if online_rotations else "-r0")
    else:
        tag = precision
    if vocabulary is not None:
        ids = vocabulary.to(torch.int64).numpy().tobytes()
        tag += f"-v{vocabulary.numel()}-{hashlib.sha256(ids).hexdigest()[:8]}"
    name = f"{tag}-{kernels.signature()}.safetensors"
    return cache_dir() / "quantized" / f"{path.name}-{where}" / name


def load_cache(path: str | os.PathLike[str], precision: str,
               kernel: Int8Kernel | None = None, vocabulary: Tensor | None = None, *,
               online_rotations: bool = True) -> dict[str, Tensor] | None:
    """The cached ``precision`` (int8 or int4) state of the model in directory ``path``, or
    None when there is none or it was made from other weights or by another format version
    (the file's name already pins the kernel and the machine signature)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    file = cache_file(path, precision, kernel, vocabulary, online_rotations=online_rotations)
    if not file.exists():
        return None
    try:
        with safe_open(str(file), framework="pt") as h:
            meta = h.metadata() or {}
        if (meta.get("format") != CACHE_VERSIONS[precision]
                or meta.get("source") != _source_stamp(Path(path))
                or meta.get("cpu") != kernels.signature()):
            return None
        state = {k: v for k, v in load_file(str(file)).items()  # mmapped: read on first use
                 if not k.startswith("__pad__.")}
    except (OSError, ValueError, RuntimeError):  # unreadable or truncated: rebuild it
        return None
    if any(t.data_ptr() % ALIGN for t in state.values() if t.numel()):
        state = {k: v.clone() for k, v in state.items()}  # a file written by other means
    return state


ALIGN = 64  # byte alignment of every tensor in the cache file (packed weights are mmapped)
_DTYPES = {torch.int8: "I8", torch.uint8: "U8", torch.int64: "I64", torch.float32: "F32",
           torch.float16: "F16", torch.bfloat16: "BF16"}


def _write_aligned(tensors: dict[str, Tensor], file: str, metadata: dict[str, str]) -> None:
    """A safetensors file whose tensors all start at multiples of :data:`ALIGN` bytes in the
    file (gaps are filled by ``__pad__.i`` tensors, the header by trailing spaces), so the
    mmapped tensors ``load_file`` returns are aligned for vector loads."""
    header: dict[str, Any] = {"__metadata__": metadata}
    order: list[Tensor | int] = []  # tensors, or pad byte counts
    offset = 0
    for name, t in tensors.items():
        pad = -offset % ALIGN
        if pad:
            header[f"__pad__.{len(order)}"] = {"dtype": "U8", "shape": [pad],
                                               "data_offsets": [offset, offset + pad]}
            order.append(pad)
            offset += pad
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        order.append(t)
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)
    with open(file, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for item in order:
            if isinstance(item, int):
                f.write(bytes(item))
            else:
                f.write(item.detach().contiguous().view(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())


def save_cache(path: str | os.PathLike[str], precision: str, state: dict[str, Tensor],
               kernel: Int8Kernel | None = None, vocabulary: Tensor | None = None, *,
               online_rotations: bool = True) -> Path:
    """Write ``state`` to :func:`cache_file` atomically; returns the file."""
    file = cache_file(path, precision, kernel, vocabulary, online_rotations=online_rotations)
    file.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": CACHE_VERSIONS[precision], "source": _source_stamp(Path(path)),
            "cpu": kernels.signature(), "kernel": str(kernel) if kernel else precision,
            "model": str(Path(path).resolve())}
    fd, tmp = tempfile.mkstemp(prefix=f".{precision}-", suffix=".tmp", dir=file.parent)
    os.close(fd)
    try:
        _write_aligned(state, tmp, meta)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return file
