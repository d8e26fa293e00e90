"""The sides of a benchmark row besides verispec's own loop: the peers (transformers' and
llama.cpp's), how they are prepared and run, and the timing and provenance fields every row
gets. The definitions of those fields are stated once, in :mod:`verispec.bench.runner`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from verispec.bench.grid import Config
from verispec.bench.llamacpp import run_llamacpp
from verispec.bench.peers import PeerResult, run_peer
from verispec.models.base import CausalLM

__all__ = ["PeerRunner", "llamacpp_meta", "ours_timing", "peer_fields", "prepare_peers"]

Row = dict[str, Any]

#: What a side's ``prefill_seconds`` covers (see :mod:`verispec.bench.runner`).
PREFILL_PROMPT = "prompt"  # the prompt read up to its last token; no token generated yet
PREFILL_FIRST_TOKEN = "first_token"  # the whole prompt read and the first token sampled
PREFILL_FIRST_STEP = "first_step"  # the whole prompt read and the first assisted round done


def gguf(spec: str) -> str:
    """The verified GGUF file of an embedded model (the llama.cpp peers run it)."""
    from verispec.models.fetch import model_path

    return str(model_path(spec, "gguf"))


def ours_timing(stats: dict[str, Any], seconds: float, prefill: float | None,
                tokens: int) -> Row:
    """The timing fields of a verispec row: ``prefill`` is the engine's ``prefill_time_s``
    (its share, for a batch row); None where the method does not time its prefill (it ran
    one, ``prefill_calls`` > 0, yet recorded no time)."""
    if prefill is not None and prefill <= 0 and stats.get("prefill_calls"):
        prefill = None
    return _timing(seconds, prefill, tokens, 0, PREFILL_PROMPT)


def _timing(seconds: float, prefill: float | None, tokens: int, first_tokens: int,
            covers: str) -> Row:
    if prefill is None:
        return {"prefill_seconds": None, "decode_seconds": None, "decode_tokens": None,
                "prefill_covers": covers}
    prefill = min(max(float(prefill), 0.0), float(seconds))
    return {"prefill_seconds": prefill, "decode_seconds": float(seconds) - prefill,
            "decode_tokens": max(tokens - first_tokens, 0), "prefill_covers": covers}


def peer_fields(name: str, peer: PeerResult) -> Row:
    """The row fields of a peer's result (counts, timing, threads, masked ids, notes)."""
    if peer.first_tokens == 0:
        covers = PREFILL_PROMPT
    else:
        covers = PREFILL_FIRST_STEP if name.startswith("hf-assisted") else PREFILL_FIRST_TOKEN
    row: Row = {
        "tokens": len(peer.tokens), "seconds": peer.seconds,
        "call_seconds": peer.seconds, "target_calls": peer.target_calls,
        "prefill_calls": 0, "draft_calls": peer.draft_calls,
        "target_tokens_scored": peer.target_positions,
        "bias_tv_sum": 0.0, "energy_joules": peer.energy_joules,
        "energy_source": peer.energy_source, "output": peer.tokens,
        **_timing(peer.seconds, peer.prefill_seconds, len(peer.tokens), peer.first_tokens,
                  covers),
        "threads": peer.threads,
    }
    if peer.masked_tokens:
        row["law_masked_tokens"] = list(peer.masked_tokens)
    if peer.notes:
        row["notes"] = list(peer.notes)
    return row


