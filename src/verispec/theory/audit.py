"""``verispec audit``: the exact output distribution of a method, compared with the target's.

:func:`audit` builds a small pair of toy models (or a named toy pair), computes by
enumeration the law of the first ``length`` tokens that a method emits — every draft block
and every outcome of the verifier's randomness, weighted exactly, not sampled — and compares
it with autoregressive sampling from the target (:func:`verispec.theory.exact.target_law`).

Every method of :data:`verispec.methods.METHODS` is covered: each declares its exact law where
it lives (``MethodInfo.law``), built on the one enumeration walk of
:mod:`verispec.engine.exact` and the library's own code (plan functions and
:func:`~verispec.verify.plan_law`, greedy block verification's modifications, multi-draft's
plan, PEARL's schedule, the real beam search of MJSD / MJGD). A method without a declared law
is an error, never silently skipped.

A **user verifier** is given as ``module:function``:

* a *plan function* ``f(target_probs [B, γ+1, V], draft_probs [B, γ, V], draft_tokens [B, γ])
  -> VerifyPlan`` is audited exactly (float64, error ~1e-15);
* a function with the core verifier signature ``f(target_probs, draft_probs, draft_tokens,
  generator) -> VerifyResult`` hides its randomness in the generator, which cannot be
  integrated exactly from outside. Every draft block is still enumerated with its exact
  probability, but the law of (τ, Y) given a block is estimated from ``samples`` rows of one
  batched call, and the decision is statistical (:mod:`verispec.theory.audit_mc`; ``exact:
  false`` in the result). Its power is limited by the sampling resolution (about
  1/√samples): give the plan function for a 1e-12 audit.

Verdict: ``lossless`` is True when the method's law equals the target's (max |error| ≤ 1e-12
for exact audits); ``ok`` is False when a method that claims to be lossless is not.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from verispec.checks import TOLERANCE, check_positive
from verispec.engine.exact import Law, expected_accepted, speculative_law, target_law
from verispec.engine.protocols import Method
from verispec.methods import METHODS, build_method, parse_spec
from verispec.models.toy import ContextIndependentLM, MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Sampling
from verispec.verify import VerifyPlan

__all__ = [
    "AUDIT_MODELS",
    "MAX_BLOCKS",
    "TOLERANCE",
    "AuditResult",
    "audit",
    "audit_models",
    "law_distance",
    "load_user_function",
    "method_law",
]

#: Largest number of draft blocks (or multi-draft tuples) per iteration the audit enumerates.
MAX_BLOCKS = 100_000
#: The toy pairs ``--model`` accepts.
AUDIT_MODELS = ("random", "markov", "sparse", "ab-example")

PlanFn = Callable[[Tensor, Tensor, Tensor], VerifyPlan]


class _SparseLM(TableLM):
    """A random-context model with exact zeros: after each context about a third of the
    tokens (never all) get probability 0, so audits meet p(x) = 0 and q(x) = 0."""

    def __init__(self, vocab_size: int, seed: int, **kw: Any) -> None:
        super().__init__(vocab_size, name="sparse", **kw)
        self._base = RandomContextLM(vocab_size, seed)
        self.seed = seed

    def next_probs(self, context: Sequence[int]) -> Tensor:
        base = self._base.next_probs(context).clone()  # [V]
        digest = hashlib.sha256(repr(("zeros", self.seed, tuple(context))).encode()).digest()
        keep = torch.tensor([digest[i % len(digest)] % 3 != 0 for i in range(self.vocab_size)])
        if not bool(keep.any()):
            keep[digest[0] % self.vocab_size] = True
        base = torch.where(keep, base, torch.zeros_like(base))
        return base / base.sum()


def audit_models(model: str, vocab: int, seed: int, eos: int | None = None) -> tuple[TableLM, TableLM]:
    """(target p, draft q) for ``--model``: independent random pairs, or the paper's A/B pair."""
    kw: dict[str, Any] = {"eos_token_id": eos}
    if eos is not None and not 0 <= eos < vocab:
        raise ValueError(f"--eos {eos} is not a token of a vocabulary of {vocab}")
    # equation (2) of Block Verification Accelerates Speculative Decoding (Sun et al.):
    if model == "ab-example":  # Mb = (1/3, 2/3), Ms = (2/3, 1/3)
        if vocab != 2:
            raise ValueError("the ab-example pair has a vocabulary of 2 tokens (A, B): use --vocab 2")
        return (ContextIndependentLM([1 / 3, 2 / 3], **kw), ContextIndependentLM([2 / 3, 1 / 3], **kw))
    if vocab < 2:
        raise ValueError(f"--vocab must be >= 2, got {vocab}")
    if model == "random":
        return RandomContextLM(vocab, 2 * seed, **kw), RandomContextLM(vocab, 2 * seed + 1, **kw)
    if model == "markov":
        return MarkovLM.random(vocab, 2 * seed, **kw), MarkovLM.random(vocab, 2 * seed + 1, **kw)
    if model == "sparse":
        return _SparseLM(vocab, 2 * seed, **kw), _SparseLM(vocab, 2 * seed + 1, **kw)
    raise ValueError(f"unknown audit model {model!r}; choose one of {', '.join(AUDIT_MODELS)}")


