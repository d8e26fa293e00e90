"""The benchmark loop: every prompt × config × repeat, appended to ``results.jsonl``.

Order of work: for each repeat, for each prompt, every config of the grid — so that the
methods compared on one prompt run back to back (slow drifts of the machine's speed hit them
alike). With ``order="random"`` (the default) the configs are shuffled on each (repeat,
prompt) by a ``random.Random`` seeded from the run's seed, the repeat and the prompt's id, so
that no method always runs first or right after another (a resumed run reproduces the
order); ``order="fixed"`` keeps the grid's order. Each row records ``order``, its 0-based
slot among the runs on its prompt (a batched run holds the slot of its first prompt). Each
config gets one warm-up generation (a 16-token prefix of the first prompt, 16 new tokens)
the first time it runs in a process; warm-ups are never recorded.

Threads: one number, ``threads`` (default: the CPUs this process may run on,
:func:`~verispec.bench.llamacpp.default_threads`), is torch's intra-op thread count for the
whole run (verispec's methods and the transformers peers; restored afterwards) and every
llama.cpp thread count of the llama.cpp peers (``-t -tb -td -tbd``, ``n_threads``,
``n_threads_batch``). Every row records the ``threads`` it ran with (PEARL's two worker
processes take their own counts, from its options).

Fixed length (``ignore_eos``): every side decodes exactly ``max_new_tokens`` (unless a
context window ends first). verispec's methods and the transformers peers emit an EOS like
any other token and go on, every token drawn from the target's law at its context (for a
lossless method the law is unchanged); the llama.cpp peers cannot go past an
end-of-generation token, so both use llama.cpp's ``--ignore-eos`` rule: a −inf logit bias
on every end-of-generation id (never sampled; their law is the target's with those ids
removed, and the law check of their rows removes them too: ``law_masked_tokens``).

Timing (every row): ``seconds`` brackets generation only — tokenisation, model loading,
warm-ups and the perplexity re-scoring of peer outputs are outside it; prompt tokens never
count as generated. It is split as ``seconds = prefill_seconds + decode_seconds``:

* ``prefill_seconds``: the phase before decoding; ``prefill_covers`` says what it holds:

  - ``"prompt"`` — verispec's methods: :attr:`Stats.prefill_time_s`, the engine's admission
    of the request (``Engine._admit``): the target reading the prompt *except its last
    token* (``add_rows(prompt[:-1])``) and the draft model reading it (``drafter.admit``),
    synchronised with the device; the last prompt token is the first position of the first
    iteration, which makes the first generated token(s). PEARL times the same span (its
    ``executor.prefill``). For a batched call: the call's prefill time shared among its
    rows in proportion to their tokens, like ``seconds``. ``llamacpp-spec``: the example's
    own "encoded" time, the same span (target prompt[:-1] decoded, the draft reading the
    same batch, sampler and speculator set-up; see :mod:`verispec.bench.llamacpp`);
  - ``"first_token"`` — ``llamacpp-ar``: ``eval(prompt)`` (the whole prompt) and the first
    token's sampling; ``hf-ar``: from the start of ``generate`` until transformers hands its
    first new token to the streamer;
  - ``"first_step"`` — ``hf-assisted*``: until the streamer gets the first accepted block
    (the prompt's prefill and the first assisted round);

  None where a side does not measure it (a method that records no prefill time).
* ``decode_seconds`` = ``seconds − prefill_seconds`` (≥ 0; None with the prefill).
* ``decode_tokens``: the generated tokens made during ``decode_seconds``: all of them for
  ``"prompt"``, all but the first for ``"first_token"``, all but the first block for
  ``"first_step"``. ``decode_tokens / decode_seconds`` is a decode rate that counts the same
  work on every side.

Resuming: each finished prompt × config × repeat is one JSON line, flushed as soon as it is
measured. Rerunning the same command with the same ``--out`` skips the lines already there
(a torn last line from an interrupted write is dropped) and runs the rest; the summary is
computed from the file alone. ``run.json`` records the settings that change results (models,
dtype, budget, seed, drafter, ``ignore_eos``, ``order``, ``threads``); resuming with
different ones is refused (a ``run.json`` written before ``ignore_eos`` / ``order`` existed
counts as ``false`` / ``"fixed"``; one without ``threads`` accepts any).
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from verispec.api import generate_batch
from verispec.bench.grid import Config, expand_grid, parse_method
from verispec.bench.lawcheck import token_terms
from verispec.bench.llamacpp import default_threads
from verispec.bench.measure import (
    MemoryMeter,
    derive_seed,
    machine_description,
    rescore,
    score_nll,
)
from verispec.bench.progress import Progress
from verispec.bench.report import results_by_key
from verispec.bench.sides import PeerRunner, llamacpp_meta, ours_timing, peer_fields, prepare_peers
from verispec.bench.suites import Prompt, encode, load_suites
from verispec.engine.stats import Stats
from verispec.models.base import CausalLM

__all__ = ["BenchSettings", "plan", "read_results", "run_benchmark"]

Row = dict[str, Any]

RESULTS = "results.jsonl"
RUN_META = "run.json"
WARMUP_TOKENS = 16
ORDERS = ("random", "fixed")
#: The value of a setting in a run.json written before the setting existed.
_LEGACY_META = {"ignore_eos": False, "order": "fixed"}
#: Stats fields copied into each result row.
_STATS_FIELDS = (
    "iterations", "target_calls", "prefill_calls", "draft_calls", "accepted_total",
    "drafted_total", "target_tokens_scored", "extra_tokens_scored", "tau_histogram",
    "drafted_by_position", "accepted_by_position", "bias_tv_sum", "nll_sum", "stop_reason",
    "energy_joules", "energy_source", "draft_time_s", "target_time_s", "verify_time_s",
    "prefill_time_s",
)
#: Every key of the base Stats.to_dict() (anything else is method-specific).
_BASE_STATS = frozenset(Stats().to_dict())


@dataclass
class BenchSettings:
    """Everything that defines a benchmark run (the CLI's options)."""

    methods: list[Any]  # list[MethodSpec]
    temperatures: list[float]
    gammas: list[int | None]
    suites: list[str]
    out: Path
    num_prompts: int | None = 10
    categories: list[str] | None = None
    max_new_tokens: int = 64
    repeats: int = 1
    seed: int = 0
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    target: str = ""
    draft: str = ""
    precision: str = "auto"
    target_precision: str | None = None
    draft_precision: str | None = None
    drafter: str = "model"
    chat_template: str = "auto"
    warmup: bool = True
    ignore_eos: bool = False
    order: str = "random"
    threads: int | None = None  # None: default_threads()

    @property
    def thread_count(self) -> int:
        """The threads of torch and of the llama.cpp peers."""
        return self.threads or default_threads()

    def meta(self, target_name: str, draft_name: str) -> dict[str, Any]:
        """The settings a resumed run must share with the original."""
        return {"target": target_name, "draft": draft_name, "precision": self.precision,
                "target_precision": self.target_precision, "draft_precision": self.draft_precision,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "drafter": self.drafter, "chat_template": self.chat_template,
                "ignore_eos": self.ignore_eos, "order": self.order,
                "threads": self.thread_count}


def _gamma(c: Config) -> int | str | None:
    """The γ a config runs with: ``auto`` is the method's own measured choice."""
    return "auto" if c.gamma is None and c.method.uses_gamma else c.gamma


def _stats_fields(stats: dict[str, Any]) -> Row:
    """The row fields taken from a :meth:`Stats.to_dict`; fields a method adds to its own
    statistics (e.g. PEARL's) go under ``extra_stats``, its ``timeline`` under ``timeline``."""
    row: Row = {k: stats.get(k) for k in _STATS_FIELDS}
    row.update({"tokens": stats["tokens_emitted"], "seconds": stats["wall_time_s"],
                "call_seconds": stats["wall_time_s"]})
    row.update(ours_timing(stats, stats["wall_time_s"], stats["prefill_time_s"],
                           stats["tokens_emitted"]))
    extra = {k: v for k, v in stats.items() if k not in _BASE_STATS and k != "timeline"}
    if extra:
        row["extra_stats"] = extra
    if stats.get("timeline"):
        row["timeline"] = stats["timeline"]
    return row


def read_results(path: Path) -> dict[str, Row]:
    """The complete rows of ``results.jsonl`` by key (none if it does not exist); a torn
    last line is cut off the file so that appending continues cleanly."""
    return results_by_key(path, truncate=True) if path.exists() else {}


@dataclass(frozen=True)
class Unit:
    """One call to a generator: a config on one prompt (or one batch of prompts)."""

    config: Config
    repeat: int
    prompts: tuple[int, ...]  # indices into the prompt list
    order: int = 0  # its slot among the units run on its (first) prompt

    def row_keys(self, prompts: Sequence[Prompt]) -> list[str]:
        return [f"{self.config.key}|{prompts[i].id}|r={self.repeat}" for i in self.prompts]


def plan(configs: Sequence[Config], num_prompts: int, repeats: int, *, order: str = "fixed",
         seed: int = 0, prompt_ids: Sequence[str] | None = None) -> list[Unit]:
    """The units in execution order: repeat, prompt, then the configs in the grid's order
    (``order="fixed"``) or shuffled by ``random.Random`` seeded from ``seed``, the repeat and
    the prompt's id (``prompt_ids[i]``, default ``str(i)``), the same on every call."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    units = []
    for r in range(repeats):
        for i in range(num_prompts):
            here = list(configs)
            if order == "random":
                pid = prompt_ids[i] if prompt_ids is not None else str(i)
                random.Random(f"order/{seed}/{r}/{pid}").shuffle(here)
            slot = 0
            for c in here:
                b = c.batch_size
                if b == 1 or i % b == 0:
                    units.append(Unit(c, r, tuple(range(i, min(i + b, num_prompts))), slot))
                    slot += 1
    return units


def _check_meta(out: Path, meta: dict[str, Any]) -> None:
    path = out / RUN_META
    if path.exists():
        old = json.loads(path.read_text())
        old = {k: old.get(k, _LEGACY_META.get(k, v)) for k, v in meta.items()}
        diff = [f"{k}: {old[k]!r} there, {v!r} now" for k, v in meta.items() if old[k] != v]
        if diff:
            raise ValueError(f"{out} holds results of a different run ({'; '.join(diff)}); "
                             "use another --out or delete it")
    else:
        path.write_text(json.dumps(meta, indent=2) + "\n")


class _Runner:
    def __init__(self, settings: BenchSettings, target: CausalLM, draft: CausalLM | None,
                 prompts: list[Prompt], encoded: list[list[int]],
                 hf_pair: tuple[CausalLM, CausalLM | None] | None = None) -> None:
        self.s, self.target, self.draft = settings, target, draft
        self.prompts, self.encoded = prompts, encoded
        # the transformers peers' models: the same weights and precision, run by transformers
        hf_target, hf_draft = hf_pair or (target, draft)
        self.peers = PeerRunner(settings.target, settings.draft, hf_target, hf_draft,
                                threads=settings.thread_count, ignore_eos=settings.ignore_eos)
        self.warmed: set[str] = set()

    def _ours(self, c: Config, ids: list[int], seed: int, max_new: int) -> tuple[Any, float | None, str]:
        from verispec.api import generate

        with MemoryMeter(self.target.device) as mem:
            result = generate(
                self.target, self.draft, ids, method=c.method.name, gamma=_gamma(c),
                temperature=c.temperature, seed=seed, max_new_tokens=max_new,
                drafter=self.s.drafter, ignore_eos=self.s.ignore_eos, **c.method.option_dict())
        return result, mem.peak_mb, mem.source

    def _peer(self, c: Config, ids: list[int], seed: int, max_new: int) -> tuple[Any, float | None, str]:
        with MemoryMeter(self.target.device) as mem:
            result = self.peers.run(c, ids, seed, max_new, tuple(self.target.eos_token_ids))
        return result, mem.peak_mb, mem.source

    def warm_up(self, c: Config) -> None:
        if not self.s.warmup or c.key in self.warmed:
            return
        ids = self.encoded[0][:WARMUP_TOKENS]
        max_new = min(WARMUP_TOKENS, self.s.max_new_tokens)
        if c.batch_size > 1:
            generate_batch(self.target, self.draft, [ids] * c.batch_size,
                           **self._batch_kwargs(c, list(range(c.batch_size)), max_new))
        elif c.method.is_peer:
            self._peer(c, ids, 0, max_new)
        else:
            self._ours(c, ids, 0, max_new)
        self.warmed.add(c.key)

    def _base_row(self, unit: Unit, i: int, seed: int) -> Row:
        c, p = unit.config, self.prompts[i]
        return {
            "key": f"{c.key}|{p.id}|r={unit.repeat}", "config": c.key, "method": c.method.label,
            "base_method": c.method.name, "options": c.method.option_dict(),
            "temperature": c.temperature, "batch_size": c.batch_size,
            # γ = auto (the method's own choice) is recorded as "auto", not None.
            "gamma": "auto" if c.gamma is None and c.method.uses_gamma else c.gamma,
            "suite": p.suite, "category": p.category, "prompt_id": p.id,
            "prompt_index": i, "repeat": unit.repeat, "seed": seed,
            "prompt_tokens": len(self.encoded[i]), "lossless": c.method.lossless,
            "order": unit.order, "ignore_eos": self.s.ignore_eos,
            "threads": torch.get_num_threads(),
        }

    def run_single(self, unit: Unit) -> list[Row]:
        c, i = unit.config, unit.prompts[0]
        seed = derive_seed(self.s.seed, unit.repeat, self.prompts[i].id)
        ids = self.encoded[i]
        row = self._base_row(unit, i, seed)
        if c.method.is_peer:
            peer, peak, source = self._peer(c, ids, seed, self.s.max_new_tokens)
            row.update(peer_fields(c.method.name, peer))
            if peer.info:
                row["peer_info"] = peer.info
        else:
            result, peak, source = self._ours(c, ids, seed, self.s.max_new_tokens)
            row.update(_stats_fields(result.stats.to_dict()))
            row["output"] = list(result.tokens)
        row["peak_memory_mb"], row["memory_source"] = peak, source
        self._check_law(row, ids, seed, c.temperature, rescore_nll=c.method.is_peer,
                        masked=row.get("law_masked_tokens", ()))
        return [row]

    def _check_law(self, row: Row, ids: list[int], seed: int, temperature: float,
                   rescore_nll: bool, masked: Sequence[int] = ()) -> None:
        """Re-score the output once: the NLL (for peers) and the law check (T > 0) against
        the target's law, with the ``masked`` ids removed (a peer that never samples them)."""
        out = row["output"]
        if not out or (temperature == 0 and not rescore_nll):
            if rescore_nll:
                row["nll_sum"] = 0.0
            return
        logits = rescore(self.target, ids, out)  # [n, V]
        if rescore_nll:
            row["nll_sum"] = score_nll(self.target, ids, out, logits)
        if temperature > 0:
            gen = torch.Generator().manual_seed(seed)
            row["law_z_sum"], row["law_v_sum"], row["law_pits"] = token_terms(
                _without(logits, masked), out, temperature, gen)

    def _batch_kwargs(self, c: Config, seeds: list[int], max_new: int) -> dict[str, Any]:
        return {"method": c.method.name, "gamma": _gamma(c), "temperature": c.temperature,
                "seeds": seeds, "max_new_tokens": max_new, "batch_size": c.batch_size,
                "drafter": self.s.drafter, "ignore_eos": self.s.ignore_eos,
                **c.method.option_dict()}

    def run_batch(self, unit: Unit) -> list[Row]:
        """One batched call on up to ``batch_size`` prompts. The call's wall time, prefill
        time and energy are shared among its rows in proportion to their tokens, so that sums
        over rows give the batch's."""
        c = unit.config
        seeds = [derive_seed(self.s.seed, unit.repeat, self.prompts[i].id) for i in unit.prompts]
        batch = [self.encoded[i] for i in unit.prompts]
        with MemoryMeter(self.target.device) as mem:
            out = generate_batch(self.target, self.draft, batch,
                                 **self._batch_kwargs(c, seeds, self.s.max_new_tokens))
        call_seconds = float(out.stats.wall_time_s)
        energy = out.stats.energy_joules
        total = sum(len(r.tokens) for r in out.results) or 1
        rows = []
        for i, seed, result in zip(unit.prompts, seeds, out.results, strict=True):
            share = len(result.tokens) / total
            row = self._base_row(unit, i, seed)
            stats = result.stats.to_dict()
            row.update(_stats_fields(stats))
            row.update({"seconds": call_seconds * share, "call_seconds": call_seconds,
                        "energy_joules": None if energy is None else energy * share,
                        "energy_source": out.stats.energy_source,
                        "output": list(result.tokens), "peak_memory_mb": mem.peak_mb,
                        "memory_source": mem.source})
            row.update(ours_timing(stats, call_seconds * share,
                                   out.stats.prefill_time_s * share, len(result.tokens)))
            self._check_law(row, self.encoded[i], seed, c.temperature, rescore_nll=False)
            rows.append(row)
        return rows


def _without(logits: torch.Tensor, masked: Sequence[int]) -> torch.Tensor:
    """``logits`` [n, V] with the ``masked`` ids made impossible (a finite −1e30 in float64,
    so that p·log p stays 0 in the law check's sums)."""
    ids = [int(t) for t in masked if 0 <= int(t) < logits.shape[-1]]
    if not ids:
        return logits
    out = logits.double().clone()  # [n, V]
    out[:, ids] = -1e30
    return out


def _load_models(s: BenchSettings, needs_draft: bool, err: TextIO) -> tuple[CausalLM, CausalLM | None]:
    from verispec.api import load_pair

    pair = load_pair(s.target, s.draft, needs_draft=needs_draft,
                     precision=s.precision, target_precision=s.target_precision,
                     draft_precision=s.draft_precision,
                     progress=lambda msg: print(msg, file=err))
    return pair.target, pair.draft


def _configs(s: BenchSettings, err: TextIO) -> list[Config]:
    """The settings' grid (``ar`` added: every speed-up is paired against it), batched
    configurations for the methods that can run batched."""
    if not any(m.label == "ar" for m in s.methods):
        s.methods = [parse_method("ar"), *s.methods]
        print("adding ar: every speed-up is paired against it", file=err)
    configs = expand_grid(s.methods, s.temperatures, s.gammas, [1])
    batched = [b for b in s.batch_sizes if b > 1]
    if batched:
        skipped = [m.label for m in s.methods if not m.batchable]
        if skipped:
            print(f"batch sizes > 1: {', '.join(skipped)} cannot run batched; they run at "
                  "batch size 1 only", file=err)
        configs += [Config(c.method, c.temperature, c.gamma, b) for c in configs
                    for b in batched if c.method.batchable]
    return configs


def _summary_meta(s: BenchSettings, names: tuple[str, str], target: CausalLM,
                  draft: CausalLM | None, prompts: Sequence[Prompt], costs: str | None,
                  llamacpp: dict[str, Any] | None) -> dict[str, Any]:
    """What the summary says of the run: settings, models, precisions, machine, costs,
    threads and the llama.cpp peers' provenance."""
    precision = f"target {target.precision}" + (f", draft {draft.precision}" if draft else "")
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
    meta = {
        **s.meta(*names),
        "precision_note": precision,
        "device": str(target.device), "torch_threads": torch.get_num_threads(),
        "suites": list(s.suites),
        "prompts_per_category": counts, "repeats": s.repeats,
        "methods": [m.label for m in s.methods], "temperatures": list(s.temperatures),
        "gammas": [g if g is not None else "auto" for g in s.gammas],
        "batch_sizes": list(s.batch_sizes),
        "pair_costs": costs, "machine": machine_description(),
    }
    if llamacpp is not None:
        meta["llamacpp"] = llamacpp
    return meta


def _recorded_priors(s: BenchSettings, configs: Sequence[Config], target: CausalLM,
                     draft: CausalLM) -> list[str]:
    """Where each γ auto configuration's acceptance prior starts, before the first row: the
    pair's acceptance recorded by earlier processes (:mod:`verispec.engine.history`), or
    none (the generic prior)."""
    from verispec.engine.gamma import HISTORY_MIN
    from verispec.plan import RequestConfig, pair_history, plan_request

    lines = []
    for c in configs:
        if c.method.is_peer or _gamma(c) != "auto" or c.batch_size > 1:
            continue
        plan = plan_request(RequestConfig(c.method.name, c.method.option_dict(), "auto",
                                          s.drafter, temperature=c.temperature))
        if plan.drafter is None or plan.info.runner is not None:
            continue
        h = pair_history(target, draft, plan.engine_method.name, plan.sampling)
        known = getattr(h, "recorded", 0.0)
        if known >= HISTORY_MIN:
            prior = h.prior()
            start = (f"α₀ {prior.first:.3f} at a block's first position, {prior.rest:.3f} "
                     f"after it, from {known:.0f} positions recorded by earlier runs")
        elif known:
            start = f"the generic prior ({known:.0f} positions recorded, fewer than {HISTORY_MIN})"
        else:
            start = "no acceptance recorded, the generic prior"
        lines.append(f"{c.method.label} T={c.temperature:g}: {start}")
    return lines


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block (restored after)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _check_settings(s: BenchSettings) -> None:
    if s.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {s.repeats}")
    if s.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {s.max_new_tokens}")
    if s.order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {s.order!r}")
    if s.threads is not None and s.threads < 1:
        raise ValueError(f"threads must be >= 1, got {s.threads}")


def run_benchmark(settings: BenchSettings, *, target: CausalLM | None = None,
                  draft: CausalLM | None = None, err: TextIO | None = None,
                  on_row: Callable[[Row], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the benchmark; write ``results.jsonl``, ``summary.json``,
    ``summary.md`` and the plots into ``settings.out``; return the summary.

    ``target`` / ``draft`` may be given already loaded (tests use toy and tiny models);
    otherwise they are loaded from ``settings.target`` / ``settings.draft``.
    ``on_row`` is called after each row is written (tests interrupt runs through it).
    torch runs with ``settings.thread_count`` threads meanwhile (restored after).
    """
    _check_settings(settings)
    with _torch_threads(settings.thread_count):
        return _run(settings, target, draft, err or sys.stderr, on_row)


def _run(s: BenchSettings, target: CausalLM | None, draft: CausalLM | None, err: TextIO,
         on_row: Callable[[Row], None] | None) -> dict[str, Any]:
    from verispec.bench.plots import write_plots
    from verispec.bench.report import build_summary, write_reports

    configs = _configs(s, err)
    prompts = load_suites(s.suites, s.num_prompts, s.categories)
    needs_draft = any(c.method.needs_draft(s.drafter) for c in configs)
    loaded = target is None
    if target is None:
        target, draft = _load_models(s, needs_draft, err)
    elif needs_draft and draft is None:
        raise ValueError("the methods need a draft model")
    hf_pair = prepare_peers(configs, s.target, s.draft, target, draft, err, loaded=loaded)
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(f"the target {target.name} has no tokenizer to encode prompts with")
    encoded = [encode(p, tokenizer, s.chat_template) for p in prompts]
    s.out.mkdir(parents=True, exist_ok=True)
    names = (s.target or target.name, (s.draft or draft.name) if draft is not None else "")
    _check_meta(s.out, s.meta(*names))
    results_path = s.out / RESULTS
    done = read_results(results_path)
    ids = [p.id for p in prompts]
    units = plan(configs, len(prompts), s.repeats, order=s.order, seed=s.seed, prompt_ids=ids)
    todo = [u for u in units if not all(k in done for k in u.row_keys(prompts))]
    costs, priors = None, []
    if draft is not None and needs_draft:  # why the speed-ups are what they are
        from verispec.api import pair_costs

        costs = pair_costs(target, draft).describe()
        print(f"pair costs: {costs}", file=err)
        priors = _recorded_priors(s, configs, target, draft)
        for line in priors:
            print(f"gamma auto prior: {line}", file=err)
    runner = _Runner(s, target, draft, prompts, encoded, hf_pair)
    progress = Progress(len(units), err, done=len(units) - len(todo))
    if done:
        print(f"resuming: {len(units) - len(todo)} of {len(units)} runs already in "
              f"{results_path}", file=err)
    with results_path.open("a", encoding="utf-8") as f:
        for unit in todo:
            runner.warm_up(unit.config)
            rows = runner.run_batch(unit) if unit.config.batch_size > 1 else runner.run_single(unit)
            for row in rows:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
                done[row["key"]] = row
                if on_row is not None:
                    on_row(row)
            c = unit.config
            progress.step(f"{c.method.label} T={c.temperature:g} γ={c.gamma_text} "
                          f"{prompts[unit.prompts[0]].id} r{unit.repeat}")
    # the rows in the grid's order, whatever order they ran in
    ordered = [done[k] for u in plan(configs, len(prompts), s.repeats)
               for k in u.row_keys(prompts)]
    llamacpp = llamacpp_meta(configs, ordered, s.thread_count, runner.peers)
    meta = _summary_meta(s, names, target, draft, prompts, costs, llamacpp)
    if priors:
        meta["gamma_auto_priors"] = priors
    summary = build_summary(meta, ordered)
    write_reports(s.out, summary)
    write_plots(s.out, summary, ordered, err)
    return summary
