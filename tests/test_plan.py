"""The request plan: what each method needs, decided by one rule from its table entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from verispec.engine.protocols import Method, ScheduledMethod
from verispec.methods import METHODS
from verispec.models.toy import RandomContextLM
from verispec.plan import (
    MethodCache,
    PlanError,
    RequestConfig,
    check_gamma,
    drafter_for,
    make_drafter,
    pair_history,
    plan_request,
)
from verispec.sampling import Sampling

# method -> (engine drafter, needs the draft model) with the model drafter / the n-gram one
EXPECTED = {
    "ar": ((None, False), (None, False)),
    "token": (("model", True), ("ngram", False)),
    "block": (("model", True), ("ngram", False)),
    "greedy-block": (("model", True), ("ngram", False)),
    "greedy-block-unmodified": (("model", True), ("ngram", False)),
    "lossy": (("model", True), ("ngram", False)),
    "multidraft": (("model", True), ("ngram", False)),
    "mjsd": (("beam", True), "error"),
    "mjgd": ((None, False), (None, False)),
    "pearl": ((None, True), "error"),
}


def test_every_method_of_the_table_has_its_needs_stated() -> None:
    assert set(EXPECTED) == set(METHODS)
    for name, (with_model, with_ngram) in EXPECTED.items():
        info = METHODS[name]
        assert drafter_for(info, "model") == with_model, name
        if with_ngram == "error":
            with pytest.raises(PlanError, match="n-gram drafter cannot serve it") as exc:
                drafter_for(info, "ngram")
            assert exc.value.field == "drafter"
        else:
            assert drafter_for(info, "ngram") == with_ngram, name
    with pytest.raises(PlanError, match="drafter must be one of"):
        drafter_for(METHODS["block"], "beam")


def test_methods_with_a_schedule_of_their_own_are_not_engine_methods() -> None:
    for name in ("mjgd", "pearl"):
        plan = plan_request(RequestConfig(name))
        assert isinstance(plan.method, ScheduledMethod) and not isinstance(plan.method, Method)
        assert not hasattr(plan.method, "verify")
        with pytest.raises(TypeError, match="schedule of its own"):
            plan.engine_method  # noqa: B018
    assert isinstance(plan_request(RequestConfig("block")).engine_method, Method)


@pytest.mark.parametrize("config, field, message", [
    (RequestConfig("nope"), "method", "unknown method"),
    (RequestConfig("block[verifier=token]"), "method", "only pearl takes a verifier"),
    (RequestConfig("block[epsilon=0.1]"), "method", "does not take"),
    (RequestConfig("block", gamma=0), "gamma", "gamma"),
    (RequestConfig("ar", gamma="auto"), "gamma", "must be an integer"),
    (RequestConfig("block", gamma="auto", drafter="ngram"), "gamma", "n-gram drafter has none"),
    (RequestConfig("token", draft_stop=0.5, drafter="ngram"), "draft_stop", "draft_stop"),
    (RequestConfig("lossy", draft_stop=0.5), "draft_stop", "draft_stop"),
    (RequestConfig("multidraft", drafter="ngram"), "drafter", "n-gram drafter"),
    (RequestConfig("block", temperature=-1.0), "sampling", "temperature"),
])
def test_bad_requests_name_the_setting_at_fault(config: RequestConfig, field: str,
                                                message: str) -> None:
    with pytest.raises(PlanError, match=message) as exc:
        plan_request(config)
    assert exc.value.field == field


def test_plans_report_label_gamma_and_sampling() -> None:
    plan = plan_request(RequestConfig("lossy[epsilon=0.1]", gamma=3, temperature=0.5))
    assert (plan.label, plan.gamma, plan.drafter, plan.needs_draft) == \
        ("lossy[epsilon=0.1]", 3, "model", True)
    assert plan.sampling.temperature == 0.5
    assert plan_request(RequestConfig("ar", gamma=5)).gamma == 0  # ar never drafts
    assert check_gamma(METHODS["pearl"], None) == "auto"
    assert plan_request(RequestConfig("mjsd")).sampling.top_k == 20  # the paper's warp


def test_a_method_cache_shares_instances_and_separates_matching_rows() -> None:
    cache = MethodCache()
    sampled = plan_request(RequestConfig("block", temperature=1.0), cache).method
    again = plan_request(RequestConfig("block", gamma=2, temperature=0.7), cache).method
    greedy = plan_request(RequestConfig("block", temperature=0.0), cache).method
    assert sampled is again and greedy is not sampled
    assert plan_request(RequestConfig("block")).method is not sampled  # no cache: fresh


def test_make_drafter_follows_the_same_rule() -> None:
    from verispec.drafters.beam import BeamDrafter
    from verispec.drafters.ngram import NgramDrafter
    from verispec.models.toy import RandomContextLM

    target, draft = RandomContextLM(5, seed=1), RandomContextLM(5, seed=2)
    assert make_drafter(target, draft, plan_request(RequestConfig("ar")).engine_method) is None
    beam = make_drafter(target, draft, plan_request(RequestConfig("mjsd[num_beams=3]")).engine_method)
    assert isinstance(beam, BeamDrafter)
    ngram = make_drafter(target, None, plan_request(RequestConfig("token")).engine_method,
                         kind="ngram")
    assert isinstance(ngram, NgramDrafter)
    with pytest.raises(PlanError, match="give one"):
        make_drafter(target, None, plan_request(RequestConfig("token")).engine_method)


def test_no_second_copy_of_the_rule_in_the_sources() -> None:
    """What a method needs is decided in verispec.plan only: no other module combines the
    table's drafting with the caller's drafter choice."""
    src = Path(__file__).resolve().parents[1] / "src" / "verispec"
    pattern = re.compile(r"uses_draft\s+and\s*\(|drafting\s*==\s*\"beam\"|== \"mjsd\"")
    found = [str(p.relative_to(src)) for p in src.rglob("*.py")
             if p.name != "plan.py" and pattern.search(p.read_text(encoding="utf-8"))]
    assert found == []


def test_batch_grids_are_shared_between_nearby_batch_sizes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of 3 rows is timed on the grid up to 4 (and interpolated), a batch of 4 or 2
    then reuses it, a wider batch times the next grid once, and a narrower one reuses it."""
    import verispec.plan as plan

    class Model:  # a stand-in: the grids are held per (target, draft) object
        pass

    timed: list[tuple[int, ...]] = []

    def fake(target: object, draft: object, *, rows: tuple[int, ...]) -> tuple[int, ...]:
        timed.append(rows)
        return rows

    monkeypatch.setattr(plan, "measure_costs", fake)
    target, draft = Model(), Model()
    assert plan.pair_costs(target, draft, 3) == (1, 2, 4)
    assert plan.pair_costs(target, draft, 4) == (1, 2, 4)
    assert plan.pair_costs(target, draft, 2) == (1, 2, 4)
    assert plan.pair_costs(target, draft, 6) == (1, 2, 4, 8)
    assert plan.pair_costs(target, draft, 5) == (1, 2, 4, 8)
    assert plan.pair_costs(target, draft, 12) == (1, 2, 4, 8, 12)
    assert timed == [(1, 2, 4), (1, 2, 4, 8), (1, 2, 4, 8, 12)]


