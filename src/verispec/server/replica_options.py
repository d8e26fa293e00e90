"""What a replica needs to build its engine, and how many replicas: picklable settings.

:class:`ModelSpec` names the models (``verispec serve``'s model arguments, or a factory
named ``module:function``) so that every replica process, single or one of many on a Ray
cluster, loads its own pair; :class:`ReplicaOptions` sizes a Ray Serve deployment (a fixed
number of replicas or an autoscaling range). Neither needs Ray: ``verispec serve`` checks
its arguments before anything starts.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from verispec.models.base import CausalLM
from verispec.models.threads import release_worker_threads

__all__ = ["ModelSpec", "ReplicaOptions", "load_factory"]

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
#: Beyond max_batch + max_queue, the requests an engine replica takes at once: room for
#: /health, /v1/models and the queue-full answers while its batch and queue are full.
CONTROL_HEADROOM = 8


def load_factory(name: str) -> Any:
    """The callable ``module:function`` names; raises ValueError if there is none."""
    if not _FACTORY.match(name):
        raise ValueError(f"a model factory is named module:function, got {name!r}")
    module_name, function_name = name.split(":")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model factory {name!r}: cannot import {module_name} ({exc})") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):  # a name without a function: bad input, not a type error
        raise ValueError(f"model factory {name!r}: {module_name} has no function "  # noqa: TRY004
                         f"{function_name}")
    return factory


@dataclass(frozen=True)
class ModelSpec:
    """The pair a replica serves: model names as ``verispec serve --target/--draft`` takes
    them (``draft=None``: no draft model), or ``factory``, an importable ``module:function``
    called with ``factory_kwargs`` that returns ``(target, draft_or_None)``."""

    target: str | None = None
    draft: str | None = None
    precision: str = "auto"
    target_precision: str | None = None
    draft_precision: str | None = None
    factory: str | None = None
    factory_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.factory is None and self.target is None:
            raise ValueError("a model spec needs a target model or a model factory")
        if self.factory is not None and not _FACTORY.match(self.factory):
            raise ValueError(f"a model factory is named module:function, got {self.factory!r}")
        if not isinstance(self.factory_kwargs, dict):  # bad input, as every check here
            kind = type(self.factory_kwargs).__name__
            raise ValueError(f"factory_kwargs must be a mapping, got {kind}")  # noqa: TRY004

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelSpec:
        """The spec of ``verispec serve``'s parsed arguments."""
        if getattr(args, "model_factory", None):
            return cls(factory=args.model_factory, factory_kwargs=dict(args.factory_kwargs))
        return cls(target=args.target, draft=None if args.no_draft else args.draft,
                   precision=args.precision, target_precision=args.target_precision,
                   draft_precision=args.draft_precision)

    def load(self, progress: Any = None) -> tuple[CausalLM, CausalLM | None]:
        """Build the pair (in the calling process). The calling thread then hands back its
        torch worker threads: the server's scheduler thread runs the models
        (:func:`~verispec.models.threads.release_worker_threads`)."""
        try:
            if self.factory is not None:
                return self._from_factory()
            from verispec.api import load_pair

            assert self.target is not None
            pair = load_pair(self.target, self.draft, needs_draft=self.draft is not None,
                             precision=self.precision, target_precision=self.target_precision,
                             draft_precision=self.draft_precision, progress=progress)
            return pair.target, pair.draft
        finally:
            release_worker_threads()

    def _from_factory(self) -> tuple[CausalLM, CausalLM | None]:
        assert self.factory is not None
        made = load_factory(self.factory)(**self.factory_kwargs)
        if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], CausalLM)
                and (made[1] is None or isinstance(made[1], CausalLM))):
            raise ValueError(f"model factory {self.factory!r} must return (target, draft or "
                             f"None), models of verispec; got {type(made).__name__}")
        return made[0], made[1]


@dataclass(frozen=True)
class ReplicaOptions:
    """How many engine replicas, and what each gets.

    Attributes:
        replicas: a fixed number of engine replicas (None: autoscale between
            ``min_replicas`` and ``max_replicas``).
        min_replicas, max_replicas: the autoscaling range; Ray Serve adds a replica when the
            replicas average more than ``max_batch`` requests in flight and removes one
            when they average less.
        replica_cpus: CPUs Ray reserves for each engine replica (fractions allowed).
        ingress_replicas: replicas of the light ingress deployment in front.
        health_check_period_s: how often Ray Serve checks each replica's health.
        max_ongoing_requests: requests one engine replica takes at once (None: its
            ``max_batch + max_queue`` plus :data:`CONTROL_HEADROOM`); must be at least
            ``max_batch + max_queue`` so that its engine batches and queues as one server.
    """

    replicas: int | None = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    replica_cpus: float = 1.0
    ingress_replicas: int = 1
    health_check_period_s: float = 2.0
    max_ongoing_requests: int | None = None

    def __post_init__(self) -> None:
        scaling = (self.min_replicas, self.max_replicas)
        if self.replicas is not None:
            if any(v is not None for v in scaling):
                raise ValueError("give --replicas or --min-replicas/--max-replicas, not both")
            if self.replicas < 1:
                raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        else:
            if any(v is None for v in scaling):
                raise ValueError("autoscaling needs both --min-replicas and --max-replicas")
            low, high = self.min_replicas, self.max_replicas
            assert low is not None and high is not None
            if not 0 <= low <= high or high < 1:
                raise ValueError(f"the replica range needs 0 <= --min-replicas <= "
                                 f"--max-replicas and --max-replicas >= 1, got {low}..{high}")
        if not self.replica_cpus >= 0:
            raise ValueError(f"--replica-cpus must be >= 0, got {self.replica_cpus}")
        if self.ingress_replicas < 1:
            raise ValueError(f"ingress replicas must be >= 1, got {self.ingress_replicas}")
        if not self.health_check_period_s > 0:
            raise ValueError(f"health_check_period_s must be > 0, got "
                             f"{self.health_check_period_s}")
        if self.max_ongoing_requests is not None and self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got "
                             f"{self.max_ongoing_requests}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReplicaOptions | None:
        """The options of ``verispec serve``'s parsed arguments; None when they ask for
        no replicas (the single-process server)."""
        replicas = getattr(args, "replicas", None)
        low, high = getattr(args, "min_replicas", None), getattr(args, "max_replicas", None)
        address = getattr(args, "address", None)
        if replicas is None and low is None and high is None:
            if address is None:
                return None
            replicas = 1
        return cls(replicas=replicas, min_replicas=low, max_replicas=high,
                   replica_cpus=getattr(args, "replica_cpus", 1.0))

    @property
    def most_replicas(self) -> int:
        """The largest number of engine replicas there may be."""
        most = self.replicas if self.replicas is not None else self.max_replicas
        assert most is not None
        return most

    def engine_max_ongoing(self, max_batch: int, max_queue: int) -> int:
        """Each engine replica's ``max_ongoing_requests``; raises ValueError if it is below
        ``max_batch + max_queue`` (its engine could not fill its batch and queue)."""
        floor = max_batch + max_queue
        if self.max_ongoing_requests is None:
            return floor + CONTROL_HEADROOM
        if self.max_ongoing_requests < floor:
            raise ValueError(f"max_ongoing_requests {self.max_ongoing_requests} is below "
                             f"max_batch + max_queue = {floor}: the replica's engine could not "
                             "batch and queue what it is configured for")
        return self.max_ongoing_requests
