"""The methods of ``verispec generate --method NAME`` and :func:`verispec.generate`.

The table is explicit: each entry comes from the module where its method lives, with its
options, whether it is lossless, how it runs and its exact law (for ``verispec audit``).
"""

from __future__ import annotations

from typing import Any

from verispec.engine.protocols import Method, ScheduledMethod
from verispec.methods.basic import AR, BLOCK, TOKEN
from verispec.methods.greedy_block import GREEDY_BLOCK, GREEDY_BLOCK_UNMODIFIED
from verispec.methods.lossy import LOSSY
from verispec.methods.mjsd import MJGD, MJSD
from verispec.methods.multidraft import MULTIDRAFT
from verispec.methods.pearl import PEARL
from verispec.methods.registry import MethodInfo, MethodOptionError, parse_spec

__all__ = ["METHODS", "MethodInfo", "MethodOptionError", "build_method", "parse_spec", "resolve"]

#: Name -> entry, in ``--help`` order.
METHODS: dict[str, MethodInfo] = {info.name: info for info in (
    AR, TOKEN, BLOCK, GREEDY_BLOCK, GREEDY_BLOCK_UNMODIFIED, LOSSY, MULTIDRAFT, MJSD, MJGD, PEARL)}


def resolve(spec: str, **options: Any) -> tuple[MethodInfo, dict[str, Any]]:
    """The entry and options of ``name`` or ``name[key=value,...]``, merged with ``options``
    (None values are ignored; an option given twice must agree)."""
    name, inline = parse_spec(spec)
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    given = {k: v for k, v in options.items() if v is not None}
    for key in set(inline) & set(given):
        if inline[key] != given[key]:
            raise ValueError(f"method option {key} given twice: {inline[key]!r} in {spec!r} "
                             f"and {given[key]!r}")
    return METHODS[name], {**inline, **given}


def build_method(spec: str, **options: Any) -> Method | ScheduledMethod:
    """Build the method ``name`` or ``name[key=value,...]``; options that are None are ignored."""
    info, opts = resolve(spec, **options)
    known = info.options()
    unknown = sorted(set(opts) - set(known))
    if unknown:
        takes = ", ".join(f"{k}={v!r}" for k, v in known.items()) or "no options"
        raise MethodOptionError(f"method {info.name!r} does not take the option(s) "
                                f"{', '.join(unknown)}; it takes {takes}")
    return info.build(**opts)
