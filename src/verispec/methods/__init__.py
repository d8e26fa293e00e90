"""The named methods of ``verispec generate --verifier NAME`` and :func:`verispec.generate`.

Each entry says whether the method is lossless and how to build it from options. Methods
contributed by other modules register themselves here with :func:`register`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verispec.engine.methods import Method

__all__ = ["METHODS", "MethodInfo", "MethodOptionError", "build_method", "register"]


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
        runner: for methods that are not an iteration of Algorithm 3 (MJGD's target-only
            beam search), ``runner(target, prompt_ids, sampling=..., max_new_tokens=...,
            generator=..., on_tokens=..., **options) -> GenerationOutput``; else None.
            A runner of a method that ``uses_draft`` also gets ``draft=`` (the draft model).
        auto_gamma: the method accepts ``gamma="auto"`` (and uses it when none is given).
    """

    name: str
    lossless: bool
    summary: str
    build: Callable[..., Method]
    uses_draft: bool = True
    default_gamma: int = 8
    runner: Callable[..., Any] | None = None
    auto_gamma: bool = False


METHODS: dict[str, MethodInfo] = {}


class MethodOptionError(ValueError, TypeError):
    """An option was given to a method that does not take it."""


def register(info: MethodInfo) -> MethodInfo:
    METHODS[info.name] = info
    return info


def build_method(name: str, **options: Any) -> Method:
    """Build the method ``name``; options that are None are ignored."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    given = {k: v for k, v in options.items() if v is not None}
    try:
        return METHODS[name].build(**given)
    except TypeError as exc:  # an option that the method does not take
        raise MethodOptionError(f"method {name!r} does not take the option(s) "
                         f"{', '.join(sorted(given)) or '(none)'}: {exc}") from exc



# Importing the method modules registers them (order = order in --help).
from verispec.methods import basic as _basic  # noqa: F401

for _name in ("greedy_block", "lossy", "multidraft", "mjsd", "pearl"):  # --help order
    importlib.import_module(f"verispec.methods.{_name}")
