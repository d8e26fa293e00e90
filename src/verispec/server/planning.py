"""From a validated body to an engine :class:`~verispec.engine.request.Request`, built the
way :func:`verispec.generate` builds its one request, so a request's tokens equal the
offline output for the same prompt, seed, method, γ and sampling.

Two halves, for the two threads:

* :meth:`Planner.plan` (event loop, per HTTP request) resolves the method, γ, sampling,
  prompt tokens and budget, and refuses what cannot run (400s naming the field). Methods
  are built once per spelling and shared, so rows of one method verify in one call.
* :meth:`Planner.build` (scheduler thread, when the request is handed to the engine) adds
  what touches models: the shared drafter of its kind, its γ policy (``auto`` times the pair
  once per process) and its own random generator seeded with its seed.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verispec.api import Pair, _check_gamma, _Plan, _policy, decode, encode_prompt, make_drafter
from verispec.drafters.base import Drafter
from verispec.engine.protocols import Method
from verispec.engine.request import Request
from verispec.methods import MethodInfo, build_method, resolve
from verispec.models.base import CausalLM
from verispec.sampling import Randomness, Sampling
from verispec.server.config import ServerConfig
from verispec.server.errors import APIError
from verispec.server.schemas import Generation

__all__ = ["Plan", "Planner"]

SEED_BITS = 63


@dataclass
class Plan:
    """Everything a request needs besides the models' state.

    Attributes:
        method_label: the method as reported (``block``, ``lossy[epsilon=0.1]``).
        drafter_kind: ``model`` or ``ngram``; None for methods that never draft.
        needs_draft: whether the draft model is part of the pair (as in ``generate``).
    """

    info: MethodInfo
    method: Method
    method_label: str
    sampling: Sampling
    gamma: int | str
    drafter_kind: str | None
    needs_draft: bool
    prompt_ids: list[int]
    max_tokens: int
    seed: int


class Planner:
    """Plans requests for one target/draft pair (see the module docstring)."""

    def __init__(self, target: CausalLM, draft: CausalLM | None, config: ServerConfig) -> None:
        self.target, self.draft, self.config = target, draft, config
        self._methods: dict[str, tuple[MethodInfo, Method, str]] = {}  # event loop only
        self._drafters: dict[tuple[Any, ...], Drafter | None] = {}  # scheduler thread only
        # the tokenizer encodes on the event loop and decodes on the scheduler thread
        self._tokenizer_lock = threading.Lock()
        self.default_label = self._method(config.method, "--method")[2]

    # -- event loop side ----------------------------------------------------------------------

    def plan_info(self, spelling: str) -> tuple[MethodInfo, bool]:
        """A method's entry and whether it needs the draft model with the default drafter;
        ValueError if the configured γ does not fit it."""
        info, method, _ = self._method(spelling, "--method")
        _check_gamma(info, self.config.gamma)
        kind = self.config.drafter
        return info, info.uses_draft and (kind == "model" or method.drafter_kind == "beam")

    def plan(self, gen: Generation) -> Plan:
        """Resolve a validated request, or raise a 400 naming the field."""
        spec = gen.speculative
        info, method, label = self._method(spec.method or self.config.method, "speculative.method")
        if not info.batchable:
            raise APIError(400, f"speculative.method: {info.name} runs by a schedule of its own "
                                "and cannot share the server's batch; choose a batchable method "
                                "(ar, token, block, greedy-block, lossy, multidraft, mjsd)",
                           param="speculative.method", code="method_not_batchable")
        gamma = spec.gamma
        if gamma is None and label == self.default_label:
            gamma = self.config.gamma
        try:
            gamma = _check_gamma(info, gamma)
        except ValueError as exc:
            raise APIError(400, f"speculative.gamma: {exc}", param="speculative.gamma",
                           code="invalid_value") from None
        kind = spec.drafter or self.config.drafter
        needs_draft = info.uses_draft and (kind == "model" or method.drafter_kind == "beam")
        self._check_drafter(info, method, kind, needs_draft, gamma)
        try:
            sampling = method.adjust_sampling(
                Sampling(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p))
        except ValueError as exc:
            raise APIError(400, str(exc), param="temperature", code="invalid_value") from None
        if sampling.greedy and method.matches_at_greedy:  # see _method: its own group
            method = self._method(spec.method or self.config.method, "speculative.method",
                                  matching=True)[1]
        ids = self._prompt_ids(gen)
        budget = self._budget(ids, gen.max_tokens, gen.messages is not None, needs_draft)
        seed = gen.seed if gen.seed is not None else secrets.randbits(SEED_BITS)
        return Plan(info, method, label, sampling, gamma,
                    kind if info.uses_draft and info.runner is None else None, needs_draft,
                    ids, budget, seed)

    def _method(self, spelling: str, param: str,
                matching: bool = False) -> tuple[MethodInfo, Method, str]:
        """The shared instance of a method. The engine verifies the rows of one instance in
        one call; requests that verify by plain matching (temperature 0) get an instance of
        their own, so that they take the engine's matching path, as they do offline."""
        try:
            info, opts = resolve(spelling)
            key = info.name + json.dumps(opts, sort_keys=True, default=str) + "=" * matching
            if key not in self._methods:
                label = info.name + ("[" + ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
                                     + "]" if opts else "")
                self._methods[key] = (info, build_method(info.name, **opts), label)
        except (ValueError, TypeError) as exc:
            raise APIError(400, f"{param}: {exc}", param=param, code="invalid_method") from None
        return self._methods[key]

    def _check_drafter(self, info: MethodInfo, method: Method, kind: str, needs_draft: bool,
                       gamma: int | str) -> None:
        if needs_draft and self.draft is None:
            raise APIError(400, f"speculative.method: {info.name} drafts with a draft model and "
                                "this server has none; use method ar or drafter ngram",
                           param="speculative.method", code="no_draft_model")
        if gamma == "auto" and info.uses_draft and not needs_draft:
            raise APIError(400, "speculative.gamma: gamma auto times the draft model; the n-gram "
                                "drafter has none: give an integer", param="speculative.gamma",
                           code="invalid_value")
        if info.uses_draft and info.runner is None:
            try:  # the same checks as generate(); the drafter itself is built by build()
                make_drafter(self.target, self.draft if needs_draft else None, method, kind=kind)
            except ValueError as exc:
                raise APIError(400, f"speculative.drafter: {exc}", param="speculative.drafter",
                               code="invalid_value") from None

    def _prompt_ids(self, gen: Generation) -> list[int]:
        param = "messages" if gen.messages is not None else "prompt"
        try:
            text = self.chat_text(gen.messages) if gen.messages is not None else gen.prompt
            assert text is not None
            with self._tokenizer_lock:
                ids = encode_prompt(self.target, text)
        except ValueError as exc:
            raise APIError(400, f"{param}: {exc}", param=param, code="invalid_prompt") from None
        bad = [t for t in ids if not 0 <= t < self.target.vocab_size]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                                f"[0, {self.target.vocab_size})", param="prompt",
                           code="invalid_prompt")
        return ids

    def chat_text(self, messages: list[dict[str, str]]) -> str:
        """The messages in the target's chat template, ready for the assistant's turn (as
        ``verispec generate --chat`` wraps its prompt)."""
        tokenizer = self.target.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise APIError(400, f"messages: {self.target.name} has no chat template; use "
                                "/v1/completions", param="messages", code="no_chat_template")
        with self._tokenizer_lock:
            return str(tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True))

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, as ``verispec generate`` decodes its output."""
        with self._tokenizer_lock:
            return decode(self.target, ids)

    def window(self, needs_draft: bool) -> int | None:
        """The context window a request decodes in (the draft's too where it drafts)."""
        limits = [m.max_length for m in (self.target, self.draft if needs_draft else None)
                  if m is not None and m.max_length is not None]
        return min(limits) if limits else None

    def _budget(self, ids: list[int], max_tokens: int | None, chat: bool,
                needs_draft: bool) -> int:
        window = self.window(needs_draft)
        param = "messages" if chat else "prompt"
        if window is None:
            return max_tokens or self.config.default_max_tokens
        room = window - len(ids)
        if room < 1:
            raise APIError(400, f"{param}: the prompt has {len(ids)} tokens; the context window "
                                f"is {window} tokens, leaving no room to generate",
                           param=param, code="context_length_exceeded")
        if max_tokens is None:
            return min(self.config.default_max_tokens, room)
        if max_tokens > room:
            raise APIError(400, f"max_tokens: {max_tokens} new tokens after a prompt of "
                                f"{len(ids)} exceed the context window of {window} tokens "
                                f"(at most {room})", param="max_tokens",
                           code="context_length_exceeded")
        return max_tokens

    # -- scheduler side -----------------------------------------------------------------------

    def build(self, plan: Plan, on_tokens: Callable[[list[int]], None]) -> Request:
        """The engine request of a plan (scheduler thread: it may time the pair)."""
        drafter = self._drafter(plan)
        pair = Pair(self.target, self.draft if plan.needs_draft else None)
        policy = _policy(_Plan(plan.info, plan.method, plan.sampling, plan.gamma, pair, drafter),
                         self.config.max_batch)
        random = Randomness(torch.Generator(device=self.target.device).manual_seed(plan.seed))
        return Request(list(plan.prompt_ids), plan.method, plan.sampling, plan.max_tokens,
                       random, policy, drafter, on_tokens)

    def _drafter(self, plan: Plan) -> Drafter | None:
        """One drafter per kind, shared by every request of that kind: one cache in the
        draft model, one batched draft pass per position for all of them."""
        if plan.drafter_kind is None:
            return None
        key = (plan.drafter_kind, plan.method.drafter_kind,
               getattr(plan.method, "num_beams", None))
        if key not in self._drafters:
            self._drafters[key] = make_drafter(
                self.target, self.draft if plan.needs_draft else None, plan.method,
                kind=plan.drafter_kind)
        return self._drafters[key]

    def reset_drafters(self) -> None:
        """Forget every drafter (after an engine fault; the draft model is reset too)."""
        self._drafters.clear()
        if self.draft is not None:
            self.draft.reset()
