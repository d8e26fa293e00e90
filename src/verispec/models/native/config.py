"""The few numbers a Qwen2/Llama-family decoder needs, read from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NativeConfig", "UnsupportedModelError", "unsupported_reason"]

FAMILIES = ("qwen2", "llama")


class UnsupportedModelError(ValueError):
    """The architecture is outside what the native model implements."""


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _rope(config: Any) -> tuple[float, str]:
    """(theta, rope type) from ``rope_parameters`` (transformers 5) or the older fields."""
    params = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    theta = params.get("rope_theta", _get(config, "rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    return float(theta), str(kind)


def unsupported_reason(config: Any) -> str | None:
    """Why the native model cannot run this config, or None if it can."""
    kind = _get(config, "model_type")
    if kind not in FAMILIES:
        return f"model_type {kind!r} is not one of {', '.join(FAMILIES)}"
    if _get(config, "hidden_act", "silu") != "silu":
        return f"activation {_get(config, 'hidden_act')!r} is not silu"
    if _rope(config)[1] != "default":
        return f"rope type {_rope(config)[1]!r} is not the default rotary embedding"
    if _get(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in (_get(config, "layer_types") or [])):
        return "sliding-window attention layers"
    return None


@dataclass(frozen=True)
class NativeConfig:
    vocab_size: int  # V
    hidden: int  # H, model width
    intermediate: int  # I, MLP width
    layers: int
    heads: int  # Hq, query heads
    kv_heads: int  # Hkv, key/value heads (GQA: Hq = G * Hkv)
    head_dim: int  # D
    rope_theta: float
    norm_eps: float
    max_positions: int | None
    tied: bool  # lm_head shares the embedding matrix

    @property
    def group(self) -> int:
        """G, query heads per key/value head."""
        return self.heads // self.kv_heads

    @classmethod
    def from_hf(cls, config: Any) -> NativeConfig:
        """From a ``transformers`` config object or its ``config.json`` dict."""
        reason = unsupported_reason(config)
        if reason is not None:
            raise UnsupportedModelError(f"the native model does not support this model: {reason}")
        hidden, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
        return cls(
            vocab_size=int(_get(config, "vocab_size")),
            hidden=hidden,
            intermediate=int(_get(config, "intermediate_size")),
            layers=int(_get(config, "num_hidden_layers")),
            heads=heads,
            kv_heads=int(_get(config, "num_key_value_heads") or heads),
            head_dim=int(_get(config, "head_dim") or hidden // heads),
            rope_theta=_rope(config)[0],
            norm_eps=float(_get(config, "rms_norm_eps", 1e-6)),
            max_positions=_get(config, "max_position_embeddings"),
            tied=bool(_get(config, "tie_word_embeddings", False)),
        )
