"""verispec — speculative decoding with exact verification.

p is the target, q is the draft, everywhere. See :mod:`verispec.verify` for the verifiers,
:mod:`verispec.engine` for the loop (Algorithm 3), :mod:`verispec.models` for the model
layer, :mod:`verispec.drafters` for the drafters and :mod:`verispec.methods` for the table
of methods.
"""

from verispec.api import BatchGenerationResult, GenerationResult, generate, generate_batch
from verispec.engine.stats import Stats
from verispec.methods import METHODS
from verispec.sampling import Sampling

__all__ = [
    "METHODS",
    "BatchGenerationResult",
    "GenerationResult",
    "Sampling",
    "Stats",
    "generate",
    "generate_batch",
]
__version__ = "0.1.0"
