"""``python -m verispec.server ARGS``: the same as ``verispec serve ARGS``."""

from __future__ import annotations

import sys

from verispec.server.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
