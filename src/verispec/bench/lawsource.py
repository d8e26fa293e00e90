"""Where the two-sample law test (:mod:`verispec.bench.lawtest`) gets its samples: the first
k tokens of many independent generations (one seed each) at one prompt.

* verispec's methods through :func:`verispec.api.generate_batch`, with both models wrapped
  in :class:`SharedPrefixLM` so that the N rows of a prompt are prefilled once;
* the **biased control** :class:`FirstTokenBias`, a deliberately wrong verifier (not a
  product method: it is only built here), through the same engine;
* the llama.cpp peers: ``llamacpp-ar`` (the target's GGUF, llama.cpp's own sampler chain),
  either one :func:`~verispec.bench.llamacpp.run_llamacpp` call per sample (``each``) or
  with the prompt evaluated once and every distinct context after it once (``shared``),
  and ``llamacpp-spec``, either one ``llama-speculative-simple`` process per sample
  (``each``) or one request per sample to one ``llama-server`` with the draft model, which
  keeps both models loaded and the prompt cached (``shared``; same drafting and verification
  code, :mod:`verispec.bench.llamacpp.server`).

Also the exact first-token laws p and q at a prompt and the choice of informative prompts
(:func:`advance_prompt`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Sequence
from contextlib import ExitStack

import torch
from torch import Tensor

from verispec.api import Pair, generate_batch, make_drafter
from verispec.engine.gamma import FixedGamma
from verispec.engine.loop import Engine
from verispec.engine.protocols import SingleDraftMethod, VerifyBatch
from verispec.engine.request import Request
from verispec.models.base import CausalLM
from verispec.sampling import Randomness, Sampling
from verispec.verify import VerifyResult, draw_rows, token_plan

__all__ = [
    "CHUNK_ROWS",
    "SERVED_SLOTS",
    "FirstTokenBias",
    "Seq",
    "SharedPrefixLM",
    "advance_prompt",
    "control_samples",
    "first_token_laws",
    "llamacpp_samples",
    "method_samples",
    "next_token_law",
]

Seq = tuple[int, ...]
CHUNK_ROWS = 512  # generations decoded together (one pass per distinct context per chunk)
Progress = Callable[[str], None]
SERVED_SLOTS = 4  # llama-server requests in flight at once (llamacpp-spec, shared)


class SharedPrefixLM(CausalLM):
    """A model whose rows with equal contexts share one row of the wrapped model: a prompt
    added N times is read once, and the tokens that several rows add to one shared context
    are scored once. A shared row is copied (``select_rows``) only when the rows sharing it
    part (other tokens, another rollback). Each row's logits are those the wrapped model
    gives its context: bit for bit on a batch-invariant model (the native int8 path: rows
    independent, k tokens in one pass equal to one at a time), elsewhere up to the float
    rounding of another batch. So N samples of a few tokens cost about one pass per distinct
    context, not N."""

    def __init__(self, inner: CausalLM) -> None:
        super().__init__()
        self.inner = inner
        self.vocab_size, self.eos_token_ids = inner.vocab_size, inner.eos_token_ids
        self.max_length, self.device, self.name = inner.max_length, inner.device, inner.name
        self.tokenizer, self.precision = inner.tokenizer, inner.precision
        self._of: list[int] = []  # [R] the wrapped model's row holding each row's context

    @property
    def lengths(self) -> list[int]:
        inner = self.inner.lengths
        return [inner[i] for i in self._of]

    def reset(self) -> None:
        self.inner.reset()
        self._of = []

    def _add_rows(self, prefixes: list[list[int]]) -> None:
        distinct = list(dict.fromkeys(tuple(p) for p in prefixes))
        before = self.inner.rows
        self.inner.add_rows([list(p) for p in distinct])
        where = {p: before + i for i, p in enumerate(distinct)}
        self._of += [where[tuple(p)] for p in prefixes]

    def _part(self, keys: Sequence[Hashable]) -> int:
        """One wrapped row per distinct (row, key) of the rows: a shared row is copied for
        each further key, rows no one uses are dropped. Returns the number of wrapped rows."""
        groups: dict[tuple[int, Hashable], int] = {}
        for r, key in zip(self._of, keys, strict=True):
            groups.setdefault((r, key), len(groups))
        self._of = [groups[(r, key)] for r, key in zip(self._of, keys, strict=True)]
        self.inner.select_rows([r for r, _ in groups])
        return len(groups)

    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        per_row: list[list[int]] = [[] for _ in range(self._part([tuple(t) for t in tokens]))]
        for r, t in zip(self._of, tokens, strict=True):
            per_row[r] = t
        logits = self.inner.extend(per_row, num_logits, check=False)  # [G, n, V], checked here
        if self._of == list(range(len(per_row))):
            return logits
        return logits.index_select(0, torch.tensor(self._of, device=logits.device))  # [R, n, V]

    def _rollback(self, lengths: list[int]) -> None:
        per_row = [0] * self._part(lengths)
        for r, n in zip(self._of, lengths, strict=True):
            per_row[r] = n
        self.inner.rollback(per_row)

    def _select_rows(self, indices: list[int]) -> None:
        self._of = [self._of[i] for i in indices]

    def spawn(self) -> SharedPrefixLM:
        return SharedPrefixLM(self.inner.spawn())


class FirstTokenBias(SingleDraftMethod):
    """Token verification that, at a request's first token only, keeps the draft token X₁
    with probability ε whatever p says (acceptance ε + (1 − ε)·min(1, p/q)). A positive
    control for the law test, not a product method.

    The first token's law is (1 − ε)·p₁ + ε·q₁ (p₁, q₁: the tempered target and draft at the
    prompt) and every later token follows the target exactly given the tokens before it,
    so the total-variation distance of the first-k-token law from the target's is exactly
    ε · TV(p₁, q₁) for every k ≥ 2 (k = 1 drafts nothing: no bias).
    """

    def __init__(self, epsilon: float) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
        super().__init__("biased-control", token_plan, lossless=False, matches_at_greedy=False)
        self.epsilon = epsilon

    def new_state(self) -> bool:
        return True  # the request's first token is still to come

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        p = batch.target_probs[:, 0]  # [B, γ+1, V]
        q = batch.draft_probs[:, 0].to(p.dtype)  # [B, γ, V]
        plan = token_plan(p, q, batch.draft_tokens[:, 0],
                          lengths=batch.lengths if batch.ragged else None)
        if plan.accept_probs.shape[1] > 0:
            first = torch.tensor(batch.states, dtype=torch.bool, device=p.device)  # [B]
            first &= batch.lengths.to(p.device) > 0
            h = plan.accept_probs[:, 0]  # [B]
            plan.accept_probs[:, 0] = torch.where(first, self.epsilon + (1 - self.epsilon) * h, h)
        for j in range(len(batch.states)):
            batch.states[j] = False
        return draw_rows(plan, batch.randoms)


def _chunks(seeds: Sequence[int]) -> list[list[int]]:
    return [list(seeds[i:i + CHUNK_ROWS]) for i in range(0, len(seeds), CHUNK_ROWS)]


def method_samples(pair: Pair, method: str, prompt: Sequence[int], seeds: Sequence[int], *,
                   tokens: int, temperature: float, gamma: int) -> list[Seq]:
    """The first ``tokens`` tokens of one generation per seed by a registered method."""
    target = SharedPrefixLM(pair.target)
    draft = SharedPrefixLM(pair.draft) if pair.draft is not None else None
    out: list[Seq] = []
    for chunk in _chunks(seeds):
        res = generate_batch(target, draft, [list(prompt)] * len(chunk), method=method,
                             seeds=chunk, max_new_tokens=tokens, temperature=temperature,
                             gamma=None if method == "ar" else gamma, batch_size=len(chunk))
        out.extend(tuple(r.tokens) for r in res.results)
    return out


def control_samples(pair: Pair, epsilon: float, prompt: Sequence[int], seeds: Sequence[int],
                    *, tokens: int, temperature: float, gamma: int) -> list[Seq]:
    """As :func:`method_samples` for :class:`FirstTokenBias` (run on the engine directly)."""
    if pair.draft is None:
        raise ValueError("the biased control drafts with the draft model")
    if tokens < 2 or gamma < 1:
        raise ValueError("the biased control needs tokens >= 2 and gamma >= 1 (its bias is on "
                         "the first drafted token)")
    method = FirstTokenBias(epsilon)
    target, draft = SharedPrefixLM(pair.target), SharedPrefixLM(pair.draft)
    drafter = make_drafter(target, draft.spawn(), method)
    sampling = Sampling(temperature=temperature)
    out: list[Seq] = []
    for chunk in _chunks(seeds):
        engine = Engine(target.spawn(), batch_size=len(chunk))
        requests = [Request(list(prompt), method, sampling, tokens,
                            Randomness(torch.Generator(device=target.device).manual_seed(s)),
                            FixedGamma(gamma), drafter) for s in chunk]
        out.extend(tuple(o.tokens) for o in engine.run(requests))
    return out


def llamacpp_samples(name: str, prompt: Sequence[int], seeds: Sequence[int], *, tokens: int,
                     temperature: float, gamma: int, target_gguf: str | os.PathLike[str],
                     draft_gguf: str | os.PathLike[str] | None, eos: Sequence[int],
                     prefill: str = "shared", threads: int | None = None,
                     progress: Progress | None = None) -> list[Seq]:
    """The first ``tokens`` tokens of one llama.cpp generation per seed (see the module)."""
    from verispec.bench.llamacpp import run_llamacpp

    if prefill not in ("shared", "each"):
        raise ValueError(f"prefill must be shared or each, got {prefill!r}")
    if name == "llamacpp-ar" and prefill == "shared":
        return _llamacpp_ar_shared(prompt, seeds, tokens=tokens, temperature=temperature,
                                   gguf=target_gguf, eos=eos, threads=threads)
    if name == "llamacpp-spec" and prefill == "shared":
        if draft_gguf is None:
            raise ValueError("llamacpp-spec needs a draft GGUF")
        return _llamacpp_spec_served(prompt, seeds, tokens=tokens, temperature=temperature,
                                     gamma=gamma, target_gguf=target_gguf,
                                     draft_gguf=draft_gguf, eos=eos, threads=threads,
                                     progress=progress)
    out: list[Seq] = []
    for i, seed in enumerate(seeds):
        res = run_llamacpp(name, list(prompt), target_gguf=target_gguf, draft_gguf=draft_gguf,
                           temperature=temperature, gamma=gamma, max_new_tokens=tokens,
                           seed=seed, threads=threads, eos_token_ids=eos)
        out.append(tuple(res.tokens[:tokens]))
        if progress is not None and (i + 1) % 25 == 0:
            progress(f"  {name}: {i + 1}/{len(seeds)} samples")
    return out


def _llamacpp_spec_served(prompt: Sequence[int], seeds: Sequence[int], *, tokens: int,
                          temperature: float, gamma: int, target_gguf: str | os.PathLike[str],
                          draft_gguf: str | os.PathLike[str], eos: Sequence[int],
                          threads: int | None, progress: Progress | None) -> list[Seq]:
    """``llamacpp-spec``'s drafting and verification served by one ``llama-server``: one
    request per seed, ``SERVED_SLOTS`` at a time (the server batches them; each request's
    draws depend on its own seed only), each cut to its first ``tokens`` ids and at the first
    id of ``eos`` (budget: :func:`~verispec.bench.llamacpp.server.spec_budget`)."""
    from concurrent.futures import ThreadPoolExecutor
    from itertools import count

    from verispec.bench.llamacpp.server import SpecServer, spec_budget

    ids = [int(t) for t in prompt]
    budget = spec_budget(tokens)
    stop = {int(t) for t in eos}
    done = count(1)  # next() is atomic under the GIL

    def one(seed: int) -> Seq:
        got = [int(t) for t in server.complete(ids, seed=seed, n_predict=budget,
                                               temperature=temperature)["tokens"]][:tokens]
        end = next((j for j, t in enumerate(got) if t in stop), None)
        n = next(done)
        if progress is not None and n % 250 == 0:
            progress(f"  llamacpp-spec (llama-server): {n}/{len(seeds)} samples")
        return tuple(got if end is None else got[:end + 1])

    with SpecServer(target_gguf=target_gguf, draft_gguf=draft_gguf, gamma=gamma,
                    n_ctx=len(ids) + budget + gamma + 16, threads=threads, slots=SERVED_SLOTS,
                    progress=progress) as server, ThreadPoolExecutor(SERVED_SLOTS) as pool:
        return list(pool.map(one, seeds))


def _llamacpp_ar_shared(prompt: Sequence[int], seeds: Sequence[int], *, tokens: int,
                        temperature: float, gguf: str | os.PathLike[str], eos: Sequence[int],
                        threads: int | None) -> list[Seq]:
    """``llamacpp-ar``'s sampler chain and model, every distinct context evaluated once.

    Each seed keeps its own chain for the whole run, and the samples grow token by token
    together: the samples whose tokens so far are equal share one evaluation of that
    context, and each draws its next token from those logits with its own chain. Contexts
    are visited in sorted order and evaluated one token at a time from the longest prefix
    already in the cache, so every logit is computed exactly as in a generation of its own.
    """
    from verispec.bench.llamacpp.library import _llama_cpp, _sampler, load_gguf

    llama_cpp = _llama_cpp()
    ids = [int(t) for t in prompt]
    llm = load_gguf(gguf, threads=threads, n_ctx=len(ids) + tokens)
    llm.reset()
    if len(ids) > 1:
        llm.eval(ids[:-1])
    base = len(ids) - 1  # cache positions holding the prompt but its last token
    stop = {int(t) for t in eos}
    out: list[list[int]] = [[] for _ in seeds]
    with ExitStack() as stack:
        chains = [stack.enter_context(_sampler(llama_cpp, temperature, s)) for s in seeds]
        cached: list[int] = []  # tokens in the cache after the prompt but its last token
        live = list(range(len(seeds)))
        while live:
            groups: dict[tuple[int, ...], list[int]] = {}
            for i in live:
                groups.setdefault((ids[-1], *out[i]), []).append(i)
            for context in sorted(groups):
                keep = 0
                while keep < min(len(cached), len(context)) and cached[keep] == context[keep]:
                    keep += 1
                if keep == len(context):
                    keep -= 1  # the logits of the context's last token are needed again
                llm.n_tokens = base + keep  # the next eval drops the cache past it
                for t in context[keep:]:
                    llm.eval([t])
                cached = list(context)
                for i in groups[context]:
                    out[i].append(int(llama_cpp.llama_sampler_sample(chains[i], llm.ctx, -1)))
            live = [i for i in live if out[i][-1] not in stop and len(out[i]) < tokens]
    return [tuple(o) for o in out]


def _next_law(model: CausalLM, ids: Sequence[int], sampling: Sampling) -> tuple[CausalLM, Tensor]:
    m = model.spawn()
    m.add_rows([list(ids[:-1])])
    return m, sampling.probs(m.extend([int(ids[-1])])[0, 0].double())  # [V]


def next_token_law(model: CausalLM, ids: Sequence[int], temperature: float) -> Tensor:
    """The tempered law of the token after ``ids`` under ``model``: [V] float64."""
    return _next_law(model, ids, Sampling(temperature=temperature))[1]


def first_token_laws(pair: Pair, prompt: Sequence[int], temperature: float) -> tuple[Tensor, Tensor]:
    """(p₁, q₁) [V] float64: the tempered target's and draft's laws of the first token."""
    if pair.draft is None:
        raise ValueError("first_token_laws needs the draft model")
    return (next_token_law(pair.target, prompt, temperature),
            next_token_law(pair.draft, prompt, temperature))


def entropy(p: Tensor) -> float:
    """H(p) in nats of a [V] distribution."""
    nz = p[p > 0]
    return float(-(nz * nz.log()).sum())


def advance_prompt(target: CausalLM, prompt: Sequence[int], *, temperature: float,
                   min_entropy: float, max_advance: int) -> list[int]:
    """``prompt`` followed by the target's greedy tokens until its next-token law (at the
    temperature) has entropy ≥ ``min_entropy`` nats, at most ``max_advance`` tokens, never
    an EOS, and only while the ids read back unchanged from their text (the tokenizer, if
    any, encodes the decoded text to the same ids)."""
    ids = [int(t) for t in prompt]
    sampling = Sampling(temperature=temperature)
    model, law = _next_law(target, ids, sampling)
    tok = target.tokenizer
    for _ in range(max_advance):
        if entropy(law) >= min_entropy or math.isnan(entropy(law)):
            break
        nxt = int(law.argmax())
        if nxt in target.eos_token_ids:
            break
        if tok is not None and [int(t) for t in tok.encode(tok.decode(ids + [nxt]))] != ids + [nxt]:
            break
        ids.append(nxt)
        law = sampling.probs(model.extend([nxt])[0, 0].double())
    return ids
