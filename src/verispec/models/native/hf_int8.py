"""The int8 runtime's model inside a transformers module, for the transformers peers.

:func:`int8_transformers` rewrites a Qwen2/Llama-family ``*ForCausalLM`` in place so that it
computes what :class:`~verispec.models.native.NativeCausalLM` computes in int8: the same
rotated weights (:func:`~verispec.models.native.weights.int8_state`), the same int8 codes
and scales, the same per-token activation scales. Each ``nn.Linear`` becomes an
:class:`Int8Module` around an :class:`~verispec.models.native.linear.Int8Linear` (q, k and v
as three, since transformers calls them separately; their rows are those of the fused
matrix, so the codes and per-channel scales are identical). transformers' own RMSNorms stay
in place, with the weights the rotation leaves them (ones). A position's distribution then
differs from the native runtime's by float rounding only, so ``hf-ar`` and ``hf-assisted``
run the same int8 models as verispec's methods.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from verispec.models.native.config import NativeConfig
from verispec.models.native.linear import Int8Linear
from verispec.models.native.weights import int8_state, module_tensors

__all__ = ["Int8Module", "int8_transformers"]


class Int8Module(nn.Module):
    """An ``nn.Linear`` stand-in: [..., K] -> [..., N] through an :class:`Int8Linear`."""

    def __init__(self, linear: Int8Linear) -> None:
        super().__init__()
        self.linear = linear
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        return self.linear(x.reshape(-1, x.shape[-1]).float()).view(*lead, self.out_features)


def _part(state: dict[str, Tensor], prefix: str, rows: slice) -> Int8Module:
    """An :class:`Int8Module` over output rows ``rows`` of the quantized layer ``prefix``
    (with the layer's input rotation and code scheme)."""
    bias = state.get(f"{prefix}.bias")
    return Int8Module(Int8Linear.from_int8(
        state[f"{prefix}.qweight"][rows].contiguous(), state[f"{prefix}.scale"][rows],
        None if bias is None else bias[rows], rot=state.get(f"{prefix}.rot"),
        split=f"{prefix}.split" in state, rot_b=state.get(f"{prefix}.rot_b")))


@torch.no_grad()
def int8_transformers(module: Any) -> Any:
    """Rewrite a float transformers Qwen2/Llama ``*ForCausalLM`` in place into the int8
    runtime's model (module doc); returns it. CPU only, like the int8 kernels."""
    c = NativeConfig.from_hf(module.config)
    state = int8_state(c, module_tensors(module))
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    body = module.model
    body.embed_tokens.weight = nn.Parameter(state["embed"].float(), requires_grad=False)
    for i, layer in enumerate(body.layers):
        p = f"layers.{i}"
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = _part(state, f"{p}.qkv", slice(0, q))
        attn.k_proj = _part(state, f"{p}.qkv", slice(q, q + kv))
        attn.v_proj = _part(state, f"{p}.qkv", slice(q + kv, q + 2 * kv))
        attn.o_proj = _part(state, f"{p}.o", slice(None))
        mlp.gate_proj = _part(state, f"{p}.gate_up", slice(0, c.intermediate))
        mlp.up_proj = _part(state, f"{p}.gate_up", slice(c.intermediate, None))
        mlp.down_proj = _part(state, f"{p}.down", slice(None))
        layer.input_layernorm.weight.copy_(state[f"{p}.qkv.norm"])
        layer.post_attention_layernorm.weight.copy_(state[f"{p}.gate_up.norm"])
    body.norm.weight.copy_(state["head.norm"])
    module.lm_head = _part(state, "head", slice(None))
    module.config.tie_word_embeddings = False
    return module
