"""The server's settings (what ``verispec serve`` takes besides the models)."""

from __future__ import annotations

from dataclasses import dataclass

from verispec.checks import check_positive

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """How the server decodes and how much it takes in.

    Attributes:
        method: the speculation a request gets when it does not choose one (a method name,
            optionally with options in brackets, as ``verispec generate --method``).
        gamma: γ for ``method``: an int, ``"auto"``, or None: ``"auto"`` where the draft
            model drafts (each iteration's draft lengths chosen for the whole batch from the
            measured cost of a batched pass), else the method's default. A request that
            chooses another method without a γ gets the same rule for that method.
        drafter: ``model`` (the draft model) or ``ngram`` (prompt lookup), the default of
            requests that do not choose.
        max_batch: rows decoded together (the engine's batch size).
        max_queue: requests that may wait for a free row; one more is answered 429.
        model_name: the model id of ``/v1/models`` and the ``model`` field (None: the
            target's name).
        default_max_tokens: the budget of a request without ``max_tokens`` (capped by the
            room left in the context window).
        max_body_bytes: larger request bodies are answered 413.
        max_stop: at most this many stop strings per request.
        retry_after_s: the ``Retry-After`` of a 429 (whole seconds).
        shutdown_timeout_s: on SIGINT/SIGTERM, in-flight requests may finish for this long;
            what is still running then is cancelled.
        warm_costs: time the pair's pass costs at start-up even where the default method
            does not use γ auto (it always does where it does).
    """

    method: str = "block"
    gamma: int | str | None = None
    drafter: str = "model"
    max_batch: int = 8
    max_queue: int = 64
    model_name: str | None = None
    default_max_tokens: int = 256
    max_body_bytes: int = 4 << 20
    max_stop: int = 16
    retry_after_s: int = 1
    shutdown_timeout_s: float = 30.0
    warm_costs: bool = False

    def __post_init__(self) -> None:
        check_positive("max_batch", self.max_batch)
        check_positive("max_queue", self.max_queue, minimum=0)
        check_positive("default_max_tokens", self.default_max_tokens)
        check_positive("max_body_bytes", self.max_body_bytes)
        check_positive("max_stop", self.max_stop, minimum=0)
        check_positive("retry_after_s", self.retry_after_s)
        if not self.shutdown_timeout_s >= 0:
            raise ValueError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")
        if self.drafter not in ("model", "ngram"):
            raise ValueError(f"drafter must be model or ngram, got {self.drafter!r}")
        if isinstance(self.gamma, str) and self.gamma != "auto":
            raise ValueError(f"gamma must be an integer, 'auto' or None, got {self.gamma!r}")
