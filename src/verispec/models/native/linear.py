"""The kinds of linear layer the native model runs: dense (float32 / bfloat16, any
device), int8 (x86 CPU) and weight-only int4 (x86 CPU; a target only on verispec's int4
kernel).

All offer the two shapes a decoder layer needs:

* ``layer(x)`` — ``linear(rmsnorm(x))`` when the layer owns the RMSNorm in front of it
  (q/k/v, gate/up, lm_head), plain ``linear(x)`` otherwise;
* ``layer.add_to(residual, x)`` — ``residual + linear(x)`` (o_proj, down_proj).

x is always 2-D, [M, K] -> [M, N].

**Int8.** Weights are int8 with one symmetric scale per output channel. Activations are
quantized **per row** (per token): row m is divided by its own max-abs a_m, so it lies in
[-1, 1], is quantized with a fixed scale (uint8 codes around a fixed zero point) and the
result is multiplied by a_m. Nothing a row sees depends on the other rows of the pass
(PyTorch's dynamic int8 linear picks one scale for the whole tensor, so an outlier in one
token would move every other token's output), which speculative decoding needs: scoring k
tokens in one pass gives each position the distribution it gets one token at a time.

The kernel and the width of the codes (8 bits where the CPU accumulates products in int32,
7 bits where it adds pairs of them in a saturating int16) come from
:mod:`verispec.models.native.kernels`, which proves every candidate exact on this CPU.

**Two codes per activation.** A layer built with ``split`` feeds each row twice: once as
its codes h = round(L v) (L = 63 or 127 steps per sign) and once as the codes of what they
missed, r = round(2 L² v − 2 L h); the kernel scores the 2M rows in one pass and the layer
adds the halves, y = W h / L + W r / (2 L²). The activation then carries 13 bits (7-bit
codes) or 15 bits (8-bit codes) for twice the rows, which costs little in a decoding pass
(the weights are read once for both) and is exact in the same way: integer products and
one per-row float epilogue.

The RMSNorm in front of a layer is folded: rmsnorm(x) ⊙ γ = r · (x ⊙ γ) with one number r
per row, and a row's scalar factors cancel in the division by its max-abs, so the int8
layer quantizes x ⊙ γ directly and multiplies the output by r · a. (Per-channel smoothing
factors, as in SmoothQuant, would enter the same way: x ⊙ γ / s with W·diag(s).)
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor

import verispec.models.native.codes_kernel as codes_kernel
import verispec.models.native.kernels as kernels
import verispec.models.native.onednn as onednn
import verispec.models.native.int4_kernel as int4_kernel
from verispec.models.native.kernels import Int8Kernel

__all__ = ["DRAFT_TIMING_LAYERS", "DRAFT_TIMING_WEIGHTS", "LAYER_LINEARS", "DenseLinear",
           "Int4Linear", "Int8Linear", "SubsetHead", "default_kernel", "draft_layer_times",
           "int4_available", "int4_draft_faster", "int8_available", "quantize_weight",
           "split_pass_sizes"]

#: The linear layers of a decoder block (the fields of
#: :class:`~verispec.models.native.model.Block`), in the order a pass runs them
LAYER_LINEARS = ("qkv", "o", "gate_up", "down")


class DenseLinear:
    """y = x @ W^T + b in the weights' dtype, optionally after RMSNorm (γ, eps)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, norm: Tensor | None = None,
                 eps: float = 1e-6) -> None:
        self.weight = weight  # [N, K]
        self.bias = bias  # [N] or None
        self.norm = norm  # [K] RMSNorm weight γ, or None for a layer without a norm
        self.eps = eps
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: Tensor) -> Tensor:
        if self.norm is not None:  # bit-identical to transformers' Qwen2RMSNorm in float32
            x = F.rms_norm(x, (self.in_features,), self.norm, self.eps)
        return F.linear(x, self.weight, self.bias)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        return residual + F.linear(x, self.weight, self.bias)


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """[N, K] float -> (int8 [N, K], float32 scale [N]); symmetric, one scale per output row."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # [N]
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_available() -> bool:
    """Some int8 kernel of this torch is proven exact on this CPU (:mod:`kernels`)."""
    return bool(kernels.proven())


def default_kernel() -> Int8Kernel:
    """The int8 kernel chosen for this CPU (:func:`kernels.choose`); ValueError if none."""
    kernel, why = kernels.choose()
    if kernel is None:
        raise ValueError(f"int8 is not available: {why}")
    return kernel


def _present(prefix: str, **tensors: Tensor | None) -> dict[str, Tensor]:
    """``{prefix.name: tensor}`` for the optional tensors of a layer that it has."""
    return {f"{prefix}.{name}": t for name, t in tensors.items() if t is not None}


class Int8Linear:
    """y = Wq (u / a) · a + b per row, u the (normed) input, a its row max-abs (module doc).

    ``kernel``: the library and code width (:class:`~verispec.models.native.kernels.
    Int8Kernel`); every kernel of the table computes exact integer dot products where it is
    used, so a row's output does not depend on the other rows. The bias is added after the
    per-row rescaling, so it stays out of the packed weights.
    """

    def __init__(self, packed: dict[str, object], scale: Tensor, bias: Tensor | None,
                 norm: Tensor | None, eps: float, shape: tuple[int, int], kernel: Int8Kernel,
                 keep: tuple[Tensor, ...] = (), rot: Tensor | None = None,
                 split: bool = False, rot_b: Tensor | None = None) -> None:
        self.packed = packed  # {library: packed weights} (:func:`kernels.pack_all`)
        # a mixed kernel's passes of this many rows or more run on its second library
        # (:func:`split_pass_sizes` times where; until then the first library runs them all)
        self.wide_from = kernels.NO_ROWS
        self.split = split  # two codes per activation (module doc): finer, twice the rows
        # the input's block rotation (:meth:`_rotate`), applied in float64: a float32 matmul's
        # summation order follows the kernel its shape selects (a one-row pass takes a
        # matrix-vector path), float64 rounded to float32 gives every row the same result
        # whatever the pass holds. rot [p, p] alone: a dense block of b = p channels; with
        # rot_b [q, q]: the block rot ⊗ rot_b of b = p q channels, applied in two small steps
        self.rot = None if rot is None else rot.double().contiguous()
        self.rot_b = None if rot_b is None else rot_b.double().contiguous()
        self.scale = scale.float().contiguous()  # [N]
        self._out_scale = self.scale * kernel.x_scale  # [N] per output: weight × code step
        self.bias = None if bias is None else bias.float().contiguous()  # [N]
        self.norm = None if norm is None else norm.float().contiguous()  # [K]
        # channel factors that are all 1 (a rotated model) need no multiplication
        self._factors = None if norm is None or bool((norm == 1).all()) else self.norm
        self.eps = eps
        self.out_features, self.in_features = shape
        self.kernel = kernel
        self._keep = keep  # tensors the packed weight lives on (restored oneDNN blobs), or
        # the int8 weight itself (fbgemm or a mixed kernel), for saving
        self._half = torch.tensor(kernel.x_zero + 0.5)  # rounding offset: trunc(v + z + .5)
        self._eps = torch.tensor(eps)
        # the codes made by verispec's fused kernel (decided once: it is built here and
        # takes this layer's rotation), else by torch operators
        self._fused = not split and codes_kernel.takes(rot, rot_b)
        self._codes = None if not self._fused else codes_kernel.RowCodes(
            self._factors, self.rot, self.rot_b, kernel.x_scale, kernel.x_zero,
            None if norm is None else eps)

    @classmethod
    def from_int8(cls, qweight: Tensor, scale: Tensor, bias: Tensor | None = None,
                  norm: Tensor | None = None, eps: float = 1e-6,
                  kernel: Int8Kernel | None = None, rot: Tensor | None = None,
                  split: bool = False, rot_b: Tensor | None = None) -> Int8Linear:
        """From int8 [N, K] weights and their scales [N] (packs them: slow for big layers)."""
        kernel = kernel or default_kernel()
        keep = () if kernel.saves_packed else (qweight,)
        return cls(kernels.pack_all(kernel, qweight), scale, bias, norm, eps,
                   tuple(qweight.shape), kernel, keep, rot, split, rot_b)

    def state(self, prefix: str) -> dict[str, Tensor]:
        """Tensors that rebuild this layer (:meth:`from_state`): the packed oneDNN bytes and
        descriptor for a oneDNN kernel, else the int8 weight (fbgemm and mixed kernels pack
        it at load)."""
        out = {f"{prefix}.scale": self.scale}
        if self.kernel.saves_packed:  # oneDNN's packed bytes
            blob, md = onednn.save(self.packed["onednn"])  # type: ignore[arg-type]
            out[f"{prefix}.blob"], out[f"{prefix}.md"] = blob, md
            out[f"{prefix}.shape"] = torch.tensor([self.out_features, self.in_features])
        else:
            out[f"{prefix}.qweight"] = self._keep[0]
        rot, rot_b = (None if r is None else r.float()  # made in float32: exact
                      for r in (self.rot, self.rot_b))
        split = torch.ones(1, dtype=torch.uint8) if self.split else None
        return out | _present(prefix, bias=self.bias, norm=self.norm, rot=rot, split=split,
                              rot_b=rot_b)

    @classmethod
    def from_state(cls, state: dict[str, Tensor], prefix: str, eps: float,
                   kernel: Int8Kernel | None = None) -> Int8Linear:
        """The layer from :meth:`state`'s tensors (packed oneDNN bytes only for a oneDNN
        ``kernel``) or from unpacked int8 weights (packed here for ``kernel``)."""
        kernel = kernel or default_kernel()
        scale, bias, norm, rot, rot_b = (state.get(f"{prefix}.{x}")
                                         for x in ("scale", "bias", "norm", "rot", "rot_b"))
        split = f"{prefix}.split" in state
        if f"{prefix}.blob" in state:
            if not kernel.saves_packed:
                raise ValueError(f"{prefix}: packed oneDNN weights cannot run on {kernel}")
            blob, md = state[f"{prefix}.blob"], state[f"{prefix}.md"]
            n, k = int(scale.numel()), int(state[f"{prefix}.shape"][1])  # type: ignore[union-attr]
            packed = {"onednn": onednn.restore(blob, md, (k, n))}
            return cls(packed, scale, bias, norm, eps, (n, k), kernel, (blob, md), rot, split,  # type: ignore[arg-type]
                       rot_b)
        return cls.from_int8(state[f"{prefix}.qweight"], scale, bias, norm, eps, kernel, rot,  # type: ignore[arg-type]
                             split, rot_b)

    def _scaled(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(y [M, N], s [M, 1]) with y·s the layer's output before the bias.

        Without a norm: u = x, a = max|u| per row, y = Wq (u / a), s = a.
        With a norm: rmsnorm(x) = r x ⊙ c with r = 1 / sqrt(mean(x²) + eps) one number per
        row, so u = x ⊙ c is quantized (r cancels in u / a) and s = a·r.
        The codes come from verispec's fused kernel where it runs
        (:mod:`~verispec.models.native.codes_kernel`), else from :meth:`scaled_reference`.
        """
        if not self._fused or x.device.type != "cpu" or x.dtype != torch.float32:
            return self.scaled_reference(x)
        library = kernels.library_of(self.kernel, x.shape[0], self.wide_from)
        codes, s = self._codes(x, as_float=library == "fbgemm")  # type: ignore[misc]  # [M, K], [M, 1]
        return kernels.product(self.kernel, self.packed, codes, self._out_scale, library), s

    def scaled_reference(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`_scaled` in torch operators: the path of other devices, of ``split``
        layers, and where the fused kernel does not run.
        An all-zero row has a = 0: u / a is NaN, quantized to some finite code, and y·s = 0.
        """
        u = x if self._factors is None else x * self._factors  # [M, K]
        if self.rot is not None:  # block-diagonal rotation: spreads outliers within blocks
            u = self._rotate(u)
        a = self._row_scale(u)  # [M, 1]
        if self.split:
            y = self._two_codes(u / a)
        else:
            y = kernels.matmul(self.kernel, self.packed, u, a, self._out_scale, self._half,
                               self.wide_from)
        if self.norm is None:
            return y, a
        ss = torch.linalg.vector_norm(x, 2, dim=-1, keepdim=True)  # [M, 1] sqrt(Σ x²)
        r = torch.addcmul(self._eps, ss, ss, value=1.0 / self.in_features).rsqrt_()
        return y, r.mul_(a)

    def _rotate(self, u: Tensor) -> Tensor:
        """u [M, K] -> u B for the block-diagonal B of blocks R (float64, rounded to float32).

        R = ``rot`` [b, b]: one matmul. R = A ⊗ B (A = ``rot`` [p, p], B = ``rot_b``
        [q, q]): a block x read as a p × q matrix X (channel i q + j at X[i, j]) becomes
        Aᵀ X B, in two matmuls of width p and q instead of one of width p q (8× fewer
        products for 16 ⊗ 16)."""
        assert self.rot is not None
        if self.rot_b is None:
            return (u.double().view(-1, self.rot.shape[0]) @ self.rot).view(u.shape).float()
        p, q = self.rot.shape[0], self.rot_b.shape[0]
        xt = u.view(-1, p, q).transpose(1, 2).to(torch.float64,  # [N, q, p]: Xᵀ per block
                                                 memory_format=torch.contiguous_format)
        z = (xt.view(-1, p) @ self.rot).view(-1, q, p)  # [N, q, p]: Xᵀ A = (Aᵀ X)ᵀ
        y = z.transpose(1, 2).reshape(-1, q) @ self.rot_b  # [N p, q]: Aᵀ X B
        return y.view(u.shape).float()

    @staticmethod
    def _row_scale(u: Tensor) -> Tensor:
        """[M, K] -> [M, 1]: each row's own max-abs (one activation scale per token; a max
        is exact in any order, and ``abs().amax`` is several times faster than the inf-norm)."""
        return u.abs().amax(dim=-1, keepdim=True)

    def _two_codes(self, v: Tensor) -> Tensor:
        """W v for v [M, K] in [-1, 1] from two codes per entry: v = h / L + r / (2 L²) with
        h = round(L v) and r = round(2 L² v − 2 L h) (L = 1 / x_scale: 63 or 127), both
        codes of the kernel's width, scored as 2M rows of one pass; the error of v is
        1 / (4 L²) instead of 1 / (2 L). Every row is still an exact integer product and
        a per-row float epilogue, so rows stay independent."""
        levels = 1.0 / self.kernel.x_scale
        hi = torch.round(v * levels).div_(levels)  # [M, K] on the code grid
        rest = (v - hi).mul_(2.0 * levels)  # [M, K] in [-1, 1]
        ones = torch.ones((2 * v.shape[0], 1), dtype=v.dtype)
        y = kernels.matmul(self.kernel, self.packed, torch.cat([hi, rest]), ones,
                           self._out_scale, self._half, self.wide_from)  # [2M, N]
        m = v.shape[0]
        return torch.add(y[:m], y[m:], alpha=1.0 / (2.0 * levels))

    def __call__(self, x: Tensor) -> Tensor:
        y, s = self._scaled(x)
        return y.mul_(s) if self.bias is None else torch.addcmul(self.bias, y, s)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        y, s = self._scaled(x)
        out = torch.addcmul(residual, y, s)
        return out if self.bias is None else out.add_(self.bias)


#: pass sizes (rows) at which a mixed kernel's two libraries are timed on a model's layers
SPLIT_ROWS = (1, 2, 3, 4, 6, 9, 16, 64)
SPLIT_REPEATS = 5  # sweeps per library and pass size, in turns (the median is kept)


def _sweep_times(layers: list[Int8Linear]) -> dict[str, dict[str, float]]:
    """{rows: {library: median seconds of one call of every layer on random [rows, K]
    inputs}} for the two libraries of the layers' mixed kernel at each of
    :data:`SPLIT_ROWS`, timed in turns (a slow phase of the machine slows both alike)."""
    kernel = layers[0].kernel
    forced = {kernel.library: kernels.NO_ROWS, kernel.wide: kernels.ALL_ROWS}
    g = torch.Generator().manual_seed(0)
    inputs = {rows: {k: torch.randn((rows, k), generator=g)
                     for k in {x.in_features for x in layers}} for rows in SPLIT_ROWS}
    times: dict[tuple[int, str], list[float]] = {}
    for rep in range(SPLIT_REPEATS + 1):  # the first round warms up
        for rows, by_width in inputs.items():
            for library, wide_from in forced.items():
                t0 = time.perf_counter()
                for layer in layers:
                    layer.wide_from = wide_from
                    layer(by_width[layer.in_features])
                if rep:
                    times.setdefault((rows, library), []).append(time.perf_counter() - t0)
    return {str(rows): {lib: statistics.median(times[(rows, lib)]) for lib in forced}  # type: ignore[misc]
            for rows in SPLIT_ROWS}


def _best_split(times: dict[str, dict[str, float]], narrow: str, wide: str) -> int:
    """The rows from which ``wide`` runs that minimise the product over the timed pass sizes
    of the time a pass takes (each size counts alike; one noisy size cannot flip the
    others): a timed size, or :data:`kernels.NO_ROWS`."""
    def cost(wide_from: int) -> float:
        return sum(math.log(t[wide if int(rows) >= wide_from else narrow])
                   for rows, t in times.items())

    return min((*SPLIT_ROWS, kernels.NO_ROWS), key=cost)


def split_pass_sizes(layers: list[Int8Linear], record: str | None = None) -> str:
    """Set where the layers of one model (of one mixed kernel) change library: each library
    is timed on the layers themselves (sweeps through all of them, as a pass streams them
    from memory) at the pass sizes of :data:`SPLIT_ROWS`, and the second library runs the
    passes from the size that minimises the time over all of them (:func:`_best_split`).
    ``record``: a name under which the timing is kept in verispec's cache
    (:func:`kernels.recorded`) and reused. Returns the split as text. A library that runs
    no pass size is unpacked (its memory freed)."""
    kernel = layers[0].kernel
    if kernel.wide is None:
        return f"int8 passes: {kernel} for every pass"

    def measure() -> dict[str, object]:
        times = _sweep_times(layers)
        return {"wide_from": _best_split(times, kernel.library, kernel.wide),  # type: ignore[arg-type]
                "times": times}

    def valid(r: dict[str, object]) -> bool:  # a record of these pass sizes and libraries
        times = r.get("times")
        return (isinstance(r.get("wide_from"), int) and isinstance(times, dict)
                and times.keys() == {str(x) for x in SPLIT_ROWS}
                and all(isinstance(t, dict) and set(t) == set(kernel.libraries)
                        for t in times.values()))

    result = kernels.recorded(record, measure, valid) if record else measure()
    wide_from = int(result["wide_from"])  # type: ignore[call-overload]
    unused = (kernel.wide if wide_from == kernels.NO_ROWS else
              kernel.library if wide_from == kernels.ALL_ROWS else None)
    for layer in layers:
        layer.wide_from = wide_from
        layer.packed.pop(unused, None)  # type: ignore[arg-type]
    shown = "; ".join(f"{rows}: {t[kernel.library] * 1e3:.1f} / {t[kernel.wide] * 1e3:.1f}"
                      for rows, t in result["times"].items())  # type: ignore[attr-defined]
    where = (f"{kernel.library} only" if wide_from == kernels.NO_ROWS else
             f"{kernel.wide} only" if wide_from == kernels.ALL_ROWS else
             f"{kernel.library} under {wide_from} rows, {kernel.wide} from {wide_from}")
    return (f"int8 passes: {where} (ms per sweep of the linear layers at rows: "
            f"{kernel.library} / {kernel.wide}: {shown})")


INT4_GROUPS = (64, 32)  # input channels sharing one int4 scale and offset (first that divides)
INT4_TILES = 2  # inner k-tiles of the CPU int4 packing
#: the state names of an int4 layer's weights in verispec's kernel's layout
LANE_TENSORS = ("lanes", "lane_scales", "lane_lo")


def int4_available() -> bool:
    """This torch has the CPU int4 weight-only matmul (``_weight_int4pack_mm_for_cpu``)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Int4Linear:
    """Weight-only int4 (x86 CPU): y = x @ Ŵ^T + b, where Ŵ = code · s + lo per group of 64
    (or 32) input channels (code in 0..15).

    Every pass runs verispec's own kernel where it is available and the layer fits it
    (:mod:`~verispec.models.native.int4_kernel`: int8 activations per group of 64 channels
    of each row, exact integer dot products; a row's result never depends on the pass), and
    torch's elsewhere (bfloat16 activations, rounded as the pass decides). A target runs
    int4 only on verispec's kernel (:func:`~verispec.models.native.load_native`'s
    ``exact_passes``); a draft may run either, since a drafted token's q is the
    distribution computed in the pass that drew it.
    """

    def __init__(self, packed: Tensor, scales: Tensor, group: int, bias: Tensor | None,
                 norm: Tensor | None, eps: float, shape: tuple[int, int],
                 lanes: tuple[Tensor, Tensor, Tensor] | None = None) -> None:
        self.packed = packed  # [N, K / 2] uint8, the CPU int4 kernel's layout
        self.scales = scales  # [G, N, 2] bfloat16: scale and the value of code 8 per group
        self.group = group
        self.bias = bias  # [N] float32
        self.norm = norm  # [K] float32
        self.eps = eps
        self.out_features, self.in_features = shape
        # the same codes in verispec's kernel's layout (int4_kernel.pack), where it applies
        self.lanes = lanes

    @classmethod
    def quantize(cls, weight: Tensor, bias: Tensor | None = None, norm: Tensor | None = None,
                 eps: float = 1e-6) -> Int4Linear:
        """The layer of a float ``weight`` [N, K]: per group, codes of (w − min) / s."""
        w = weight.float()  # [N, K]
        n, k = w.shape
        group = next((g for g in INT4_GROUPS if k % g == 0), None)
        if group is None:
            raise ValueError(f"int4 needs input widths divisible by {INT4_GROUPS[-1]}, got {k}")
        groups = w.view(n, k // group, group)  # [N, G, g]
        lo, hi = groups.amin(-1), groups.amax(-1)  # [N, G]
        scale = ((hi - lo) / 15.0).clamp_min(1e-8)  # [N, G]
        codes = torch.round((groups - lo[..., None]) / scale[..., None]).clamp_(0, 15)
        codes = codes.to(torch.int32).view(n, k)  # [N, K]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INT4_TILES)
        scales = torch.stack([scale.T, (lo + 8.0 * scale).T], -1).to(torch.bfloat16)
        lanes = None
        if group == int4_kernel.GROUP and n % int4_kernel.LANES == 0:
            lanes = int4_kernel.pack(codes, scale, lo)
        return cls(packed, scales.contiguous(), group,
                   None if bias is None else bias.float().contiguous(),
                   None if norm is None else norm.float().contiguous(), eps, (n, k), lanes)

    def state(self, prefix: str) -> dict[str, Tensor]:
        """Tensors that rebuild this layer (:meth:`from_state`)."""
        out = {f"{prefix}.packed": self.packed, f"{prefix}.scales": self.scales,
               f"{prefix}.shape": torch.tensor([self.out_features, self.in_features,
                                                self.group])}
        if self.lanes is not None:
            out |= dict(zip([f"{prefix}.{n}" for n in LANE_TENSORS], self.lanes, strict=True))
        return out | _present(prefix, bias=self.bias, norm=self.norm)

    @classmethod
    def from_state(cls, state: dict[str, Tensor], prefix: str, eps: float) -> Int4Linear:
        n, k, group = (int(x) for x in state[f"{prefix}.shape"])
        lanes = None
        if f"{prefix}.{LANE_TENSORS[0]}" in state:
            lanes = tuple(state[f"{prefix}.{name}"] for name in LANE_TENSORS)
        return cls(state[f"{prefix}.packed"], state[f"{prefix}.scales"], group,
                   state.get(f"{prefix}.bias"), state.get(f"{prefix}.norm"), eps, (n, k),
                   lanes)  # type: ignore[arg-type]

    def _own_kernel(self, x: Tensor) -> bool:
        """Whether verispec's kernel runs this pass (x [M, K] on the CPU)."""
        return (self.lanes is not None
                and x.device.type == "cpu" and int4_kernel.available())

    def _linear(self, x: Tensor) -> Tensor:
        if self._own_kernel(x):
            return int4_kernel.matmul(x, self.lanes, self.bias)  # type: ignore[arg-type]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.group, self.scales).float()  # [M, N]
        return y if self.bias is None else y.add_(self.bias)

    def __call__(self, x: Tensor) -> Tensor:
        if self._own_kernel(x):  # the RMSNorm in the same call
            return int4_kernel.matmul(x, self.lanes, self.bias, norm=self.norm,  # type: ignore[arg-type]
                                      eps=self.eps)
        if self.norm is not None:
            x = F.rms_norm(x, (self.in_features,), self.norm, self.eps)
        return self._linear(x)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        if self._own_kernel(x):
            return int4_kernel.matmul(x, self.lanes, self.bias, residual)  # type: ignore[arg-type]
        return residual + self._linear(x)

    def add_gated_to(self, residual: Tensor, gate_up: Tensor) -> Tensor | None:
        """residual + silu(gate) ⊙ up through this layer, for gate_up [M, 2 K] (gate first),
        in one call of verispec's kernel; None where it does not run (the caller computes
        the product and calls :meth:`add_to`)."""
        if not self._own_kernel(gate_up):
            return None
        lanes: tuple[Tensor, Tensor, Tensor] = self.lanes  # type: ignore[assignment]
        return int4_kernel.matmul(gate_up, lanes, self.bias, residual, glu=True)


#: The layers of one draft step on which int4 and int8 are compared: [N, K] and how many a
#: step runs, those of the embedded draft (Qwen2.5 0.5B: 24 layers of fused q/k/v, o, fused
#: gate/up and down projections, and the tied 151,936-row head)
DRAFT_TIMING_LAYERS = ((1152, 896, 24), (896, 896, 24), (9728, 896, 24), (896, 4864, 24),
                       (151936, 896, 1))
#: How :func:`int4_draft_faster` times them, recorded with its result (a record timed another
#: way is measured again)
DRAFT_TIMING_WEIGHTS = "one set of weights per layer, streamed as a step reads them"


def draft_layer_times(kernel: Int8Kernel, *, streamed: bool = True) -> dict[str, float]:
    """Seconds for one row through the layers of :data:`DRAFT_TIMING_LAYERS` in int8 (on
    ``kernel``) and in weight-only int4: ``{"int8": s, "int4": s}``. ``streamed``: every
    layer has weights of its own and a sweep runs them all, as a step does (medians of
    :data:`kernels.TIMING_REPEATS` sweeps); otherwise one layer of each shape is timed again
    and again from the cache and its median multiplied by the count, which misjudges a
    format whose advantage is reading fewer bytes."""
    g = torch.Generator().manual_seed(0)
    steps: dict[str, list[tuple[Int8Linear | Int4Linear, Tensor, int]]] = {"int8": [], "int4": []}
    for n, k, count in DRAFT_TIMING_LAYERS:
        x = torch.randn((1, k), generator=g)  # [1, K]
        for _ in range(count if streamed else 1):
            w = torch.randn((n, k), generator=g) * 0.02  # [N, K]
            steps["int8"].append((Int8Linear.from_int8(*quantize_weight(w), kernel=kernel), x,
                                  1 if streamed else count))
            steps["int4"].append((Int4Linear.quantize(w), x, 1 if streamed else count))
    if not streamed:
        return {name: sum(count * kernels.median_seconds(lambda f=layer, x=x: f(x))
                          for layer, x, count in layers) for name, layers in steps.items()}

    def sweep(name: str) -> None:
        for layer, x, _ in steps[name]:
            layer(x)

    return {name: kernels.median_seconds(lambda n=name: sweep(n)) for name in steps}


def int4_draft_faster(kernel: Int8Kernel) -> tuple[bool, str]:
    """(whether weight-only int4 steps a draft faster than int8 on ``kernel`` here, the
    timing as text): one row through every layer of :data:`DRAFT_TIMING_LAYERS` in each
    format, each layer with weights of its own as in a step (medians of
    :data:`kernels.TIMING_REPEATS` sweeps), measured once per machine signature and recorded
    in verispec's cache (:func:`kernels.recorded`). Which one wins depends on the CPU and
    the int8 kernel (int4 steps with bfloat16 activations, int8 with the kernel's codes), and
    on where the weights come from: a step streams half a gigabyte of draft weights from
    memory, where int4 reads half the bytes of int8, so timing one layer again and again from
    the cache favours the format that computes faster and can pick the slower draft."""
    layers_timed = [list(shape) for shape in DRAFT_TIMING_LAYERS]

    int4_runs = int4_kernel.status()

    def measure() -> dict[str, object]:
        times = draft_layer_times(kernel)
        return {"int4_faster": times["int4"] < times["int8"], "times": times,
                "layers": layers_timed, "weights": DRAFT_TIMING_WEIGHTS, "int4_kernel": int4_runs}

    # a record is served only if it timed these same layers the same way (not one layer
    # alone) with the int4 kernel that runs now
    record = kernels.recorded(f"draft-format-{str(kernel).replace('/', '-')}", measure,
                              lambda r: isinstance(r.get("int4_faster"), bool)
                              and {"int4", "int8"} <= set(r.get("times", {}))
                              and r.get("layers") == layers_timed
                              and r.get("weights") == DRAFT_TIMING_WEIGHTS
                              and r.get("int4_kernel") == int4_runs)
    times = record["times"]
    shown = (f"the draft's layers, one row: int4 {times['int4'] * 1e3:.1f} ms "
             f"({int4_runs}), int8 {times['int8'] * 1e3:.1f} ms")
    return bool(record["int4_faster"]), shown


class SubsetHead:
    """An lm_head that scores a subset of the vocabulary: [M, H] -> [M, V] logits, -inf
    outside the subset (so a draft's q is exactly zero there, and is still the distribution
    its tokens are drawn from). ``linear`` holds the rows ``ids`` [S] of the full head;
    ``rows`` [V, H], when given, all the head's rows (in the basis and with the norm that
    ``linear`` was made from), which :meth:`score` reads for ids outside the subset."""

    def __init__(self, linear: DenseLinear | Int8Linear | Int4Linear, ids: Tensor,
                 vocab: int, rows: Tensor | None = None) -> None:
        self.linear = linear
        self.ids = ids.to(torch.int64)  # [S] vocabulary ids, ascending
        self.vocab = vocab
        self.rows = rows  # [V, H] or None
        self.out_features, self.in_features = vocab, linear.in_features

    def _ids(self, device: torch.device) -> Tensor:
        """``ids`` on ``device`` (copied there once)."""
        if self.ids.device != device:
            self.ids = self.ids.to(device)
        return self.ids

    def __call__(self, x: Tensor) -> Tensor:
        y = self.linear(x)  # [M, S]
        out = y.new_full((y.shape[0], self.vocab), float("-inf"))  # [M, V]
        return out.index_copy_(1, self._ids(y.device), y)

    def score(self, x: Tensor, extra: tuple[Tensor, Tensor] | None) -> Tensor:
        """[M, H] -> [M, V]: the subset as in ``__call__``, and the ``extra`` ids [U] where
        ``allowed`` [M, U] says so (ids outside the subset, each scored by its own row of
        ``rows`` after the head's norm)."""
        out = self(x)  # [M, V]
        if extra is None:
            return out
        if self.rows is None:
            raise ValueError("this head keeps no rows outside its subset")
        ids, allowed = extra
        norm, eps = self.linear.norm, self.linear.eps
        h = x if norm is None else F.rms_norm(x.to(norm.dtype), (self.in_features,), norm, eps)
        w = self.rows.index_select(0, ids).to(h.dtype)  # [U, H]
        y = (h @ w.T).to(out.dtype).masked_fill_(~allowed, float("-inf"))  # [M, U]
        return out.index_copy_(1, ids, y)

    def state(self, prefix: str) -> dict[str, Tensor]:
        rows = {} if self.rows is None else {f"{prefix}.rows": self.rows}
        ids = {f"{prefix}.ids": self.ids.cpu()}
        return self.linear.state(prefix) | ids | rows  # type: ignore[union-attr]
