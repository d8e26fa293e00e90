"""The benchmark grid: methods × temperatures × γ × batch sizes, parsed from the command line.

A method spec is a registry name (:data:`verispec.methods.METHODS`, so methods registered
later — e.g. ``pearl`` — work unchanged), a peer (``hf-ar``, ``hf-assisted``,
``hf-assisted-default``, ``llamacpp-ar``, ``llamacpp-spec``), optionally with options in
brackets: ``lossy[epsilon=0.05,residual=target]``, ``multidraft[num_drafts=4]``. A peer takes
only the options of :data:`PEER_OPTIONS` (``llamacpp-spec[p_min=0.5]``: llama.cpp's
``--spec-draft-p-min``). The label (the whole spec) names the method in every report, so
``llamacpp-spec[p_min=0],llamacpp-spec[p_min=0.5]`` are two methods of the grid. Any
method that drafts also takes ``gamma=N`` (or ``gamma=auto`` for verispec's own methods),
which fixes its γ whatever ``--gamma`` says: ``block,llamacpp-spec[gamma=4]`` with
``--gamma auto`` runs block with γ auto and llama.cpp's speculation with 4 draft tokens.

Methods that do not draft (``ar``, ``hf-ar``, ``hf-assisted-default``, whose drafting is
transformers' own heuristic) run once per temperature with γ recorded as 0 (``ar``, ``hf-ar``)
or ``None``; every other method runs at each γ of the grid. γ may be ``auto`` (``None`` in
the grid): verispec's methods then choose γ by measurement (PEARL: its window from c), and
peers, whose γ is a fixed number, skip it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verispec.methods import METHODS, build_method, parse_spec
from verispec.methods.registry import split_list
from verispec.plan import drafter_for

__all__ = [
    "PEERS",
    "PEER_OPTIONS",
    "Config",
    "MethodSpec",
    "expand_grid",
    "parse_gammas",
    "parse_ints",
    "parse_method",
    "parse_methods",
    "parse_temperatures",
    "split_list",
]

#: The spec option that fixes a method's γ in the grid (``block[gamma=4]``).
GAMMA_OPTION = "gamma"

#: Peer systems measured in the same run: name -> (uses the draft model, follows the γ grid).
PEERS: dict[str, tuple[bool, bool]] = {
    "hf-ar": (False, False),
    "hf-assisted": (True, True),
    "hf-assisted-default": (True, False),
    "llamacpp-ar": (False, False),
    "llamacpp-spec": (True, True),
}


def _probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


#: The options each peer takes: name -> (check returning the parsed value, what it means).
PEER_OPTIONS: dict[str, dict[str, tuple[Callable[[str, Any], Any], str]]] = {
    "llamacpp-spec": {
        "p_min": (_probability, ("llama.cpp's --spec-draft-p-min: the draft stops proposing "
                                 "where its top token's probability is below p_min (default 0)")),
    },
}


@dataclass(frozen=True)
class MethodSpec:
    """A method of the grid: its label, registry (or peer) name and options."""

    label: str
    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_peer(self) -> bool:
        return self.name in PEERS

    @property
    def uses_gamma(self) -> bool:
        if self.is_peer:
            return PEERS[self.name][1]
        info = METHODS[self.name]
        return info.uses_draft or info.runner is not None

    @property
    def takes_auto(self) -> bool:
        """γ may be ``auto``: every verispec method that drafts (not a peer)."""
        return not self.is_peer and self.uses_gamma

    def needs_draft(self, drafter: str) -> bool:
        """Whether it runs with the draft model when verispec's methods draft with
        ``drafter`` (a peer: whether it runs a draft at all)."""
        return PEERS[self.name][0] if self.is_peer else drafter_for(METHODS[self.name], drafter)[1]

    @property
    def lossless(self) -> bool:
        return True if self.is_peer else METHODS[self.name].lossless

    @property
    def batchable(self) -> bool:
        """Whether batched decoding (``--batch-size`` > 1) supports the method."""
        return not self.is_peer and METHODS[self.name].batchable

    def option_dict(self) -> dict[str, Any]:
        """The options passed to the method or peer (``gamma`` is the grid's, not theirs)."""
        return {k: v for k, v in self.options if k != GAMMA_OPTION}

    @property
    def fixed_gamma(self) -> tuple[int | None] | None:
        """(γ,) where the spec fixes γ (None inside: ``auto``), else None."""
        for k, v in self.options:
            if k == GAMMA_OPTION:
                return (v,)
        return None


@dataclass(frozen=True)
class Config:
    """One cell of the grid (a method at one temperature, γ and batch size)."""

    method: MethodSpec
    temperature: float
    gamma: int | None
    batch_size: int = 1

    @property
    def key(self) -> str:
        """Stable identifier used in ``results.jsonl`` and for resuming."""
        return (f"{self.method.label}|T={self.temperature:g}|g={self.gamma_text}"
                f"|b={self.batch_size}")

    @property
    def gamma_text(self) -> str:
        if self.gamma is None:
            return "auto" if self.method.uses_gamma else "-"
        return str(self.gamma)


def parse_method(spec: str) -> MethodSpec:
    """``name`` or ``name[key=value,...]`` -> :class:`MethodSpec` (options checked now)."""
    spec = spec.strip()
    name, options = parse_spec(spec)
    if name not in METHODS and name not in PEERS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join([*METHODS, *PEERS])}")
    fixed = _fixed_gamma(name, options.pop(GAMMA_OPTION)) if GAMMA_OPTION in options else ()
    if name in PEERS:
        allowed = PEER_OPTIONS.get(name, {})
        for key, value in options.items():
            if key not in allowed:
                takes = ", ".join(f"{k} ({what})" for k, (_, what) in allowed.items())
                raise ValueError(f"the peer {name} takes no option {key!r}; "
                                 + (f"its options: {takes}" if takes else "it takes none"))
            options[key] = allowed[key][0](key, value)
    else:
        build_method(name, **options)  # raises a clear error for an option it does not take
    return MethodSpec(label=spec.replace(" ", ""), name=name,
                      options=tuple(sorted(options.items())) + fixed)