def test_gamma_auto_pools_acceptance_per_method_and_warp() -> None:
    """γ auto's prior is the acceptance of earlier requests with the same method and
    sampling warp: greedy requests and samples at T = 1 do not share one."""
    target, draft = RandomContextLM(2, seed=1), RandomContextLM(2, seed=2)
    greedy = pair_history(target, draft, "block", Sampling(temperature=0.0))
    assert pair_history(target, draft, "block", Sampling(temperature=0.0)) is greedy
    assert pair_history(target, draft, "block", Sampling(temperature=0)) is greedy
    sampled = pair_history(target, draft, "block", Sampling(temperature=1.0))
    assert pair_history(target, draft, "block", Sampling(temperature=1, top_p=1.0)) is sampled
    assert pair_history(target, draft, "block", Sampling(temperature=1, top_p=0.9)) \
        is not sampled
    assert pair_history(target, draft, "block", Sampling(temperature=1.0)) is not greedy
    assert pair_history(target, draft, "token", Sampling(temperature=0.0)) is not greedy
    assert pair_history(target, RandomContextLM(2, seed=3), "block",
                        Sampling(temperature=0.0)) is not greedy


def test_engines_of_a_pair_carry_what_they_learned_to_the_next_call() -> None:
    """The iteration times γ auto learns (pass shapes, the engine's own time) outlive one
    ``generate_batch`` call: the next call of the same pair continues from them, and so do
    later calls with a fixed γ that decode plainly or draft with the same draft model (their
    passes have the shapes γ auto prices; an n-gram drafter's are left out, see
    ``tests/test_gamma_shapes.py``); another pair has its own."""
    from verispec.api import generate_batch
    from verispec.plan import pair_overhead

    target, draft = RandomContextLM(3, seed=1), RandomContextLM(3, seed=2)
    prompts = [[0, 1], [1, 2], [2, 0]]

    def run(gamma: int | str, method: str = "block") -> None:
        generate_batch(target, draft, prompts, method=method, gamma=gamma, seeds=[0, 1, 2],
                       max_new_tokens=6, temperature=1.0)

    run("auto")
    learned = pair_overhead(target, draft, len(prompts))
    first = learned.iterations
    assert first > 0
    run("auto")
    assert pair_overhead(target, draft, len(prompts)) is learned
    second = learned.iterations
    assert second > first
    run(2)
    third = learned.iterations
    assert third > second
    run(0, method="ar")
    assert learned.iterations > third
    assert pair_overhead(target, RandomContextLM(3, seed=3), len(prompts)) is not learned
