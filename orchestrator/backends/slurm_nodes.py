"""What a Slurm attempt's nodes wrote under its directory, read by the backend's poll.

The hosts the allocation holds (`hosts.json`), the hot spares and spare allocations they recorded,
each node's outcome (`agent/exit.json`) and the reason of an attempt Slurm ended (its state, the
job's output). Files on the shared filesystem, so a restarted control plane reads the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aerie_contracts import FailureKind
from aerie_contracts.container import read_json
from aerie_contracts.states import AttemptState
from orchestrator.backends import base
from orchestrator.backends.base import NodeStatus


def learned(handle: dict[str, Any], root: Path) -> dict[str, Any] | None:
    """The launched handle with its allocation's hosts and hot spares as the nodes recorded them
    (hosts.json), once they have and the handle does not say yet; None otherwise."""
    if handle.get("hosts") or handle.get("in_place"):
        return None
    data = read_json(root / "hosts.json")
    if not isinstance(data, dict) or not data.get("hosts"):
        return None
    learned = {**handle, "hosts": list(data["hosts"])}
    for key in ("spares", "memory_peers"):
        if data.get(key):
            learned[key] = data[key]
    return learned


def learned_spares(handle: dict[str, Any]) -> dict[str, Any] | None:
    """The handle with its spare allocations' nodes among its hot spares (and their endpoints in
    the memory ring's peers), for each allocation whose nodes recorded themselves (its
    hosts.json) and the handle does not know yet; None when nothing is new."""
    allocations = handle.get("spare_allocations") or []
    if not any("hosts" not in a for a in allocations):
        return None
    learned = {**handle, "spare_allocations": [dict(a) for a in allocations]}
    changed = False
    for allocation in learned["spare_allocations"]:
        if "hosts" in allocation:
            continue
        data = read_json(Path(allocation["root"]) / "hosts.json")
        if not isinstance(data, dict) or not data.get("spares"):
            continue
        fresh = [h for h in data["spares"] if h not in learned.get("hosts", []) and h not in learned.get("spares", [])]
        allocation["hosts"] = list(data["spares"])
        learned["spares"] = [*(learned.get("spares") or []), *fresh]
        if data.get("memory_peers") and learned.get("memory_peers"):
            # Only where the tier is on (the main allocation's ring is known): the ring grows.
            learned["memory_peers"] = {**data["memory_peers"], **learned["memory_peers"]}
        changed = True
    return learned if changed else None


def spare_job_ids(handle: dict[str, Any]) -> list[int]:
    return [int(a["slurm_job_id"]) for a in handle.get("spare_allocations") or [] if a.get("slurm_job_id")]


def recorded_hosts(root: Path) -> list[str]:
    data = read_json(root / "hosts.json")
    if isinstance(data, dict):
        return list(data.get("hosts") or [])
    # Before the first node wrote hosts.json, the node directories tell which nodes started.
    return sorted(p.parent.parent.name for p in root.glob("*/agent/agent.pid"))


def node_status(
    ml_root: Path, host: str, job_ended: bool, stop: bool, slurm_state: str, attempt_id: str | None = None
) -> NodeStatus:
    ended = base.node_outcome(ml_root, host, attempt_id)
    if ended is not None:
        return ended
    if not job_ended:
        running = (ml_root / "agent" / "agent.pid").exists()
        return NodeStatus(host, AttemptState.RUNNING if running else AttemptState.STARTING)
    # Slurm ended the job and this node's agent never wrote its outcome: killed or lost with its node.
    message = f"agent ended without reporting an exit (Slurm job state {slurm_state})"
    return base.ended_without_outcome(host, stop or slurm_state == "CANCELLED", message)


def slurm_reason(state: str, job: dict[str, Any] | None, root: Path) -> dict[str, Any]:
    detail = (job or {}).get("reason")
    kind = {
        "NODE_FAIL": FailureKind.NODE_LOST,
        "BOOT_FAIL": FailureKind.NODE_LOST,
        "LOST": FailureKind.NODE_LOST,
        "TIMEOUT": "timeout",
        "DEADLINE": "timeout",
        "OUT_OF_MEMORY": FailureKind.EXIT_OOM,
        "PREEMPTED": FailureKind.NODE_PREEMPTED,
    }.get(state, FailureKind.LAUNCH_FAILED)
    message = f"Slurm job ended {state}" + (f" ({detail})" if detail and detail != "None" else "")
    tail = tail_of(root / f"slurm-{job_id_of(root)}.out")
    if tail:
        message += f": {tail}"
    return {"kind": kind, "message": message[:1000], "slurm_state": state}


def job_id_of(root: Path) -> Any:
    handle = read_json(root / "handle.json") or {}
    return handle.get("slurm_job_id") if isinstance(handle, dict) else None


def tail_of(path: Path, n: int = 400) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
