"""The model options every command shares: ``--target``, ``--draft`` and the precisions."""

from __future__ import annotations

import argparse

from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import PRECISIONS

__all__ = ["add_model_args"]


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--target``, ``--draft``, ``--precision`` and the per-model precision overrides."""
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: embedded name, local dir, hub id or toy spec "
                        f"(default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"draft model (default {DEFAULT_DRAFT})")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="numeric format of both models; auto picks int8 on an x86-64 CPU "
                        "where an int8 kernel is proven exact (8-bit activation codes with "
                        "VNNI, 7-bit without; weight-only int4 for the draft where a timing of "
                        "its layers finds it faster), bfloat16 on a "
                        "GPU or a CPU with native bf16, float32 otherwise (the choice is "
                        "printed); auto picks weight-only int4 for drafts only (a target in int4, "
                        "on verispec's int4 kernel, must be asked for); "
                        "VERISPEC_INT8_KERNEL=library/bits overrides the int8 kernel")
    p.add_argument("--target-precision", choices=PRECISIONS, default=None,
                   help="override --precision for the target")
    p.add_argument("--draft-precision", choices=PRECISIONS, default=None,
                   help="override --precision for the draft")
