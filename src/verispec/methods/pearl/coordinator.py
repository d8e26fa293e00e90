"""The concurrent PEARL engine: a coordinator and two worker processes.

:class:`PearlEngine` starts a draft worker and a target worker (see :mod:`.workers`) with
the machine's cores split between them, and runs requests with the shared driver
(:func:`~verispec.methods.pearl.driver.run_schedule`) through :class:`RemoteExecutor`, which
sends each phase's draft command and target command at once and waits for both: the two
models really compute at the same time. The coordinator draws every random number and does
the verification (the rows are read in place from shared memory), so the output is the
sequential reference's output for the same seed.

``--gamma auto`` (Theorem 1): at the first request that asks for it, both workers process a
dummy context and time single forward passes *at the same time* (so that they compete for
the memory bandwidth as they will while decoding); the target is then timed again on a
window of round(c₁) tokens. c = T(target forward) / T(draft forward) and γ = max(1, round(c)).

Shutdown: :meth:`PearlEngine.close` (also on ``with`` exit, on any exception and on Ctrl-C)
asks both workers to stop, then terminates and finally kills those that do not, and reaps
them. An exception in a worker reaches the caller as :class:`PearlWorkerError` with the
worker's traceback.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn, Self

import torch
from torch import Tensor

from verispec.engine.request import GenerationOutput
from verispec.checks import check_positive
from verispec.methods.pearl.driver import run_schedule
from verispec.methods.pearl.schedule import PearlConfig, Phase
from verispec.methods.pearl.sides import CacheMirror
from verispec.methods.pearl.stats import PearlStats
from verispec.telemetry.timeline import Timeline, now
from verispec.methods.pearl.workers import portable, worker_main
from verispec.models.base import CausalLM
from verispec.models.loading import check_compatible
from verispec.sampling import Sampling

__all__ = ["PearlEngine", "PearlWorkerError", "RemoteExecutor", "split_threads"]

ROLES = ("draft", "target")
PROBE_CONTEXT = 16  # dummy tokens processed before timing forwards for --gamma auto
PROBE_REPS = 3


class PearlWorkerError(RuntimeError):
    """A worker process failed or died; the message carries its traceback or exit status."""


def split_threads(total: int | None = None) -> tuple[int, int]:
    """(draft threads, target threads): a third of the cores for the draft, at least one each."""
    if total is None:
        total = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    draft = max(1, total // 3)
    return draft, max(1, total - draft)


class PearlEngine:
    """Two worker processes serving PEARL requests for one (target, draft) pair.

    Args:
        target, draft: the models (same vocabulary); they are sent to the workers once.
        draft_threads, target_threads: torch threads per worker (default :func:`split_threads`).
        start_method: multiprocessing start method; ``"spawn"`` (the default) is the safe one
            with multi-threaded OpenMP.

    Devices: each worker keeps its model on the device it was loaded on (CUDA weights are
    shared with the worker through CUDA IPC), except that with a CUDA target and two or more
    GPUs the draft worker moves the draft model to ``cuda:1`` — one model per GPU, as in the
    paper. The p and q rows always travel through CPU shared memory.
    """

    def __init__(self, target: CausalLM, draft: CausalLM, *, draft_threads: int | None = None,
                 target_threads: int | None = None, start_method: str = "spawn") -> None:
        import torch.multiprocessing as tmp  # registers the shared-memory tensor pickling

        self.closed = False
        self.conns: dict[str, Connection] = {}
        self.procs: dict[str, Any] = {}
        check_compatible(target, draft)
        default_d, default_t = split_threads()
        self.threads = {"draft": default_d if draft_threads is None else draft_threads,
                        "target": default_t if target_threads is None else target_threads}
        for role, n in self.threads.items():
            check_positive(f"{role}_threads", n)
        self.vocab = target.vocab_size
        self.eos_token_ids = target.eos_token_ids
        limits = [m.max_length for m in (target, draft) if m.max_length is not None]
        self.max_length = min(limits) if limits else None
        self.buffers: dict[str, Tensor] = {}
        self.speed: tuple[float, float, float] | None = None  # (c, draft s, target s)
        start = now()
        ctx = tmp.get_context(start_method)
        try:
            on_main = threading.current_thread() is threading.main_thread()
            watch = os.getpid() if on_main else 0  # see workers._die_with_parent
            two_gpus = target.device.type == "cuda" and torch.cuda.device_count() >= 2
            devices = {"draft": "cuda:1" if two_gpus else None, "target": None}
            for role, model in (("draft", draft), ("target", target)):
                parent, child = ctx.Pipe()
                payload = portable(model, devices[role])
                proc = ctx.Process(target=worker_main, name=f"verispec-pearl-{role}", daemon=True,
                                   args=(role, child, payload, self.threads[role], watch))
                proc.start()
                child.close()
                self.conns[role], self.procs[role] = parent, proc
            self.wait_all(ROLES, expect="ready")
        except BaseException:
            self.close()
            raise
        self.startup_s = now() - start

    # -- process plumbing -------------------------------------------------------------

    @property
    def pids(self) -> dict[str, int]:
        return {role: int(proc.pid) for role, proc in self.procs.items()}

    def send(self, role: str, msg: tuple[Any, ...]) -> None:
        try:
            self.conns[role].send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
            self._raise_dead(role, exc)

    def wait_all(self, roles: Sequence[str], expect: str = "done") -> dict[str, dict[str, Any]]:
        """Wait for one reply from each of ``roles``; raise if a worker fails or dies."""
        pending = set(roles)
        replies: dict[str, dict[str, Any]] = {}
        while pending:
            handles: list[Any] = [self.conns[r] for r in pending]
            handles += [self.procs[r].sentinel for r in pending]
            ready = wait(handles)
            for role in list(pending):
                conn, proc = self.conns[role], self.procs[role]
                if conn in ready or (proc.sentinel in ready and conn.poll()):
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError) as exc:
                        self._raise_dead(role, exc)
                    if msg[0] == "error":
                        raise PearlWorkerError(f"PEARL {role} worker failed:\n{msg[1].rstrip()}")
                    if msg[0] != expect:
                        raise PearlWorkerError(f"PEARL {role} worker sent {msg[0]!r}, expected {expect!r}")
                    replies[role] = msg[1]
                    pending.discard(role)
                elif proc.sentinel in ready:
                    self._raise_dead(role, None)
        return replies

    def _raise_dead(self, role: str, exc: BaseException | None) -> NoReturn:
        proc = self.procs[role]
        proc.join(timeout=1.0)
        raise PearlWorkerError(f"PEARL {role} worker exited unexpectedly (exit code {proc.exitcode})"
                               + (f": {exc}" if exc else "")) from exc

    def close(self) -> None:
        """Stop both workers (stop → terminate → kill) and reap them. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns.values():
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in self.procs.values():
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns.values():
            conn.close()
        self.buffers.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort if close() was forgotten
        with contextlib.suppress(Exception):
            self.close()

    # -- requests ---------------------------------------------------------------------

    def measure_speed(self) -> tuple[float, float, float]:
        """(c, draft seconds per forward, target seconds per forward), measured once."""
        if self.speed is None:
            dummy = [i % self.vocab for i in range(PROBE_CONTEXT)]
            for role in ROLES:
                self.send(role, ("prefill", dummy[:-1], Sampling()))
            self.wait_all(ROLES)
            keep, last = len(dummy) - 1, dummy[-1:]
            for role in ROLES:
                self.send(role, ("probe", keep, last, PROBE_REPS))
            r = self.wait_all(ROLES)
            t_d, t_t = (statistics.median(r[role]["times"]) for role in ROLES)
            window = max(1, round(t_t / t_d))
            if window > 1:  # time the target on a window as long as the one it will verify
                self.send("draft", ("probe", keep, last, PROBE_REPS * window))
                self.send("target", ("probe", keep, last * window, PROBE_REPS))
                r = self.wait_all(ROLES)
                t_d, t_t = (statistics.median(r[role]["times"]) for role in ROLES)
            self.speed = (t_t / t_d, t_d, t_t)
        return self.speed

    def generate(
        self,
        prompt: Sequence[int],
        *,
        gamma: int | str = "auto",
        verifier: str = "block",
        pre_verify: bool = True,
        post_verify: bool = True,
        sampling: Sampling,
        max_new_tokens: int,
        generator: torch.Generator,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerationOutput:
        """One PEARL request (``gamma`` an integer >= 1 or ``"auto"``)."""
        if self.closed:
            raise RuntimeError("this PEARL engine is closed")
        if not prompt:
            raise ValueError("the prompt is empty: at least one token is needed to condition on")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if verifier not in ("token", "block"):
            raise ValueError(f"PEARL's verifier must be token or block, got {verifier!r}")
        stats = PearlStats(method="pearl", lossless=True, verifier=verifier, pre_verify=pre_verify,
                           post_verify=post_verify, draft_threads=self.threads["draft"],
                           target_threads=self.threads["target"], startup_s=self.startup_s)
        if gamma == "auto":
            c, t_d, t_t = self.measure_speed()
            gamma = max(1, round(c))
            stats.gamma_mode, stats.speed_ratio = "auto", c
            stats.probe_draft_s, stats.probe_target_s = t_d, t_t
        elif isinstance(gamma, str):
            raise ValueError(f"gamma must be an integer >= 1 or 'auto', got {gamma!r}")
        cfg = PearlConfig(gamma, verifier, pre_verify, post_verify)
        stats.gamma = cfg.gamma
        if self.max_length is not None and len(prompt) + cfg.gamma + 1 > self.max_length:
            raise ValueError(f"the prompt has {len(prompt)} tokens; with γ={cfg.gamma} it leaves no "
                             f"room in the context window of {self.max_length} tokens")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the coordinator's verification must not steal the workers' cores
        try:
            return run_schedule(
                RemoteExecutor(self, sampling, cfg.gamma), prompt, cfg=cfg, stats=stats,
                max_new_tokens=max_new_tokens, generator=generator,
                eos_token_ids=self.eos_token_ids, max_length=self.max_length, on_tokens=on_tokens,
            )
        except BaseException:  # a failed worker, Ctrl-C, ...: no worker may outlive this
            self.close()
            raise
        finally:
            torch.set_num_threads(threads)

    def buffer(self, role: str, shape: tuple[int, ...]) -> Tensor:
        """The worker's shared output buffer, (re)allocated and sent when too small."""
        have = self.buffers.get(role)
        if have is None or have.shape != shape:
            have = torch.empty(shape, dtype=torch.float64).share_memory_()
            self.send(role, ("buffer", have))
            self.wait_all([role])
            self.buffers[role] = have
        return have


class RemoteExecutor:
    """Runs each phase's draft and target commands in the two workers at the same time."""

    def __init__(self, engine: PearlEngine, sampling: Sampling, gamma: int) -> None:
        self.engine, self.sampling, self.gamma = engine, sampling, gamma
        self.q_buf = engine.buffer("draft", (2, gamma, engine.vocab))  # two slots, alternating
        self.p_buf = engine.buffer("target", (gamma + 1, engine.vocab))
        self.slot = 1
        self.mirrors = {role: CacheMirror() for role in ROLES}
        self.timeline = Timeline()
        self.draft_forwards = self.target_forwards = self.target_tokens_scored = 0
        self.draft_prefill_calls = self.target_prefill_calls = 0
        self.nll_pending: list[tuple[int, int]] = []
        self.nll = 0.0

    def prefill(self, prompt: Sequence[int]) -> None:
        head = [int(t) for t in prompt[:-1]]
        for role in ROLES:
            self.engine.send(role, ("prefill", head, self.sampling))
            self.mirrors[role].update(0, head)
        for role, r in self.engine.wait_all(ROLES).items():
            self.timeline.add(role, r["t0"], r["t1"], "prefill")
        self.draft_prefill_calls = self.target_prefill_calls = int(bool(head))

    def run_phase(self, phase: Phase, uniforms: Tensor | None) -> tuple[list[int], list[Tensor], Tensor | None]:
        eng, roles = self.engine, []
        if phase.draft_context is not None:
            assert uniforms is not None
            self.slot ^= 1
            keep, d_feed = self.mirrors["draft"].plan(phase.draft_context, 1)
            eng.send("draft", ("draft", keep, d_feed, uniforms.tolist(), self.slot))
            roles.append("draft")
        if phase.target_sequence is not None:
            t_keep, t_feed = self.mirrors["target"].plan(phase.target_sequence, phase.target_rows)
            eng.send("target", ("score", t_keep, t_feed, phase.target_rows, self.nll_pending))
            self.nll_pending = []
            roles.append("target")
        replies = eng.wait_all(roles)
        tokens: list[int] = []
        q_rows: list[Tensor] = []
        p_rows = None
        if "draft" in replies:
            r = replies["draft"]
            tokens = r["tokens"]
            self.mirrors["draft"].update(keep, d_feed + tokens[:-1])
            q_rows = list(self.q_buf[self.slot])
            self.draft_forwards += self.gamma
            self.timeline.add("draft", r["t0"], r["t1"], phase.kind)
        if "target" in replies:
            r = replies["target"]
            self.nll += r["nll"]
            self.mirrors["target"].update(t_keep, t_feed)
            p_rows = self.p_buf[: phase.target_rows]
            self.target_forwards += 1
            self.target_tokens_scored += len(t_feed)
            self.timeline.add("target", r["t0"], r["t1"], phase.kind)
        return tokens, q_rows, p_rows

    def request_nll(self, requests: list[tuple[int, int]]) -> None:
        self.nll_pending.extend(requests)

    def collect_nll(self) -> float:
        if self.nll_pending:
            self.engine.send("target", ("nll", self.nll_pending))
            self.nll += self.engine.wait_all(["target"])["target"]["nll"]
            self.nll_pending = []
        return self.nll
