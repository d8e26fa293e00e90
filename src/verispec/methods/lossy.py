"""The ``lossy`` method: token verification with over-acceptance ε and a chosen residual
(Section 4 / Appendix G of theoretical-perspective-speculative-decoding.txt)."""

from __future__ import annotations

import torch
from torch import Tensor

from verispec.drafters.base import Draft
from verispec.engine.methods import Method
from verispec.methods import MethodInfo, register
from verispec.verify import VerifyResult
from verispec.verify.lossy import Residual, check_lossy_params, lossy_verify

__all__ = ["LossyMethod"]


class LossyMethod(Method):
    """Lossy verification, b(x) = min{1, (p(x) + ε)/q(x)} (paper's Decoding-OPT / -UNO).

    NOT lossless: ``lossless`` is True only for ε = 0 with ``residual="opt"``, which is
    token verification exactly. With ``residual="target"`` even ε = 0 is biased whenever
    p ≠ q (the step law is min{p, q} + TV(p, q)·p). Algorithm: Appendix G of
    theoretical-perspective-speculative-decoding.txt (Algorithm 2 with the acceptance
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

    def verify(self, target_probs: Tensor, draft: Draft, generator: torch.Generator) -> VerifyResult:
        return lossy_verify(
            target_probs, draft.probs.to(target_probs.dtype), draft.tokens, generator,
            epsilon=self.epsilon, residual=self.residual,
        )


register(MethodInfo(
    "lossy", False,
    "over-acceptance b=min{1,(p+ε)/q} (Yin et al., Thm 4-5): NOT lossless (ε>0); "
    "--epsilon ε (0.1), --residual opt (Pareto-optimal) | target (Decoding-UNO)",
    LossyMethod,
))
