"""The kinds of linear layer the native model runs: dense (float32 / bfloat16, any
device), int8 (x86 CPU) and, for drafts, weight-only int4 (x86 CPU).

All offer the two shapes a decoder layer needs:

* ``layer(x)`` — ``linear(rmsnorm(x))`` when the layer owns the RMSNorm in front of it
  (q/k/v, gate/up, lm_head), plain ``linear(x)`` otherwise;
* ``layer.add_to(residual, x)`` — ``residual + linear(x)`` (o_proj, down_proj).

x is always 2-D, [M, K] -> [M, N].

**Int8.** Weights are int8 with one symmetric scale per output channel. Activations are
quantized **per row** (per token): row m is divided by its own max-abs a_m, so it lies in
[-1, 1], is quantized with the fixed scale 1/127 (uint8, zero point 128) inside fbgemm's
``linear_with_input_q_dq_qweight_dq_output_fp32`` and the result is multiplied by a_m.
Nothing a row sees depends on the other rows of the pass (PyTorch's dynamic int8 linear
picks one scale for the whole tensor, so an outlier in one token would move every other
token's output), which speculative decoding needs: scoring k tokens in one pass gives each
position the distribution it gets one token at a time.

The RMSNorm in front of a layer is folded: rmsnorm(x) ⊙ γ = r · (x ⊙ γ) with one number r
per row, and a row's scalar factors cancel in the division by its max-abs, so the int8
layer quantizes x ⊙ γ directly and multiplies the output by r · a. (Per-channel smoothing
factors, as in SmoothQuant, would enter the same way: x ⊙ γ / s with W·diag(s).)
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

import verispec.models.native.onednn as onednn

__all__ = ["DenseLinear", "Int4Linear", "Int8Linear", "default_kernel", "int4_available",
           "int8_available", "quantize_weight"]

X_SCALE = 1.0 / 127.0  # activations after division by their row max-abs lie in [-1, 1]
X_ZERO = 128  # uint8 zero point: -1 -> 1, 0 -> 128, +1 -> 255


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
    """Some int8 kernel (oneDNN or fbgemm) is compiled into this torch."""
    return onednn.available() or "fbgemm" in torch.backends.quantized.supported_engines


def default_kernel() -> str:
    """``onednn`` (packed weights can be cached on disk) when present, else ``fbgemm``."""
    return "onednn" if onednn.available() else "fbgemm"


def _fbgemm_pack(qweight: Tensor, scale: Tensor) -> object:
    """fbgemm packed weights for int8 [N, K] with per-channel scales (no bias: see below)."""
    with warnings.catch_warnings():  # quantized tensors are announced as moving to torchao
        warnings.simplefilter("ignore")
        zeros = torch.zeros(scale.shape, dtype=torch.int64)
        q = torch._make_per_channel_quantized_tensor(qweight, scale.double(), zeros, 0)
        return torch.ops.quantized.linear_prepack(q, None)


def _present(prefix: str, **tensors: Tensor | None) -> dict[str, Tensor]:
    """``{prefix.name: tensor}`` for the optional tensors of a layer that it has."""
    return {f"{prefix}.{name}": t for name, t in tensors.items() if t is not None}


class Int8Linear:
    """y = Wq (u / a) · a + b per row, u the (normed) input, a its row max-abs (module doc).

    ``kernel``: ``onednn`` (``onednn::qlinear_pointwise``; the input is quantized here to
    uint8) or ``fbgemm`` (``quantized::linear_with_input_q_dq_qweight_dq_output_fp32``,
    which quantizes u / a itself with the same fixed scale). Both compute exact int32 dot
    products, so a row's output does not depend on the other rows. The bias is added after
    the per-row rescaling, so it stays out of the packed weights.
    """

    def __init__(self, packed: object, scale: Tensor, bias: Tensor | None, norm: Tensor | None,
                 eps: float, shape: tuple[int, int], kernel: str,
                 keep: tuple[Tensor, ...] = (), rot: Tensor | None = None) -> None:
        self.packed = packed
        self.rot = None if rot is None else rot.float().contiguous()  # [b, b] orthogonal
        self.scale = scale.float().contiguous()  # [N]
        self.bias = None if bias is None else bias.float().contiguous()  # [N]
        self.norm = None if norm is None else norm.float().contiguous()  # [K]
        # channel factors that are all 1 (a rotated model) need no multiplication
        self._factors = None if norm is None or bool((norm == 1).all()) else self.norm
        self.eps = eps
        self.out_features, self.in_features = shape
        self.kernel = kernel
        self._keep = keep  # tensors the packed weight lives on (restored oneDNN blobs), or
        # the int8 weight itself (fbgemm), for saving
        self._zeros = torch.zeros(shape[0], dtype=torch.int64)  # [N] weight zero points
        self._half = torch.tensor(X_ZERO + 0.5)  # rounding offset: trunc(v + 128.5)
        self._eps = torch.tensor(eps)

    @classmethod
    def from_int8(cls, qweight: Tensor, scale: Tensor, bias: Tensor | None = None,
                  norm: Tensor | None = None, eps: float = 1e-6,
                  kernel: str | None = None, rot: Tensor | None = None) -> Int8Linear:
        """From int8 [N, K] weights and their scales [N] (packs them: slow for big layers)."""
        kernel = kernel or default_kernel()
        if kernel == "onednn":
            packed, keep = onednn.pack(qweight), ()
        elif kernel == "fbgemm":
            packed, keep = _fbgemm_pack(qweight, scale), (qweight,)
        else:
            raise ValueError(f"unknown int8 kernel {kernel!r}")
        return cls(packed, scale, bias, norm, eps, tuple(qweight.shape), kernel, keep, rot)

    def state(self, prefix: str) -> dict[str, Tensor]:
        """Tensors that rebuild this layer (:meth:`from_state`): the packed oneDNN bytes and
        descriptor, or the int8 weight for fbgemm."""
        out = {f"{prefix}.scale": self.scale}
        if self.kernel == "onednn":
            blob, md = onednn.save(self.packed)  # type: ignore[arg-type]
            out[f"{prefix}.blob"], out[f"{prefix}.md"] = blob, md
            out[f"{prefix}.shape"] = torch.tensor([self.out_features, self.in_features])
        else:
            out[f"{prefix}.qweight"] = self._keep[0]
        return out | _present(prefix, bias=self.bias, norm=self.norm, rot=self.rot)

    @classmethod
    def from_state(cls, state: dict[str, Tensor], prefix: str, eps: float,
                   kernel: str | None = None) -> Int8Linear:
        scale, bias, norm, rot = (state[f"{prefix}.{x}"] if f"{prefix}.{x}" in state else None
                                  for x in ("scale", "bias", "norm", "rot"))
        if f"{prefix}.blob" in state:
            blob, md = state[f"{prefix}.blob"], state[f"{prefix}.md"]
            n, k = int(scale.numel()), int(state[f"{prefix}.shape"][1])  # type: ignore[union-attr]
            packed = onednn.restore(blob, md, (k, n))
            return cls(packed, scale, bias, norm, eps, (n, k), "onednn", (blob, md), rot)  # type: ignore[arg-type]
        return cls.from_int8(state[f"{prefix}.qweight"], scale, bias, norm, eps, kernel, rot)  # type: ignore[arg-type]

    def _scaled(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(y [M, N], s [M, 1]) with y·s the layer's output before the bias.

        Without a norm: u = x, a = max|u| per row, y = Wq (u / a), s = a.
        With a norm: rmsnorm(x) = r x ⊙ c with r = 1 / sqrt(mean(x²) + eps) one number per
        row, so u = x ⊙ c is quantized (r cancels in u / a) and s = a·r.
        An all-zero row has a = 0: u / a is NaN, quantized to some finite code, and y·s = 0.
        """
        u = x if self._factors is None else x * self._factors  # [M, K]
        if self.rot is not None:  # block-diagonal rotation: spreads outliers within blocks
            u = (u.view(-1, self.rot.shape[0]) @ self.rot).view(u.shape)
        a = torch.linalg.vector_norm(u, float("inf"), dim=-1, keepdim=True)  # [M, 1] max|u|
        if self.kernel == "onednn":
            xq = torch.addcdiv(self._half, u, a, value=127.0).to(torch.uint8)  # [M, K], 1..255
            y = torch.ops.onednn.qlinear_pointwise(
                xq, X_SCALE, X_ZERO, self.packed, self.scale, self._zeros, None, 1.0, 0,
                torch.float32, "none", [], "")
        else:
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                u / a, X_SCALE, X_ZERO, self.packed)
        if self.norm is None:
            return y, a
        ss = torch.linalg.vector_norm(x, 2, dim=-1, keepdim=True)  # [M, 1] sqrt(Σ x²)
        r = torch.addcmul(self._eps, ss, ss, value=1.0 / self.in_features).rsqrt_()
        return y, r.mul_(a)

    def __call__(self, x: Tensor) -> Tensor:
        y, s = self._scaled(x)
        return y.mul_(s) if self.bias is None else torch.addcmul(self.bias, y, s)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        y, s = self._scaled(x)
        out = torch.addcmul(residual, y, s)
        return out if self.bias is None else out.add_(self.bias)


