"""PEARL: exactness of the schedule, identity of the concurrent engine, statistics, shutdown.

1. Exact enumeration (float64, 1e-12): :func:`pearl_law` — Algorithm 2 with token or block
   verification of every window, with and without pre-verify / post-verify — equals
   :func:`target_law` on random toy models (temperature 1, 0 and warped; a target with EOS).
   Negative controls (residual replaced by p; always accept) are rejected by the same check.
2. The sequential reference sampler follows that exact law (chi-square, P_PASS = 1e-3 at a
   fixed seed); the same sampler with an always-accepting verifier is rejected (P_FAIL 1e-9).
3. The concurrent engine (two worker processes) gives exactly the reference's tokens, NLL and
   counts for the same seed, on toy models and on tiny Hugging Face models; greedy PEARL
   equals greedy autoregressive decoding.
4. Theorem 2: with i.i.d. acceptance rate α, the mean accepted tokens per drafting phase is
   α/(1-α) (the paper's 1/(1-α)+1 is rejected); Theorem 1's c is measured from per-forward
   times (--gamma auto); the timeline shows the two models busy at the same time.
5. Shutdown: workers exit on completion, on an exception in either worker (the traceback is
   in the error), when a worker is killed, on Ctrl-C and when the coordinator is SIGKILLed —
   no process survives.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from pearl_doubles import DelayedLM
from scipy import stats

from verispec.cli import main
from verispec.engine.loop import generate_one
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.methods.pearl.coordinator import PearlEngine, PearlWorkerError
from verispec.methods.pearl.reference import pearl_law
from verispec.methods.pearl.reference import reference_generate as reference
from verispec.methods.pearl.schedule import PLANS, PearlConfig, sample_with_uniform
from verispec.models.toy import ContextIndependentLM, MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Randomness, Sampling
from verispec.telemetry.timeline import draw_timeline
from verispec.theory import target_law, tv_distance
from verispec.verify import VerifyPlan, token_plan

TOL = 1e-12
P_PASS, P_FAIL = 1e-3, 1e-9
ABLATIONS = [(True, True), (False, True), (True, False), (False, False)]
SAMPLINGS = {"T1": Sampling(), "T0": Sampling(temperature=0),
             "T0.7-topk2": Sampling(temperature=0.7, top_k=2)}


def _pair(kind: str, vocab: int, seed: int, **kw: object) -> tuple[TableLM, TableLM]:
    if kind == "markov":
        return MarkovLM.random(vocab, seed, **kw), MarkovLM.random(vocab, seed + 1000)
    return RandomContextLM(vocab, seed, **kw), RandomContextLM(vocab, seed + 1000)


def _max_diff(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# --------------------------------------------------------------------------------------
# 1. Exact enumeration.
# --------------------------------------------------------------------------------------

CASES = [("random", 2, 1, 5), ("random", 2, 3, 5), ("random", 3, 2, 4), ("random", 3, 3, 3),
         ("markov", 2, 2, 5), ("markov", 4, 2, 3)]


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("kind, vocab, gamma, length", CASES)
def test_pearl_law_equals_target_law(kind: str, vocab: int, gamma: int, length: int,
                                     sampling_name: str) -> None:
    sampling = SAMPLINGS[sampling_name]
    target, draft = _pair(kind, vocab, seed=vocab * 10 + gamma)
    want = target_law(target, [1, 0], sampling, length)
    for verifier in ("token", "block"):
        for pre, post in ABLATIONS:
            got = pearl_law(target, draft, [1, 0], gamma=gamma, sampling=sampling, length=length,
                            verifier=verifier, pre_verify=pre, post_verify=post)
            assert abs(sum(got.values()) - 1) < TOL
            assert _max_diff(got, want) < TOL, (verifier, pre, post)


def test_pearl_law_with_eos_inside_windows() -> None:
    target = RandomContextLM(3, 5, eos_token_id=2)
    draft = RandomContextLM(3, 6)
    want = target_law(target, [0], Sampling(), 5)
    assert any(len(k) < 5 for k in want)  # EOS really ends some sequences early
    for verifier in ("token", "block"):
        for pre, post in ABLATIONS:
            got = pearl_law(target, draft, [0], gamma=3, sampling=Sampling(), length=5,
                            verifier=verifier, pre_verify=pre, post_verify=post)
            assert _max_diff(got, want) < TOL, (verifier, pre, post)


def _residual_is_p(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> VerifyPlan:
    plan = token_plan(p, q, x)
    return VerifyPlan(plan.accept_probs, p.clone(), plan.rule)


def _always_accept(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> VerifyPlan:
    plan = token_plan(p, q, x)
    return VerifyPlan(torch.ones_like(plan.accept_probs), plan.residuals, plan.rule)


@pytest.mark.parametrize("broken", [_residual_is_p, _always_accept])
def test_negative_controls_are_rejected_by_the_exact_check(broken: Callable[..., VerifyPlan]) -> None:
    target, draft = _pair("random", 3, seed=32)
    want = target_law(target, [1, 0], Sampling(), 4)
    for pre, post in ABLATIONS:
        got = pearl_law(target, draft, [1, 0], gamma=2, sampling=Sampling(), length=4,
                        verifier=broken, pre_verify=pre, post_verify=post)
        assert tv_distance(got, want) > 1e-2, (pre, post)


# --------------------------------------------------------------------------------------
# 2. The reference sampler follows the enumerated law.
# --------------------------------------------------------------------------------------

def _chi2_pvalue(counts: Counter, law: dict, n: int) -> float:
    if any(law.get(k, 0.0) == 0.0 for k in counts):
        return 0.0
    keys = [k for k, v in law.items() if v * n >= 5]
    rest = [k for k in law if k not in keys]
    obs = [counts.get(k, 0) for k in keys] + [sum(counts.get(k, 0) for k in rest)]
    exp = [law[k] * n for k in keys] + [sum(law[k] for k in rest) * n]
    if exp[-1] < 1:
        obs, exp = obs[:-1], exp[:-1]
    scale = sum(obs) / sum(exp)
    return float(stats.chisquare(obs, [e * scale for e in exp]).pvalue)


def _sample(target: TableLM, draft: TableLM, cfg: PearlConfig, n: int, length: int) -> Counter:
    out: Counter = Counter()
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        res = reference(target, draft, [1, 0], cfg=cfg, sampling=Sampling(),
                        max_new_tokens=length, generator=gen)
        out[tuple(res.tokens)] += 1
    return out




@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("verifier", ["token", "block"])
def test_reference_sampler_follows_the_exact_law(verifier: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = _pair("random", 3, seed=41)
    cfg, n, length = PearlConfig(2, verifier), 1500, 3
    law = pearl_law(target, draft, [1, 0], gamma=2, sampling=Sampling(), length=length,
                    verifier=verifier)
    assert _chi2_pvalue(_sample(target, draft, cfg, n, length), law, n) > P_PASS
    monkeypatch.setitem(PLANS, verifier, _always_accept)  # negative control
    assert _chi2_pvalue(_sample(target, draft, cfg, n, length), law, n) < P_FAIL


def test_sample_with_uniform_is_the_inverse_cdf() -> None:
    probs = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25], dtype=torch.float64)
    grid = [(i + 0.5) / 1000 for i in range(1000)]
    counts = Counter(sample_with_uniform(probs, u) for u in grid)
    assert counts == {1: 250, 3: 500, 4: 250}
    assert sample_with_uniform(probs, 0.0) == 1
    assert sample_with_uniform(probs, 1.0 - 2**-53) == 4  # never a zero-probability token
    assert sample_with_uniform(torch.tensor([0.3, 0.7, 0.0]), 0.9999999) == 1


# --------------------------------------------------------------------------------------
# 3. The concurrent engine reproduces the reference exactly.
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy_engine() -> Iterator[tuple[PearlEngine, TableLM, TableLM]]:
    target, draft = RandomContextLM(6, 3, eos_token_id=5), RandomContextLM(6, 4)
    with PearlEngine(target, draft) as engine:
        yield engine, target, draft


def _same(a: object, b: object) -> None:
    sa, sb = a.stats, b.stats  # type: ignore[attr-defined]
    assert a.tokens == b.tokens  # type: ignore[attr-defined]
    assert sa.nll_sum == pytest.approx(sb.nll_sum, abs=1e-9)
    for key in ("draft_calls", "target_calls", "draft_forwards", "target_forwards", "iterations",
                "tau_histogram", "phase_counts", "drafting_phases", "accepted_in_phases",
                "target_tokens_scored", "stop_reason", "tokens_emitted"):
        assert getattr(sa, key) == getattr(sb, key), key


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
def test_engine_output_is_identical_to_the_reference(toy_engine: tuple, sampling_name: str) -> None:
    engine, target, draft = toy_engine
    sampling = SAMPLINGS[sampling_name]
    for verifier in ("token", "block"):
        for pre, post in ABLATIONS:
            for gamma, seed in ((1, 0), (3, 1), (4, 2)):
                cfg = PearlConfig(gamma, verifier, pre, post)
                want = reference(target, draft, [1, 2, 0], cfg=cfg, sampling=sampling,
                                 max_new_tokens=25, generator=torch.Generator().manual_seed(seed))
                got = engine.generate([1, 2, 0], gamma=gamma, verifier=verifier, pre_verify=pre,
                                      post_verify=post, sampling=sampling, max_new_tokens=25,
                                      generator=torch.Generator().manual_seed(seed))
                _same(got, want)
                assert got.stats.concurrent and not want.stats.concurrent


def test_engine_forward_counts_and_streaming(toy_engine: tuple) -> None:
    engine, _, _ = toy_engine
    streamed: list[int] = []
    out = engine.generate([0, 1], gamma=3, sampling=Sampling(temperature=0.8),
                          max_new_tokens=40, generator=torch.Generator().manual_seed(7),
                          on_tokens=streamed.extend)
    st = out.stats
    assert streamed == out.tokens and st.tokens_emitted == len(out.tokens)
    drafting = sum(v for k, v in st.phase_counts.items() if k != "verify-only")
    scoring = sum(v for k, v in st.phase_counts.items() if k != "draft-only")
    assert st.draft_forwards == 3 * drafting and st.target_forwards == scoring == st.target_calls
    assert st.draft_calls == st.draft_forwards + 1  # + the prompt's prefill
    assert st.mean_accepted_per_phase == st.accepted_in_phases / st.drafting_phases
    assert set(st.wait_fraction) == {"draft", "target", "verify"}
    assert all(0.0 <= f <= 1.0 for f in st.wait_fraction.values())
    assert st.to_dict()["mean_accepted_per_phase"] == st.mean_accepted_per_phase
    assert "mean accepted per drafting phase" in st.summary()


def test_engine_rejects_bad_requests_and_stays_usable(toy_engine: tuple) -> None:
    engine, _, _ = toy_engine
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], gamma=2, sampling=Sampling(), max_new_tokens=3, generator=gen)
    with pytest.raises(ValueError, match="gamma"):
        engine.generate([1], gamma="fast", sampling=Sampling(), max_new_tokens=3, generator=gen)
    with pytest.raises(ValueError, match="token or block"):
        engine.generate([1], gamma=2, verifier="multidraft", sampling=Sampling(),
                        max_new_tokens=3, generator=gen)
    assert len(engine.generate([1], gamma=2, sampling=Sampling(), max_new_tokens=3,
                               generator=gen).tokens) == 3


def test_engine_on_tiny_hf_models(tiny: Callable) -> None:
    target, draft = tiny("target"), tiny("close")
    prompt = [3, 17, 42, 5]
    ar = generate_one(target, Request(prompt, build_method("ar"), Sampling(temperature=0), 20,
                                      Randomness(torch.Generator().manual_seed(0))))
    with PearlEngine(target, draft) as engine:
        greedy = engine.generate(prompt, gamma=3, sampling=Sampling(temperature=0),
                                 max_new_tokens=20, generator=torch.Generator().manual_seed(0))
        assert greedy.tokens == ar.tokens
        for seed, verifier in ((1, "token"), (2, "block")):
            got = engine.generate(prompt, gamma=2, verifier=verifier, sampling=Sampling(),
                                  max_new_tokens=20, generator=torch.Generator().manual_seed(seed))
            want = reference(tiny("target"), tiny("close"), prompt, cfg=PearlConfig(2, verifier),
                             sampling=Sampling(), max_new_tokens=20,
                             generator=torch.Generator().manual_seed(seed))
            assert got.tokens == want.tokens
            assert got.stats.nll_sum == pytest.approx(want.stats.nll_sum, rel=1e-5)


# --------------------------------------------------------------------------------------
# 4. Theorems 1 and 2, the timeline.
# --------------------------------------------------------------------------------------

@pytest.mark.usefixtures("one_thread")
def test_theorem_2_mean_accepted_per_drafting_phase() -> None:
    p, q = [0.5, 0.3, 0.2], [0.3, 0.3, 0.4]
    alpha = sum(min(a, b) for a, b in zip(p, q, strict=True))  # 0.8
    out = reference(ContextIndependentLM(p), ContextIndependentLM(q), [0], cfg=PearlConfig(3, "token"),
                    sampling=Sampling(), max_new_tokens=3000,
                    generator=torch.Generator().manual_seed(0))
    st = out.stats
    se = (alpha ** 0.5 / (1 - alpha)) / st.drafting_phases ** 0.5  # sd of a geometric count
    assert abs(st.mean_accepted_per_phase - alpha / (1 - alpha)) < 4 * se
    assert abs(st.mean_accepted_per_phase - (1 / (1 - alpha) + 1)) > 8 * se  # eq. (6) as printed


def _overlap(timeline: list, a: str, b: str) -> float:
    spans = {lane: [(s, e) for ln, s, e, lab in timeline if ln == lane and lab != "prefill"]
             for lane in (a, b)}
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in spans[a] for s2, e2 in spans[b])


def test_gamma_auto_measures_c_and_the_models_run_concurrently(tmp_path) -> None:
    target = DelayedLM(RandomContextLM(5, 1), delay_s=0.03)
    draft = DelayedLM(RandomContextLM(5, 2), delay_s=0.01)
    with PearlEngine(target, draft) as engine:
        pids = list(engine.pids.values())
        out = engine.generate([1, 2], gamma="auto", sampling=Sampling(), max_new_tokens=30,
                              generator=torch.Generator().manual_seed(0))
        st = out.stats
        assert st.gamma_mode == "auto" and 2.0 < st.speed_ratio < 4.5
        assert st.gamma == max(1, round(st.speed_ratio)) and st.probe_target_s > st.probe_draft_s
        busy_t = sum(e - s for ln, s, e, lab in st.timeline if ln == "target" and lab != "prefill")
        assert _overlap(st.timeline, "draft", "target") > 0.5 * busy_t  # really in parallel
        seq = engine.generate([1, 2], gamma=3, pre_verify=False, post_verify=False,
                              sampling=Sampling(), max_new_tokens=30,
                              generator=torch.Generator().manual_seed(0))
        assert _overlap(seq.stats.timeline, "draft", "target") == 0.0  # sequential SD schedule
        assert seq.stats.wait_fraction["target"] > st.wait_fraction["target"]
        png = tmp_path / "timeline.png"
        draw_timeline(st.timeline, str(png), end=st.decode_time_s, title="test")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any(_running(pid) for pid in pids)  # workers exit on completion


# --------------------------------------------------------------------------------------
# 5. Shutdown.
# --------------------------------------------------------------------------------------

def _running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_running(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("role", ["draft", "target"])
def test_exception_in_a_worker_is_shown_and_both_workers_exit(role: str) -> None:
    models = {"target": RandomContextLM(5, 1), "draft": RandomContextLM(5, 2)}
    models[role] = DelayedLM(models[role], fail_after=6)
    engine = PearlEngine(models["target"], models["draft"])
    pids = list(engine.pids.values())
    with pytest.raises(PearlWorkerError, match=f"(?s)PEARL {role} worker failed.*InjectedFailure"):
        engine.generate([1, 2], gamma=2, sampling=Sampling(), max_new_tokens=200,
                        generator=torch.Generator().manual_seed(0))
    assert engine.closed and _gone(pids)
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([1], gamma=2, sampling=Sampling(), max_new_tokens=2,
                        generator=torch.Generator())


def test_a_killed_worker_is_reported_and_the_other_one_stopped() -> None:
    engine = PearlEngine(DelayedLM(RandomContextLM(5, 1), 0.01), DelayedLM(RandomContextLM(5, 2), 0.005))
    pids = list(engine.pids.values())
    killer = threading.Timer(1.0, os.kill, (engine.pids["target"], signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(PearlWorkerError, match="target worker exited unexpectedly"):
            engine.generate([1, 2], gamma=2, sampling=Sampling(), max_new_tokens=100_000,
                            generator=torch.Generator().manual_seed(0))
    finally:
        killer.cancel()
        engine.close()
    assert _gone(pids)


SCRIPT = """
import json, signal, sys, torch
from pearl_doubles import DelayedLM
from verispec.methods.pearl.coordinator import PearlEngine
from verispec.models.toy import RandomContextLM
from verispec.sampling import Sampling
if __name__ == "__main__":
    # a terminal's Ctrl-C: KeyboardInterrupt, even where the test runner's process ignores
    # SIGINT (an ignored signal is inherited by the processes it starts)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target = DelayedLM(RandomContextLM(5, 1), 0.02, started=sys.argv[1])
    draft = DelayedLM(RandomContextLM(5, 2), 0.01)
    with PearlEngine(target, draft) as engine:
        print(json.dumps(list(engine.pids.values())), flush=True)
        engine.generate([1, 2], gamma=2, sampling=Sampling(), max_new_tokens=100000,
                        generator=torch.Generator().manual_seed(0))