def _fixed_gamma(name: str, value: Any) -> tuple[tuple[str, int | None]]:
    """The ``gamma=`` option of a spec, checked: an integer >= 1, or ``auto`` for a verispec
    method that takes it."""
    spec = MethodSpec(label=name, name=name)
    if not spec.uses_gamma:
        raise ValueError(f"{name} does not draft, so it takes no gamma")
    if value == "auto":
        if not spec.takes_auto:
            raise ValueError(f"{name} needs an integer gamma (auto is verispec's own choice)")
        return ((GAMMA_OPTION, None),)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"gamma must be an integer >= 1 or auto, got {value!r}")
    return ((GAMMA_OPTION, value),)


def parse_methods(text: str) -> list[MethodSpec]:
    specs = [parse_method(s) for s in split_list(text)]
    if not specs:
        raise ValueError("no method given")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a method is listed twice: {text!r}")
    return specs


def parse_temperatures(text: str) -> list[float]:
    out = []
    for item in split_list(str(text)):
        try:
            t = float(item)
        except ValueError as exc:
            raise ValueError(f"temperature {item!r} is not a number") from exc
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {item}")
        out.append(t)
    if not out:
        raise ValueError("no temperature given")
    return list(dict.fromkeys(out))


def parse_gammas(text: str) -> list[int | None]:
    """``4,6,8`` -> [4, 6, 8]; ``auto`` -> None (the method's default)."""
    out: list[int | None] = []
    for item in split_list(str(text)):
        if item == "auto":
            out.append(None)
            continue
        try:
            g = int(item)
        except ValueError as exc:
            raise ValueError(f"gamma {item!r} is not an integer (or 'auto')") from exc
        if g < 1:
            raise ValueError(f"gamma must be >= 1, got {g}")
        out.append(g)
    if not out:
        raise ValueError("no gamma given")
    return list(dict.fromkeys(out))


def parse_ints(text: str, what: str, minimum: int = 1) -> list[int]:
    out = []
    for item in split_list(str(text)):
        try:
            v = int(item)
        except ValueError as exc:
            raise ValueError(f"{what} {item!r} is not an integer") from exc
        if v < minimum:
            raise ValueError(f"{what} must be >= {minimum}, got {v}")
        out.append(v)
    if not out:
        raise ValueError(f"no {what} given")
    return list(dict.fromkeys(out))


def expand_grid(methods: list[MethodSpec], temperatures: list[float],
                gammas: list[int | None], batch_sizes: tuple[int, ...] | list[int] = (1,)
                ) -> list[Config]:
    """Every config, in a fixed order: temperature, method, γ, batch size."""
    configs: list[Config] = []
    for t in temperatures:
        for m in methods:
            if m.fixed_gamma is not None:
                gs: list[int | None] = list(m.fixed_gamma)
            elif m.uses_gamma:
                gs = [g for g in gammas if g is not None or m.takes_auto]
            else:
                gs = [0 if m.name in ("ar", "hf-ar", "llamacpp-ar") else None]
            for g in gs:
                for b in batch_sizes:
                    configs.append(Config(m, t, g, b))
    return configs
