"""How close the int4 draft's one-token step is to the host's memory bandwidth.

A one-token step reads every weight of the draft once, and a CPU with two cores reads
weights no faster than its memory delivers them: the step's floor is the bytes its linear
layers read divided by the read bandwidth of the moment. The script loads the embedded
draft as ``verispec`` loads it for ``auto`` on a CPU where the int4 kernel runs (int4, no
run-time rotations), counts the bytes each int4 layer's kernel reads per one-token pass
(verispec's int4 layout where the layer has it, else torch's packed weights and scales;
norms, biases and the embedding row are left out), and then, in
``--rounds`` rounds, times ``--steps`` one-token steps after a 200-token context and a
float32 sum over a 512 MiB tensor (far beyond the last-level cache), alternated so both
see the same state of the host; with ``--layer-by-layer`` each round also times the same
steps run layer by layer (the model's ``replay`` off: every kernel call through its Python
wrapper) against the replayed calls (:mod:`verispec.models.native.replay`).

    python benchmarks/draft_step_bytes.py [--rounds 5] [--layer-by-layer] [--out FILE]
    python benchmarks/draft_step_bytes.py --table FILE
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import results_io

CONTEXT = 200
SWEEP_BYTES = 512 * 1024 * 1024  # the bandwidth probe's tensor


def _int4_layers(model: Any) -> list[Any]:
    """The int4 linear layers a one-token pass of the native model runs, in order (the
    draft's int8 form of the same layers reads prompts)."""
    from verispec.models.native.linear import Int4Linear
    from verispec.models.native.weights import linear_layers

    found = [x for x in linear_layers(model.net) if isinstance(x, Int4Linear)]
    if not found:
        raise SystemExit("the draft has no int4 layers here")
    return found


def _bytes_read(layer: Any) -> int:
    """Bytes of weights one pass of an int4 layer reads: verispec's layout where the layer
    has it, else torch's packed weights and scales."""
    tensors = layer.lanes if layer.lanes is not None else (layer.packed, layer.scales)
    return sum(int(t.nbytes) for t in tensors)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from verispec.models.fetch import model_path
    from verispec.models.native import int4_kernel, load_native

    torch.set_num_threads(2)
    draft = load_native(model_path("qwen2.5-coder-0.5b-instruct", "hf"), "int4",
                        online_rotations=False)
    layers = _int4_layers(draft)
    weights = sum(_bytes_read(layer) for layer in layers)
    g = torch.Generator().manual_seed(0)
    draft.reset()
    draft.add_rows([torch.randint(1000, 20000, (CONTEXT,), generator=g).tolist()])
    sweep = torch.ones(SWEEP_BYTES // 4)  # float32

    def step(replayed: bool = True) -> float:
        draft.net.replay = replayed
        start = time.perf_counter()
        draft.extend(torch.randint(1000, 20000, (1, 1), generator=g))
        draft.rollback([CONTEXT])
        return time.perf_counter() - start

    def bandwidth() -> float:
        start = time.perf_counter()
        sweep.sum()
        return SWEEP_BYTES / (time.perf_counter() - start)

    for _ in range(5):  # warm-up: allocations, caches, the kernels' first calls
        step(), step(False), bandwidth()
    rounds = []
    for _ in range(args.rounds):
        rnd = {"step_s": [step() for _ in range(args.steps)],
               "bandwidth_b_s": [bandwidth() for _ in range(args.probes)]}
        if args.layer_by_layer:
            rnd["layer_by_layer_step_s"] = [step(False) for _ in range(args.steps)]
        rounds.append(rnd)
    rec = results_io.record(__file__, args, results_io.torch_info())
    rec.update({"int4_kernel": int4_kernel.status(), "layers": len(layers),
                "weight_bytes": weights, "context": CONTEXT, "rounds": rounds})
    return rec


def table(rec: dict[str, Any]) -> str:
    """Per round: the step's median, the read bandwidth's median and the floor they give."""
    weights = rec["weight_bytes"]
    head = (f"int4 draft: {rec['layers']} int4 layers reading {weights / 1e6:.1f} MB per "
            f"pass; {rec['int4_kernel']}")
    both = all("layer_by_layer_step_s" in rnd for rnd in rec["rounds"])
    columns = ("| round | one-token step, ms (median) | read bandwidth, GB/s (median) | "
               "bytes / bandwidth, ms | step / floor |")
    if both:
        columns += " layer by layer, ms (median) | step / layer by layer |"
    lines = [head, columns, "|---|---|---|---|---|" + ("---|---|" if both else "")]
    for i, rnd in enumerate(rec["rounds"]):
        step = statistics.median(rnd["step_s"])
        bandwidth = statistics.median(rnd["bandwidth_b_s"])
        floor = weights / bandwidth
        line = (f"| {i} | {step * 1e3:.2f} | {bandwidth / 1e9:.1f} | {floor * 1e3:.2f} | "
                f"{step / floor:.2f} |")
        if both:
            layers = statistics.median(rnd["layer_by_layer_step_s"])
            line += f" {layers * 1e3:.2f} | {step / layers:.3f} |"
        lines.append(line)
    return "\n".join(lines)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=15, help="draft steps timed per round")
    p.add_argument("--probes", type=int, default=5, help="bandwidth sweeps per round")
    p.add_argument("--layer-by-layer", action="store_true",
                   help="also time each round's steps with the replayed calls off")


if __name__ == "__main__":
    raise SystemExit(results_io.cli(__doc__.split("\n\n")[0], measure, table, options=options))
