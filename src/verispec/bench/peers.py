"""The peer system: transformers' own ``generate``, plain and assisted, on the same models.

* ``hf-ar``: ``model.generate`` of the target, no assistant.
* ``hf-assisted``: ``generate(assistant_model=draft)`` with exactly γ draft tokens per round
  (``num_assistant_tokens=γ``, constant schedule, the assistant's confidence-based early stop
  disabled), so that it drafts like verispec's methods at the same γ.
* ``hf-assisted-default``: assisted generation with transformers' own defaults (20 draft
  tokens, stopping a draft early when the assistant's confidence drops below 0.4).

Sampling is made identical to verispec's: greedy at T = 0; otherwise pure temperature
sampling (``top_k=0``, ``top_p=1``, no repetition penalty), overriding whatever the model's
``generation_config`` suggests; same EOS tokens, same token budget. transformers draws from
torch's *global* generator, which is seeded with the request's seed before each call (the
only way to seed it; verispec's own methods use a per-request generator).

With ``ignore_eos`` the EOS ids are taken from ``generate`` (``eos_token_id=None``, which
overrides the model's ``generation_config``): an EOS is sampled like any other token and
decoding goes on to the budget, so the law is the target's, as with verispec's
``ignore_eos``.

Timing: ``seconds`` brackets the ``generate`` call; ``prefill_seconds`` is the time from its
start until transformers hands the first new token(s) to the streamer passed to
``generate`` (it calls ``streamer.put`` with the prompt, then with each step's new tokens:
one token for ``hf-ar``, the first accepted block for the assisted peers), i.e. the prompt's
prefill and the first step; ``first_tokens`` is how many tokens that first step gave.

Forward calls are counted with forward pre-hooks on the two modules. ``target_calls`` counts
every target pass, the first one (prompt + first token, or prompt + first draft) included;
``target_tokens_scored`` counts the positions they processed minus the prompt's first
``len(prompt) − 1`` tokens, the same convention as :class:`verispec.engine.stats.Stats`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from verispec.models.base import CausalLM
from verispec.telemetry.clock import now
from verispec.telemetry.energy import EnergyMeter

__all__ = ["PeerResult", "run_peer"]


@dataclass
class PeerResult:
    """One peer run on one prompt.

    ``prefill_seconds``: the part of ``seconds`` before the decoding phase (each peer says
    what it covers; None where unknown). ``first_tokens``: generated tokens already made
    when that phase ended (1 where it ends with the first sampled token, 0 where it ends
    after reading the prompt). ``masked_tokens``: ids the peer can never sample (their
    logits set to −inf, e.g. llama.cpp's end-of-generation tokens under ``ignore_eos``); its
    law is the target's with those removed. ``threads``: CPU threads it ran with.
    ``info``: what it was built and run with (versions, build flags, system info).
    """

    tokens: list[int]
    seconds: float
    target_calls: int = 0
    target_positions: int = 0
    draft_calls: int = 0
    energy_joules: float | None = None
    energy_source: str = "unavailable"
    notes: list[str] = field(default_factory=list)
    prefill_seconds: float | None = None
    first_tokens: int = 0
    masked_tokens: tuple[int, ...] = ()
    threads: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


class _Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.positions = 0

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        self.calls += 1
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            self.positions += int(ids.shape[1])


@contextmanager
def _counted(module: Any) -> Iterator[_Counter]:
    counter = _Counter()
    handle = module.register_forward_pre_hook(counter, with_kwargs=True)
    try:
        yield counter
    finally:
        handle.remove()


@contextmanager
def _assistant_settings(draft_module: Any, gamma: int | None) -> Iterator[None]:
    """Temporarily set the assistant's drafting schedule (transformers reads it from the
    *assistant's* generation_config)."""
    cfg = draft_module.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule",
             "assistant_confidence_threshold")
    saved = {n: getattr(cfg, n, None) for n in names}
    try:
        if gamma is not None:
            cfg.num_assistant_tokens = gamma
            cfg.num_assistant_tokens_schedule = "constant"
            cfg.assistant_confidence_threshold = 0.0
        yield
    finally:
        for n, v in saved.items():
            setattr(cfg, n, v)


