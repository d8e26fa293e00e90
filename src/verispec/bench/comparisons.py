"""verispec's lossless methods against the peer systems measured in the same run.

For every temperature, every lossless verispec config at batch size 1 (a method at one γ;
``ar`` included) is compared with every peer config (``llamacpp-ar``, ``llamacpp-spec``
with any options label, ``hf-*``) at that temperature, whatever the peer's γ. Each entry
is a paired ratio of :mod:`.metrics`: rows of the same prompt, temperature and repeat,
logs averaged over repeats per prompt, geometric mean over prompts with a 95% Student-t
interval over prompts, both end to end (tokens / seconds) and over the decoding alone
(decode tokens / decode seconds, :func:`.metrics.decode_throughput`; None where either
side records no prefill).

Configs are ranked by their geometric-mean tokens per second. Where a peer ran several
configs (a kind: one ``base_method``, e.g. ``llamacpp-spec`` at several γ or with several
options), every verispec config is also compared with the kind's best config, and the best
lossless verispec config at the temperature (``method_role`` "best lossless verispec
config") with the best config of each peer kind (``peer_role`` "best <kind> config").
``peer_configs`` lists the peers' grid with their speed figures and which config is best.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from verispec.bench.metrics import (
    decode_throughput,
    geometric_mean_over_prompts,
    is_peer,
    paired_ratio,
    prefill_seconds,
    throughput,
)

__all__ = ["BEST_OURS", "CONFIG", "gamma_auto_comparisons", "peer_comparisons", "peer_configs",
           "render_comparisons", "render_gamma_auto"]

Row = dict[str, Any]
ConfigKey = tuple[str, float, Any]  # method label, temperature, γ (batch size 1)

CONFIG = "config"
BEST_OURS = "best lossless verispec config"


def _configs(results: Sequence[Row]) -> dict[ConfigKey, list[Row]]:
    out: dict[ConfigKey, list[Row]] = defaultdict(list)
    for r in results:
        if r.get("batch_size", 1) == 1:
            out[(r["method"], r["temperature"], r["gamma"])].append(r)
    return out


def _speed(rows: list[Row]) -> float:
    return geometric_mean_over_prompts(rows, throughput)[0] or 0.0


def _kind(rows: list[Row]) -> str:
    return str(rows[0].get("base_method", rows[0]["method"]))


def _figures(rows: list[Row]) -> Row:
    tps, prompts = geometric_mean_over_prompts(rows, throughput)
    decode, _ = geometric_mean_over_prompts(rows, decode_throughput)
    prefill, _ = geometric_mean_over_prompts(rows, lambda r: prefill_seconds(r) or None)
    return {"prompts": prompts, "tokens_per_s": tps, "decode_tokens_per_s": decode,
            "tpot_ms": 1000 / decode if decode else None,
            "prefill_ms": 1000 * prefill if prefill is not None else None}


def peer_configs(results: Sequence[Row]) -> list[Row]:
    """Every peer config at batch size 1 with its speed figures; ``best`` marks the config
    of its kind (and temperature) with the highest geometric-mean tokens per second."""
    configs = {k: rows for k, rows in _configs(results).items() if is_peer(rows[0])}
    best: dict[tuple[str, float], ConfigKey] = {}
    for k, rows in configs.items():
        kind = (_kind(rows), k[1])
        if kind not in best or _speed(rows) > _speed(configs[best[kind]]):
            best[kind] = k
    return [{"temperature": k[1], "peer": k[0], "kind": _kind(rows), "gamma": k[2],
             **_figures(rows), "best": best[(_kind(rows), k[1])] == k}
            for k, rows in configs.items()]


def _entry(ours: tuple[ConfigKey, list[Row]], theirs: tuple[ConfigKey, list[Row]],
           method_role: str, peer_role: str) -> Row:
    (mk, mrows), (pk, prows) = ours, theirs
    e2e = paired_ratio(mrows, prows, throughput)
    dec = paired_ratio(mrows, prows, decode_throughput)
    return {
        "temperature": mk[1], "method_role": method_role, "method": mk[0], "gamma": mk[2],
        "peer_role": peer_role, "peer": pk[0], "peer_kind": _kind(prows), "peer_gamma": pk[2],
        "pairs": e2e.prompts, "speedup": e2e.ratio, "speedup_ci95": e2e.ci95,
        "decode_pairs": dec.prompts, "speedup_decode": dec.ratio,
        "speedup_decode_ci95": dec.ci95,
        "tokens_per_s": _speed(mrows) or None, "peer_tokens_per_s": _speed(prows) or None,
    }


def peer_comparisons(results: Sequence[Row]) -> list[Row]:
    """The comparison entries (see the module docstring), per temperature in order of
    appearance: each verispec config against each peer config, then against each kind's
    best config where the kind has several, then best against best."""
    configs = _configs(results)
    out: list[Row] = []
    for t in dict.fromkeys(k[1] for k in configs):
        ours = [(k, rows) for k, rows in configs.items() if k[1] == t and not is_peer(rows[0])
                and all(r.get("lossless", True) for r in rows) and _speed(rows)]
        peers = [(k, rows) for k, rows in configs.items() if k[1] == t and is_peer(rows[0])
                 and _speed(rows)]
        if not ours or not peers:
            continue
        kinds: dict[str, list[tuple[ConfigKey, list[Row]]]] = defaultdict(list)
        for p in peers:
            kinds[_kind(p[1])].append(p)
        best = {kind: max(ps, key=lambda p: _speed(p[1])) for kind, ps in kinds.items()}
        for kind, ps in kinds.items():
            for o in ours:
                out += [_entry(o, p, CONFIG, CONFIG) for p in ps]
                if len(ps) > 1:
                    out.append(_entry(o, best[kind], CONFIG, f"best {kind} config"))
        top = max(ours, key=lambda o: _speed(o[1]))
        out += [_entry(top, best[kind], BEST_OURS, f"best {kind} config") for kind in kinds]
    return out


def gamma_auto_comparisons(results: Sequence[Row]) -> list[Row]:
    """γ auto against every fixed γ of the same method and temperature (batch size 1),
    paired per prompt like :func:`peer_comparisons`; ``best`` marks the fixed γ with the
    highest geometric-mean tokens per second, the one the γ policy has to match."""
    configs = _configs(results)
    out: list[Row] = []
    for (method, t, gamma), auto in configs.items():
        if gamma != "auto":
            continue
        fixed = [(k, rows) for k, rows in configs.items()
                 if k[0] == method and k[1] == t and k[2] not in ("auto", None, 0)]
        if not fixed:
            continue
        top = max(fixed, key=lambda f: _speed(f[1]))[0]
        for k, rows in fixed:
            r = paired_ratio(auto, rows, throughput)
            out.append({"temperature": t, "method": method, "gamma": k[2], "best": k == top,
                        "pairs": r.prompts, "ratio": r.ratio, "ratio_ci95": r.ci95})
    return out


# ---------------------------------------------------------------- markdown


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _ratio(x: float | None, ci: list[float] | None) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{x:.2f}×"


def _config(name: str, gamma: Any) -> str:
    return name if gamma in (None, 0) else f"{name} γ={gamma}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def render_comparisons(summary: dict[str, Any], temperature: float) -> list[str]:
    """The markdown of one temperature: the peers' grid, then the paired comparisons."""
    grid = [p for p in summary.get("peer_configs", []) if p["temperature"] == temperature]
    entries = [c for c in summary.get("comparisons", []) if c["temperature"] == temperature]
    if not entries:
        return []
    lines = [("Peer configurations (geometric means over prompts; ★ = the fastest config of its "
             "peer, by tok/s):"), ""]
    lines += _table(["peer", "γ", "prompts", "tok/s", "decode tok/s", "TPOT ms", "prefill ms"],
                    [[p["peer"] + (" ★" if p["best"] else ""),
                      "–" if p["gamma"] in (None, 0) else str(p["gamma"]), str(p["prompts"]),
                      _f(p["tokens_per_s"]), _f(p["decode_tokens_per_s"]),
                      _f(p["tpot_ms"], 1), _f(p["prefill_ms"], 1)] for p in grid])
    lines += [("Paired ratios verispec / peer (same prompt, temperature and repeat; geometric "
              "mean over prompts, 95% Student-t interval over prompts):"), ""]
    body = []
    for c in entries:
        mine = _config(c["method"], c["gamma"])
        theirs = _config(c["peer"], c["peer_gamma"])
        if c["method_role"] != CONFIG:
            mine = f"{c['method_role']}: {mine}"
        if c["peer_role"] != CONFIG:
            theirs = f"{c['peer_role']}: {theirs}"
        body.append([mine, theirs, str(c["pairs"]), _ratio(c["speedup"], c["speedup_ci95"]),
                     _ratio(c["speedup_decode"], c["speedup_decode_ci95"])])
    return lines + _table(["verispec", "vs peer", "prompts", "tok/s ratio [95% CI]",
                           "decode tok/s ratio [95% CI]"], body)


def render_gamma_auto(summary: dict[str, Any], temperature: float) -> list[str]:
    """The markdown of γ auto against each fixed γ at one temperature (★: the best fixed)."""
    entries = [c for c in summary.get("gamma_auto", []) if c["temperature"] == temperature]
    if not entries:
        return []
    lines = [("γ auto / fixed γ (paired per prompt; geometric mean over prompts, 95% Student-t "
              "interval over prompts; ★ = the fastest fixed γ):"), ""]
    return lines + _table(["method", "fixed γ", "prompts", "γ auto / fixed γ [95% CI]"],
                          [[c["method"], f"{c['gamma']}" + (" ★" if c["best"] else ""),
                            str(c["pairs"]), _ratio(c["ratio"], c["ratio_ci95"])]
                           for c in entries])