class PeerRunner:
    """Runs the peers of a grid with the run's settings; knows llama.cpp's provenance."""

    def __init__(self, target_spec: str, draft_spec: str, hf_target: CausalLM,
                 hf_draft: CausalLM | None, *, threads: int, ignore_eos: bool) -> None:
        self.target_spec, self.draft_spec = target_spec, draft_spec
        self.hf_target, self.hf_draft = hf_target, hf_draft
        self.threads, self.ignore_eos = threads, ignore_eos
        self._provenance: dict[str, Any] | None = None

    def provenance(self) -> dict[str, Any]:
        """llama-cpp-python's version, system info and build record (read once)."""
        if self._provenance is None:
            from verispec.bench.llamacpp import provenance

            self._provenance = provenance()
        return self._provenance

    def run(self, c: Config, ids: list[int], seed: int, max_new: int,
            eos: Sequence[int]) -> PeerResult:
        name = c.method.name
        if not name.startswith("llamacpp"):
            return run_peer(name, self.hf_target, self.hf_draft, ids, temperature=c.temperature,
                            gamma=c.gamma, max_new_tokens=max_new, seed=seed,
                            ignore_eos=self.ignore_eos)
        result = run_llamacpp(name, ids, target_gguf=gguf(self.target_spec),
                              draft_gguf=gguf(self.draft_spec) if name != "llamacpp-ar" else None,
                              temperature=c.temperature, gamma=c.gamma, max_new_tokens=max_new,
                              seed=seed, eos_token_ids=tuple(eos), threads=self.threads,
                              ignore_eos=self.ignore_eos, **c.method.option_dict())
        result.info = {**self.provenance(), **result.info}
        result.notes.extend(_provenance_notes(result.info))
        return result


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _provenance_notes(info: dict[str, Any]) -> list[str]:
    """The provenance of a llama.cpp row, in words (its ``peer_info`` has the same)."""
    built = info.get("installed_build") or {}
    notes = [f"llama-cpp-python {info.get('llama_cpp_python')}; CMake flags "
             f"{info.get('cmake_flags')}"
             + (f"; its installed CMake files record {_pairs(built)}" if built else ""),
             f"llama.cpp system_info (llama-cpp-python): {info.get('system_info')}"]
    if "speculative_binary" in info:
        build = info.get("speculative_build")
        if build:
            cache = build.get("cmake_cache") or {}
            text = (f"CMake flags {' '.join(build.get('cmake_flags', []))}, sources of "
                    f"llama-cpp-python {build.get('llama_cpp_python')}"
                    + (f"; its CMake cache: {_pairs(cache)}" if cache else ""))
        else:
            text = f"unknown (no build.json next to {info['speculative_binary']})"
        notes.append(f"llama-speculative-simple build: {text}")
        notes.append("llama-speculative-simple system_info: "
                     f"{info.get('speculative_system_info')}; thread pools it logged: "
                     f"{info.get('speculative_threads_logged') or 'none'} threads")
    return notes


def llamacpp_meta(configs: Sequence[Config], rows: Sequence[Row], threads: int,
                  runner: PeerRunner | None) -> dict[str, Any] | None:
    """The summary's record of the llama.cpp peers (None without them): provenance, threads
    and, from the first ``llamacpp-spec`` row, the example's build record and system info."""
    names = {c.method.name for c in configs if c.method.name.startswith("llamacpp")}
    if not names:
        return None
    info = next((r.get("peer_info") for r in rows if r.get("peer_info")), None)
    if info is None and runner is not None:
        info = runner.provenance()
    info = dict(info or {})
    spec = next((r["peer_info"] for r in rows
                 if r.get("base_method") == "llamacpp-spec" and r.get("peer_info")), None)
    out = {key: info.get(key) for key in ("llama_cpp_python", "system_info", "cmake_flags",
                                          "installed_build")}
    out["threads"] = threads
    if "llamacpp-spec" in names:
        for key in ("speculative_build", "speculative_system_info",
                    "speculative_threads_logged"):
            out[key] = spec.get(key) if spec else None
    return out


def prepare_peers(configs: Sequence[Config], target_spec: str | None, draft_spec: str | None,
                  target: CausalLM, draft: CausalLM | None, err: TextIO, *, loaded: bool,
                  ) -> tuple[CausalLM, CausalLM | None] | None:
    """Refuse peers that cannot run here, with the reason and the remedy; load the models of
    the transformers peers where ours run on the native runtime (None: ours are
    transformers models already). ``loaded``: the models were loaded from the settings'
    names (not passed in), so the peers' models can be loaded from them too."""
    peers = sorted({c.method.name for c in configs if c.method.is_peer})
    hf = [p for p in peers if p.startswith("hf-")]
    hf_pair = None
    if hf and not hasattr(target, "model"):
        if not loaded or target_spec is None:
            raise ValueError(f"the transformers peers ({', '.join(hf)}) need transformers "
                             f"models; {target.name} is not one (drop them or use --no-hf)")
        from verispec.models.loading import load_transformers

        def load(spec: str, model: CausalLM) -> CausalLM:
            precision = model.precision
            if precision == "int4":  # transformers has no int4 layers: its int8 form
                precision = "int8"
                print(f"{', '.join(hf)}: the draft runs in int8 inside transformers (it has "
                      "no int4 layers)", file=err)
            return load_transformers(spec, precision=precision, device=model.device,
                                     progress=lambda msg: print(msg, file=err))

        needs_draft = any(p != "hf-ar" for p in hf)
        hf_pair = (load(target_spec, target),
                   load(draft_spec, draft) if needs_draft and draft_spec and draft else None)
    if any(p.startswith("llamacpp") for p in peers):
        from verispec.bench.llamacpp import llamacpp_available

        missing = llamacpp_available()
        if missing is not None:
            raise ValueError(missing)
        gguf(target_spec or "")
        if "llamacpp-spec" in peers:
            gguf(draft_spec or "")
    return hf_pair