def _module(model: CausalLM, role: str) -> Any:
    module = getattr(model, "model", None)
    if module is None or not hasattr(module, "generate"):
        raise ValueError(f"the transformers peers need Hugging Face models; the {role} "
                         f"{model.name} is not one")
    return module


class _FirstTokens:
    """A ``generate`` streamer that notes when the first new tokens arrive (and how many)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.puts = 0
        self.time: float | None = None
        self.count = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:  # the first put is the prompt
            self.time = now(self.device)
            self.count = int(value.numel())

    def end(self) -> None:
        pass


def run_peer(name: str, target: CausalLM, draft: CausalLM | None, prompt: Sequence[int], *,
             temperature: float, gamma: int | None, max_new_tokens: int, seed: int,
             ignore_eos: bool = False) -> PeerResult:
    """Run ``hf-ar``, ``hf-assisted`` or ``hf-assisted-default`` on one prompt
    (``ignore_eos``: decode the whole budget, EOS tokens included)."""
    if name not in ("hf-ar", "hf-assisted", "hf-assisted-default"):
        raise ValueError(f"unknown peer {name!r}")
    module = _module(target, "target")
    device = target.device
    input_ids = torch.tensor([list(prompt)], dtype=torch.int64, device=device)  # [1, n]
    eos = sorted(target.eos_token_ids)
    pad = module.generation_config.pad_token_id
    kwargs: dict[str, Any] = {
        "attention_mask": torch.ones_like(input_ids),
        "max_new_tokens": max_new_tokens,
        "do_sample": temperature > 0,
        "repetition_penalty": 1.0,
        "eos_token_id": None if ignore_eos else (eos or None),
        "pad_token_id": pad if pad is not None else (eos[0] if eos else 0),
    }
    if temperature > 0:  # pure temperature sampling, like Sampling(temperature=T)
        # The temperature goes in as an explicit warper, with the config's temperature left at
        # 1: in assisted generation transformers hands the target's processors (its
        # TemperatureLogitsWarper included) to the assistant's ``generate``, which appends a
        # second one built from the same config, so ``temperature=T`` would make the assistant
        # draft at T² (still lossless, since q is what it sampled from, but not what verispec's
        # drafts use; on the embedded pair it costs little acceptance below T = 1 and much
        # above it). Passed this way, T is applied once to the target and once to the
        # assistant; hf-ar's processors, and so its outputs, are unchanged.
        from transformers import LogitsProcessorList, TemperatureLogitsWarper

        kwargs.update(temperature=1.0, top_k=0, top_p=1.0,
                      logits_processor=LogitsProcessorList([TemperatureLogitsWarper(temperature)]))
    draft_module = None
    if name != "hf-ar":
        if draft is None:
            raise ValueError(f"{name} needs a draft model")
        draft_module = _module(draft, "draft")
        kwargs["assistant_model"] = draft_module
    target.reset()
    gamma_setting = gamma if name == "hf-assisted" else None
    if name == "hf-assisted" and gamma is None:
        raise ValueError("hf-assisted needs an integer gamma")
    with _assistant_settings(draft_module, gamma_setting) if draft_module is not None \
            else _noop(), _counted(module) as t_count, \
            (_counted(draft_module) if draft_module is not None else _noop_counter()) as d_count, \
            EnergyMeter(device) as meter:
        torch.manual_seed(seed)
        first = _FirstTokens(device)
        start = now(device)
        with torch.inference_mode():
            out = module.generate(input_ids, streamer=first, **kwargs)  # [1, n + new]
        seconds = now(device) - start
    new = [int(t) for t in out[0, input_ids.shape[1]:].tolist()]
    if eos and not ignore_eos:  # generate pads finished sequences; a row stops at EOS
        for i, tok in enumerate(new):
            if tok in target.eos_token_ids:
                new = new[: i + 1]
                break
    return PeerResult(
        tokens=new, seconds=seconds, target_calls=t_count.calls,
        target_positions=max(0, t_count.positions - (len(prompt) - 1)),
        draft_calls=d_count.calls, energy_joules=meter.joules, energy_source=meter.source,
        prefill_seconds=None if first.time is None else first.time - start,
        first_tokens=min(first.count, len(new)), threads=torch.get_num_threads())


@contextmanager
def _noop() -> Iterator[None]:
    yield


@contextmanager
def _noop_counter() -> Iterator[_Counter]:
    yield _Counter()
