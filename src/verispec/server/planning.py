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

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from verispec.api import decode, encode_prompt
from verispec.drafters.base import Drafter
from verispec.engine.request import Request
from verispec.models.base import CausalLM
from verispec.plan import (
    MethodCache,
    PlanError,
    RequestConfig,
    RequestPlan,
    gamma_policy,
    make_drafter,
    plan_request,
)
from verispec.sampling import Randomness
from verispec.server.config import ServerConfig
from verispec.server.errors import APIError
from verispec.server.schemas import Generation

__all__ = ["Plan", "Planner"]

SEED_BITS = 63

#: The request field a planning error is reported under, by :class:`PlanError` field.
FIELDS = {"method": "speculative.method", "gamma": "speculative.gamma",
          "drafter": "speculative.drafter", "draft_stop": "speculative.drafter",
          "sampling": "temperature"}
CODES = {"method": "invalid_method"}


@dataclass
class Plan:
    """A planned request and what it decodes: its prompt, budget and seed; ``ignore_eos``:
    an end-of-text token does not end it (it decodes its whole budget); ``streamed``: its
    tokens are sent as they come (the request's ``stream``: the time to the first one
    counts)."""

    request: RequestPlan
    prompt_ids: list[int]
    max_tokens: int
    seed: int
    ignore_eos: bool = False
    streamed: bool = True


class Planner:
    """Plans requests for one target/draft pair (see the module docstring)."""

    def __init__(self, target: CausalLM, draft: CausalLM | None, config: ServerConfig) -> None:
        self.target, self.draft, self.config = target, draft, config
        self._methods = MethodCache()  # event loop only
        self._drafters: dict[tuple[Any, ...], Drafter | None] = {}  # scheduler thread only
        # the tokenizer encodes on the event loop and decodes on the scheduler thread
        self._tokenizer_lock = threading.Lock()
        self.default = self._plan(RequestConfig(config.method, gamma=config.gamma,
                                                drafter=config.drafter), "--method")

    # -- event loop side ----------------------------------------------------------------------

    def plan(self, gen: Generation) -> Plan:
        """Resolve a validated request, or raise a 400 naming the field."""
        spec = gen.speculative
        config = RequestConfig(spec.method or self.config.method, gamma=spec.gamma,
                               drafter=spec.drafter or self.config.drafter,
                               temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p)
        request = self._plan(config, None)
        if spec.gamma is None and self.config.gamma is not None \
                and request.label == self.default.label:  # the server's γ for its method
            request = self._plan(replace(config, gamma=self.config.gamma), None)
        ids = self._prompt_ids(gen)
        budget = self._budget(ids, gen.max_tokens, gen.messages is not None, request.needs_draft)
        seed = gen.seed if gen.seed is not None else secrets.randbits(SEED_BITS)
        return Plan(request, ids, budget, seed, gen.ignore_eos, gen.stream)

    def _plan(self, config: RequestConfig, option: str | None) -> RequestPlan:
        """Plan through :func:`verispec.plan.plan_request`; a 400 naming the request field
        (or the server option ``option``) for what cannot run here."""
        try:
            plan = plan_request(config, self._methods, auto_default=True)
        except PlanError as exc:
            param = option or FIELDS[exc.field]
            raise APIError(400, f"{param}: {exc}", param=param,
                           code=CODES.get(exc.field, "invalid_value")) from None
        param = option or "speculative.method"
        if not plan.info.batchable:
            raise APIError(400, f"{param}: {plan.info.name} runs by a schedule of its own and "
                                "cannot share the server's batch; choose a batchable method "
                                "(ar, token, block, greedy-block, lossy, multidraft, mjsd)",
                           param=param, code="method_not_batchable")
        if plan.needs_draft and self.draft is None:
            raise APIError(400, f"{param}: {plan.info.name} drafts with a draft model and this "
                                "server has none; use method ar or drafter ngram",
                           param=param, code="no_draft_model")
        return plan

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
        request = plan.request
        drafter = self._drafter(request)
        draft = self.draft if request.needs_draft else None
        policy = gamma_policy(request, self.target, draft, drafter, self.config.max_batch)
        random = Randomness(torch.Generator(device=self.target.device).manual_seed(plan.seed))
        return Request(list(plan.prompt_ids), request.engine_method, request.sampling,
                       plan.max_tokens, random, policy, drafter, on_tokens,
                       ignore_eos=plan.ignore_eos, streamed=plan.streamed)

    def _drafter(self, plan: RequestPlan) -> Drafter | None:
        """One drafter per kind, shared by every request of that kind: one cache in the
        draft model, one batched draft pass per position for all of them."""
        if plan.drafter is None:
            return None
        key = (plan.drafter, getattr(plan.method, "num_beams", None))
        if key not in self._drafters:
            self._drafters[key] = make_drafter(
                self.target, self.draft if plan.needs_draft else None, plan.engine_method,
                kind="ngram" if plan.drafter == "ngram" else "model")
        return self._drafters[key]

    def reset_drafters(self) -> None:
        """Forget every drafter (after an engine fault; the draft model is reset too)."""
        self._drafters.clear()
        if self.draft is not None:
            self.draft.reset()
