"""What every backend's in-place attempt shares (`Backend.launch` with `request.in_place_of`): the
handle it derives from the failed attempt's, and the one rule for its rendezvous port.

An in-place attempt runs on the failed attempt's nodes (the agents stay up and restart their worker
groups), so its handle is the old one's, told to read only this attempt's outcomes, with:
- a rendezvous port of its own: a new worker group must never join a store the last group's
  torchrun may still serve while it is being stopped (`rendezvous_port`);
- a memory-tier replication key of its own (GET .../next hands it to each agent as it switches:
  the last attempt's stops being accepted by a node once it switched);
- with hot spares, each replaced node's rank slot given to its spare, which is a spare no more.
What only one backend does (the local one spawns replenished spares, Slurm submits an allocation
for them, SageMaker checks its training job still runs) stays in that backend.
"""

from __future__ import annotations

from typing import Any

from aerie_contracts import memckpt
from orchestrator import placement
from orchestrator.backends.base import LaunchRequest

# The full range of unprivileged ports.
PORTS_LOW, PORTS_SPAN = 1024, 65536 - 1024


def restarts_of(previous: dict[str, Any]) -> int:
    """How many in-place attempts the allocation will have run, this one included."""
    return int(previous.get("in_place_restarts") or 0) + 1


def rendezvous_port(base: int, restarts: int, low: int = PORTS_LOW, span: int = PORTS_SPAN, stride: int = 1) -> int:
    """The `restarts`-th in-place attempt's rendezvous port: the allocation's own `base` moved by
    `restarts` strides, wrapping within [low, low + span) (a backend's port range)."""
    return low + (int(base) - low + restarts * stride) % span


def next_handle(
    previous: dict[str, Any], request: LaunchRequest, *, master_port: int, hosts: list[str] | None = None
) -> dict[str, Any]:
    """The in-place attempt's handle, from the failed attempt's (`hosts`: its nodes, where the old
    handle does not list them)."""
    handle = {
        **previous,
        "hosts": list(hosts if hosts is not None else previous.get("hosts") or []),
        "attempt_id": request.attempt_id,
        "in_place": True,
        "in_place_restarts": restarts_of(previous),
        "master_port": master_port,
    }
    if memckpt.HANDLE_KEY in handle:
        handle[memckpt.HANDLE_KEY] = memckpt.new_key()
    if request.replace_nodes:
        handle["hosts"] = placement.swap(handle["hosts"], request.replace_nodes)
        taken = set(request.replace_nodes.values())
        handle["spares"] = [h for h in previous.get("spares") or [] if h not in taken]
        handle["replaced_nodes"] = dict(request.replace_nodes)
    return handle


def spares_taken(previous: dict[str, Any], request: LaunchRequest) -> list[str]:
    """The failed attempt's hot spares this attempt puts in replaced nodes' slots."""
    waiting = set(previous.get("spares") or [])
    return [h for h in (request.replace_nodes or {}).values() if h in waiting]
