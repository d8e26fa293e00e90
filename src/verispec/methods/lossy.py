"""The ``lossy`` method: token verification with over-acceptance ε and a chosen residual
(Section 4 / Appendix G of *A Theoretical Perspective for Speculative Decoding Algorithm*,
Yin et al., NeurIPS 2024)."""

from __future__ import annotations

from functools import partial

from verispec.engine.protocols import Method, VerifyBatch
from verispec.methods.basic import plan_method_law
from verispec.methods.registry import MethodInfo
from verispec.verify import VerifyResult, draw_rows
from verispec.verify.lossy import (
    Residual,
    check_lossy_params,
    lossy_plan,
    lossy_plan_with_bias,
    reached_bias,
)

__all__ = ["LOSSY", "LossyMethod"]


class LossyMethod(Method):
    """Lossy verification, b(x) = min{1, (p(x) + ε)/q(x)} (paper's Decoding-OPT / -UNO).

    NOT lossless: ``lossless`` is True only for ε = 0 with ``residual="opt"``, which is
    token verification exactly. With ``residual="target"`` even ε = 0 is biased whenever
    p ≠ q (the step law is min{p, q} + TV(p, q)·p). Algorithm: Appendix G of
    *A Theoretical Perspective for Speculative Decoding Algorithm* (Algorithm 2 with the acceptance
    raised by ε; residual = Theorem 4's Pareto-optimal [A]₊ normalised, or the target p).
    Each step's exact bias TV(step law, p) is added to ``Stats.bias_tv_sum``.

    Args:
        epsilon: over-acceptance ε ≥ 0 (default 0.1).
        residual: "opt" (Pareto-optimal, default) or "target" (Decoding-UNO baseline).
    """

    def __init__(self, epsilon: float = 0.1, residual: Residual = "opt") -> None:
        check_lossy_params(epsilon, residual)
        self.name = "lossy"
        self.epsilon = float(epsilon)
        self.residual: Residual = residual
        self.lossless = self.epsilon == 0 and residual == "opt"
        self.plan = partial(lossy_plan, epsilon=self.epsilon, residual=self.residual)

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        p = batch.target_probs[:, 0]  # [B, γ+1, V]
        lengths = batch.lengths if batch.ragged else None
        plan, tv = lossy_plan_with_bias(p, batch.draft_probs[:, 0].to(p.dtype),
                                        batch.draft_tokens[:, 0], epsilon=self.epsilon,
                                        residual=self.residual, lengths=lengths)
        result = draw_rows(plan, batch.randoms)
        result.bias_tv = reached_bias(tv, result.num_accepted, lengths)
        return result


LOSSY = MethodInfo(
    "lossy", False,
    "over-acceptance b=min{1,(p+ε)/q} (Yin et al., Thm 4-5): NOT lossless (ε>0); "
    "epsilon ε (0.1), residual opt (Pareto-optimal) | target (Decoding-UNO)",
    LossyMethod, law=plan_method_law,
)
