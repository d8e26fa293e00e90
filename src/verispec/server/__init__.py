"""``verispec serve``: an OpenAI-compatible HTTP server over the batching engine.

One scheduler thread owns the :class:`~verispec.engine.loop.Engine`; a FastAPI app (run
by uvicorn) speaks OpenAI's completions and chat completions API, streamed or not, and
hands requests to it. Continuous batching: a request takes a free row at the next engine
iteration and leaves at EOS, its budget, a stop string or when its client goes away; with
a seed and a fixed γ its text does not depend on the rest of the batch (with γ ``auto`` its
law is still exact, but at T > 0 the batch and the engine's timing choose its γ, and so which
random draws it uses).

Needs the ``serve`` extra (``pip install 'verispec[serve]'``). The names below are
imported on first use, so ``verispec.server.cli`` (the argument parser) loads without it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verispec.server.app import create_app
    from verispec.server.config import ServerConfig
    from verispec.server.runner import ServerHandle, serve

__all__ = ["ServerConfig", "ServerHandle", "create_app", "serve"]

_HOMES = {"ServerConfig": "config", "ServerHandle": "runner", "create_app": "app",
          "serve": "runner"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(f"verispec.server.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'verispec.server' has no attribute {name!r}")
