"""The named methods of ``verispec generate --verifier NAME`` and :func:`verispec.generate`.

Each entry says whether the method is lossless and how to build it from options. Methods
contributed by other modules register themselves here with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verispec.engine.methods import Method, SingleDraftMethod
from verispec.verify import block_verify, token_verify

__all__ = ["MethodInfo", "METHODS", "register", "build_method"]


@dataclass(frozen=True)
class MethodInfo:
    """A method's registry entry.

    Attributes:
        name: the CLI / API name.
        lossless: whether outputs follow the target distribution exactly.
        summary: one line for ``--help``.
        build: ``build(**options) -> Method``; unknown options raise TypeError.
        uses_draft: False for plain autoregressive decoding.
        default_gamma: γ used when the caller does not choose one.
    """

    name: str
    lossless: bool
    summary: str
    build: Callable[..., Method]
    uses_draft: bool = True
    default_gamma: int = 8


METHODS: dict[str, MethodInfo] = {}


def register(info: MethodInfo) -> MethodInfo:
    METHODS[info.name] = info
    return info


def build_method(name: str, **options: Any) -> Method:
    """Build the method ``name``; options that are None are ignored."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    given = {k: v for k, v in options.items() if v is not None}
    return METHODS[name].build(**given)


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
