"""The local backend's hot-spare pool: which waiting spares a relaunch keeps, and where new ones go.

Pure planning over the handle and the node pool's slots (`placement`); the backend starts the trees
(`LocalBackend._grow`). A new spare never takes a name a node of the attempt's tree had:
that name's folder is the old node's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator import placement
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.local_procs import alive, read_pid
from orchestrator.backends.local_spawn import free_port


def reusable(request: LaunchRequest, wanted: int) -> dict[str, dict[str, str]]:
    """The spares of the attempt before (`request.reuse_spares`) a relaunch can keep: alive, not
    excluded, at most `wanted`."""
    out = {}
    for host, info in request.reuse_spares.items():
        pid = read_pid(Path(info["root"]) / host / "agent" / "agent.pid")
        if len(out) < wanted and host not in request.exclude_nodes and pid is not None and alive(pid, "agent"):
            out[host] = info
    return out


def replenish(request: LaunchRequest, handle: dict[str, Any], count: int | None = None) -> list[str]:
    """The pool refilled (`resources.spare_nodes`): as many new spares as took slots, on the
    next free slots (never a name a node of this tree had: its folder is the old node's), added
    to the handle and to its memory ring's endpoints. Fewer when the pool runs out. `count`:
    that many instead (spares that died while they waited)."""
    used = len(request.replace_nodes) if count is None else count
    fresh = free_slots(request, handle)[:used]
    if fresh:
        handle["spares"] = [*handle.get("spares", []), *fresh]
        if handle.get("memory_peers"):
            handle["memory_peers"] = {**handle["memory_peers"], **{h: f"127.0.0.1:{free_port()}" for h in fresh}}
    return fresh


def free_slots(request: LaunchRequest, handle: dict[str, Any]) -> list[str]:
    """The node pool's slots a new spare of `handle`'s attempt may take, in slot order: not a node
    or spare of it, not a replaced or excluded node, not a name its tree has a folder of."""
    spec = request.spec
    slots = placement.node_slots(spec.backend_options, spec.resources.instance_count, spec.resources.spare_nodes)
    root = Path(handle["root"])
    had = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    kept = handle.get("node_roots") or {}  # spares kept from an earlier attempt, dead ones too
    taken = [*handle["hosts"], *handle.get("spares", []), *request.replace_nodes, *had, *kept]
    return placement.spares(slots, slots, taken, request.exclude_nodes)


Launched = dict[tuple[str, str | None], tuple[LaunchRequest, int]]


def remember(launched: Launched, request: LaunchRequest, handle: dict[str, Any]) -> None:
    """Keep what launched `handle`'s attempt (its request, and the rendezvous port a spare started
    later uses) where `LocalBackend._replace_dead_spares` finds it: keyed as `poll` looks it up (an
    in-place handle names its attempt, a fresh launch's does not: its folder is the attempt's).
    Spawns nothing, so remembering twice is harmless."""
    port = handle.get("master_port")
    if port is None:
        # A handle launched before fresh launches kept their port: any free one. A spare's tree
        # uses it for nothing (its pre-flight takes a port of its own); the in-place attempt
        # that hands it a rank slot names that attempt's port (GET .../next).
        port = free_port()
    launched[(str(Path(handle["root"])), handle.get("attempt_id"))] = (request, int(port))