INT4_GROUPS = (64, 32)  # input channels sharing one int4 scale and offset (first that divides)
INT4_TILES = 2  # inner k-tiles of the CPU int4 packing


def int4_available() -> bool:
    """This torch has the CPU int4 weight-only matmul (``_weight_int4pack_mm_for_cpu``)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Int4Linear:
    """Weight-only int4 (x86 CPU): y = x @ Ŵ^T + b with bfloat16 activations, where
    Ŵ = (w4 − 8) · s + z per group of 64 (or 32) input channels (w4 in 0..15).

    The activations keep their floating-point values (no activation quantization), so
    there is no per-token scale question; but the kernel's rounding may depend on how
    many rows a pass holds, so int4 is for the **draft** only: a drafted token's q is the
    distribution computed in the pass that drew it, whatever the pass, while the target's
    distribution must not depend on the pass.
    """

    def __init__(self, packed: Tensor, scales: Tensor, group: int, bias: Tensor | None,
                 norm: Tensor | None, eps: float, shape: tuple[int, int]) -> None:
        self.packed = packed  # [N, K / 2] uint8, the CPU int4 kernel's layout
        self.scales = scales  # [G, N, 2] bfloat16: scale and the value of code 8 per group
        self.group = group
        self.bias = bias  # [N] float32
        self.norm = norm  # [K] float32
        self.eps = eps
        self.out_features, self.in_features = shape

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
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.to(torch.int32).view(n, k), INT4_TILES)  # [N, K / 2] uint8
        scales = torch.stack([scale.T, (lo + 8.0 * scale).T], -1).to(torch.bfloat16)
        return cls(packed, scales.contiguous(), group,
                   None if bias is None else bias.float().contiguous(),
                   None if norm is None else norm.float().contiguous(), eps, (n, k))

    def state(self, prefix: str) -> dict[str, Tensor]:
        """Tensors that rebuild this layer (:meth:`from_state`)."""
        out = {f"{prefix}.packed": self.packed, f"{prefix}.scales": self.scales,
               f"{prefix}.shape": torch.tensor([self.out_features, self.in_features,
                                                self.group])}
        return out | _present(prefix, bias=self.bias, norm=self.norm)

    @classmethod
    def from_state(cls, state: dict[str, Tensor], prefix: str, eps: float) -> Int4Linear:
        n, k, group = (int(x) for x in state[f"{prefix}.shape"])
        return cls(state[f"{prefix}.packed"], state[f"{prefix}.scales"], group,
                   state.get(f"{prefix}.bias"), state.get(f"{prefix}.norm"), eps, (n, k))

    def _linear(self, x: Tensor) -> Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.group, self.scales).float()  # [M, N]
        return y if self.bias is None else y.add_(self.bias)

    def __call__(self, x: Tensor) -> Tensor:
        if self.norm is not None:
            x = F.rms_norm(x, (self.in_features,), self.norm, self.eps)
        return self._linear(x)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        return residual + self._linear(x)
