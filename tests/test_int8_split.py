"""A mixed int8 kernel runs each pass on the library that is faster for its number of rows:
the split is chosen from a timing of the model's own layers, recorded and reused, robust to
one noisy pass size, and never changes a result (the libraries agree bit for bit). Tiny
in-process models, no downloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from native_support import (  # noqa: F401 (fixtures: module, module_cache, own_cache)
    MIXED,
    module,
    module_cache,
    native_int8,
    own_cache,
    seq,
)

from verispec.models.native import kernels, linear
from verispec.models.native.linear import SPLIT_ROWS, split_pass_sizes
from verispec.models.native.weights import int8_layers


def _times(narrow: dict[int, float], wide: dict[int, float]) -> dict[str, dict[str, float]]:
    return {str(r): {"fbgemm": narrow[r], "onednn": wide[r]} for r in SPLIT_ROWS}


def test_the_split_follows_the_timings_and_no_batch_size_constant() -> None:
    """The second library runs from the pass size where it starts to win; one noisy size
    does not move the split; where it never wins (or always wins) one library runs all."""
    rows = SPLIT_ROWS
    flat = {r: 1.0 for r in rows}
    grows = {r: 0.75 + 0.1 * r for r in rows}  # the narrow library's cost grows with rows
    assert linear._best_split(_times(grows, flat), "fbgemm", "onednn") == 3
    noisy = dict(flat) | {9: 2.0}  # the wide library slow at one size only
    assert linear._best_split(_times(grows, noisy), "fbgemm", "onednn") == 3
    assert linear._best_split(_times(flat, grows), "fbgemm", "onednn") == kernels.NO_ROWS
    assert linear._best_split(_times({r: 2.0 for r in rows}, flat), "fbgemm",
                              "onednn") == kernels.ALL_ROWS


@pytest.mark.parametrize("kernel", MIXED)
def test_a_split_is_timed_once_recorded_and_frees_an_unused_library(
        module: Any, kernel: kernels.Int8Kernel, own_cache: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    layers = int8_layers(native_int8(module, kernel).net)
    text = split_pass_sizes(layers, "tiny/split-passes")
    assert "int8 passes:" in text and "ms per sweep" in text
    file = kernels._record_file("tiny/split-passes")
    record = json.loads(file.read_text())
    assert set(record["times"]) == {str(r) for r in SPLIT_ROWS}
    assert {layer.wide_from for layer in layers} == {record["wide_from"]}

    def no_timing(_layers: Any) -> Any:
        raise AssertionError("timed again")

    file.write_text(json.dumps(record | {"times": []}))  # damaged: timed again, not a crash
    split_pass_sizes(int8_layers(native_int8(module, kernel).net), "tiny/split-passes")
    record = json.loads(file.read_text())
    assert set(record["times"]) == {str(r) for r in SPLIT_ROWS}
    monkeypatch.setattr(linear, "_sweep_times", no_timing)
    file.write_text(json.dumps(record | {"wide_from": kernels.NO_ROWS}))
    again = int8_layers(native_int8(module, kernel).net)
    assert f"{kernel.library} only" in split_pass_sizes(again, "tiny/split-passes")
    assert all(set(layer.packed) == {kernel.library} for layer in again)  # freed


@pytest.mark.parametrize("kernel", MIXED)
def test_every_split_gives_the_same_model(module: Any, kernel: kernels.Int8Kernel) -> None:
    """Where the passes change library does not change a logit: 6 tokens in one pass and
    one at a time are equal whatever rows the second library starts at."""
    m = native_int8(module, kernel)
    layers = int8_layers(m.net)
    prefix, block = seq(9, 130), seq(6, 131)
    outs = []
    for wide_from in (kernels.ALL_ROWS, 2, 4, kernels.NO_ROWS):
        for layer in layers:
            layer.wide_from = wide_from
        twin = m.spawn()
        twin.add_rows([prefix])
        together = twin.extend([block])[0]  # [6, V]
        twin.rollback([len(prefix)])
        singles = torch.cat([twin.extend([[t]])[0] for t in block])  # [6, V]
        assert torch.equal(together, singles), wide_from
        outs.append(together)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
