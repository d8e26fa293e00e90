"""What a method's table entry holds, and the ``name[key=value,...]`` spelling of options."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verispec.engine.protocols import Method, Runner, ScheduledMethod

__all__ = ["DRAFTING", "LawFn", "MethodInfo", "MethodOptionError", "option_defaults", "parse_spec",
           "split_list"]

#: ``law(method, target, draft, prompt, *, gamma, sampling, length, draft_stop)`` ->
#: (exact law of the first ``length`` tokens on toy models, expected tokens emitted by the
#: first iteration or None).
LawFn = Callable[..., tuple[dict[tuple[int, ...], float], float | None]]


#: How a method's drafts are made: ``none`` (it never drafts), ``sample`` (drawn by any
#: drafter: the draft model or prompt lookup), ``beam`` (beam search with the draft model).
DRAFTING = ("none", "sample", "beam")


class MethodOptionError(ValueError, TypeError):
    """An option was given to a method that does not take it."""


@dataclass(frozen=True)
class MethodInfo:
    """A method's entry in :data:`verispec.methods.METHODS`.

    Attributes:
        name: the name in ``--method`` and ``generate(method=...)``.
        lossless: whether outputs follow the target distribution exactly.
        summary: one line for ``--help``.
        build: ``build(**options)`` -> a :class:`Method`, or a :class:`ScheduledMethod` for
            methods with a ``runner``; its keyword parameters are the options.
        drafting: one of :data:`DRAFTING`: what the method needs to draft.
        default_gamma: γ used when the caller does not choose one.
        runner: for methods that are not "draft → score → verify" iterations (MJGD,
            PEARL), the :class:`~verispec.engine.protocols.Runner` that runs a request.
        auto_gamma: the method accepts ``gamma="auto"``.
        law: the method's exact law on toy models (None: it has none).
        batchable: several requests can share the engine's batch.
    """

    name: str
    lossless: bool
    summary: str
    build: Callable[..., Method | ScheduledMethod]
    drafting: str = "sample"
    default_gamma: int = 8
    runner: Runner | None = None
    auto_gamma: bool = False
    law: LawFn | None = None
    batchable: bool = True

    def __post_init__(self) -> None:
        if self.drafting not in DRAFTING:
            raise ValueError(f"{self.name}: drafting must be one of {DRAFTING}, "
                             f"got {self.drafting!r}")

    @property
    def uses_draft(self) -> bool:
        """Whether the method drafts at all (not ``ar``, not MJGD)."""
        return self.drafting != "none"

    def options(self) -> dict[str, Any]:
        """The method's options and their defaults."""
        return option_defaults(self.build)


def option_defaults(build: Callable[..., Any]) -> dict[str, Any]:
    """Keyword parameters of a builder and their defaults."""
    params = inspect.signature(build).parameters.values()
    return {p.name: p.default for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is not p.empty}


def split_list(text: str) -> list[str]:
    """Split on commas outside brackets: ``"ar,lossy[epsilon=0.1,residual=opt]"``."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in {text!r}")
    items.append("".join(cur).strip())
    return [i for i in items if i]


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name`` or ``name[key=value,...]`` -> (name, options); values are parsed as bool,
    None, int, float or left as text."""
    spec = spec.strip()
    name, options = spec, {}
    if "[" in spec:
        if not spec.endswith("]"):
            raise ValueError(f"method {spec!r}: options go in brackets at the end, "
                             "e.g. lossy[epsilon=0.1]")
        name, inner = spec[:-1].split("[", 1)
        for item in split_list(inner):
            if "=" not in item:
                raise ValueError(f"method {spec!r}: option {item!r} is not key=value")
            key, val = item.split("=", 1)
            options[key.strip().replace("-", "_")] = _value(val.strip())
    return name.strip(), options