def load_user_function(spec: str) -> Callable[..., Any]:
    """Import ``module:function`` (the function may be a dotted attribute path)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a user verifier is given as module:function, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:  # like `python -m`: the working
        sys.path.insert(0, os.getcwd())  # directory's modules are importable
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is not callable")  # noqa: TRY004 - bad input is ValueError here
    return obj  # type: ignore[no-any-return]


def _user_kind(fn: Callable[..., Any]) -> str:
    """"plan" for f(p, q, tokens) -> VerifyPlan, "verifier" for f(p, q, tokens, generator)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "verifier"
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return "verifier"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(positional) >= 4 and positional[3].name == "generator":
        return "verifier"
    if len(required) == 3:
        return "plan"
    if len(required) == 4 or (len(required) < 4 <= len(positional)):
        return "verifier"
    raise ValueError(
        f"{getattr(fn, '__name__', fn)!r} takes {len(required)} required positional arguments; a "
        "plan function takes (target_probs, draft_probs, draft_tokens) and a verifier takes "
        "(target_probs, draft_probs, draft_tokens, generator)"
    )


def _checked_plan(fn: PlanFn) -> PlanFn:
    def plan(p: Tensor, q: Tensor, tokens: Tensor) -> VerifyPlan:
        out = fn(p, q, tokens)
        if not isinstance(out, VerifyPlan):
            raise ValueError(  # noqa: TRY004 - every invalid input raises ValueError in verispec
                f"the plan function returned {type(out).__name__}, not a VerifyPlan")
        b, g1, v = p.shape
        if tuple(out.accept_probs.shape) != (b, g1 - 1) or tuple(out.residuals.shape) != (b, g1, v):
            raise ValueError(
                f"the plan has accept_probs {tuple(out.accept_probs.shape)} and residuals "
                f"{tuple(out.residuals.shape)}; expected {(b, g1 - 1)} and {(b, g1, v)}")
        return out

    return plan


# --------------------------------------------------------------------------------------
# The audit.


