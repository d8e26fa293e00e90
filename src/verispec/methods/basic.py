"""Autoregressive decoding, token verification and block verification as methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verispec.engine.methods import Method, SingleDraftMethod
from verispec.methods import MethodInfo, register
from verispec.verify import block_verify, token_verify

__all__: list[str] = []


def _single(name: str, fn: Any) -> Callable[..., Method]:
    def build() -> Method:
        return SingleDraftMethod(name, fn)

    return build


register(MethodInfo("ar", True, "plain autoregressive decoding of the target (no draft), "
                    "the baseline", _single("ar", token_verify), uses_draft=False, default_gamma=0))
register(MethodInfo("token", True, "token verification (Algorithm 1; Leviathan et al.): "
                    "lossless", _single("token", token_verify)))
register(MethodInfo("block", True, "block verification (Algorithm 2; Sun et al. 2025): "
                    "lossless, optimal tokens per iteration", _single("block", block_verify)))
