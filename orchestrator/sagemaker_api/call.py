"""What an operation of the endpoint is handed, and how operations are registered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.principal import Principal


@dataclass(frozen=True)
class EndpointSettings:
    """What the endpoint needs from the control plane's settings (orchestrator/settings.py)."""

    server_key: bytes
    default_backend: str = "local"
    max_instances: int = 0  # 0: no instance quota


@dataclass
class Call:
    """One authenticated call, with an open transaction (`session`) committed after it returns."""

    session: Any
    who: Principal
    region: str
    operation: str
    settings: EndpointSettings
    backends: dict[str, Any]
    now: float


@dataclass(frozen=True)
class Operation:
    fn: Callable[[Call, dict[str, Any]], dict[str, Any]]
    writes: bool = False  # needs a writer's token (admin, member, service) and counts against its rate


def registry() -> tuple[dict[str, Operation], Callable]:
    """A dict of operations and a decorator filling it: `@operation("CreateTrainingJob", writes=True)`."""
    ops: dict[str, Operation] = {}

    def operation(name: str, writes: bool = False):
        def register(fn):
            ops[name] = Operation(fn, writes)
            return fn

        return register

    return ops, operation
