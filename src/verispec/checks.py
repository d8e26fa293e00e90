"""Checks and constants shared by every layer."""

from __future__ import annotations

import argparse
import operator
from typing import Any

__all__ = ["TOLERANCE", "check_flag", "check_positive", "parse_gamma"]

#: Exact laws (float64 enumeration) count as equal when no probability differs by more.
TOLERANCE = 1e-12


def check_positive(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int, or ValueError unless it is an integer (not a bool) >= ``minimum``."""
    try:
        number = operator.index(value)  # int-like only: no floats, strings or bools
    except TypeError:
        number = None
    if number is None or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def check_flag(name: str, value: Any) -> bool:
    """``value`` unchanged, or ValueError unless it is exactly True or False."""
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def parse_gamma(text: str) -> int | str:
    """The argparse type of ``--gamma``: an integer, or ``auto`` (chosen by measurement)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