@dataclass
class AuditResult:
    """One audit. ``lossless`` is the verdict of the audit, ``claims_lossless`` the method's
    claim; ``ok`` is False exactly when a lossless claim is refuted."""

    method: str
    vocab: int
    gamma: int
    length: int
    max_abs_error: float
    tv: float
    expected_tokens_per_iteration: float | None
    lossless: bool
    claims_lossless: bool
    ok: bool
    exact: bool
    seed: int
    model: str
    temperature: float
    tolerance: float
    num_sequences: int
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    z_max: float | None = None
    z_critical: float | None = None
    laws: dict[str, dict[str, float]] | None = None

    def to_dict(self, with_laws: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_laws:
            d.pop("laws")
        return d


def law_distance(a: Law, b: Law) -> tuple[float, float]:
    """(max |a(s) − b(s)|, TV(a, b)) over the union of supports."""
    keys = set(a) | set(b)
    diffs = [abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys]
    return (max(diffs) if diffs else 0.0), 0.5 * sum(diffs)


def method_law(method: Method, target: TableLM, draft: TableLM, prompt: Sequence[int], *,
               gamma: int, sampling: Sampling, length: int,
               draft_stop: float | None = None) -> tuple[Law, float | None]:
    """Exact law of a method's first ``length`` tokens, and the exact expected number of
    tokens emitted by its first iteration (None where that is not defined), from the law
    the method declares in :data:`verispec.methods.METHODS`."""
    info = METHODS.get(method.name)
    if info is None or info.law is None:
        raise ValueError(f"the audit has no exact law for method {method.name!r}: its entry in "
                         "verispec.methods.METHODS declares none")
    if draft_stop is not None and method.name not in ("token", "block", "lossy"):
        raise ValueError(f"--draft-stop is audited for token, block and lossy, not {method.name!r}")
    return info.law(method, target, draft, tuple(prompt), gamma=gamma, sampling=sampling,
                    length=length, draft_stop=draft_stop)


def _sampling(temperature: float, top_k: int | None, top_p: float | None) -> Sampling:
    return Sampling(temperature=temperature, top_k=top_k, top_p=top_p)


def _user_law(fn: Any, target: TableLM, draft: TableLM, prompt: Sequence[int], base: Sampling,
              gamma: int, length: int, reference: Law, samples: int, alpha: float,
              bootstrap: int, seed: int,
              ) -> tuple[Law, float | None, float | None, float | None, str]:
    """(law, expected tokens per iteration, z_max, z_critical, note) of a user verifier: exact
    for a plan function (z None), estimated by sampling its randomness otherwise."""
    if _user_kind(fn) == "plan":
        plan_fn = _checked_plan(fn)
        law = speculative_law(target, draft, prompt, plan_fn=plan_fn, gamma=gamma,
                              sampling=base, length=length)
        expected = expected_accepted(target, draft, prompt, plan_fn=plan_fn,
                                     gamma=min(gamma, length - 1), sampling=base)[0] + 1
        return law, expected, None, None, "user plan function: exact enumeration"
    from verispec.theory.audit_mc import mc_audit

    law, mc_expected, z_max, z_crit = mc_audit(fn, target, draft, prompt, base, gamma, length,
                                               reference, samples, alpha, bootstrap, seed)
    return law, mc_expected, z_max, z_crit, (
        f"user verifier with a generator: every draft block enumerated exactly, (τ, Y) given "
        f"a block estimated from {samples} draws; decision by bootstrap z-scores at "
        f"family-wise α = {alpha}")


def _check_audit(method: str, vocab: int, gamma: int, length: int, samples: int,
                 prompt: Sequence[int], options: dict[str, Any]) -> None:
    """Refuse bad sizes, a prompt outside the vocabulary and laws too large to enumerate."""
    for name, value, low in (("gamma", gamma, 0), ("length", length, 1), ("samples", samples, 2)):
        check_positive(name, value, minimum=low)
    if not prompt or any(not 0 <= int(t) < vocab for t in prompt):
        raise ValueError(f"the prompt must be non-empty token ids in [0, {vocab}), got {list(prompt)}")
    name, inline = parse_spec(method) if ":" not in method else (method, {})
    drafts = (options.get("num_drafts") or inline.get("num_drafts") or 2) \
        if name == "multidraft" else 1  # M defaults to 2
    if float(vocab) ** (min(gamma, length - 1) * drafts) > MAX_BLOCKS:
        raise ValueError(f"V^(γ·M) = {vocab}^{min(gamma, length - 1) * drafts} draft blocks per "
                         f"iteration is too many to enumerate (limit {MAX_BLOCKS}); use a smaller "
                         "--vocab, --gamma or --num-drafts")


def audit(
    method: str,
    *,
    vocab: int = 3,
    gamma: int = 2,
    length: int = 3,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    model: str = "random",
    prompt: Sequence[int] = (0,),
    eos: int | None = None,
    draft_stop: float | None = None,
    samples: int = 20000,
    alpha: float = 1e-4,
    bootstrap: int = 100,
    with_laws: bool = False,
    **options: Any,
) -> AuditResult:
    """Audit ``method`` (a registered name or ``module:function``) on one toy pair.

    ``options`` are the method's options (``epsilon``, ``residual``, ``num_drafts``,
    ``num_beams``, ``threshold``, ``paper_warp``, ``verifier``, ...); None is ignored.
    ``samples``, ``alpha`` and ``bootstrap`` only matter for a user verifier that is not a
    plan function (see the module docstring).
    """
    _check_audit(method, vocab, gamma, length, samples, prompt, options)
    target, draft = audit_models(model, vocab, seed, eos)
    base = _sampling(temperature, top_k, top_p)
    reference = target_law(target, prompt, base, length)
    opts = {k: v for k, v in options.items() if v is not None}
    notes: list[str] = []
    exact, z_max, z_crit = True, None, None
    expected: float | None
    if ":" in method:
        if opts or draft_stop is not None:
            raise ValueError("a user verifier takes no method options, got "
                             f"{', '.join(sorted(opts)) or 'draft_stop'}")
        claims = True
        law, expected, z_max, z_crit, note = _user_law(
            load_user_function(method), target, draft, prompt, base, gamma, length, reference,
            samples, alpha, bootstrap, seed)
        exact = z_max is None
        notes.append(note)
    else:
        if parse_spec(method)[0] not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)} "
                             "or give a user verifier as module:function")
        m = build_method(method, **opts)
        claims = bool(m.lossless)
        sampling = m.adjust_sampling(base)
        if sampling != base:
            notes.append(f"{method} samples with its own warp {sampling}; compared with the "
                         f"target under the requested warp {base}")
        law, expected = method_law(m, target, draft, prompt, gamma=gamma, sampling=sampling,
                                   length=length, draft_stop=draft_stop)
        if expected is None:
            notes.append(f"{method}: expected tokens per iteration not computed (PEARL has no "
                         "iterations; --draft-stop makes the draft length random)")
    max_err, tv = law_distance(law, reference)
    if exact:
        lossless = max_err <= TOLERANCE
    else:
        lossless = z_max is not None and z_crit is not None and z_max <= z_crit
    laws = None
    if with_laws:
        laws = {"target": {",".join(map(str, k)): v for k, v in sorted(reference.items())},
                "method": {",".join(map(str, k)): v for k, v in sorted(law.items())}}
    return AuditResult(
        method=method, vocab=vocab, gamma=gamma, length=length, max_abs_error=max_err, tv=tv,
        expected_tokens_per_iteration=expected, lossless=lossless, claims_lossless=claims,
        ok=lossless or not claims, exact=exact, seed=seed, model=model, temperature=temperature,
        tolerance=TOLERANCE if exact else math.nan, num_sequences=len(set(law) | set(reference)),
        options=opts, notes=notes, z_max=z_max, z_critical=z_crit, laws=laws,
    )
