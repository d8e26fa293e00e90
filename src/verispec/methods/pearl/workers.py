"""The worker processes: one owns the draft model, one the target model.

Each worker is a spawned process (a fresh interpreter: OpenMP thread pools do not survive
``fork``) with its own share of the machine's cores (``torch.set_num_threads``). It receives
its model once, at start-up: a Hugging Face model travels as its ``nn.Module``, whose
weights ``torch.multiprocessing`` moves to shared memory (no copy per worker); a toy model
is pickled. Then it serves commands from the coordinator over a pipe, one at a time:

* ``("prefill", tokens, sampling)`` — empty the cache, process ``tokens``, use ``sampling``;
* ``("buffer", tensor)`` — the shared-memory tensor the worker writes its rows into;
* ``("draft", keep, feed, uniforms, slot)`` — draft side: sample ``len(uniforms)`` tokens,
  q rows into ``buffer[slot]``; reply with the tokens;
* ``("score", keep, feed, rows, nll_requests)`` — target side: first the NLL of the
  requests on the *previous* scoring, then p rows into ``buffer[:rows]``;
* ``("nll", requests)`` — target side: NLL on the latest scoring;
* ``("probe", keep, feed, reps)`` — time ``reps`` forward passes of ``feed`` (for
  ``--gamma auto``);
* ``("stop",)`` — exit.

Replies are ``("done", dict)`` with the busy interval ``t0``/``t1`` on the monotonic clock,
or ``("error", traceback)``, after which the worker exits with status 1. Only token ids,
a few floats and the vocabulary-sized rows (through shared memory, written once) cross
between processes. A worker ignores SIGINT (the coordinator decides), exits when the
coordinator's end of the pipe closes, and on Linux is killed by the kernel if the
coordinator dies (``PR_SET_PDEATHSIG``): no orphans.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from verispec.methods.pearl.sides import DraftSide, TargetSide
from verispec.telemetry.timeline import now
from verispec.models.base import CausalLM
from verispec.sampling import Sampling

__all__ = ["HFPayload", "NativePayload", "materialise", "portable", "worker_main"]


@dataclass
class HFPayload:
    """A Hugging Face model without its tokenizer and cache, for sending to a worker.

    Attributes:
        device: move the module there in the worker (None: keep its device).
    """

    module: Any
    name: str
    device: str | None = None


@dataclass
class NativePayload:
    """A native model loaded from a directory, sent as its path and precision (int8 weights
    are opaque oneDNN tensors that do not pickle; the worker reloads them from the disk
    cache)."""

    path: str
    precision: str
    name: str
    vocabulary: int | None = None
    online_rotations: bool = True
    exact_passes: bool = False


def portable(model: CausalLM, device: str | None = None) -> Any:
    """What to send to a worker for ``model`` (see :func:`materialise`)."""
    from verispec.models.hf import HFCausalLM
    from verispec.models.native import NativeCausalLM

    if isinstance(model, HFCausalLM):
        return HFPayload(model.model, model.name, device)
    if isinstance(model, NativeCausalLM) and model.source is not None:
        return NativePayload(model.source, model.precision, model.name, model.vocabulary,
                             model.online_rotations, model.exact_passes)
    return model


def materialise(payload: Any) -> CausalLM:
    """The model a worker runs, rebuilt from :func:`portable`'s payload."""
    if isinstance(payload, NativePayload):
        from verispec.models.native import load_native

        # a vocabulary subset is ranked with the tokenizer (the coordinator's ids)
        return load_native(payload.path, payload.precision, name=payload.name,
                           load_tokenizer=payload.vocabulary is not None,
                           vocabulary=payload.vocabulary,
                           online_rotations=payload.online_rotations,
                           exact_passes=payload.exact_passes)
    if isinstance(payload, HFPayload):
        from verispec.models.hf import HFCausalLM

        module = payload.module if payload.device is None else payload.module.to(payload.device)
        return HFCausalLM(module, None, name=payload.name)
    if not isinstance(payload, CausalLM):
        raise TypeError(f"a PEARL worker needs a CausalLM, got {type(payload).__name__}")
    return payload


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere).

    The kernel's signal fires when the parent *thread* that started the worker exits, so the
    coordinator only asks for it (``parent_pid`` > 0) when it runs on the main thread.
    """
    if parent_pid <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def worker_main(role: str, conn: Connection, payload: Any, threads: int, parent_pid: int = 0) -> None:
    """Entry point of a worker process (``role`` is ``"draft"`` or ``"target"``).

    ``parent_pid`` > 0: be killed by the kernel when that process (the coordinator) dies.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    try:
        torch.set_num_threads(max(1, threads))
        model = materialise(payload)
        side: DraftSide | TargetSide = (DraftSide if role == "draft" else TargetSide)(model, Sampling())
        buffer: torch.Tensor | None = None
        conn.send(("ready", {"threads": torch.get_num_threads(), "name": model.name}))
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the coordinator is gone
                return
            kind = msg[0]
            if kind == "stop":
                return
            t0 = now()
            reply: dict[str, Any] = {}
            if kind == "prefill":
                side.sampling = msg[2]
                side.prefill(msg[1])
            elif kind == "buffer":
                buffer = msg[1]
            elif kind == "draft":
                assert isinstance(side, DraftSide) and buffer is not None
                _, keep, feed, uniforms, slot = msg
                reply["tokens"] = side.draft(keep, feed, torch.tensor(uniforms, dtype=torch.float64),
                                             buffer[slot])
            elif kind == "score":
                assert isinstance(side, TargetSide) and buffer is not None
                _, keep, feed, rows, requests = msg
                reply["nll"] = side.nll(requests)
                side.score(keep, feed, rows, buffer)
            elif kind == "nll":
                assert isinstance(side, TargetSide)
                reply["nll"] = side.nll(msg[1])
            elif kind == "probe":
                _, keep, feed, reps = msg
                times = []
                for _ in range(reps):
                    s = now()
                    side.probe(keep, feed)
                    times.append(now() - s)
                reply["times"] = times
            else:
                raise ValueError(f"unknown command {kind!r}")
            reply["t0"], reply["t1"] = t0, now()
            conn.send(("done", reply))
    except BaseException:  # noqa: BLE001 - reported to the coordinator, then exit
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, ValueError):
            pass
        sys.exit(1)
