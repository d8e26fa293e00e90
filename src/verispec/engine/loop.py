"""The speculative decoding loop (Algorithm 3 of block-verification.txt).

One request, one sequence. Each iteration:

1. **Draft** up to γ tokens (M drafts for multi-draft methods) from the drafter.
2. **Score** the pending context tokens and the block with the target in one forward pass,
   giving p at positions 0..γ.
3. **Verify**: the method returns τ accepted draft tokens and the next token Y.
4. **Accept** X_1..X_τ, Y — truncated at the first EOS and at the token budget.
5. **Roll back** the target's cache to the accepted prefix; tell the drafter what was kept.

γ = 0 is plain autoregressive decoding through the same code (``--verifier ar``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from verispec.drafters.base import Draft, Drafter
from verispec.engine.methods import Method
from verispec.engine.stats import Stats
from verispec.models.base import CausalLM, ContextTooLongError
from verispec.sampling import Sampling

__all__ = [
    "GenerationOutput",
    "accept_tokens",
    "check_request",
    "now",
    "prefill",
    "room_left",
    "speculative_generate",
]


@dataclass
class GenerationOutput:
    tokens: list[int]
    stats: Stats


def accept_tokens(
    block: Sequence[int], eos_token_ids: frozenset[int], budget: int
) -> tuple[list[int], str]:
    """Clamp an accepted block X_1..X_τ, Y: stop after the first EOS and at ``budget``.

    Returns the tokens to emit and why generation stops ("" if it does not).
    """
    out: list[int] = []
    for token in block:
        if len(out) == budget:
            return out, "max_new_tokens"
        out.append(int(token))
        if int(token) in eos_token_ids:
            return out, "eos"
    return out, ("max_new_tokens" if len(out) == budget else "")


def now(device: torch.device) -> float:
    """A wall-clock reading after the device's queued work has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def check_request(target: CausalLM, prompt: Sequence[int], max_new_tokens: int) -> None:
    """Reject an empty prompt, a budget < 1 and a prompt that fills the context window."""
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed to condition on")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if target.max_length is not None and len(prompt) >= target.max_length:
        raise ContextTooLongError(
            f"the prompt has {len(prompt)} tokens; {target.name}'s context window is "
            f"{target.max_length} tokens, leaving no room to generate"
        )


def prefill(target: CausalLM, ctx: list[int], stats: Stats, start: float) -> None:
    """Reset the target and prefill all but the last context token, which stays pending."""
    target.reset()
    if len(ctx) > 1:
        target.extend(torch.tensor(ctx[:-1], device=target.device), num_logits=1)
        stats.prefill_calls += 1
        stats.prefill_time_s = now(target.device) - start


def room_left(target: CausalLM, ctx: list[int], emitted: int, max_new_tokens: int) -> int:
    """Tokens that may still be emitted: the budget's remainder, capped by the context window."""
    room = max_new_tokens - emitted
    if target.max_length is not None:
        room = min(room, target.max_length - len(ctx))
    return room


def speculative_generate(
    target: CausalLM,
    drafter: Drafter | None,
    prompt: Sequence[int],
    *,
    method: Method,
    gamma: int,
    sampling: Sampling,
    max_new_tokens: int,
    generator: torch.Generator,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` (token ids)."""
    check_request(target, prompt, max_new_tokens)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if gamma > 0 and drafter is None:
        raise ValueError("gamma > 0 needs a drafter")
    device, m = target.device, method.num_drafts
    stats = Stats(method=method.name, lossless=method.lossless, gamma=gamma)
    start = now(device)
    method.reset()
    if drafter is not None:
        drafter.begin(prompt)
        draft_calls0 = drafter.forward_calls
    ctx = [int(t) for t in prompt]
    prefill(target, ctx, stats, start)
    emitted: list[int] = []
    while not stats.stop_reason:
        room = room_left(target, ctx, len(emitted), max_new_tokens)
        g = min(gamma, room - 1)
        # 1. Draft.
        t0 = now(device)
        if g > 0 and drafter is not None:
            draft = drafter.propose(ctx, g, generator, num_drafts=m, with_next=method.needs_next_probs)
        else:
            draft = Draft(tokens=torch.empty((1, 0), dtype=torch.int64),
                          probs=torch.empty((1, 0, target.vocab_size)))
        g, rows = draft.gamma, int(draft.tokens.shape[0])
        # 2. Score pending context tokens + the block in one target pass.
        t1 = now(device)
        pending = torch.tensor(ctx[target.length :], dtype=torch.int64)
        block = torch.cat([pending.expand(rows, -1), draft.tokens], dim=1).to(device)  # [M, k]
        if rows > 1:
            target.fork(rows)
            logits = target.extend(block, num_logits=g + 1)  # [M, γ+1, V]
        else:
            logits = target.extend(block[0], num_logits=g + 1).unsqueeze(0)  # [1, γ+1, V]
        p = sampling.probs(logits, target.name)  # [M, γ+1, V]
        t2 = now(device)
        # 3. Verify.
        result = method.verify(p, draft, generator)
        tau, y = int(result.num_accepted[0]), int(result.next_token[0])
        branch = int(result.extras["branch"][0]) if "branch" in result.extras else 0
        t3 = now(device)
        # 4. Accept, clamped at EOS and the budget.
        new, stats.stop_reason = accept_tokens(
            draft.tokens[branch, :tau].tolist() + [y], target.eos_token_ids, room
        )
        if stats.stop_reason == "max_new_tokens" and len(emitted) + len(new) < max_new_tokens:
            stats.stop_reason = "context_window"  # the room was the window's, not the budget's
        # 5. Roll back the target to the accepted prefix; feed back to the drafter.
        if rows > 1:
            target.join(branch, len(ctx) + tau)
        else:
            target.rollback(len(ctx) + tau)
        ctx.extend(new)
        emitted.extend(new)
        if drafter is not None and g > 0:
            drafter.feedback(ctx, tau, branch)
        if not stats.stop_reason and target.max_length is not None and len(ctx) >= target.max_length:
            stats.stop_reason = "context_window"
        # Bookkeeping.
        raw = torch.log_softmax(logits[branch, : len(new)].float(), dim=-1)  # [n, V]
        stats.nll_sum -= float(raw.gather(-1, torch.tensor(new, device=raw.device)[:, None]).sum())
        if result.bias_tv is not None:
            stats.bias_tv_sum += float(result.bias_tv[0])
        stats.record_iteration(g, tau)
        stats.target_calls += 1
        stats.target_tokens_scored += int(block.numel())
        stats.extra_tokens_scored += int(block.numel()) - int(block.shape[1])
        stats.tokens_emitted += len(new)
        stats.draft_time_s += t1 - t0
        stats.target_time_s += t2 - t1
        stats.verify_time_s += t3 - t2
        if on_tokens is not None:
            on_tokens(new)
    if drafter is not None:
        stats.draft_calls = drafter.forward_calls - draft_calls0
    stats.wall_time_s = now(device) - start
    return GenerationOutput(tokens=emitted, stats=stats)
