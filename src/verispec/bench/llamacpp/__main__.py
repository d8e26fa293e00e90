"""``python -m verispec.bench.llamacpp {status,build-spec}``."""

from verispec.bench.llamacpp import main

raise SystemExit(main())
