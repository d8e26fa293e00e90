"""A request's plan, decided in one place.

:class:`RequestConfig` is what a caller chooses (method and options, γ, drafter, sampling,
precision); :func:`plan_request` turns it into a :class:`RequestPlan` (the built method, the
checked γ, the warped sampling, the drafter it drafts with and whether that needs the draft
model) without touching a model. The CLI, :func:`verispec.generate`,
:func:`verispec.generate_batch`, ``verispec serve`` and ``verispec bench`` all plan through
it; :func:`make_drafter` and :func:`gamma_policy` then add what touches the models.

What a method needs comes from its table entry (:class:`~verispec.methods.MethodInfo`):
``drafting`` (none, sample or beam) and ``runner`` (a schedule of its own). The rule that
turns it into a drafter is :func:`drafter_for`, and nowhere else.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verispec.checks import check_positive
from verispec.drafters.base import Drafter
from verispec.engine.overhead import IterationOverhead
from verispec.engine.costs import BATCH_ROWS, measure_costs
from verispec.engine.gamma import AutoGamma, FixedGamma, GammaPolicy, PairHistory, PassCosts
from verispec.engine.history import pair_history_for
from verispec.engine.protocols import Method, ScheduledMethod
from verispec.methods import METHODS, MethodInfo, build_method, resolve
from verispec.models.base import CausalLM
from verispec.sampling import Sampling

__all__ = [
    "DRAFTERS",
    "DRAFT_STOP_METHODS",
    "MethodCache",
    "PlanError",
    "RequestConfig",
    "RequestPlan",
    "check_gamma",
    "drafter_for",
    "gamma_policy",
    "held_overhead",
    "make_drafter",
    "pair_costs",
    "pair_history",
    "pair_overhead",
    "plan_request",
]

#: Drafters a caller may choose; methods with ``drafting="beam"`` draft by beam search.
DRAFTERS = ("model", "ngram")
#: The draft-stop rule is proven lossless for these methods.
DRAFT_STOP_METHODS = ("token", "block")


class PlanError(ValueError):
    """A request that cannot be planned; ``field`` names the setting at fault
    (``method``, ``gamma``, ``drafter``, ``draft_stop`` or ``sampling``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RequestConfig:
    """What a caller chooses for a request.

    Attributes:
        method: a method name, optionally with options in brackets (``lossy[epsilon=0.1]``).
        options: more method options (merged with the bracketed ones; None values ignored).
        gamma: draft length γ: an int, ``"auto"``, or None for the method's default.
        drafter: ``model`` (the draft model) or ``ngram`` (prompt lookup).
        draft_stop: end a model draft early where the draft's top probability is below this.
        temperature, top_k, top_p: the sampling warp (temperature 0: greedy).
        precision: numeric format of both models; ``target_precision`` and
            ``draft_precision`` override it per model.
    """

    method: str = "block"
    options: Mapping[str, Any] = field(default_factory=dict)
    gamma: int | str | None = None
    drafter: str = "model"
    draft_stop: float | None = None
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    precision: str = "auto"
    target_precision: str | None = None
    draft_precision: str | None = None


@dataclass(frozen=True)
class RequestPlan:
    """A planned request (no model touched yet).

    Attributes:
        info: the method's table entry.
        method: the built method (a :class:`ScheduledMethod` where ``info.runner`` is set).
        label: the method as reported (``block``, ``lossy[epsilon=0.1]``).
        sampling: the warp the method samples with.
        gamma: the checked γ (an int or ``"auto"``).
        drafter: the engine's drafter: ``model``, ``ngram``, ``beam``, or None where the
            engine drafts nothing (``ar``, and methods that run by their own schedule).
        needs_draft: whether the draft model is loaded for it.
        draft_stop: the draft-stop threshold (None: drafts run their whole length).
    """

    info: MethodInfo
    method: Method | ScheduledMethod
    label: str
    sampling: Sampling
    gamma: int | str
    drafter: str | None
    needs_draft: bool
    draft_stop: float | None = None

    @property
    def engine_method(self) -> Method:
        """The method as the engine verifies it (TypeError for a scheduled method)."""
        if not isinstance(self.method, Method):
            raise TypeError(f"{self.info.name} runs by a schedule of its own, not the engine")
        return self.method


def drafter_for(info: MethodInfo, chosen: str) -> tuple[str | None, bool]:
    """The one rule of what a method needs: (the engine's drafter, whether the draft model
    is needed) for a method whose caller chose the drafter ``chosen``."""
    _check_choice(chosen)
    if info.drafting == "none":
        return None, False
    if info.drafting == "beam" or info.runner is not None:
        if chosen != "model":
            raise PlanError("drafter", f"{info.name} drafts with the draft model "
                                       f"({'beam search' if info.drafting == 'beam' else 'its own workers'}); "
                                       "the n-gram drafter cannot serve it")
        return ("beam" if info.drafting == "beam" else None), True
    return chosen, chosen == "model"


def _check_choice(chosen: str) -> None:
    if chosen not in DRAFTERS:
        raise PlanError("drafter", f"drafter must be one of {', '.join(DRAFTERS)}, got {chosen!r}")


def check_gamma(info: MethodInfo, gamma: int | str | None) -> int | str:
    """γ for a method: its default for None, ``"auto"`` where it takes it, else an int ≥ 1
    (≥ 0 for methods that do not draft, whose γ is then 0)."""
    if gamma is None:
        return "auto" if info.auto_gamma else info.default_gamma
    if isinstance(gamma, str):
        takes_auto = info.uses_draft or info.auto_gamma
        if gamma != "auto" or not takes_auto:
            raise PlanError("gamma", f"gamma must be an integer{' or auto' if takes_auto else ''} "
                                     f"for {info.name}, got {gamma!r}")
        return gamma
    try:
        check_positive("gamma", gamma, minimum=1 if info.uses_draft else 0)
    except ValueError as exc:
        raise PlanError("gamma", f"{exc} ({info.name})") from None
    return gamma if info.uses_draft or info.runner is not None else 0


def _check_drafter(method: Method | ScheduledMethod, drafter: str | None,
                   draft_stop: float | None) -> None:
    if draft_stop is not None and (drafter != "model" or method.name not in DRAFT_STOP_METHODS):
        raise PlanError("draft_stop", f"draft_stop works with the model drafter and the methods "
                                      f"{', '.join(DRAFT_STOP_METHODS)} (lossless with them); "
                                      f"not with {method.name} / the {drafter} drafter")
    if drafter == "ngram" and isinstance(method, Method) and (
            method.needs_next_probs or method.num_drafts > 1):
        raise PlanError("drafter", f"{method.name} cannot use the n-gram drafter: it needs q as a "
                                   "fixed function of the context (or several i.i.d. drafts); use "
                                   "the model drafter")


class MethodCache:
    """Built methods shared per spelling, so that the engine verifies the rows of one method
    in one call (the server's). Requests that verify by plain matching (temperature 0) get
    an instance of their own, so that they take the engine's matching path, as offline."""

    def __init__(self) -> None:
        self._built: dict[str, Method | ScheduledMethod] = {}

    def get(self, info: MethodInfo, options: Mapping[str, Any],
            matching: bool) -> Method | ScheduledMethod:
        key = info.name + json.dumps(dict(options), sort_keys=True, default=str) + "=" * matching
        if key not in self._built:
            self._built[key] = build_method(info.name, **options)
        return self._built[key]


def _label(info: MethodInfo, options: Mapping[str, Any]) -> str:
    inner = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{info.name}[{inner}]" if inner else info.name


def plan_request(config: RequestConfig, methods: MethodCache | None = None, *,
                 auto_default: bool = False) -> RequestPlan:
    """Plan a request; :class:`PlanError` (a ValueError) names the setting at fault.

    ``auto_default``: the request shares a batch (the server, :func:`verispec.generate_batch`),
    so where the caller gave no γ and the draft model drafts, γ is ``auto``: chosen each
    iteration for the whole batch from the measured cost of a batched pass, rather than the
    method's fixed default, which costs throughput once the batch is wide."""
    try:
        info, options = resolve(config.method, **config.options)
        if "verifier" in options and info.name != "pearl":
            raise ValueError(f"verifier={options['verifier']!r}: the verification method is "
                             "chosen with method=...; only pearl takes a verifier (for its "
                             "windows)")
        method = build_method(info.name, **options)
    except (ValueError, TypeError) as exc:
        raise PlanError("method", str(exc)) from None
    drafter, needs_draft = drafter_for(info, config.drafter)
    auto = auto_default and config.gamma is None and drafter == "model"
    gamma = check_gamma(info, "auto" if auto else config.gamma)
    _check_drafter(method, drafter, config.draft_stop)
    if gamma == "auto" and info.uses_draft and not needs_draft:
        raise PlanError("gamma", "gamma auto times the draft model; the n-gram drafter has none: "
                                 "give an integer")
    try:
        sampling = method.adjust_sampling(Sampling(temperature=config.temperature,
                                                   top_k=config.top_k, top_p=config.top_p))
    except ValueError as exc:
        raise PlanError("sampling", str(exc)) from None
    if methods is not None:
        matching = sampling.greedy and getattr(method, "matches_at_greedy", False)
        method = methods.get(info, options, matching)
    return RequestPlan(info, method, _label(info, options), sampling, gamma, drafter,
                       needs_draft, config.draft_stop)


def make_drafter(target: CausalLM, draft: CausalLM | None, method: Method, *,
                 kind: str = "model", draft_stop: float | None = None) -> Drafter | None:
    """The drafter ``method`` drafts with (None for methods that never draft); ``kind`` is
    the caller's choice of drafter, overridden where the method's table entry decides.

    ``draft_stop``: the model drafter stops a row's draft early where its own confidence
    falls below this (see :class:`~verispec.drafters.model.ModelDrafter`); token and block
    verification only, for which it is proven lossless.
    """
    info = METHODS.get(method.name)
    if info is not None:
        drafter = drafter_for(info, kind)[0]
    else:  # a method outside the table (a test double) drafts by sampling, as chosen
        _check_choice(kind)
        drafter = kind
    _check_drafter(method, drafter, draft_stop)
    if drafter is None:
        return None
    if drafter == "ngram":
        from verispec.drafters.ngram import NgramDrafter

        return NgramDrafter(target.vocab_size)
    if draft is None:
        raise PlanError("drafter", f"{method.name} drafts with a draft model; give one")
    if drafter == "beam":
        from verispec.drafters.beam import BeamDrafter

        return BeamDrafter(draft, num_beams=getattr(method, "num_beams", 8))
    from verispec.drafters.model import ModelDrafter

    return ModelDrafter(draft, stop_below=draft_stop)


_COSTS: weakref.WeakKeyDictionary[
    CausalLM, weakref.WeakKeyDictionary[CausalLM, dict[tuple[int, ...], PassCosts]]] = \
    weakref.WeakKeyDictionary()
_OVERHEAD: weakref.WeakKeyDictionary[
    CausalLM, weakref.WeakKeyDictionary[CausalLM, dict[int, IterationOverhead]]] = \
    weakref.WeakKeyDictionary()
_HISTORY: weakref.WeakKeyDictionary[
    CausalLM, weakref.WeakKeyDictionary[CausalLM, dict[tuple[object, ...], PairHistory]]] = \
    weakref.WeakKeyDictionary()


def pair_costs(target: CausalLM, draft: CausalLM, rows: int = 1) -> PassCosts:
    """The pair's measured pass costs (V(k), c), with a batched grid that reaches ``rows``
    rows, timed once per machine, pair and grid (kept on disk) and held per process.

    A grid this process already holds that reaches ``rows`` serves it; else the grid is
    :data:`~verispec.engine.costs.BATCH_ROWS` up to the first entry ≥ ``rows`` (``rows``
    itself beyond them), so batches of 3 and 4 rows share one grid (3 is interpolated)
    instead of each timing its own."""
    held = _held_costs(target, draft, rows)
    if held is not None:
        return held
    top = next((r for r in BATCH_ROWS if r >= rows), rows)
    grid = tuple(sorted({1, top, *(r for r in BATCH_ROWS if r < top)}))
    costs = measure_costs(target, draft, rows=grid)
    _COSTS.setdefault(target, weakref.WeakKeyDictionary()).setdefault(draft, {})[grid] = costs
    return costs


def _held_costs(target: CausalLM, draft: CausalLM, rows: int) -> PassCosts | None:
    """The smallest grid this process holds for the pair that reaches ``rows`` (None: none;
    nothing is timed here)."""
    held = _COSTS.get(target, {}).get(draft, {})
    reaching = [g for g in held if g[-1] >= rows]
    return held[min(reaching, key=lambda g: g[-1])] if reaching else None


def pair_overhead(target: CausalLM, draft: CausalLM, rows: int = 1) -> IterationOverhead:
    """What the engines of this process have learned about the pair's iterations on the
    grid :func:`pair_costs` gives for ``rows`` (the passes' measured shapes and level, the
    engine's own time): one per pair and grid, shared by every engine that decodes γ auto
    requests of the pair, so a ``generate`` or ``generate_batch`` call starts from what the
    calls before it measured instead of from the start-up grid alone. Everything in it was
    measured on earlier iterations, so a γ chosen from it still depends only on the past."""
    grid = pair_costs(target, draft, rows).batch
    per_draft = _OVERHEAD.setdefault(target, weakref.WeakKeyDictionary()).setdefault(draft, {})
    return per_draft.setdefault(id(grid), IterationOverhead())


def held_overhead(target: CausalLM, draft: CausalLM | None,
                  rows: int = 1) -> IterationOverhead | None:
    """The record :func:`pair_overhead` holds for the pair at ``rows``, where an earlier
    γ auto engine of this process made one, else None (nothing is timed here). Engines of
    the pair's fixed-γ requests record their iterations into it (see
    :meth:`IterationOverhead.grid_for`), as the rows of one server's engine do: their
    passes measure the shapes γ auto prices."""
    held = None if draft is None else _held_costs(target, draft, rows)
    if held is None:
        return None
    return _OVERHEAD.get(target, {}).get(draft, {}).get(id(held.batch))


def pair_history(target: CausalLM, draft: CausalLM, method: str = "",
                 sampling: Sampling | None = None) -> PairHistory:
    """The pair's acceptance pooled over the requests that share the method and the
    sampling warp (γ auto's prior): acceptance depends on both (greedy drafts of a code
    model are accepted far more often than samples at T = 1), so a server that mixes them
    does not start one kind of request from the other's acceptance. One history per
    process, which starts from the counts recorded by earlier processes where the models
    were loaded from a directory (:mod:`verispec.engine.history`)."""
    warp = None if sampling is None else _warp_key(sampling)
    per_draft = _HISTORY.setdefault(target, weakref.WeakKeyDictionary()).setdefault(draft, {})
    if (method, warp) not in per_draft:
        per_draft[(method, warp)] = pair_history_for(target, draft, method, warp)
    return per_draft[(method, warp)]


def _warp_key(sampling: Sampling) -> tuple[float, int | None, float | None]:
    """The sampling warp as one key per law: ``temperature=0`` and ``0.0`` are one warp, and
    so are ``top_p`` None and 1.0 (both keep every token)."""
    top_p = None if sampling.top_p is None or sampling.top_p >= 1.0 else float(sampling.top_p)
    return float(sampling.temperature), sampling.top_k, top_p


def gamma_policy(plan: RequestPlan, target: CausalLM, draft: CausalLM | None,
                 drafter: Drafter | None, rows: int = 1) -> GammaPolicy:
    """A fresh γ policy for one request (``auto`` keeps per-request acceptance; ``rows``: the
    most rows its engine decodes together, the extent of the timed batch grid)."""
    if drafter is None:
        return FixedGamma(0)
    if plan.gamma == "auto":
        if draft is None:
            raise PlanError("gamma", "gamma auto times the draft model; the n-gram drafter has "
                                     "none")
        return AutoGamma(pair_costs(target, draft, rows),
                         min_gamma=1 if plan.engine_method.needs_next_probs else 0,
                         history=pair_history(target, draft, plan.engine_method.name,
                                              plan.sampling))
    assert isinstance(plan.gamma, int)
    return FixedGamma(plan.gamma)
