"""Is a node of a running attempt lost? Two ways to be: it stopped reporting, or it never did.

Pure functions over what the store knows of each node (its last heartbeat) and what the backend
reports (which hosts it runs), so the rules are tested without a control plane:

- `stopped_reporting`: a node that sent heartbeats and then none for `lost_after_heartbeats`
  intervals (a dead machine, a partition, a frozen agent);
- `never_reported`: a node with no heartbeat at all `health.first_heartbeat_s` after the backend
  said the attempt's machines were allocated (an instance that never boots, an agent that dies or
  hangs before its first heartbeat). Without this, such an attempt stays Running until
  `max_runtime_s`, since a node without heartbeats never stops heartbeating.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aerie_contracts import failures
from aerie_contracts.failures import FailureKind
from aerie_contracts.states import NodeState

# Backend node states of a node that ended on its own (it reported its exit, so it was not lost).
_ENDED = {NodeState.COMPLETED, NodeState.FAILED, NodeState.STOPPED}


@dataclass(frozen=True)
class Lost:
    """A lost node: the attempt's failure reason, and the verdict's evidence."""

    host: str | None  # None when the backend cannot name the node (it never showed up at all)
    reason: dict[str, Any]
    evidence: dict[str, Any]


def stopped_reporting(
    heartbeats: dict[str, float | None], states: dict[str, str], now: float, limit_s: float
) -> Lost | None:
    """The first Running node whose last heartbeat is older than `limit_s`."""
    for host, last in heartbeats.items():
        if last is not None and now - last > limit_s and states.get(host) == NodeState.RUNNING:
            message = f"no heartbeat from {host} for {now - last:.0f}s"
            return Lost(
                host,
                failures.reason(FailureKind.NODE_LOST, message, host=host),
                {"last_heartbeat_at": last, "limit_s": limit_s},
            )
    return None


def never_reported(
    heartbeats: dict[str, float | None],
    polled: Iterable[tuple[str, str]],
    expected: int,
    booted_at: float,
    now: float,
    limit_s: float,
) -> Lost | None:
    """A node that has not sent one heartbeat `limit_s` after `booted_at`.

    `heartbeats`: host -> last heartbeat time (None: never) as the store has them; `polled`: (host,
    state) as the backend reports them now; `expected`: the attempt's node count. A node the
    backend lists, not ended, without a heartbeat is named; if the backend lists fewer nodes than
    expected and the missing ones never reported either, the node cannot be named (host None)."""
    waited = now - booted_at
    if waited <= limit_s:
        return None
    reported = sorted(h for h, t in heartbeats.items() if t is not None)
    polled = list(polled)
    silent = sorted(h for h, state in polled if state not in _ENDED and heartbeats.get(h) is None)
    known = set(reported) | {h for h, _ in polled}
    if not silent and len(known) >= expected:
        return None
    host = silent[0] if silent else None
    who = host or f"{expected - len(known)} of {expected} node(s)"
    evidence = {
        "never_reported": True,
        "waited_s": round(waited, 1),
        "first_heartbeat_s": limit_s,
        "reported": reported,
        "expected": expected,
    }
    message = (
        f"{who} never reported: no heartbeat {waited:.0f}s after the attempt's machines were allocated "
        f"(health.first_heartbeat_s={limit_s:g})"
    )
    fields: dict[str, Any] = {"evidence": evidence}
    if host:
        fields["host"] = host
    return Lost(host, failures.reason(FailureKind.NODE_LOST, message, **fields), evidence)
