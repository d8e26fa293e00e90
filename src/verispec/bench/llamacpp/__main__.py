"""``python -m verispec.bench.llamacpp {status,build-spec,build-server}``."""

from verispec.bench.llamacpp import main

raise SystemExit(main())