"""


#: Upper bounds of the condition waits below (each returns as soon as its condition holds).
BUSY_MACHINE_S = 120


def _wait_for(path: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + BUSY_MACHINE_S
    while not os.path.exists(path):
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "decoding never started"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_no_orphans_when_the_coordinator_is_interrupted_or_killed(how: str,
                                                                  tmp_path: Path) -> None:
    tests_dir = os.path.dirname(os.path.abspath(__file__))  # where pearl_doubles lives
    path = os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")]))
    started = str(tmp_path / "decoding")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, started], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": path})
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, proc.stderr.read()  # type: ignore[union-attr]
        pids = json.loads(line)
        _wait_for(started, proc)  # the target worker has run a forward pass
        if how == "ctrl-c":  # a terminal's Ctrl-C reaches the whole process group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.kill()
        _, err = proc.communicate(timeout=BUSY_MACHINE_S)  # drains the pipes while it exits
        if how == "ctrl-c":
            assert "KeyboardInterrupt" in err
        assert proc.returncode != 0 and _gone(pids, timeout=BUSY_MACHINE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------------------
# CLI and API.
# --------------------------------------------------------------------------------------

def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out=out, err=err), out.getvalue(), err.getvalue()


def test_cli_pearl_json_and_timeline_match_the_reference(tmp_path) -> None:
    png = tmp_path / "t.png"
    code, out, err = _cli("generate", "ABCAB", "--target", "toy:random:5:1", "--draft",
                          "toy:random:5:2", "--method", "pearl[verifier=token,pre_verify=false]",
                          "--gamma", "2", "--max-new-tokens", "15", "--seed", "4",
                          "--json", "--timeline", str(png))
    assert code == 0, err
    payload = json.loads(out)
    st = payload["stats"]
    assert st["method"] == "pearl" and st["verifier"] == "token" and st["gamma"] == 2
    assert st["pre_verify"] is False and st["post_verify"] is True
    for key in ("mean_accepted_per_phase", "wait_fraction", "timeline", "draft_forwards",
                "target_forwards", "drafting_phases"):
        assert key in st
    assert png.read_bytes()[:4] == b"\x89PNG"
    want = reference(RandomContextLM(5, 1), RandomContextLM(5, 2), [0, 1, 2, 0, 1],
                     cfg=PearlConfig(2, "token", pre_verify=False), sampling=Sampling(),
                     max_new_tokens=15, generator=torch.Generator().manual_seed(4))
    assert payload["tokens"] == want.tokens


@pytest.mark.parametrize("argv, message", [
    (["--method", "ar", "--gamma", "auto"], "gamma must be an integer for ar"),
    (["--method", "mjgd", "--gamma", "auto"], "gamma must be an integer for mjgd"),
    (["--method", "token[verifier=block]"], "only pearl takes a verifier"),
    (["--method", "block", "--timeline", "x.png"], "--timeline needs --method pearl"),
    (["--method", "pearl[verifier=multidraft]"], "token or block"),
    (["--method", "pearl", "--drafter", "ngram"], "the n-gram drafter cannot serve it"),
    (["--method", "pearl", "--no-pre-verify"], "unrecognized arguments: --no-pre-verify"),
])
def test_cli_rejects_bad_pearl_options(argv: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code, _, err = _cli("generate", "AB", "--target", "toy:random:5:1", "--draft",
                            "toy:random:5:2", *argv)
    except SystemExit as exc:  # argparse rejects unknown flags itself, on sys.stderr
        code, err = int(exc.code or 0), capsys.readouterr().err
    assert code == 2 and message in err


def test_api_gamma_auto_needs_a_draft_and_pearl_options_are_checked() -> None:
    import verispec

    with pytest.raises(ValueError, match="gamma must be an integer for ar"):
        verispec.generate("toy:random:5:1", "toy:random:5:2", "AB", method="ar", gamma="auto")
    with pytest.raises(ValueError, match="n-gram drafter has none"):
        verispec.generate("toy:random:5:1", "toy:random:5:2", "ABAB", method="token",
                          gamma="auto", drafter="ngram")
    with pytest.raises(ValueError, match="only pearl takes a verifier"):
        verispec.generate("toy:random:5:1", "toy:random:5:2", "AB", method="token",
                          verifier="block")
    with pytest.raises(ValueError, match="token or block"):
        verispec.generate("toy:random:5:1", "toy:random:5:2", "AB", method="pearl",
                          verifier="multidraft")
    with pytest.raises(ValueError, match="given twice"):
        verispec.generate("toy:random:5:1", "toy:random:5:2", "AB",
                          method="pearl[verifier=block]", verifier="token")
    with pytest.raises(ValueError, match="cannot share a batch"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", ["AB", "BA"], method="pearl")


def test_api_pearl_verifier_option_reaches_every_window() -> None:
    """``method="pearl", verifier="token"`` runs the windows with token verification: the
    reference's tokens for that rule, same seed (the bracket spelling goes through the CLI
    test above; here it must build the same method)."""
    import verispec

    kw = {"gamma": 2, "max_new_tokens": 12, "seed": 3}
    want = {v: reference(RandomContextLM(5, 1), RandomContextLM(5, 2), [0, 1, 0],
                         cfg=PearlConfig(2, v), sampling=Sampling(), max_new_tokens=12,
                         generator=torch.Generator().manual_seed(3)).tokens
            for v in ("token", "block")}
    assert want["token"] != want["block"]  # the seed tells the two rules apart
    out = verispec.generate("toy:random:5:1", "toy:random:5:2", "ABA", method="pearl",
                            verifier="token", **kw)
    assert out.tokens == want["token"]
    assert out.stats.verifier == "token"  # type: ignore[attr-defined]
    bracket = build_method("pearl[verifier=token]")
    assert vars(bracket) == vars(build_method("pearl", verifier="token"))
    assert bracket.verifier == "token" and build_method("pearl").verifier == "block"  # type: ignore[attr-defined]
